#include "peft/arch/arch_table.hpp"

#include <algorithm>
#include <set>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"
#include "peft/arch/key_grammar.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;
constexpr uint64_t kMaxTableBytes = 16ull << 20;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

[[noreturn]] void bad_table(const std::string& source, const std::string& what) {
  fail(PEFT_ERR_INVALID_CONFIG, "translation table " + source + ": " + what);
}

std::optional<ModuleKind> kind_from_name(std::string_view name) {
  if (name == "linear") return ModuleKind::linear;
  if (name == "conv1d") return ModuleKind::conv1d;
  if (name == "embedding") return ModuleKind::embedding;
  if (name == "conv2d") return ModuleKind::conv2d;
  if (name == "norm") return ModuleKind::norm;
  if (name == "other") return ModuleKind::other;
  return std::nullopt;
}

std::vector<std::string> string_list(const Json& v, const std::string& source, const std::string& field) {
  if (!v.is_array()) bad_table(source, peft::quoted(field) + " must be a list of strings");
  std::vector<std::string> out;
  for (const Json& item : v) {
    if (!item.is_string()) bad_table(source, peft::quoted(field) + " must be a list of strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::string required_string(const Json& obj, const char* field, const std::string& source, const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end() || !it->is_string() || it->get<std::string>().empty())
    bad_table(source, where + ": " + peft::quoted(field) + " must be a non-empty string");
  return it->get<std::string>();
}

std::vector<RoleRule> parse_roles(const Json& v, const std::string& source, const std::string& field) {
  if (!v.is_array()) bad_table(source, peft::quoted(field) + " must be a list of {\"hf\", \"native\"} objects");
  std::vector<RoleRule> out;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string where = field + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) bad_table(source, where + " must be an object");
    RoleRule r{required_string(v[i], "hf", source, where), required_string(v[i], "native", source, where)};
    if (r.hf.front() == '.' || r.hf.back() == '.' || r.hf.find("..") != std::string::npos)
      bad_table(source, where + ": hf role " + peft::quoted(r.hf) + " has an empty segment");
    if (r.native.find('/') != std::string::npos)
      bad_table(source, where + ": native role " + peft::quoted(r.native) + " must be one segment (no '/')");
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

const char* module_kind_name(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::linear: return "linear";
    case ModuleKind::conv1d: return "conv1d";
    case ModuleKind::embedding: return "embedding";
    case ModuleKind::conv2d: return "conv2d";
    case ModuleKind::norm: return "norm";
    case ModuleKind::other: return "other";
  }
  return "other";
}

const std::vector<RoleRule>& default_roles() {
  static const std::vector<RoleRule> roles = {
      {"lora_A.weight", "lora_a"},
      {"lora_B.weight", "lora_b"},
      {"lora_B.bias", "lora_b_bias"},
      {"lora_embedding_A", "lora_embedding_a"},
      {"lora_embedding_B", "lora_embedding_b"},
      {"lora_magnitude_vector", "lora_magnitude"},
      {"token_adapter.trainable_tokens_delta", "trainable_tokens_delta"},
      {"base_layer.weight", "base_layer_weight"},
      {"base_layer.bias", "base_layer_bias"},
      {"weight", "weight"},
      {"bias", "bias"},
  };
  return roles;
}

// ---- NameTemplate ---------------------------------------------------------------------------------

NameTemplate NameTemplate::parse(std::string_view text, const std::string& what) {
  NameTemplate t;
  t.text_ = std::string(text);
  auto bad = [&](const std::string& why) {
    fail(PEFT_ERR_INVALID_CONFIG, what + ": template " + peft::quoted(t.text_) + " " + why);
  };
  if (text.empty()) bad("is empty");
  std::set<std::string> seen;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '{') {
      size_t close = text.find('}', i);
      if (close == std::string_view::npos) bad("has an unclosed '{'");
      std::string name(text.substr(i + 1, close - i - 1));
      bool ok = !name.empty() && !is_digit(name[0]);
      for (char c : name) ok = ok && is_ident_char(c);
      if (!ok) bad("has a bad placeholder name " + peft::quoted(name));
      if (!seen.insert(name).second) bad("uses {" + name + "} twice");
      if (!t.tokens_.empty() && t.tokens_.back().placeholder) bad("has two placeholders in a row");
      t.tokens_.push_back({true, name});
      i = close + 1;
      continue;
    }
    if (text[i] == '}') bad("has a '}' without '{'");
    size_t next = text.find_first_of("{}", i);
    std::string literal(text.substr(i, next == std::string_view::npos ? std::string_view::npos : next - i));
    // A placeholder matches a maximal run of digits, so the literal after it must not start with one.
    if (!t.tokens_.empty() && t.tokens_.back().placeholder && is_digit(literal[0]))
      bad("has a digit right after a placeholder");
    t.tokens_.push_back({false, literal});
    i += literal.size();
  }
  return t;
}

