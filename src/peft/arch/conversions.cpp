#include "peft/arch/conversions.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/python_regex.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"
#include "peft/arch/arch_registry.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad_step(const std::string& what, const std::string& message) {
  fail(PEFT_ERR_INVALID_CONFIG, "transformers conversions, " + what + ": " + message);
}

// One rename step of transformers' WeightTransform.rename_source_key.
struct Step {
  PythonRegex regex;
  std::vector<std::string> targets;  // per named group g<i>
  std::vector<int> groups;           // the group number of g<i>
  std::optional<std::string> scope;  // _scoped_match's scope_prefix
  std::string base_model_prefix;
  bool prefix_change = false;

  // The key after this step (unchanged when it does not match).
  std::string apply(const std::string& key) const {
    std::string prefix;
    std::string_view rest = key;
    if (scope) {
      const std::string own = scope->empty() ? "" : *scope + ".";
      const std::string outer = base_model_prefix.empty() ? "" : base_model_prefix + ".";
      if (key.starts_with(outer + own)) prefix = outer + own;
      else if (key.starts_with(own)) prefix = own;
      else return key;
      rest.remove_prefix(prefix.size());
    }
    auto m = regex.search_groups(rest);
    if (!m) return key;
    for (size_t i = 0; i < groups.size(); ++i) {
      if (!m->groups[static_cast<size_t>(groups[i])]) continue;
      std::string replacement;
      const std::string& target = targets[i];
      for (size_t p = 0; p < target.size(); ++p) {  // \N: group N counted from g<i>
        if (target[p] == '\\' && p + 1 < target.size() && target[p + 1] >= '0' && target[p + 1] <= '9') {
          size_t n = static_cast<size_t>(groups[i]) + static_cast<size_t>(target[++p] - '0');
          if (n < m->groups.size() && m->groups[n]) replacement += *m->groups[n];
        } else {
          replacement += target[p];
        }
      }
      const std::string& matched = *m->groups[0];  // str.replace(match, replacement, 1)
      std::string renamed(rest);
      renamed.replace(renamed.find(matched), matched.size(), replacement);
      return prefix + renamed;
    }
    return key;
  }
};

struct Chain {
  std::vector<Step> steps;
  bool supported = true;
  bool prefixes_only = true;  // every step is anchored at the start of the key (renames a leading path)
};

std::string text_of(const nlohmann::json& j, const char* field, const std::string& what) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) bad_step(what, std::string("\"") + field + "\" must be a string");
  return it->get<std::string>();
}

// An entry's "save" chain, or its "load" chain (`direction`).
std::shared_ptr<const Chain> compile_chain(const nlohmann::json& entry, const std::string& what,
                                           const char* direction = "save") {
  auto chain = std::make_shared<Chain>();
  auto save = entry.is_object() ? entry.find(direction) : entry.end();
  if (save == entry.end() || !save->is_array()) bad_step(what, std::string("\"") + direction + "\" must be a list");
  for (size_t s = 0; s < save->size(); ++s) {
    const nlohmann::json& j = (*save)[s];
    const std::string where = what + " " + direction + "[" + std::to_string(s) + "]";
    if (!j.is_object()) bad_step(where, "must be an object");
    if (j.contains("unsupported")) {
      chain->supported = false;
      return chain;
    }
    const std::string regex = text_of(j, "regex", where);
    chain->prefixes_only = chain->prefixes_only && regex.starts_with("(?P<g0>^");
    Step step{PythonRegex(regex, PEFT_ERR_INVALID_CONFIG, "transformers conversions, " + where),
              {}, {}, std::nullopt, "", text_of(j, "kind", where) == "PrefixChange"};
    auto targets = j.find("targets");
    if (targets == j.end() || !targets->is_array() || targets->empty())
      bad_step(where, "\"targets\" must be a non-empty list");
    for (size_t i = 0; i < targets->size(); ++i) {
      if (!(*targets)[i].is_string()) bad_step(where, "\"targets\" must hold strings");
      step.targets.push_back((*targets)[i].get<std::string>());
      int group = step.regex.group_number("g" + std::to_string(i));
      if (group < 0) bad_step(where, "the regex has no group g" + std::to_string(i));
      step.groups.push_back(group);
    }
    if (j.contains("scope")) {
      step.scope = text_of(j, "scope", where);
      step.base_model_prefix = text_of(j, "base_model_prefix", where);
    }
    chain->steps.push_back(std::move(step));
  }
  return chain;
}

std::optional<std::string> run(const Chain& chain, std::string_view key, bool with_prefix_changes) {
  if (!chain.supported) return std::nullopt;
  std::string out(key);
  for (const Step& step : chain.steps)
    if (with_prefix_changes || !step.prefix_change) out = step.apply(out);
  return out;
}

// A chain of some model, for conversion_renames.
struct NamedChain {
  std::string direction;             // "save" or "load"
  std::vector<std::string> models;   // the classes and model types that have it, in file order
  std::shared_ptr<const Chain> chain;
};

struct Data {
  bool loaded = false;
  nlohmann::json doc;  // null when the file is not installed
  std::map<std::string, std::shared_ptr<const Chain>> chains;  // by "composed/<type>/<class>", "models/<name>"
  std::optional<std::vector<NamedChain>> every_chain;  // every distinct save and load chain (conversion_renames)
};

