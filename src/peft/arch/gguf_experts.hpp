// Modules that llama.cpp's converter stacks into one GGUF tensor (a rule's "gguf_stack"): Mixtral's
// model.layers.L.block_sparse_moe.experts.E.w1 is slice E (outermost index) of blk.L.ffn_gate_exps,
// w2 of ffn_down_exps, w3 of ffn_up_exps (conversion/llama.py stacks the experts with torch.stack).
// One place for where a module is in GGUF, stacked or not, and for LoRA factors stacked and unstacked
// as convert_lora_to_gguf.py stacks them (torch.stack of the A's and of the B's), which llama.cpp
// applies per expert (llama-graph's build_lora_mm_id, llama-export-lora's batched matmul).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf_header.hpp"
#include "peft/arch/arch_table.hpp"

namespace peft {

struct GgufSlot {
  const ModuleRule* rule = nullptr;
  std::string tensor;             // "blk.0.ffn_gate_exps.weight"
  std::optional<uint64_t> slice;  // a stacked module's index in the tensor's outermost dimension
};

// Where an adapter's module (its path as it is, else with the table's base_model_prefix) is in
// GGUF, or that of its checkpoint alias (transformers 5's "mlp.gate" is Mixtral's
// "block_sparse_moe.gate" on disk), else that of its path outside a vision-language wrapper
// (language_model_path); nullopt when the table gives it no GGUF name.
std::optional<GgufSlot> gguf_slot(const ArchTable& table, std::string_view module);

// A GGUF model of a vision-language model (Llava, Gemma 3...) is its language model: llama.cpp's
// converter drops the "language_model" component of every name (transformers 5's in-memory
// "model.language_model.layers.0.self_attn.q_proj" and the saved "language_model.model.layers.0..."
// both become the text model's "model.layers.0.self_attn.q_proj") and writes the vision tower and
// projector to a separate mmproj file, to which llama.cpp applies no LoRA. `module` without that
// component, or nullopt when it has none.
std::optional<std::string> language_model_path(std::string_view module);

// The module path of slice `slice` of a stacked GGUF module that `rule` matched with `captures`.
std::string gguf_stacked_module(const ModuleRule& rule, NameTemplate::Captures captures, uint64_t slice);

// The number of experts: "<architecture>.expert_count" of a GGUF file, num_local_experts of a
// config.json; nullopt when absent.
std::optional<uint64_t> gguf_experts_from_metadata(const GgufHeader& header, const std::string& architecture);
std::optional<uint64_t> gguf_experts_from_config(const nlohmann::json& config);

// "0, 2" for the slices of 0..count-1 that `present` (sorted or not) lacks; empty when none. At most
// 8 are named ("0, 1, ..., 7 and 12 more"); time and memory depend on `present` only.
std::string missing_slices(const std::vector<uint64_t>& present, uint64_t count);

// LoRA factors in PyTorch's layout, row-major f32: A (rank, in) and B (out, rank), or stacked,
// `count` of each: A (count, rank, in) and B (count, out, rank).
struct LoraFactors {
  std::vector<float> a, b;
  uint64_t rank = 0, in = 0, out = 0, count = 1;
};

// Stacks single pairs of the same in/out (else PEFT_ERR_SHAPE_MISMATCH naming `what`) with
// `rank` >= each pair's rank: a smaller rank is zero-padded (A's extra rows, B's extra columns), which
// leaves every B_i A_i exactly as it was.
LoraFactors stack_lora(const std::vector<LoraFactors>& slices, uint64_t rank, const std::string& what);
// The reverse: `stacked.count` single pairs of rank `stacked.rank`.
std::vector<LoraFactors> unstack_lora(const LoraFactors& stacked);

}  // namespace peft
