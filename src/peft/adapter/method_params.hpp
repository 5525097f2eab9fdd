// The parameters of a non-LoRA adapter module (LoHa, LoKr, AdaLoRA, IA3) read as f32, and what
// the method makes of them for a merge (methods/peft_methods.hpp): the dense delta of the
// additive methods, IA3's scale vector. Shared by the checkpoint merge and the buffer merge.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "peft/adapter/adapter.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft {

// MethodParams (a module's parameters as f32 and its settings): methods/method_table.hpp.

// Every method_param tensor of `module`, converted to f32, with the projections VeRA and RandLoRA
// share among layers (Adapter::shared_param) where the module has none of its own.
MethodParams load_method_params(const Adapter& adapter, const AdapterModule& module);

// dW [layout.out * layout.in] in PyTorch order of a LoHa, LoKr, AdaLoRA, MiSS, SHiRA, VeRA, RandLoRA or
// FourierFT module, with
// `coefficient` = merge weight x the module's scaling (PEFT_ERR_INTERNAL for IA3 or LoRA). MiSS's
// "bat" form reads `weight` (the weight as it stands, f32 in PyTorch order, from merge::weight_f32);
// without it, it only checks the shapes and returns an empty vector. MiSS has no scale: a
// coefficient other than 1 is PEFT_ERR_UNSUPPORTED.
std::vector<float> method_delta(const AdapterModule& module, const MethodParams& params, double coefficient,
                                const merge::DeltaLayout& layout, const float* weight = nullptr);

// The layout of a non-LoRA module's layer in a weight of `shape`: Linear [out, in], GPT-2 Conv1D
// [in, out] when `kind` is conv1d, and for LoHa and LoKr an nn.Conv2d weight [out, c, kh, kw] as
// the matrix [out, c * kh * kw] (the order of PEFT's delta reshaped to the weight). Other shapes
// are PEFT_ERR_UNSUPPORTED naming the module and its method.
merge::DeltaLayout method_layer_layout(const AdapterModule& module, LayerKind kind, std::span<const int64_t> shape);

// A LoHa/LoKr module's 4-D factors (the CP cores hada_t1, hada_t2, lokr_t2, a whole lokr_w2
// [b, d, kh, kw]) need a 4-D Conv2d weight of the same kernel: PEFT_ERR_SHAPE_MISMATCH naming the
// factor otherwise (the flattened width alone would let another kernel or a 2-D weight through).
void check_conv_kernel(const AdapterModule& module, const MethodParams& params, std::span<const int64_t> shape);

// Whether the module's delta depends on the weight it is added to (MiSS "bat").
bool method_reads_weight(const AdapterModule& module);

// IA3: ia3_l flattened, times float(weight) when weight != 1 (add_weighted_adapter's weighted sum
// for one adapter).
std::vector<float> ia3_vector(const MethodParams& params, double weight);

// OFT, BOFT and HRA: the module's method multiplies the weight by a rotation (method_transform)
// instead of adding a delta (the row's effect).
bool is_rotation(PeftMethod method);

// PEFT_ERR_UNSUPPORTED unless `weight` is 1: PEFT has no merge weight for rotations (set_scale
// warns and keeps 1).
void check_rotation_weight(const AdapterModule& module, double weight);

// The rotation of an OFT, BOFT or HRA module for `layout` (merge::transform_input applies it);
// `inverse` gives PEFT's arithmetic unmerge; `weight` passes check_rotation_weight.
merge::InputTransform method_transform(const AdapterModule& module, const MethodParams& params, double weight,
                                       const merge::DeltaLayout& layout, bool inverse);

}  // namespace peft

namespace peft {

// LN_TUNING and TRAINABLE_TOKENS adapters only replace tensors (norm weights) and rows (token
// embeddings); PEFT defines no scale for them (no set_scale, no add_weighted_adapter), so a merge
// weight other than 1 is PEFT_ERR_UNSUPPORTED naming the adapter. Other methods pass.
void check_replacement_weight(const Adapter& adapter, double weight);

}  // namespace peft
