#include "peft/export/adapter_export_versions.hpp"

#include <charconv>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "core/python_json.hpp"
#include "core/python_regex.hpp"
#include "core/text.hpp"
#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/module_matcher.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kOldestKnownMinor = 13;
constexpr int kNewestKnownMinor = 21;

// The release (0.minor) that introduced each field PEFT writes for LoRA (docs/peft-semantics.md,
// "Fields per PEFT release"; checked against the installed 0.21.2 for the newest ones). runtime_config is never written.
struct FieldSince {
  const char* name;
  int minor;
};
constexpr FieldSince kFields[] = {
    // PeftConfigMixin / PeftConfig
    {"task_type", 0}, {"peft_type", 0}, {"auto_mapping", 0}, {"base_model_name_or_path", 0}, {"revision", 0},
    {"inference_mode", 0},
    // LoraConfig as of 0.13
    {"r", 0}, {"target_modules", 0}, {"lora_alpha", 0}, {"lora_dropout", 0}, {"fan_in_fan_out", 0}, {"bias", 0},
    {"use_rslora", 0}, {"modules_to_save", 0}, {"init_lora_weights", 0}, {"layers_to_transform", 0},
    {"layers_pattern", 0}, {"rank_pattern", 0}, {"alpha_pattern", 0}, {"megatron_config", 0},
    {"megatron_core", 0}, {"loftq_config", 0}, {"use_dora", 0}, {"layer_replication", 0},
    // later releases
    {"exclude_modules", 14}, {"eva_config", 14}, {"lora_bias", 14},
    {"trainable_token_indices", 15}, {"corda_config", 15},
    {"use_qalora", 16}, {"qalora_group_size", 16},
    {"target_parameters", 17},
    {"alora_invocation_tokens", 18}, {"arrow_config", 18}, {"ensure_weight_tying", 18}, {"peft_version", 18},
    {"lora_ga_config", 19}, {"use_bdlora", 19},
    {"velora_config", 20}, {"monteclora_config", 20},
    {"kasa_config", 21},
};

std::optional<int> field_since(const std::string& name) {
  for (const FieldSince& f : kFields)
    if (name == f.name) return f.minor;
  return std::nullopt;
}

// Fields whose value never changes what a loaded adapter computes: settings of a fresh
// initialisation (the trained factors replace it), QALoRA's group size (only with use_qalora,
// which peft_c refuses) and the writer's version.
bool is_inert_field(const std::string& name) {
  return name == "eva_config" || name == "corda_config" || name == "lora_ga_config" || name == "qalora_group_size" ||
         name == "peft_version";
}

// A value that makes the field do nothing: null, false, or an empty string, list or object.
bool is_default_value(const Json& value) {
  if (value.is_null()) return true;
  if (value.is_boolean()) return !value.get<bool>();
  if (value.is_string()) return value.get_ref<const std::string&>().empty();
  if (value.is_array() || value.is_object()) return value.empty();
  return false;
}

// init_lora_weights values that only decide how fresh lora factors are drawn (PEFT's
// LoraLayer.update_layer): loading the adapter overwrites those factors, so `true` means the same.
bool init_is_factor_only(const Json& value) {
  if (value.is_boolean()) return !value.get<bool>();
  if (!value.is_string()) return false;
  const std::string v = value.get<std::string>();
  return v == "gaussian" || v == "eva" || v == "orthogonal" || ascii_lower(v) == "mica";
}

std::string version_name(int minor) { return "0." + std::to_string(minor); }

// Rank and alpha of one module under a release's get_pattern_key (keys in the file's order).
struct PatternRules {
  int minor;
  const LoraConfig& config;

  static bool old_match(const std::string& key, const std::string& module) {
    return PythonRegex(".*\\." + key + "$", PEFT_ERR_INVALID_CONFIG, "rank_pattern / alpha_pattern key " + peft::quoted(key))
        .match(module);
  }

