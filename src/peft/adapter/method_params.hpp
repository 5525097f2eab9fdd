// The parameters of a non-LoRA adapter module (LoHa, LoKr, AdaLoRA, IA3) read as f32, and what
// the method makes of them for a merge (methods/peft_methods.hpp): the dense delta of the
// additive methods, IA3's scale vector. Shared by the checkpoint merge and the buffer merge.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "peft/adapter/adapter.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft {

struct MethodParams {
  std::map<std::string, merge::MethodTensor> tensors;  // by parameter name ("hada_w1_a")
  const merge::MethodTensor* get(const std::string& name) const;
};

// Every method_param tensor of `module`, converted to f32.
MethodParams load_method_params(const Adapter& adapter, const AdapterModule& module);

// dW [layout.out * layout.in] in PyTorch order of a LoHa, LoKr or AdaLoRA module, with
// `coefficient` = merge weight x the module's scaling (PEFT_ERR_INTERNAL for IA3 or LoRA).
std::vector<float> method_delta(const AdapterModule& module, const MethodParams& params, double coefficient,
                                const merge::DeltaLayout& layout);

// IA3: ia3_l flattened, times float(weight) when weight != 1 (add_weighted_adapter's weighted sum
// for one adapter).
std::vector<float> ia3_vector(const MethodParams& params, double weight);

// OFT, BOFT and HRA: the module's method multiplies the weight by a rotation (method_transform)
// instead of adding a delta.
bool is_rotation(PeftMethod method);

// PEFT_ERR_UNSUPPORTED unless `weight` is 1: PEFT has no merge weight for rotations (set_scale
// warns and keeps 1).
void check_rotation_weight(const AdapterModule& module, double weight);

// The rotation of an OFT, BOFT or HRA module for `layout` (merge::transform_input applies it);
// `inverse` gives PEFT's arithmetic unmerge; `weight` passes check_rotation_weight.
merge::InputTransform method_transform(const AdapterModule& module, const MethodParams& params, double weight,
                                       const merge::DeltaLayout& layout, bool inverse);

}  // namespace peft
