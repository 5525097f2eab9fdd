// Combining LoRA adapters into a new adapter folder as PEFT's
// `LoraModel.add_weighted_adapter(adapters, weights, name, combination_type)` does (peft 0.21,
// peft/tuners/lora/model.py), for each of its combination types:
//
// * "cat": for each module, A = rows w_i * s_i * A_i and B = columns B_i of the adapters that have
//   the module, in the order given, zero-padded to the new rank r = sum over adapters of
//   max(r_i, rank_pattern values); delta = sum_i w_i s_i B_i A_i exactly.
// * "linear": all adapters must have the same such rank r (the new rank), and every module that
//   rank; c_i = w_i * s_i, A = sum_i sign(c_i) sqrt|c_i| A_i, B = sum_i sqrt|c_i| B_i (cross terms
//   B_i A_j included: exact only for one adapter). One adapter always combines as "linear", as in
//   PEFT.
// * "ties", "dare_linear", "dare_ties", "magnitude_prune": as "linear" (equal ranks, the same
//   weights on A and B), with the A factors and the B factors each pruned and merged by PEFT's
//   merge_utils function of that name (merge::combine_task_arithmetic); the cross terms remain.
// * "svd", "ties_svd", "dare_linear_svd", "dare_ties_svd", "magnitude_prune_svd": each module's
//   deltas w_i-weighted and summed (after pruning, for the last four) and factored by truncated SVD
//   at the new rank r = svd_rank, or the largest of the adapters' ranks (merge::combine_svd has the
//   arithmetic and the svd_clamp rule). PEFT's svd_full_matrices changes only how torch computes
//   the same leading r components, and its svd_driver applies to CUDA only: neither is an option.
// s_i is the module's scaling in adapter i (its rank/alpha patterns and use_rslora applied).
//
// The new config is the FIRST adapter's with r = lora_alpha = new rank, rank_pattern =
// alpha_pattern = {} and target_modules = the union: a sorted list of the adapters' names (PEFT
// writes the union of Python sets in hash order; lists of 20 or more names may also be shortened
// to suffixes by PEFT, which target the same modules), or for regex targets "(t1)|(t2)|...". An
// "all-linear" or absent target_modules counts as the list of the adapter's LoRA module names,
// which is what PEFT expands it to on the base model. Everything else is inherited from the first
// adapter, as PEFT's `replace(config, ...)` does, including use_rslora: the new scaling is then
// new_rank / sqrt(new_rank) = sqrt(new_rank) instead of 1, so the combined delta is sqrt(r) times
// the weighted sum. That is PEFT's result, reproduced on purpose (PEFT PR #3449 changes it later).
//
// Modules present in only some adapters get contributions from those only (PEFT skips the others).
// Refused with PEFT_ERR_UNSUPPORTED (PEFT fails, or silently gives something else):
// * DoRA (PEFT keeps the new adapter's magnitude at the base weight's norm, ignoring the
//   adapters'), lora_bias (PEFT drops the biases), full replacement tensors (modules_to_save,
//   bias="all", saved embeddings) and trainable tokens (PEFT resets them to the base model's);
// * a module the inherited config no longer targets (e.g. another layers_to_transform or
//   exclude_modules in the first adapter): PEFT would silently drop its contributions;
// * regex and list target_modules mixed (PEFT raises).
// "linear" with unequal ranks is PEFT_ERR_INVALID_ARGUMENT (PEFT raises too); factor shapes that
// differ between adapters for the same module are PEFT_ERR_SHAPE_MISMATCH.
//
// The combined factors are computed in f32 as PEFT does on CPU (lora_math.hpp combine_cat /
// combine_linear) and written as F32 (PEFT's default autocast_adapter_dtype keeps adapters in
// f32), or converted to ExportOptions::dtype. One module at a time is held in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "peft/adapter/adapter.hpp"
#include "peft/export/adapter_export.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {

enum class CombineMethod {
  cat,
  linear,
  ties,
  dare_linear,
  dare_ties,
  magnitude_prune,
  svd,
  ties_svd,
  dare_linear_svd,
  dare_ties_svd,
  magnitude_prune_svd,
};

// The settings of the pruning types (ties*, dare_*, magnitude_prune*; lora_math.hpp has their
// arithmetic): PEFT's `density` (required by them, in [0, 1]) and `majority_sign_method`, and
// the seed of DARE's masks (merge::dare_keep, one stream per module name); and of the SVD types,
// PEFT's `svd_rank` (0: the largest of the adapters' ranks) and `svd_clamp` (a quantile in [0, 1]).
struct CombineSettings {
  std::optional<double> density;
  merge::MajoritySign majority_sign = merge::MajoritySign::total;
  uint64_t seed = 0;
  int64_t svd_rank = 0;
  std::optional<double> svd_clamp;
};

// The task arithmetic of a combination type: its pruning and election ("ties_svd" is "ties" on the
// deltas; "cat", "linear" and "svd" are "linear"), with the settings' density, majority sign and
// seed. INVALID_ARGUMENT, naming `job` and the type, when a pruning type has no density in [0, 1].
merge::TaskSettings task_settings_of(CombineMethod method, const CombineSettings& settings, const std::string& job);

// Whether `method` is linear, ties, dare_linear, dare_ties or magnitude_prune: the types that
// combine plain tensors (the delta-space and whole-model combinations take only these).
bool is_task_arithmetic(CombineMethod method);

// "adapter #i (<its folder>)": how the combinations name an input in messages.
std::string combine_input_name(const Adapter& adapter, size_t i);

// One input adapter's part in one module of a combination: the adapter's position and its module.
struct CombinePart {
  size_t adapter = 0;
  const AdapterModule* module = nullptr;
};

// Combines `adapters` with `weights` (one finite weight per adapter) into `out_dir`.
// INVALID_ARGUMENT for no adapters, a count mismatch, a null adapter, a non-finite weight, a
// pruning type without a density in [0, 1], a negative svd_rank or a clamp outside [0, 1].
void combine_adapters(std::span<const std::shared_ptr<const Adapter>> adapters, std::span<const double> weights,
                      CombineMethod method, const std::string& out_dir, const ExportOptions& options = {},
                      const CombineSettings& settings = {});

}  // namespace peft
