// The module of a buffer merge, found by the name a host uses for one of its layers: from a loaded
// adapter and that name to the BufferMergeModule that BufferMerge (buffer_merge.hpp) merges into the
// host's buffer. Used by the C API's buffer merge and by serving's hot-swap (serve/host_model.hpp).
//
// Names: without a translator, a HuggingFace module path ("model.layers.0.self_attn.q_proj") or
// tensor name ("model.layers.0.self_attn.q_proj.weight"), with or without "base_model.model.", or
// the base tensor the adapter resolved the module to; with a translator, the host's own name for
// the module ("transformer/layer_0/attention/query") or for its weight (".../weight"); with a
// translator of GGUF names (Translator::for_gguf), the GGUF tensor name ("blk.0.attn_q.weight") or
// that name without ".weight".
//
// GGUF buffers hold their rows in the order llama.cpp's converter gave them (gguf_rows: LLaMA's q/k
// RoPE permutation, ...): the module's lora_B rows (and lora_B.bias's, DoRA's magnitude's) are put
// in that order (in_gguf_row_order), never the host's buffer, so the buffer merge writes exactly
// what a merge in PyTorch's order followed by the converter's reorder gives, and removal by the
// saved bytes stays exact.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "peft/adapter/adapter.hpp"
#include "peft/arch/gguf_row_order.hpp"
#include "peft/arch/translator.hpp"
#include "peft/base/expert_base.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"

namespace peft {

// The HuggingFace module paths a layer name may stand for, most specific first (see Names above).
// PEFT_ERR_UNRESOLVED_KEY when the translator does not resolve the name.
std::vector<std::string> module_candidates(std::string_view name, const Translator* translator);

// The module `name` addresses: a LoRA (or other method's) layer, or a replacement (full tensors,
// trainable tokens; merged by overwriting, see replacement_module in layer_module.cpp).
// PEFT_ERR_UNRESOLVED_KEY when the translator does not resolve the name, PEFT_ERR_NOT_FOUND when
// the adapter has no such module.
const AdapterModule& find_lora_module(const Adapter& adapter, std::string_view name, const Translator* translator);

// The kind a host's buffer holds a layer as: a GGUF weight is always [out, in] (llama.cpp's converter
// transposes GPT-2's Conv1D weights), so with GGUF names a Conv1D layer is laid out as Linear.
LayerKind host_layer_kind(LayerKind kind, const Translator* translator);

// The row order of the host's buffer `name`: the converter's (the table's gguf_rows) with a
// translator of GGUF names, GgufRows::same otherwise.
GgufRows host_row_order(std::string_view name, const Translator* translator);

// `module` with lora_B's rows, and lora_B.bias's and a DoRA magnitude's, in GGUF's `order` over
// `heads` (reorder_gguf_rows), copied and owned by the result's keep_alive (which also holds the
// module's own); `module` as it is for GgufRows::same. PEFT_ERR_SHAPE_MISMATCH naming `what` when the
// order does not fit the layer's output features; PEFT_ERR_UNSUPPORTED for a layer whose delta is
// stored transposed (embeddings).
BufferMergeModule in_gguf_row_order(BufferMergeModule module, GgufRows order, const GgufHeads& heads,
                                    const std::string& what);

// The layout of a LoRA layer's delta in a weight of `weight_shape`, from the factors' shapes as
// stored (lora_A, lora_B; embeddings: lora_embedding_A/B). Linear vs GPT-2 Conv1D follows the
// weight's shape when only one fits, `kind` (the adapter's decision) when both do (a square weight).
// PEFT_ERR_SHAPE_MISMATCH naming `module` when the weight does not fit; PEFT_ERR_UNSUPPORTED for a
// kind that is not a LoRA layer.
merge::DeltaLayout lora_layout(LayerKind kind, std::span<const int64_t> weight_shape, std::span<const int64_t> a_shape,
                               std::span<const int64_t> b_shape, const std::string& module);

// One expert's LoRA pair of a stacked expert parameter (expert_base.hpp) as a module: expert e's A
// and the rows row_begin, row_begin + row_stride, ... (`rows` of them) of its B, laid out [rows, in]
// (transposed: [in, rows]); the module keeps `factors` alive.
BufferMergeModule expert_pair_module(const std::shared_ptr<const ExpertFactors>& factors, int64_t e, int64_t row_begin,
                                     int64_t rows, bool transposed, double scaling, int64_t row_stride = 1);
// The same for one per-expert part (per_expert_parts), laid out [part.rows, in].
BufferMergeModule expert_pair_module(const std::shared_ptr<const ExpertFactors>& factors, const ExpertPart& part,
                                     double scaling);

// A LoRA on a stacked expert parameter (module.expert set, `factors` read from it) into a host buffer
// named as transformers names it: the fused parameter ([E, out, in], or [E, in, out] transposed),
// one slice per expert; or one tensor a checkpoint saves per expert ([out / parts, in]), that
// expert's rows of the parameter. PEFT_ERR_SHAPE_MISMATCH when the buffer does not fit,
// PEFT_ERR_NOT_FOUND when `name` is none of the parameter's buffers.
BufferMergeModule expert_buffer_module(const std::shared_ptr<const ExpertFactors>& factors, const AdapterModule& module,
                                       std::string_view name, std::span<const int64_t> weight_shape);

// With a translator of GGUF names, the LoRA on stacked expert parameters that a stacked GGUF tensor
// `name` of `weight_shape` ([slices, rows, in], "blk.0.ffn_gate_exps.weight") holds a part of: its
// module and the parts of every expert merged into their slices. nullopt
// when `name` is no such tensor; PEFT_ERR_NOT_FOUND when the adapter adapts none of its slices.
struct StackedBufferModule {
  const AdapterModule* module = nullptr;
  BufferMergeModule merge;
};
std::optional<StackedBufferModule> gguf_stacked_buffer_module(const std::shared_ptr<const Adapter>& adapter,
                                                              std::string_view name,
                                                              std::span<const int64_t> weight_shape,
                                                              const Translator* translator);

// The module's factors as f32 (owned by the result's keep_alive, which also holds the adapter) and
// its layout for a weight of `weight_shape` (lora_layout). PEFT_ERR_SHAPE_MISMATCH when the weight
// does not fit the module.
BufferMergeModule buffer_merge_module(const std::shared_ptr<const Adapter>& adapter, const AdapterModule& module,
                               std::span<const int64_t> weight_shape);

// The module as it merges into the host's buffer `name` of `weight_shape`: buffer_merge_module with
// the host's kind (host_layer_kind) and row order (host_row_order, in_gguf_row_order).
BufferMergeModule host_buffer_module(const std::shared_ptr<const Adapter>& adapter, const AdapterModule& module,
                                     std::string_view name, std::span<const int64_t> weight_shape,
                                     const Translator* translator);

}  // namespace peft
