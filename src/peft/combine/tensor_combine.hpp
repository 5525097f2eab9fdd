// One tensor of whole-model task arithmetic (model_combine.hpp, gguf_model_combine.hpp), streamed:
// out = W + combine_i(w_i (M_i - W)) over slices of whole rows, so that no input tensor is held whole;
// and the options both kinds of model combination take.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "core/dtype.hpp"
#include "peft/merge/checkpoint_merge.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {

struct ModelCombineOptions {
  std::optional<DType> dtype;   // F32, BF16 or F16; nullopt keeps the base's dtypes
  uint64_t max_shard_size = 0;  // 0: the base's files and shard names
  MergeProgress progress;       // optional: bytes written so far and the total; false cancels
  bool require_config = true;   // false: a base without config.json is combined anyway
  bool allow_nonfinite = false; // true: combined tensors may hold infinities and NaNs
};

// One tensor of a checkpoint (or GGUF file) as an input of the combination.
struct CombineInput {
  const Checkpoint* file = nullptr;
  size_t index = 0;
};

// Tensor `name` of a model (`who` names it in messages) as an input for the base tensor `base`:
// NOT_FOUND when the model lacks it, SHAPE_MISMATCH when its shape differs, UNSUPPORTED when it holds
// no float values (a dtype other than F32, BF16, F16 and F64; a ggml type without a dequantizer).
CombineInput model_tensor(const Checkpoint& model, const std::string& who, const TensorInfo& base);

// out = W + combine_i(w_i (M_i - W)) of one tensor (`name`: messages and DARE's stream) whose inputs
// have its shape and a float dtype or ggml type, streamed: slices of whole rows of about 2^20 values
// read, combined (merge::combine_task_slices) and handed to `emit(values, count)` in order.
// NON_FINITE naming the tensor for a value that is not finite (unless allowed).
void combine_tensor_slices(const CombineInput& base, std::span<const CombineInput> models,
                           std::span<const double> weights, merge::TaskSettings task, const std::string& name,
                           bool allow_nonfinite, const std::function<void(const float*, size_t)>& emit);

}  // namespace peft
