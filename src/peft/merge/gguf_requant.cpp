#include "peft/merge/gguf_requant.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/convert.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/quant/ggml_types.hpp"
#include "gguf/ggml_type.hpp"
#include "peft/kernels/merge_parallel.hpp"
#include "peft/merge/merge_compute.hpp"

namespace peft {
namespace {

// Rows per task: about 64 Ki values, at least one row.
uint64_t rows_per_block(uint64_t cols) { return std::max<uint64_t>(1, (uint64_t{1} << 16) / std::max<uint64_t>(cols, 1)); }

void to_f32(uint32_t type, const void* in, uint64_t rows, uint64_t cols, float* out) {
  if (const std::optional<DType> plain = dtype_of_ggml(type); plain && is_float(*plain))
    convert(*plain, in, DType::F32, out, rows * cols);
  else
    dequantize_rows(type, in, rows, cols, out);
}

void from_f32(uint32_t type, const float* in, uint64_t rows, uint64_t cols, void* out) {
  if (const std::optional<DType> plain = dtype_of_ggml(type); plain && is_float(*plain))
    convert(DType::F32, in, *plain, out, rows * cols);
  else
    quantize_rows(type, in, rows, cols, out);
}

// The scales of `bytes` of blocks are all finite (an f16 is not finite when its exponent bits are all set).
bool scales_finite(const GgmlType& type, const uint8_t* blocks, uint64_t bytes) {
  bool finite = true;
  for (uint64_t b = 0; b + type.type_size <= bytes; b += type.type_size)
    for (int k = 0; k < type.scale_count; ++k) {
      const uint8_t* h = blocks + b + type.scale_offsets[k];
      const auto bits = static_cast<uint16_t>(h[0] | (h[1] << 8));
      finite &= (bits & 0x7C00) != 0x7C00;
    }
  return finite;
}

}  // namespace

double StoreError::rms() const { return values == 0 ? 0.0 : std::sqrt(sum_squares / static_cast<double>(values)); }

void dequantize_blocks(uint32_t type, const void* in, uint64_t rows, uint64_t cols, float* out, unsigned threads) {
  const uint64_t row_bytes = ggml_rows_bytes(type, 1, cols);
  const uint64_t step = rows_per_block(cols);
  const auto blocks = static_cast<int64_t>((rows + step - 1) / step);
  merge::parallel_tasks(blocks, merge::worker_count(threads, blocks), [&](int64_t b, unsigned) {
    const uint64_t first = static_cast<uint64_t>(b) * step, n = std::min(step, rows - first);
    to_f32(type, static_cast<const uint8_t*>(in) + first * row_bytes, n, cols, out + first * cols);
  });
}

void quantize_blocks(uint32_t type, const float* in, uint64_t rows, uint64_t cols, void* out, unsigned threads,
                     StoreError* error, bool figures) {
  const std::optional<GgmlType> row = ggml_type(type);
  const GgmlType* by_scales = !figures && row && row->scale_count > 0 ? &*row : nullptr;
  std::optional<DType> plain = dtype_of_ggml(type);
  if (plain && !is_float(*plain)) plain.reset();
  const uint64_t row_bytes = ggml_rows_bytes(type, 1, cols);
  const uint64_t step = rows_per_block(cols);
  const auto blocks = static_cast<int64_t>((rows + step - 1) / step);
  const unsigned workers = merge::worker_count(threads, blocks);
  std::vector<StoreError> errors(error ? static_cast<size_t>(blocks) : 0);
  std::vector<std::vector<float>> scratch(error ? workers : 0);
  merge::parallel_tasks(blocks, workers, [&](int64_t b, unsigned worker) {
    const uint64_t first = static_cast<uint64_t>(b) * step, n = std::min(step, rows - first);
    uint8_t* stored = static_cast<uint8_t*>(out) + first * row_bytes;
    const float* values = in + first * cols;
    from_f32(type, values, n, cols, stored);
    if (!error) return;
    StoreError& e = errors[static_cast<size_t>(b)];
    if (by_scales != nullptr) {
      e.values = n * cols;
      e.finite = scales_finite(*by_scales, stored, n * row_bytes);
      return;
    }
    if (!figures && plain) {  // a float type: its own bits say whether a value is finite
      e.values = n * cols;
      e.finite = first_nonfinite(*plain, *plain, stored, n * cols) == n * cols;
      return;
    }
    std::vector<float>& back = scratch[worker];
    back.resize(static_cast<size_t>(n * cols));
    to_f32(type, stored, n, cols, back.data());
    e.values = n * cols;
    for (size_t i = 0; i < back.size(); ++i) {
      if (!std::isfinite(back[i])) e.finite = false;
      const double d = std::fabs(static_cast<double>(back[i]) - static_cast<double>(values[i]));
      e.sum_squares += d * d;
      e.max = std::max(e.max, d);
    }
  });
  if (!error) return;
  *error = StoreError{};
  for (const StoreError& e : errors) {
    error->values += e.values;
    error->sum_squares += e.sum_squares;
    error->max = std::max(error->max, e.max);
    error->finite = error->finite && e.finite;
  }
}

}  // namespace peft