bool NameTemplate::match(std::string_view text, Captures& captures) const {
  captures.clear();
  size_t pos = 0;
  for (const Token& token : tokens_) {
    if (!token.placeholder) {
      if (text.substr(pos, token.text.size()) != token.text) return false;
      pos += token.text.size();
      continue;
    }
    size_t end = pos;
    while (end < text.size() && is_digit(text[end])) ++end;
    if (end == pos) return false;
    captures.emplace_back(token.text, std::string(text.substr(pos, end - pos)));
    pos = end;
  }
  return pos == text.size();
}

std::string NameTemplate::fill(const Captures& captures) const {
  std::string out;
  for (const Token& token : tokens_) {
    if (!token.placeholder) {
      out += token.text;
      continue;
    }
    for (const auto& [name, value] : captures)
      if (name == token.text) out += value;
  }
  return out;
}

std::vector<std::string> NameTemplate::placeholder_names() const {
  std::vector<std::string> out;
  for (const Token& token : tokens_)
    if (token.placeholder) out.push_back(token.text);
  return out;
}

// ---- ArchTable ------------------------------------------------------------------------------------

std::shared_ptr<const ArchTable> ArchTable::from_file(const std::string& path) {
  return parse(read_text_file(path, kMaxTableBytes), path);
}

std::shared_ptr<const ArchTable> ArchTable::parse(std::string_view json_text, const std::string& source) {
  const Json doc = parse_json_ordered(json_text, PEFT_ERR_INVALID_CONFIG, "translation table " + source);
  if (!doc.is_object()) bad_table(source, "must be a JSON object");
  static const std::set<std::string> known = {
      "format", "version", "family", "description", "detect", "base_model_prefix", "output_embedding",
      "input_embeddings", "tie_embeddings_config",
      "peft_default_target_modules", "modules", "roles", "extra_roles", "checkpoint_aliases",
      "gguf_architectures", "gguf_output_always_tied", "experts"};
  for (const auto& [key, value] : doc.items())
    if (!known.contains(key) && !key.starts_with("_"))
      bad_table(source, "unknown field " + peft::quoted(key) + " (fields starting with '_' are free for comments)");
  if (doc.contains("format") && doc["format"] != "peft_c/arch-table")
    bad_table(source, "\"format\" must be \"peft_c/arch-table\"");
  if (doc.contains("version") && doc["version"] != 1)
    bad_table(source, "\"version\" " + doc["version"].dump() + " is not supported (this library reads 1)");

  auto table = std::make_shared<ArchTable>();
  table->source_ = source;
  table->family_ = required_string(doc, "family", source, "table");
  if (auto it = doc.find("base_model_prefix"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) bad_table(source, "\"base_model_prefix\" must be a string or null");
    table->base_model_prefix_ = it->get<std::string>();
  }
  if (auto it = doc.find("gguf_architectures"); it != doc.end()) {
    if (!it->is_object()) bad_table(source, "\"gguf_architectures\" must be {gguf_architecture: [model_types]}");
    for (const auto& [key, value] : it->items())
      table->gguf_architectures_[key] = string_list(value, source, "gguf_architectures." + key);
  }
  if (auto it = doc.find("gguf_output_always_tied"); it != doc.end()) {
    table->gguf_output_always_tied_ = string_list(*it, source, "gguf_output_always_tied");
    for (const std::string& architecture : table->gguf_output_always_tied_)
      if (!table->gguf_architectures_.contains(architecture))
        bad_table(source, "\"gguf_output_always_tied\" names " + peft::quoted(architecture) +
                              ", which is not one of its gguf_architectures");
  }
  if (auto it = doc.find("output_embedding"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) bad_table(source, "\"output_embedding\" must be a string or null");
    table->output_embedding_ = it->get<std::string>();
  }
  if (auto it = doc.find("input_embeddings"); it != doc.end())
    table->input_embeddings_ = string_list(*it, source, "input_embeddings");
  if (auto it = doc.find("tie_embeddings_config"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) bad_table(source, "\"tie_embeddings_config\" must be a string or null");
    table->tie_embeddings_config_ = it->get<std::string>();
  }
  if (auto it = doc.find("detect"); it != doc.end()) {
    if (!it->is_object()) bad_table(source, "\"detect\" must be an object");
    for (const auto& [key, value] : it->items()) {
      if (key == "model_types") table->model_types_ = string_list(value, source, "detect.model_types");
      else if (key == "architectures") table->architectures_ = string_list(value, source, "detect.architectures");
      else if (key == "name_patterns") table->name_patterns_ = string_list(value, source, "detect.name_patterns");
      else bad_table(source, "unknown field " + peft::quoted("detect." + key));
    }
  }
  if (auto it = doc.find("peft_default_target_modules"); it != doc.end()) {
    if (!it->is_object()) bad_table(source, "\"peft_default_target_modules\" must be {model_type: [names]}");
    for (const auto& [key, value] : it->items())
      table->default_targets_[key] = string_list(value, source, "peft_default_target_modules." + key);
  }

  table->roles_ = doc.contains("roles") ? parse_roles(doc["roles"], source, "roles") : default_roles();
  if (doc.contains("extra_roles")) {
    for (RoleRule& r : parse_roles(doc["extra_roles"], source, "extra_roles")) table->roles_.push_back(std::move(r));
  }
  std::set<std::string> hf_roles, native_roles;
  for (const RoleRule& r : table->roles_) {
    if (!hf_roles.insert(r.hf).second) bad_table(source, "role " + peft::quoted(r.hf) + " is listed twice");
    if (!native_roles.insert(r.native).second)
      bad_table(source, "native role " + peft::quoted(r.native) + " is listed twice");
  }
  for (size_t i = 0; i < table->roles_.size(); ++i) table->roles_by_hf_length_.push_back(i);
  std::stable_sort(table->roles_by_hf_length_.begin(), table->roles_by_hf_length_.end(), [&](size_t a, size_t b) {
    return table->roles_[a].hf.size() > table->roles_[b].hf.size();
  });

  auto modules = doc.find("modules");
  if (modules == doc.end() || !modules->is_array())
    bad_table(source, "\"modules\" must be a list of {\"hf\", \"native\", \"kind\"} rules");
  for (size_t i = 0; i < modules->size(); ++i) {
    const Json& rule = (*modules)[i];
    std::string where = source + " modules[" + std::to_string(i) + "]";
    if (!rule.is_object()) bad_table(source, "modules[" + std::to_string(i) + "] must be an object");
    for (const auto& [key, value] : rule.items())
      if (key != "hf" && key != "native" && key != "kind" && key != "gguf" && key != "gguf_rows" &&
          key != "gguf_stack" && !key.starts_with("_"))
        bad_table(source, "modules[" + std::to_string(i) + "] has an unknown field " + peft::quoted(key));
    ModuleRule m{NameTemplate::parse(required_string(rule, "hf", source, where), where),
                 NameTemplate::parse(required_string(rule, "native", source, where), where), ModuleKind::other,
                 std::nullopt, GgufRows::same, std::nullopt};
    if (auto kind = rule.find("kind"); kind != rule.end()) {
      auto parsed = kind->is_string() ? kind_from_name(kind->get<std::string>()) : std::nullopt;
      if (!parsed)
        bad_table(source, "modules[" + std::to_string(i) +
                              "]: \"kind\" must be linear, conv1d, embedding, conv2d, norm or other");
      m.kind = *parsed;
    }
    if (auto gguf = rule.find("gguf"); gguf != rule.end()) {
      if (!gguf->is_string() || gguf->get<std::string>().empty())
        bad_table(source, "modules[" + std::to_string(i) + "]: \"gguf\" must be a non-empty string");
      m.gguf = NameTemplate::parse(gguf->get<std::string>(), where);
    }
    if (auto rows = rule.find("gguf_rows"); rows != rule.end()) {
      const std::string text = rows->is_string() ? rows->get<std::string>() : "";
      if (text == "rope_q") m.gguf_rows = GgufRows::rope_q;
      else if (text == "rope_k") m.gguf_rows = GgufRows::rope_k;
      else if (text == "qkv_per_head") m.gguf_rows = GgufRows::qkv_per_head;
      else if (text == "qkv_per_kv_group") m.gguf_rows = GgufRows::qkv_per_kv_group;
      else if (text != "same")
        bad_table(source, "modules[" + std::to_string(i) +
                              "]: \"gguf_rows\" must be same, rope_q, rope_k, qkv_per_head or qkv_per_kv_group");
      if (!m.gguf) bad_table(source, "modules[" + std::to_string(i) + "]: \"gguf_rows\" needs \"gguf\"");
    }
    auto hf_names = m.hf.placeholder_names(), native_names = m.native.placeholder_names();
    std::sort(hf_names.begin(), hf_names.end());
    std::sort(native_names.begin(), native_names.end());
    if (hf_names != native_names)
      bad_table(source, "modules[" + std::to_string(i) + "]: " + peft::quoted(m.hf.text()) + " and " +
                            peft::quoted(m.native.text()) + " must use the same placeholders");
    if (auto stack = rule.find("gguf_stack"); stack != rule.end()) {
      const std::string text = stack->is_string() ? stack->get<std::string>() : "";
      if (!m.gguf || std::find(hf_names.begin(), hf_names.end(), text) == hf_names.end())
        bad_table(source, "modules[" + std::to_string(i) + "]: \"gguf_stack\" must name a placeholder of " +
                              peft::quoted(m.hf.text()) + " and needs \"gguf\"");
      if (m.gguf_rows != GgufRows::same)
        bad_table(source, "modules[" + std::to_string(i) + "]: \"gguf_stack\" and \"gguf_rows\" do not combine");
      m.gguf_stack = text;
    }
    if (m.gguf) {
      auto gguf_names = m.gguf->placeholder_names();
      if (m.gguf_stack) gguf_names.push_back(*m.gguf_stack);  // the slice index, not in the tensor name
      std::sort(gguf_names.begin(), gguf_names.end());
      if (gguf_names != hf_names)
        bad_table(source, "modules[" + std::to_string(i) + "]: " + peft::quoted(m.hf.text()) + " and " +
                              peft::quoted(m.gguf->text()) + " must use the same placeholders");
    }
    const std::string& h = m.hf.text();
    const std::string& n = m.native.text();
    if (h.front() == '.' || h.back() == '.' || h.find("..") != std::string::npos)
      bad_table(source, "modules[" + std::to_string(i) + "]: " + peft::quoted(h) + " has an empty segment");
    if (n.front() == '/' || n.back() == '/' || n.find("//") != std::string::npos)
      bad_table(source, "modules[" + std::to_string(i) + "]: " + peft::quoted(n) + " has an empty segment");
    table->modules_.push_back(std::move(m));
  }
  if (auto aliases = doc.find("checkpoint_aliases"); aliases != doc.end()) {
    if (!aliases->is_array()) bad_table(source, "\"checkpoint_aliases\" must be a list of {\"module\", \"checkpoint\"}");
    for (size_t i = 0; i < aliases->size(); ++i) {
      const Json& alias = (*aliases)[i];
      std::string where = source + " checkpoint_aliases[" + std::to_string(i) + "]";
      if (!alias.is_object()) bad_table(source, "checkpoint_aliases[" + std::to_string(i) + "] must be an object");
      NameTemplate module = NameTemplate::parse(required_string(alias, "module", source, where), where);
      NameTemplate checkpoint = NameTemplate::parse(required_string(alias, "checkpoint", source, where), where);
      auto a = module.placeholder_names(), b = checkpoint.placeholder_names();
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b) bad_table(source, "checkpoint_aliases[" + std::to_string(i) + "] must use the same placeholders on both sides");
      table->aliases_.emplace_back(std::move(module), std::move(checkpoint));
    }
  }
  if (auto it = doc.find("experts"); it != doc.end()) table->experts_ = nlohmann::json::parse(it->dump());  // arch/expert_params
  table->check_round_trips();
  return table;
}

