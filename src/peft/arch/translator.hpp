// Translation of tensor keys between HuggingFace names and a host's native names, backed by an
// ArchTable. A key no rule resolves is an error (PEFT_ERR_UNRESOLVED_KEY) that lists every
// unresolved key of the batch, never a silent pass-through.
//
//   HF:     [base_model.model.]model.layers.4.self_attn.q_proj.lora_A.weight
//   native: transformer/layer_4/attention/query/lora_a
//
// Native names never carry PEFT's "base_model.model." prefix; the reverse direction adds it on
// request, so to_hf(to_native(k), has_peft_prefix(k)) == k for every key the table resolves.
// A Translator is immutable; every method may be called from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "peft/arch/arch_table.hpp"

namespace peft {

class Translator {
 public:
  explicit Translator(std::shared_ptr<const ArchTable> table) : table_(std::move(table)) {}

  static Translator for_family(const std::string& family);  // a built-in table
  static Translator from_file(const std::string& path);
  static Translator from_json(std::string_view json_text);

  const ArchTable& table() const { return *table_; }
  const std::shared_ptr<const ArchTable>& table_ptr() const { return table_; }

  // One key; PEFT_ERR_UNRESOLVED_KEY naming it when the table does not resolve it.
  std::string to_native(std::string_view hf_key) const;
  std::string to_hf(std::string_view native_key, bool with_peft_prefix) const;

  // Many keys, in order; PEFT_ERR_UNRESOLVED_KEY listing every key that does not resolve.
  std::vector<std::string> to_native(const std::vector<std::string>& hf_keys) const;
  std::vector<std::string> to_hf(const std::vector<std::string>& native_keys, bool with_peft_prefix) const;

 private:
  std::shared_ptr<const ArchTable> table_;
};

bool has_peft_prefix(std::string_view key);

// "N keys cannot be translated by <what>: "a", "b", ..." (every key listed).
[[noreturn]] void fail_unresolved(const std::vector<std::string>& keys, const std::string& what);

}  // namespace peft
