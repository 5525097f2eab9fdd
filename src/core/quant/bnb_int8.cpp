#include "core/no_fp_contract.hpp"
#include "core/quant/bnb_int8.hpp"

#include <algorithm>
#include <cmath>


namespace peft::bnb {

void dequantize_int8(const int8_t* q, const float* scb, uint64_t rows, uint64_t cols, float* values) {
  constexpr float kInv127 = static_cast<float>(7.874015718698502e-3);
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < cols; ++c)
      values[r * cols + c] = (static_cast<float>(q[r * cols + c]) * scb[r]) * kInv127;
}

void quantize_int8(const float* values, uint64_t rows, uint64_t cols, int8_t* q, float* scb) {
  for (uint64_t r = 0; r < rows; ++r) {
    const float* row = values + r * cols;
    float m = 0.0f;
    for (uint64_t c = 0; c < cols; ++c) m = std::max(m, std::fabs(row[c]));
    scb[r] = m;
    const float factor = 127.0f / m;
    for (uint64_t c = 0; c < cols; ++c) {
      const float v = std::nearbyint(row[c] * factor);  // round half to even, as torch.round
      q[r * cols + c] = std::isnan(v) ? int8_t{0} : static_cast<int8_t>(std::clamp(v, -128.0f, 127.0f));
    }
  }
}

}  // namespace peft::bnb