void ArchTable::check_round_trips() const {
  for (size_t i = 0; i < modules_.size(); ++i) {
    for (const char* value : {"0", "12"}) {
      NameTemplate::Captures captures;
      for (const std::string& name : modules_[i].hf.placeholder_names()) captures.emplace_back(name, value);
      std::string hf = modules_[i].hf.fill(captures);
      std::string native = modules_[i].native.fill(captures);
      const ModuleRule* forward = rule_for_hf(hf);
      const ModuleRule* backward = rule_for_native(native);
      auto index = [&](const ModuleRule* r) { return std::to_string(r - modules_.data()); };
      if (forward != &modules_[i])
        bad_table(source_, "modules[" + std::to_string(i) + "] is shadowed by modules[" + index(forward) +
                               "]: both match " + peft::quoted(hf));
      if (backward != &modules_[i])
        bad_table(source_, "modules[" + std::to_string(i) + "] is shadowed by modules[" + index(backward) +
                               "]: both match " + peft::quoted(native));
      if (modules_[i].gguf) {
        const std::string gguf = modules_[i].gguf->fill(captures);
        const ModuleRule* from_gguf = rule_for_gguf(gguf);
        if (from_gguf != &modules_[i])
          bad_table(source_, "modules[" + std::to_string(i) + "] is shadowed by modules[" + index(from_gguf) +
                                 "]: both match " + peft::quoted(gguf));
      }
    }
  }
}

