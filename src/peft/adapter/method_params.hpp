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

}  // namespace peft

namespace peft {

// LN_TUNING and TRAINABLE_TOKENS adapters only replace tensors (norm weights) and rows (token
// embeddings); PEFT defines no scale for them (no set_scale, no add_weighted_adapter), so a merge
// weight other than 1 is PEFT_ERR_UNSUPPORTED naming the adapter. Other methods pass.
void check_replacement_weight(const Adapter& adapter, double weight);

}  // namespace peft
