// Stacked expert parameters of MoE architectures, as architecture data: the "experts" section of
// an architecture table (data/arch/<family>.json), which PEFT's LoRA on parameters
// (LoraConfig.target_parameters, ParamWrapper) is resolved and merged by.
//
//   "experts": [{"module": "model.layers.{layer}.mlp.experts",
//                "checkpoint": "model.layers.{layer}.block_sparse_moe.experts",
//                "params": [{"name": "gate_up_proj", "per_expert": ["w1.weight", "w3.weight"]},
//                           {"name": "down_proj", "per_expert": ["w2.weight"]}]}]
//
// * module: the experts module in memory (transformers 5), whose parameters are 3-D [E, out, in]
//   ("transposed": true: [E, in, out], gpt-oss);
// * checkpoint: the same module's name in checkpoint files when it differs (Mixtral saves
//   block_sparse_moe); optional;
// * params: the targetable parameters in the module's declaration order (PEFT nests the wrappers
//   of several targeted parameters in that order: the first declared is the innermost);
// * per_expert: the per-expert tensors the parameter splits into, as the tensor names below
//   "<checkpoint>.<e>." that split the out dimension of [out, in] (after the transpose of a
//   transposed parameter) into equal consecutive parts in this order (gate then up): how
//   transformers' save_pretrained stores Qwen3-MoE and Mixtral, and how llama.cpp's converter splits
//   a fused one (gpt-oss). Absent when nothing splits the fused tensor "<checkpoint>.<name>". A
//   fused tensor of that name is used whenever the base has one. The table's module rules give
//   these per-expert modules their GGUF names (stacked tensors, "gguf_stack");
// * split: "interleaved" when part j takes rows j, j + n, j + 2n... of the n parts instead
//   (gpt-oss's gate_up_proj: gate the even rows, up the odd ones); "consecutive" by default.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "peft/arch/arch_table.hpp"

namespace peft {

struct ExpertParamRule {
  std::string name;                     // "gate_up_proj"
  bool transposed = false;              // stored [E, in, out]
  std::vector<std::string> per_expert;  // saved names per expert ("w1.weight", "w3.weight")
  bool interleaved = false;             // per_expert parts take every n-th row ("split": "interleaved")
};

struct ExpertsRule {
  NameTemplate module;
  std::optional<NameTemplate> checkpoint;
  std::vector<ExpertParamRule> params;  // declaration order
};

// The table's experts rules (empty when it has none). PEFT_ERR_INVALID_CONFIG naming the table on
// a malformed section.
std::vector<ExpertsRule> expert_rules(const ArchTable& table);

// An experts module matched: its rule and the checkpoint name of the module ("" when no rule matches).
struct ExpertsModule {
  const ExpertsRule* rule = nullptr;
  std::string checkpoint_module;  // the module's name in checkpoint files
};
ExpertsModule match_experts_module(const std::vector<ExpertsRule>& rules, const std::string& module);

}  // namespace peft