std::vector<std::string> ArchTable::aliases_of(std::string_view module) const {
  std::vector<std::string> out;
  NameTemplate::Captures captures;
  for (const auto& [in_memory, checkpoint] : aliases_) {
    if (in_memory.match(module, captures)) out.push_back(checkpoint.fill(captures));
    if (checkpoint.match(module, captures)) out.push_back(in_memory.fill(captures));
  }
  return out;
}

const std::vector<std::string>* ArchTable::default_targets(const std::string& model_type) const {
  auto it = default_targets_.find(model_type);
  return it == default_targets_.end() ? nullptr : &it->second;
}

namespace {

// The first rule whose `side` (hf or native) template matches `module`.
const ModuleRule* first_match(const std::vector<ModuleRule>& rules, NameTemplate ModuleRule::*side,
                              std::string_view module, NameTemplate::Captures* captures) {
  NameTemplate::Captures local;
  for (const ModuleRule& rule : rules) {
    if ((rule.*side).match(module, local)) {
      if (captures) *captures = std::move(local);
      return &rule;
    }
  }
  return nullptr;
}

}  // namespace

const ModuleRule* ArchTable::rule_for_hf(std::string_view hf_module, NameTemplate::Captures* captures) const {
  return first_match(modules_, &ModuleRule::hf, hf_module, captures);
}