  std::pair<int64_t, double> resolve(const std::string& module, const ModuleMatcher& current) const {
    if (minor >= 15) return {current.rank_for(module), current.alpha_for(module)};
    if (minor == 14) {
      int64_t r = config.r;
      double alpha = config.lora_alpha;
      for (const auto& [key, value] : config.rank_pattern)
        if (old_match(key, module)) {
          r = value;
          break;
        }
      for (const auto& [key, value] : config.alpha_pattern)
        if (old_match(key, module)) {
          alpha = value;
          break;
        }
      return {r, alpha};
    }
    // <= 0.13: the first key of rank_pattern + alpha_pattern that matches is looked up in both.
    std::optional<std::string> found;
    for (const auto& entry : config.rank_pattern)
      if (!found && old_match(entry.first, module)) found = entry.first;
    for (const auto& entry : config.alpha_pattern)
      if (!found && old_match(entry.first, module)) found = entry.first;
    int64_t r = config.r;
    double alpha = config.lora_alpha;
    if (found) {
      for (const auto& [key, value] : config.rank_pattern)
        if (key == *found) r = value;
      for (const auto& [key, value] : config.alpha_pattern)
        if (key == *found) alpha = value;
    }
    return {r, alpha};
  }
};

// The layer index a release reads from a module name for layers_to_transform, or nullopt.
std::optional<int64_t> layer_index(int minor, const LoraConfig& config, const std::string& module) {
  std::vector<std::string> patterns;
  if (config.layers_pattern.empty()) {
    patterns.push_back(minor <= 19 ? ".*\\.[^.]*\\.(\\d+)\\." : ".*?\\.[^.]*\\.(\\d+)\\.");
  } else {
    const char* lead = minor <= 19 ? ".*\\." : minor == 20 ? ".*?\\." : "(?:^|.*?\\.)";
    for (const std::string& p : config.layers_pattern) patterns.push_back(lead + p + "\\.(\\d+)\\.");
  }
  for (const std::string& pattern : patterns) {
    auto m = PythonRegex(pattern, PEFT_ERR_INVALID_CONFIG, "layers_pattern").match_groups(module);
    if (!m) continue;
    if (m->groups.size() < 2 || !m->groups[1]) return std::nullopt;
    int64_t value = 0;
    const std::string& digits = *m->groups[1];
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return value;
  }
  return std::nullopt;
}

bool exact_target(const LoraConfig& config, const std::string& module) {
  for (const std::string& name : config.target_modules.names)
    if (name == module) return true;
  return false;
}

std::string number_text(double value) { return python_float_repr(value); }

std::string pattern_reason(int minor) {
  std::string why = "the first matching key wins and the written file lists keys in sorted order";
  if (minor == 14) why += "; PEFT 0.14 matches a key k as re.match(\".*\\.k$\"), so a full module name never matches";
  if (minor <= 13)
    why += "; PEFT 0.13 matches a key k as re.match(\".*\\.k$\") over rank_pattern and alpha_pattern together "
           "and looks the first match up in both";
  return why;
}

// Every LoRA module must keep its targeting, rank and alpha under the target release's rules.
void check_modules(const Json& doc, std::span<const ExportedModule> modules, int minor, const std::string& what,
                   const std::string& for_whom) {
  const LoraConfig config = LoraConfig::parse(python_json_dumps(doc), what + " (exported config)");
  const ModuleMatcher matcher(config);
  const PatternRules rules{minor, config};
  const bool layer_filter = config.target_modules.kind == ModuleSelector::Kind::list && config.layers_to_transform &&
                            !config.layers_to_transform->empty();
  for (const ExportedModule& m : modules) {
    const ModuleMatcher::Verdict verdict = matcher.check(m.name);
    bool targeted = m.target_parameter || verdict == ModuleMatcher::Verdict::targeted ||
                    verdict == ModuleMatcher::Verdict::unknown;
    if (targeted && layer_filter && minor < kNewestKnownMinor && !exact_target(config, m.name)) {
      auto index = layer_index(minor, config, m.name);
      targeted = false;
      for (int64_t wanted : *config.layers_to_transform) targeted = targeted || (index && *index == wanted);
    }
    if (!targeted)
      fail(PEFT_ERR_UNSUPPORTED, what + ": " + for_whom + " would not put LoRA on module " + peft::quoted(m.name) +
                                     " (field \"layers_to_transform\" / \"layers_pattern\" / \"target_modules\" are "
                                     "read differently), so the adapter would change");
    auto [rank, alpha] = rules.resolve(m.name, matcher);
    if (rank != m.rank)
      fail(PEFT_ERR_UNSUPPORTED, what + ": field \"rank_pattern\": " + for_whom + " would give module " +
                                     peft::quoted(m.name) + " rank " + std::to_string(rank) + " instead of " +
                                     std::to_string(m.rank) + " (" + pattern_reason(minor) + ")");
    if (alpha != m.alpha)
      fail(PEFT_ERR_UNSUPPORTED, what + ": field \"alpha_pattern\": " + for_whom + " would give module " +
                                     peft::quoted(m.name) + " lora_alpha " + number_text(alpha) + " instead of " +
                                     number_text(m.alpha) + " (" + pattern_reason(minor) + ")");
  }
}

}  // namespace

