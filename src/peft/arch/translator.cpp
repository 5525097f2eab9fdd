#include "peft/arch/translator.hpp"

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/key_grammar.hpp"

namespace peft {
namespace {

std::string table_name(const ArchTable& table) {
  return "the " + peft::quoted(table.family()) + " translation table (" + table.source() + ")";
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

std::string Translator::to_native(std::string_view hf_key) const {
  auto out = table_->key_to_native(hf_key);
  if (!out) fail_unresolved({std::string(hf_key)}, table_name(*table_));
  return *out;
}

std::string Translator::to_hf(std::string_view native_key, bool with_peft_prefix) const {
  auto out = table_->key_to_hf(native_key, with_peft_prefix);
  if (!out) fail_unresolved({std::string(native_key)}, table_name(*table_));
  return *out;
}

std::vector<std::string> Translator::to_native(const std::vector<std::string>& hf_keys) const {
  std::vector<std::string> out, unresolved;
  out.reserve(hf_keys.size());
  for (const std::string& key : hf_keys) {
    auto native = table_->key_to_native(key);
    if (native) out.push_back(std::move(*native));
    else unresolved.push_back(key);
  }
  if (!unresolved.empty()) fail_unresolved(unresolved, table_name(*table_));
  return out;
}

std::vector<std::string> Translator::to_hf(const std::vector<std::string>& native_keys, bool with_peft_prefix) const {
  std::vector<std::string> out, unresolved;
  out.reserve(native_keys.size());
  for (const std::string& key : native_keys) {
    auto hf = table_->key_to_hf(key, with_peft_prefix);
    if (hf) out.push_back(std::move(*hf));
    else unresolved.push_back(key);
  }
  if (!unresolved.empty()) fail_unresolved(unresolved, table_name(*table_));
  return out;
}

}  // namespace peft