const ModuleRule* ArchTable::rule_for_module(std::string_view module) const {
  const ModuleRule* rule = rule_for_hf(module);
  if (!rule && !base_model_prefix().empty()) rule = rule_for_hf(base_model_prefix() + "." + std::string(module));
  return rule;
}

const ModuleRule* ArchTable::rule_for_gguf(std::string_view gguf_module, NameTemplate::Captures* captures) const {
  NameTemplate::Captures local;
  for (const ModuleRule& rule : modules_) {
    if (rule.gguf && rule.gguf->match(gguf_module, local)) {
      if (captures) *captures = std::move(local);
      return &rule;
    }
  }
  return nullptr;
}

bool ArchTable::reads_gguf_architecture(std::string_view architecture) const {
  return gguf_architectures_.find(std::string(architecture)) != gguf_architectures_.end();
}

bool ArchTable::gguf_output_always_tied(std::string_view architecture) const {
  return std::find(gguf_output_always_tied_.begin(), gguf_output_always_tied_.end(), architecture) !=
         gguf_output_always_tied_.end();
}

std::optional<std::string> ArchTable::gguf_architecture_of(std::string_view model_type) const {
  for (const auto& [architecture, model_types] : gguf_architectures_)
    if (std::find(model_types.begin(), model_types.end(), model_type) != model_types.end()) return architecture;
  return std::nullopt;
}

