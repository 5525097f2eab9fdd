// Translation of tensor keys between HuggingFace names and a host's native names, backed by an
// ArchTable. A key no rule resolves is an error (PEFT_ERR_UNRESOLVED_KEY) that lists every
// unresolved key of the batch, never a silent pass-through.
//
//   HF:     [base_model.model.]model.layers.4.self_attn.q_proj.lora_A.weight
//   native: transformer/layer_4/attention/query/lora_a
//
// Native names never carry PEFT's "base_model.model." prefix; the reverse direction adds it on
// request, so to_hf(to_native(k), has_peft_prefix(k)) == k for every key the table resolves.
//
// A translator for GGUF names (for_gguf) reads and writes the tensor names of GGUF model files
// instead, from the table's "gguf" side, and knows the head counts the converter's row orders run
// over ("gguf_rows", gguf_row_order.hpp):
//
//   HF:     [base_model.model.]model.layers.4.self_attn.q_proj.weight
//   GGUF:   blk.4.attn_q.weight                      (roles: "weight" and "bias" only)
//
// A Translator is immutable; every method may be called from many threads at once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_header.hpp"
#include "peft/arch/arch_table.hpp"
#include "peft/arch/gguf_row_order.hpp"

namespace peft {

// What a translator of GGUF names knows about the model: its GGUF architecture and head counts.
struct GgufNames {
  std::string architecture;
  GgufHeads heads;
};

class Translator {
 public:
  explicit Translator(std::shared_ptr<const ArchTable> table) : table_(std::move(table)) {}
  Translator(std::shared_ptr<const ArchTable> table, GgufNames gguf)
      : table_(std::move(table)), gguf_(std::move(gguf)) {}

  static Translator for_family(const std::string& family);  // a built-in table
  static Translator from_file(const std::string& path);
  static Translator from_json(std::string_view json_text);
  // GGUF names: the built-in table that reads `architecture` (builtin_table_for_gguf; UNSUPPORTED
  // when none does) and the given head counts.
  static Translator for_gguf(const std::string& architecture, GgufHeads heads);
  // GGUF names of a GGUF model file: general.architecture and its head counts
  // (gguf_heads_from_metadata); with "<architecture>.expert_count" above 0, the table that names
  // the stacked expert tensors (Mixtral's among the tables reading "llama"). INVALID_CHECKPOINT
  // naming `file` without a string general.architecture.
  static Translator for_gguf_file(const GgufHeader& header, const std::string& file);

  const ArchTable& table() const { return *table_; }
  const std::shared_ptr<const ArchTable>& table_ptr() const { return table_; }
  // Set for a translator of GGUF names.
  const std::optional<GgufNames>& gguf() const { return gguf_; }

  // GGUF names: the module path (HuggingFace) of a GGUF module or weight name ("blk.0.attn_q" or
  // "blk.0.attn_q.weight") and the row order of that weight; nullopt when the table has no such
  // GGUF name (or the translator does not read GGUF names).
  struct GgufModule {
    std::string module;
    GgufRows rows = GgufRows::same;
  };
  std::optional<GgufModule> gguf_module(std::string_view name) const;
  // GGUF names: the module paths of slices 0 .. slices-1 of a stacked GGUF tensor (a rule with
  // "gguf_stack": "blk.0.ffn_gate_exps.weight" -> "model.layers.0.mlp.experts.0.gate_proj", ...);
  // empty when `name` is not one.
  std::vector<std::string> gguf_slice_modules(std::string_view name, uint64_t slices) const;

  // One key; PEFT_ERR_UNRESOLVED_KEY naming it when the table does not resolve it.
  std::string to_native(std::string_view hf_key) const;
  std::string to_hf(std::string_view native_key, bool with_peft_prefix) const;

  // Many keys, in order; PEFT_ERR_UNRESOLVED_KEY listing every key that does not resolve.
  std::vector<std::string> to_native(const std::vector<std::string>& hf_keys) const;
  std::vector<std::string> to_hf(const std::vector<std::string>& native_keys, bool with_peft_prefix) const;

 private:
  std::optional<std::string> gguf_key(std::string_view hf_key) const;
  std::optional<std::string> hf_key_of_gguf(std::string_view gguf_key, bool with_peft_prefix) const;
  std::optional<std::string> key_to_native(std::string_view hf_key) const;
  std::optional<std::string> key_to_hf(std::string_view native_key, bool with_peft_prefix) const;

  std::shared_ptr<const ArchTable> table_;
  std::optional<GgufNames> gguf_;
};

bool has_peft_prefix(std::string_view key);

// "N keys cannot be translated by <what>: "a", "b", ..." (every key listed).
[[noreturn]] void fail_unresolved(const std::vector<std::string>& keys, const std::string& what);

}  // namespace peft
