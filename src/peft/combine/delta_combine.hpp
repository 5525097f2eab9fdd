// Combining adapters in delta space: the weighted sum of each module's true weight change, written
// as a plain LoRA adapter. Unlike add_weighted_adapter (adapter_combine.hpp), which combines LoRA
// factors (cross terms B_i A_j for "linear" and the pruning types) and takes LoRA adapters only:
//
// * each input module's change dW_i is what a merge adds (adapter_delta.hpp module_delta): LoRA
//   with its own scaling (rsLoRA, rank and alpha patterns), every additive method's dense delta
//   (LoHa, LoKr, AdaLoRA, VeRA, ...), and, with a base model, the multiplicative methods' W' - W
//   (IA3, OFT, BOFT, HRA); in PEFT's get_delta_weight layout ([in, out] for a GPT-2 Conv1D);
// * they are combined with the weights w_i by merge::combine_task_tensors: "linear" sums them, and
//   "ties", "dare_linear", "dare_ties", "magnitude_prune" prune and elect on the deltas (PEFT's
//   merge_utils functions, DARE's masks drawn with factor 2, as the SVD types draw them);
// * the sum is written:
//   - exactly, when no rank or energy is chosen: each module's lora_A holds the rows
//     w_i * s_i * A_i and lora_B the columns B_i (rank = the sum of the ranks), which only LoRA
//     inputs combined "linear" allow (INVALID_ARGUMENT otherwise, naming the module: a pruned or
//     non-LoRA delta has no such factors);
//   - or truncated by SVD to a rank or an energy fraction (lora_lowrank.hpp, with the relative
//     error of each module reported).
// The config is a fresh LoraConfig as convert_to_lora writes it (scaling 1; target_modules the
// modules' names; base_model_name_or_path and task_type from the first adapter). When an input has
// lora_bias, so does the output: each module's lora_B.bias is sum_i w_i s_i b_i over the inputs
// with one (what a merge adds to the base bias; not pruned), zeros where none has one.
// Refused (UNSUPPORTED, naming the adapter and module and why): DoRA (its change rescales
// W + dW by a magnitude per row, so it is not a delta that adds), modules_to_save and other whole
// tensors, trainable tokens, stacked expert parameters, activated LoRA, embedding and conv modules;
// a multiplicative module without a base (as module_delta). Deltas of one module whose shapes
// differ between adapters: SHAPE_MISMATCH.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "peft/adapter/adapter.hpp"
#include "peft/combine/adapter_combine.hpp"
#include "peft/lowrank/lora_lowrank.hpp"

namespace peft {

// `method`: linear, ties, dare_linear, dare_ties or magnitude_prune (others INVALID_ARGUMENT);
// `settings`: density (required by the pruning types), majority sign and seed; `options`: a rank,
// an energy fraction, or neither (exact), the SVD method, threads, dtype and the base folder ("" =
// the first adapter's). Returns the report of write_lowrank_adapter (error 0 for exact modules).
std::vector<LowRankModule> combine_deltas(std::span<const std::shared_ptr<const Adapter>> adapters,
                                          std::span<const double> weights, CombineMethod method,
                                          const CombineSettings& settings, const LowRankOptions& options,
                                          const std::string& out_dir);

}  // namespace peft