std::optional<std::string> ArchTable::module_to_gguf(std::string_view hf_module) const {
  NameTemplate::Captures captures;
  const ModuleRule* rule = rule_for_hf(hf_module, &captures);
  if (!rule || !rule->gguf) return std::nullopt;
  return rule->gguf->fill(captures);
}

std::optional<std::string> ArchTable::module_from_gguf(std::string_view gguf_module) const {
  NameTemplate::Captures captures;
  const ModuleRule* rule = rule_for_gguf(gguf_module, &captures);
  if (!rule || rule->gguf_stack) return std::nullopt;  // a stacked tensor holds several modules
  return rule->hf.fill(captures);
}

const ModuleRule* ArchTable::rule_for_native(std::string_view native_module, NameTemplate::Captures* captures) const {
  return first_match(modules_, &ModuleRule::native, native_module, captures);
}

std::optional<std::string> ArchTable::module_to_native(std::string_view hf_module) const {
  NameTemplate::Captures captures;
  const ModuleRule* rule = rule_for_hf(hf_module, &captures);
  if (!rule) return std::nullopt;
  return rule->native.fill(captures);
}

std::optional<std::string> ArchTable::module_to_hf(std::string_view native_module) const {
  NameTemplate::Captures captures;
  const ModuleRule* rule = rule_for_native(native_module, &captures);
  if (!rule) return std::nullopt;
  return rule->hf.fill(captures);
}

std::optional<std::string> ArchTable::key_to_native(std::string_view hf_key) const {
  if (hf_key.starts_with(kPeftPrefix)) hf_key.remove_prefix(kPeftPrefix.size());
  // The longest role that ends the key decides; the module path is what precedes it.
  for (size_t index : roles_by_hf_length_) {
    const RoleRule& role = roles_[index];
    if (hf_key.size() < role.hf.size() + 2 || !hf_key.ends_with(role.hf) ||
        hf_key[hf_key.size() - role.hf.size() - 1] != '.')
      continue;
    auto module = module_to_native(hf_key.substr(0, hf_key.size() - role.hf.size() - 1));
    if (!module) return std::nullopt;
    return *module + "/" + role.native;
  }
  return std::nullopt;
}

std::optional<std::string> ArchTable::key_to_hf(std::string_view native_key, bool with_peft_prefix) const {
  size_t slash = native_key.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return std::nullopt;
  std::string_view role_name = native_key.substr(slash + 1);
  for (const RoleRule& role : roles_) {
    if (role.native != role_name) continue;
    auto module = module_to_hf(native_key.substr(0, slash));
    if (!module) return std::nullopt;
    return (with_peft_prefix ? std::string(kPeftPrefix) : std::string()) + *module + "." + role.hf;
  }
  return std::nullopt;
}

}  // namespace peft
