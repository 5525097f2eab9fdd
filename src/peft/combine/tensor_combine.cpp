#include "peft/combine/tensor_combine.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/quant/ggml_types.hpp"
#include "core/shape.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

// Values per slice of a combined tensor (rounded down to whole rows, at least one row): 4 MB of f32
// for each input, so that the largest tensor need not be held (model_combine.hpp, "Memory").
constexpr uint64_t kSliceValues = uint64_t{1} << 20;

// Rows [row, row + rows) of tensor `index` as f32: converted from its dtype, or dequantized from its
// ggml type (a GGUF tensor).
void read_rows(const Checkpoint& file, size_t index, uint64_t row, uint64_t rows, uint64_t cols, float* out,
               std::vector<uint8_t>& bytes) {
  const TensorInfo& info = file.tensor(index);
  if (info.ggml_type >= 0) {
    const auto type = static_cast<uint32_t>(info.ggml_type);
    const uint64_t row_bytes = ggml_rows_bytes(type, 1, cols);
    bytes.resize(rows * row_bytes);
    file.read_bytes(index, row * row_bytes, bytes.data(), bytes.size());
    dequantize_rows(type, bytes.data(), rows, cols, out);
    return;
  }
  const uint64_t width = dtype_bits(info.dtype) / 8;
  bytes.resize(rows * cols * width);
  file.read_bytes(index, row * cols * width, bytes.data(), bytes.size());
  convert(info.dtype, bytes.data(), DType::F32, out, rows * cols);
}

}  // namespace

CombineInput model_tensor(const Checkpoint& model, const std::string& who, const TensorInfo& base) {
  const std::optional<size_t> j = model.find(base.name);
  if (!j)
    fail(PEFT_ERR_NOT_FOUND, "model " + peft::quoted(who) + " has no tensor " + quoted_name(base.name) +
                                 ", which the base holds");
  const TensorInfo& info = model.tensor(*j);
  if (info.shape != base.shape)
    fail(PEFT_ERR_SHAPE_MISMATCH, "tensor " + quoted_name(base.name) + " is " + shape_text(info.shape) + " in model " +
                                      peft::quoted(who) + " but " + shape_text(base.shape) + " in the base");
  const std::optional<GgmlType> type = info.ggml_type >= 0 ? ggml_type(static_cast<uint32_t>(info.ggml_type))
                                                           : std::nullopt;
  const bool floats = info.ggml_type >= 0 ? type && type->to_float
                                          : info.dtype == DType::F32 || info.dtype == DType::BF16 ||
                                                info.dtype == DType::F16 || info.dtype == DType::F64;
  if (!floats)
    fail(PEFT_ERR_UNSUPPORTED, "tensor " + quoted_name(base.name) + " of model " + peft::quoted(who) +
                                   " holds no float values the base's can be subtracted from");
  return {&model, *j};
}

void combine_tensor_slices(const CombineInput& base, std::span<const CombineInput> models,
                           std::span<const double> weights, merge::TaskSettings task, const std::string& name,
                           bool allow_nonfinite, const std::function<void(const float*, size_t)>& emit) {
  const std::vector<uint64_t>& shape = base.file->tensor(base.index).shape;
  const uint64_t cols = shape.empty() ? 1 : shape.back();
  const uint64_t n = shape_elements(shape, "tensor " + peft::quoted(name));
  if (n == 0) return;
  const uint64_t slice = std::max<uint64_t>(1, kSliceValues / cols) * cols;
  // The base's slice, read once for every model's difference and the sum (slices come in order).
  std::vector<float> w(static_cast<size_t>(std::min(slice, n)));
  uint64_t w_offset = UINT64_MAX;
  std::vector<uint8_t> bytes;
  auto base_slice = [&](uint64_t offset, size_t count) {
    if (offset != w_offset) read_rows(*base.file, base.index, offset / cols, count / cols, cols, w.data(), bytes);
    w_offset = offset;
  };
  std::vector<float> f32_weights;
  for (double weight : weights) f32_weights.push_back(static_cast<float>(weight));
  task.stream = name;
  std::vector<float> out(w.size());
  merge::combine_task_slices(
      models.size(), f32_weights, n, task, 2, static_cast<size_t>(slice),
      [&](size_t k, uint64_t offset, size_t count, float* values) {
        read_rows(*models[k].file, models[k].index, offset / cols, count / cols, cols, values, bytes);
        base_slice(offset, count);
        for (size_t e = 0; e < count; ++e) values[e] = values[e] - w[e];
      },
      [&](uint64_t offset, const float* sum, size_t count) {
        base_slice(offset, count);
        for (size_t e = 0; e < count; ++e) {
          out[e] = w[e] + sum[e];
          if (!allow_nonfinite && !std::isfinite(out[e]))
            fail(PEFT_ERR_NON_FINITE, "tensor " + peft::quoted(name) + " is not finite after combining (value " +
                                          std::to_string(offset + e) + ")");
        }
        emit(out.data(), count);
      });
}

}  // namespace peft
