// The base tensors a LoRA module on a stacked expert parameter (adapter/expert_modules.hpp)
// changes, and how: the fused tensor as transformers 5 holds it in memory ("<module>.<param>",
// [E, out, in], or [E, in, out] transposed; gpt-oss saves it so), or, as transformers 5.24's
// save_pretrained writes Qwen3-MoE and Mixtral, one tensor per expert and per part of the out
// dimension ("<checkpoint module>.<e>.<per_expert name>", [out / parts, in]; gate then up).
// A fused tensor is used whenever the base has one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "peft/adapter/adapter_module.hpp"
#include "peft/arch/arch_table.hpp"
#include "peft/base/base_model.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

struct ExpertSlot {
  size_t base_index = 0;  // the base tensor
  int64_t expert = -1;    // the expert whose delta rows it holds; -1: the fused tensor of all experts
  int64_t row_begin = 0;  // per expert: the first of its rows within the parameter's out dimension
  int64_t rows = 0;       // per expert: how many
  int64_t row_stride = 1;  // per expert: rows row_begin, row_begin + row_stride, ...
};

// The factors' sizes: in and out of the parameter ([E, out, in] in memory when not transposed).
struct ExpertFactorShape {
  int64_t experts = 0, rank = 0, in = 0, out = 0;
};
ExpertFactorShape expert_factor_shape(const AdapterModule& m, const Checkpoint& adapter_weights);

// A module's factors (m.expert set), read once as f32: expert e's LoRA pair is lora_A's rows
// e*r .. e*r+r-1 and lora_B's columns k*E + e (k < r), as PEFT's ParamWrapper lays them out.
class ExpertFactors {
 public:
  ExpertFactors(const AdapterModule& m, const Checkpoint& adapter_weights);
  const ExpertFactorShape& shape() const { return shape_; }
  // Expert e's A, [rank, in] (valid while this object lives).
  const float* a(int64_t e) const { return a_.data() + e * shape_.rank * shape_.in; }
  // Rows row_begin, row_begin + row_stride, ... (`rows` of them) of expert e's B, gathered as [rows, rank].
  std::vector<float> b(int64_t e, int64_t row_begin, int64_t rows, int64_t row_stride = 1) const;

 private:
  ExpertFactorShape shape_;
  std::vector<float> a_, b_;
};

// One per-expert tensor's share of a parameter's LoRA (ExpertsRule's per_expert): expert
// `expert`'s out rows row_begin, row_begin + row_stride, ... (`rows` of them; gate then up, or
// interleaved) are the tensor `tensor`, "<checkpoint module>.<e>.<per_expert name>"
// ("...block_sparse_moe.experts.0.w1.weight").
struct ExpertPart {
  std::string tensor;
  int64_t expert = 0, row_begin = 0, rows = 0, row_stride = 1;
  std::string module() const { return tensor.substr(0, tensor.rfind('.')); }
};
std::vector<ExpertPart> per_expert_parts(const AdapterModule& m, const ExpertFactorShape& f);

// m's name as checkpoints save it, which architecture tables name: for a LoRA on a stacked expert
// parameter saved per expert, expert 0's first saved module ("...block_sparse_moe.experts.0.w1");
// otherwise m.name.
std::string saved_module_name(const AdapterModule& m);

// The slots of module `m` (m.expert set) in the base; appends what does not resolve or fit to
// `unresolved` / `mismatched` (and returns no slots then).
std::vector<ExpertSlot> expert_slots(const AdapterModule& m, const Checkpoint& adapter_weights, const BaseModel& base,
                                     const ArchTable* table, std::vector<std::string>& unresolved,
                                     std::vector<std::string>& mismatched);

}  // namespace peft
