#include "peft/arch/translator.hpp"

#include <optional>
#include <utility>

#include "core/error.hpp"
#include "core/error_context.hpp"
#include "core/text.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/gguf_experts.hpp"
#include "peft/arch/key_grammar.hpp"

namespace peft {
namespace {

std::string table_name(const ArchTable& table, bool gguf) {
  return "the " + peft::quoted(table.family()) + " translation table (" + table.source() + ")" +
         (gguf ? " for GGUF names" : "");
}

// The roles a GGUF model file names: "<module>.weight" and "<module>.bias".
constexpr std::string_view kGgufRoles[] = {"weight", "bias"};

// Splits "<module>.<role>" for a GGUF role; nullopt for another tail.
std::optional<std::pair<std::string_view, std::string_view>> split_gguf_role(std::string_view key) {
  for (std::string_view role : kGgufRoles)
    if (key.size() > role.size() + 1 && key.ends_with(role) && key[key.size() - role.size() - 1] == '.')
      return std::pair{key.substr(0, key.size() - role.size() - 1), role};
  return std::nullopt;
}

}  // namespace

bool has_peft_prefix(std::string_view key) { return key.starts_with(kPeftPrefix); }

void fail_unresolved(const std::vector<std::string>& keys, const std::string& what) {
  std::string message = std::to_string(keys.size()) + (keys.size() == 1 ? " key" : " keys") +
                        " cannot be translated by " + what + ": ";
  for (size_t i = 0; i < keys.size(); ++i) message += (i ? ", " : "") + peft::quoted(keys[i]);
  fail(PEFT_ERR_UNRESOLVED_KEY, message);
}

Translator Translator::for_family(const std::string& family) { return Translator(builtin_arch_table(family)); }

Translator Translator::from_file(const std::string& path) { return Translator(ArchTable::from_file(path)); }

Translator Translator::from_json(std::string_view json_text) {
  return Translator(ArchTable::parse(json_text, "<json string>"));
}

Translator Translator::for_gguf(const std::string& architecture, GgufHeads heads) {
  return Translator(builtin_table_for_gguf(architecture), GgufNames{architecture, heads});
}

Translator Translator::for_gguf_file(const GgufHeader& header, const std::string& file) {
  const std::optional<std::string> architecture = metadata_string(header, "general.architecture");
  if (!architecture) fail(PEFT_ERR_INVALID_CHECKPOINT, file + ": the GGUF file has no string general.architecture");
  return with_path(file, [&] {
    const GgufHeads heads = gguf_heads_from_metadata(header, *architecture);
    const std::optional<uint64_t> experts = gguf_experts_from_metadata(header, *architecture);
    if (!experts || *experts == 0) return for_gguf(*architecture, heads);
    // Several tables read one architecture (llama, mistral and mixtral: "llama"); a file with
    // experts takes the one that names llama.cpp's stacked expert tensors.
    auto names_experts = [](const ArchTable& table) { return table.rule_for_gguf("blk.0.ffn_gate_exps") != nullptr; };
    return Translator(builtin_table_for_gguf(*architecture, names_experts), GgufNames{*architecture, heads});
  });
}

std::optional<Translator::GgufModule> Translator::gguf_module(std::string_view name) const {
  if (!gguf_) return std::nullopt;
  constexpr std::string_view kWeight = ".weight";
  const std::string_view module = name.ends_with(kWeight) ? name.substr(0, name.size() - kWeight.size()) : name;
  for (std::string_view candidate : {name, module}) {
    NameTemplate::Captures captures;
    if (const ModuleRule* rule = table_->rule_for_gguf(candidate, &captures))
      return GgufModule{rule->hf.fill(captures), rule->gguf_rows};
  }
  return std::nullopt;
}

std::vector<std::string> Translator::gguf_slice_modules(std::string_view name, uint64_t slices) const {
  if (!gguf_) return {};
  constexpr std::string_view kWeight = ".weight";
  const std::string_view module = name.ends_with(kWeight) ? name.substr(0, name.size() - kWeight.size()) : name;
  NameTemplate::Captures captures;
  const ModuleRule* rule = table_->rule_for_gguf(module, &captures);
  if (rule == nullptr || !rule->gguf_stack) return {};
  std::vector<std::string> out;
  for (uint64_t slice = 0; slice < slices; ++slice) out.push_back(gguf_stacked_module(*rule, captures, slice));
  return out;
}

std::optional<std::string> Translator::gguf_key(std::string_view hf_key) const {
  if (hf_key.starts_with(kPeftPrefix)) hf_key.remove_prefix(kPeftPrefix.size());
  const auto split = split_gguf_role(hf_key);
  if (!split) return std::nullopt;
  const auto module = table_->module_to_gguf(split->first);
  if (!module) return std::nullopt;
  return *module + "." + std::string(split->second);
}

std::optional<std::string> Translator::hf_key_of_gguf(std::string_view gguf_key, bool with_peft_prefix) const {
  const auto split = split_gguf_role(gguf_key);
  if (!split) return std::nullopt;
  const auto module = table_->module_from_gguf(split->first);
  if (!module) return std::nullopt;
  return (with_peft_prefix ? std::string(kPeftPrefix) : std::string()) + *module + "." + std::string(split->second);
}

std::optional<std::string> Translator::key_to_native(std::string_view hf_key) const {
  return gguf_ ? gguf_key(hf_key) : table_->key_to_native(hf_key);
}

std::optional<std::string> Translator::key_to_hf(std::string_view native_key, bool with_peft_prefix) const {
  return gguf_ ? hf_key_of_gguf(native_key, with_peft_prefix) : table_->key_to_hf(native_key, with_peft_prefix);
}

std::string Translator::to_native(std::string_view hf_key) const {
  auto out = key_to_native(hf_key);
  if (!out) fail_unresolved({std::string(hf_key)}, table_name(*table_, gguf_.has_value()));
  return *out;
}

std::string Translator::to_hf(std::string_view native_key, bool with_peft_prefix) const {
  auto out = key_to_hf(native_key, with_peft_prefix);
  if (!out) fail_unresolved({std::string(native_key)}, table_name(*table_, gguf_.has_value()));
  return *out;
}

std::vector<std::string> Translator::to_native(const std::vector<std::string>& hf_keys) const {
  std::vector<std::string> out, unresolved;
  out.reserve(hf_keys.size());
  for (const std::string& key : hf_keys) {
    auto native = key_to_native(key);
    if (native) out.push_back(std::move(*native));
    else unresolved.push_back(key);
  }
  if (!unresolved.empty()) fail_unresolved(unresolved, table_name(*table_, gguf_.has_value()));
  return out;
}

std::vector<std::string> Translator::to_hf(const std::vector<std::string>& native_keys, bool with_peft_prefix) const {
  std::vector<std::string> out, unresolved;
  out.reserve(native_keys.size());
  for (const std::string& key : native_keys) {
    auto hf = key_to_hf(key, with_peft_prefix);
    if (hf) out.push_back(std::move(*hf));
    else unresolved.push_back(key);
  }
  if (!unresolved.empty()) fail_unresolved(unresolved, table_name(*table_, gguf_.has_value()));
  return out;
}

}  // namespace peft
