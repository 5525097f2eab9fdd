#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "core/quant/fp8_block.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.hpp"
#include "core/f8.hpp"

namespace peft {

uint8_t f32_to_e4m3_saturating(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float a = std::fabs(value);
  if (!(a < kE4m3Max)) return sign | 0x7E;  // 448 and above (the caller has excluded NaN)
  // Scaling by a power of two is exact here, so nearbyint (the default mode: nearest, ties to even)
  // rounds the exact value. The codes are consecutive across binades: a mantissa rounding up to 8
  // carries into the exponent field, and the largest subnormal code + 1 is the smallest normal.
  uint32_t code;
  if (a < 0x1p-6f) {
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 9)));  // zero and subnormals: steps of 2^-9
  } else {
    int exponent = 0;
    std::frexp(a, &exponent);    // a = f * 2^exponent with f in [0.5, 1)
    const int e = exponent - 1;  // a in [2^e, 2^(e+1)), steps of 2^(e-3)
    code = static_cast<uint32_t>(e + 7) * 8 + static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 3 - e))) - 8;
  }
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7E));
}

Fp8BlockLayout fp8_block_layout(const std::vector<uint64_t>& shape, uint64_t block_rows, uint64_t block_cols) {
  Fp8BlockLayout layout;
  layout.block_rows = block_rows;
  layout.block_cols = block_cols;
  const size_t n = shape.size();
  if (n >= 2) {
    layout.rows = shape[n - 2];
    layout.cols = shape[n - 1];
    for (size_t d = 0; d + 2 < n; ++d) layout.batch *= shape[d];
  }
  return layout;
}

std::vector<uint64_t> fp8_scale_shape(const std::vector<uint64_t>& shape, const Fp8BlockLayout& layout) {
  std::vector<uint64_t> scales = shape;
  const size_t n = scales.size();
  if (n >= 2) {
    scales[n - 2] = layout.scale_rows();
    scales[n - 1] = layout.scale_cols();
  }
  return scales;
}

void fp8_block_dequantize(const Fp8BlockLayout& layout, const uint8_t* q, const float* scale_inv, float* out) {
  const auto& table = f8_table(DType::F8_E4M3);
  const uint64_t sr = layout.scale_rows(), sc = layout.scale_cols();
  for (uint64_t m = 0; m < layout.batch; ++m) {
    const float* scales = scale_inv + m * sr * sc;
    for (uint64_t r = 0; r < layout.rows; ++r) {
      const uint64_t at = (m * layout.rows + r) * layout.cols;
      const float* row_scales = scales + (r / layout.block_rows) * sc;
      for (uint64_t c = 0; c < layout.cols; ++c)
        out[at + c] = std::bit_cast<float>(table[q[at + c]]) * row_scales[c / layout.block_cols];
    }
  }
}

void fp8_block_quantize(const Fp8BlockLayout& layout, const float* w, uint8_t* q, float* scale_inv,
                        const std::string& what) {
  const uint64_t sr = layout.scale_rows(), sc = layout.scale_cols();
  for (uint64_t m = 0; m < layout.batch; ++m) {
    const uint64_t base = m * layout.rows * layout.cols;
    for (uint64_t br = 0; br < sr; ++br) {
      const uint64_t r0 = br * layout.block_rows, r1 = std::min(layout.rows, r0 + layout.block_rows);
      for (uint64_t bc = 0; bc < sc; ++bc) {
        const uint64_t c0 = bc * layout.block_cols, c1 = std::min(layout.cols, c0 + layout.block_cols);
        float amax = 0.0f;
        for (uint64_t r = r0; r < r1; ++r)
          for (uint64_t c = c0; c < c1; ++c) {
            const uint64_t i = base + r * layout.cols + c;
            if (!std::isfinite(w[i]))
              fail(PEFT_ERR_NON_FINITE, what + " holds an infinity or a NaN (element " + std::to_string(i) +
                                            "), which FP8 block quantization cannot represent; nothing was written");
            amax = std::max(amax, std::fabs(w[i]));
          }
        float s = amax > 0.0f ? (1.0f / amax) * kE4m3Max : 1.0f;  // torch's 448 / t: reciprocal, then product
        if (!std::isfinite(s)) s = 1.0f;
        scale_inv[(m * sr + br) * sc + bc] = 1.0f / s;
        for (uint64_t r = r0; r < r1; ++r)
          for (uint64_t c = c0; c < c1; ++c) {
            const uint64_t i = base + r * layout.cols + c;
            q[i] = f32_to_e4m3_saturating(std::clamp(w[i] * s, -kE4m3Max, kE4m3Max));
          }
      }
    }
  }
}

}  // namespace peft