// The data file, read once (callers hold the mutex).
std::mutex data_mutex;
Data& data_locked() {
  static Data data;
  if (data.loaded) return data;
  for (const std::string& dir : arch_table_search_dirs()) {
    fs::path path = fs::path(dir) / "conversions" / "transformers.json";
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;
    nlohmann::json doc = parse_json(read_text_file(path.string(), 64u << 20), PEFT_ERR_INVALID_CONFIG,
                                     "transformers conversions " + path.string());
    if (!doc.is_object() || !doc.contains("transformers_version") || !doc["transformers_version"].is_string())
      fail(PEFT_ERR_INVALID_CONFIG, peft::quoted(path.string()) + " is not a transformers conversions file");
    data.doc = std::move(doc);
    break;
  }
  data.loaded = true;
  return data;
}

// The chain of a base: its class's composed chain, else its class's or model_type's own entry.
std::shared_ptr<const Chain> chain_for(Data& data, const nlohmann::json& config) {
  if (!data.doc.is_object() || !config.is_object()) return nullptr;
  std::string type, architecture;
  if (auto t = config.find("model_type"); t != config.end() && t->is_string()) type = t->get<std::string>();
  if (auto a = config.find("architectures"); a != config.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    architecture = (*a)[0].get<std::string>();
  // transformers looks a class up before its model_type; "composed" is per model_type, then class.
  const std::vector<std::vector<std::string>> candidates = {
      {"composed", type, architecture}, {"models", architecture}, {"models", type}};
  for (const std::vector<std::string>& path : candidates) {
    const nlohmann::json* entry = &data.doc;
    std::string what;
    for (const std::string& step : path) {
      auto it = entry->is_object() && !step.empty() ? entry->find(step) : entry->end();
      if (it == entry->end()) {
        entry = nullptr;
        break;
      }
      entry = &*it;
      what += (what.empty() ? "" : "/") + step;
    }
    if (!entry) continue;
    auto& cached = data.chains[what];
    if (!cached) cached = compile_chain(*entry, what);
    return cached;
  }
  return nullptr;
}

// Every distinct save and load chain of the data that renames leading paths only (conversion_renames),
// in file order, compiled once.
const std::vector<NamedChain>& every_chain(Data& data) {
  if (data.every_chain) return *data.every_chain;
  std::vector<NamedChain> out;
  std::map<std::string, size_t> seen;  // a chain's direction and JSON text -> its index in `out`
  auto add = [&](const nlohmann::json& entry, const std::string& name, const std::string& what) {
    for (const char* direction : {"save", "load"}) {
      auto steps = entry.is_object() ? entry.find(direction) : entry.end();
      if (steps == entry.end() || !steps->is_array() || steps->empty()) continue;
      auto [it, added] = seen.emplace(std::string(direction) + steps->dump(), out.size());
      if (added) out.push_back({direction, {}, compile_chain(entry, what, direction)});
      out[it->second].models.push_back(name);
    }
  };
  if (data.doc.is_object()) {
    if (auto composed = data.doc.find("composed"); composed != data.doc.end() && composed->is_object())
      for (const auto& [type, classes] : composed->items())
        if (classes.is_object())
          for (const auto& [name, entry] : classes.items()) add(entry, name, "composed/" + type + "/" + name);
    if (auto models = data.doc.find("models"); models != data.doc.end() && models->is_object())
      for (const auto& [name, entry] : models->items()) add(entry, name, "models/" + name);
  }
  std::erase_if(out, [](const NamedChain& c) { return !c.chain->supported || !c.chain->prefixes_only; });
  data.every_chain = std::move(out);
  return *data.every_chain;
}

}  // namespace

std::vector<ConversionRename> conversion_renames(std::string_view key) {
  std::lock_guard lock(data_mutex);  // the chains are compiled on first use
  Data& data = data_locked();
  std::vector<ConversionRename> out;
  for (const NamedChain& c : every_chain(data)) {
    for (bool with_prefix_changes : {true, false}) {
      auto name = run(*c.chain, key, with_prefix_changes);
      if (!name || *name == key) continue;
      if (std::any_of(out.begin(), out.end(), [&](const ConversionRename& r) { return r.key == *name; })) continue;
      const size_t others = c.models.size() - 1;
      out.push_back({*name, "transformers " + data.doc["transformers_version"].get<std::string>() +
                                "'s checkpoint renames on " + c.direction + " of " + c.models.front() +
                                (others ? " (and " + std::to_string(others) + " more)" : "")});
    }
  }
  return out;
}

std::vector<std::string> saved_names(const nlohmann::json& config, std::string_view key) {
  std::shared_ptr<const Chain> chain;
  {
    std::lock_guard lock(data_mutex);
    chain = chain_for(data_locked(), config);
  }
  std::vector<std::string> names;
  if (!chain) return names;
  for (bool with_prefix_changes : {true, false}) {
    auto name = run(*chain, key, with_prefix_changes);
    if (name && *name != key && std::find(names.begin(), names.end(), *name) == names.end()) names.push_back(*name);
  }
  return names;
}

std::string conversions_transformers_version() {
  std::lock_guard lock(data_mutex);
  const Data& data = data_locked();
  return data.doc.is_object() ? data.doc["transformers_version"].get<std::string>() : std::string();
}

std::optional<std::string> apply_save_chain(const nlohmann::json& entry, std::string_view key, bool with_prefix_changes,
                                            const std::string& what) {
  return run(*compile_chain(entry, what), key, with_prefix_changes);
}

}  // namespace peft
