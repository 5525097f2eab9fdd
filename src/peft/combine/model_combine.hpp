// Whole-model task arithmetic: several fine-tuned checkpoints of one base combined into one
// checkpoint, as mergekit's task_arithmetic / ties / dare_* / magnitude_prune methods do, with
// PEFT's merge_utils arithmetic (the same as the adapter combinations'):
//
//   out = W + combine_i(w_i, M_i - W)   for every floating-point tensor W of the base
//
// where M_i is the same-named tensor of model i, the differences M_i - W are taken in f32, and
// `combine` is merge::combine_task_tensors ("linear": sum_i w_i (M_i - W); "ties", "dare_linear",
// "dare_ties", "magnitude_prune": pruned and elected per tensor with the density, majority sign and
// seed of CombineSettings; DARE's masks drawn with the tensor's name as the stream, the model's
// position as the adapter index and factor 2). The sum is added to W in f32 and rounded once to the
// output dtype. Tensors that are not floating point (integer buffers) are copied from the base.
//
// It streams like the checkpoint merge (checkpoint_merge.hpp): the output folder has the base's
// files, shard names, index and other files (or is resharded at max_shard_size), written through
// temporaries and committed all at once. Memory does not grow with the tensors: each is combined in
// slices of whole rows of about 2^20 values (the base's slice, each model's difference and the
// result in f32, plus the pruned copies of the pruning types: (2 * count + 2) * 4 MB at most);
// magnitude pruning (ties, magnitude_prune) first reads each model's differences twice more for its
// exact top-k cut (merge::magnitude_cut), so those types read the inputs three times.
//
// A GGUF base (a .gguf file) takes GGUF models and writes one GGUF file at `out_dir`
// (gguf_model_combine.hpp).
//
// Errors: INVALID_ARGUMENT (no models, a count mismatch, a weight that is not finite, another
// method than the five, a pruning method without a density, an output over an input);
// NOT_FOUND naming a base tensor a model lacks; SHAPE_MISMATCH naming a tensor whose shape
// differs; UNSUPPORTED for a quantized base (bitsandbytes, FP8), whose values are not plain floats;
// NON_FINITE naming a tensor whose result is not finite (unless allowed); the errors of opening the checkpoints and
// of writing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "peft/combine/adapter_combine.hpp"
#include "peft/combine/tensor_combine.hpp"
#include "peft/merge/checkpoint_merge.hpp"

namespace peft {

// The result, as a checkpoint merge's: `merged` counts the combined tensors, `copied` the others.
CheckpointMergeResult combine_models(const std::string& base_dir, std::span<const std::string> model_dirs,
                                     std::span<const double> weights, CombineMethod method,
                                     const CombineSettings& settings, const std::string& out_dir,
                                     const ModelCombineOptions& options);

}  // namespace peft