PeftVersion parse_peft_version(std::string_view text) {
  PeftVersion v;
  v.text = std::string(text);
  int parts[3] = {0, 0, 0};
  size_t count = 0;
  size_t pos = 0;
  while (true) {
    size_t dot = text.find('.', pos);
    std::string_view part = text.substr(pos, dot == std::string_view::npos ? std::string_view::npos : dot - pos);
    int value = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos;
    if (!digits || count == 3 || ec != std::errc() || end != part.data() + part.size())
      fail(PEFT_ERR_INVALID_ARGUMENT,
           "PEFT version " + peft::quoted(v.text) + " is not of the form X.Y or X.Y.Z (e.g. \"0.13\")");
    parts[count++] = value;
    if (dot == std::string_view::npos) break;
    pos = dot + 1;
  }
  if (count < 2)
    fail(PEFT_ERR_INVALID_ARGUMENT, "PEFT version " + peft::quoted(v.text) + " is not of the form X.Y or X.Y.Z (e.g. \"0.13\")");
  v.major = parts[0];
  v.minor = parts[1];
  if (v.major == 0 && v.minor < kOldestKnownMinor)
    fail(PEFT_ERR_UNSUPPORTED, "PEFT version " + peft::quoted(v.text) + ": the config fields of PEFT before 0." +
                                   std::to_string(kOldestKnownMinor) + " are not known to peft_c");
  return v;
}

nlohmann::ordered_json export_config(const nlohmann::ordered_json& source, std::span<const ExportedModule> modules,
                                     const std::optional<PeftVersion>& target, const std::string& what) {
  if (!source.is_object()) fail(PEFT_ERR_INVALID_CONFIG, what + ": the config is not a JSON object");
  Json doc = source;
  doc.erase("runtime_config");
  doc["peft_type"] = "LORA";
  doc["inference_mode"] = true;
  if (auto it = doc.find("init_lora_weights"); it != doc.end() && init_is_factor_only(*it)) *it = true;

  int minor = kNewestKnownMinor;
  std::string for_whom = "PEFT";
  if (target) {
    minor = target->major > 0 ? kNewestKnownMinor : std::min(target->minor, kNewestKnownMinor);
    for_whom = "PEFT " + target->text;
    Json kept = Json::object();
    for (const auto& [key, value] : doc.items()) {
      std::optional<int> since = field_since(key);
      if (since && *since <= minor) {
        kept[key] = value;
        continue;
      }
      // A field this release does not know: an unknown one means nothing to PEFT <= 0.21 either.
      if (since && !is_inert_field(key) && !is_default_value(value))
        fail(PEFT_ERR_UNSUPPORTED, what + ": field " + peft::quoted(key) + " is " + value.dump() + ", but " + for_whom +
                                       " does not know it (added in " + version_name(*since) +
                                       "); leaving it out would change the adapter");
    }
    doc = std::move(kept);
  }
  check_modules(doc, modules, minor, what, for_whom);
  return doc;
}

}  // namespace peft
