#include "core/quant/q8_0.hpp"

#include <cmath>
#include <cstring>

#include "core/f16.hpp"
#include "core/quant/ggml_quant_support.hpp"

namespace peft {

void quantize_q8_0(const float* values, uint64_t count, uint8_t* out) {
  for (uint64_t block = 0; block < count / kQ8_0BlockSize; ++block) {
    const float* x = values + block * kQ8_0BlockSize;
    uint8_t* y = out + block * kQ8_0BlockBytes;
    float amax = 0.0f;
    // ggml's MAX(amax, fabsf(v)), NaNs included: a NaN is taken, then loses to the next value.
    for (uint32_t j = 0; j < kQ8_0BlockSize; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t half = f32_to_f16(d);
    std::memcpy(y, &half, 2);  // little-endian hosts only, as the rest of the library
    for (uint32_t j = 0; j < kQ8_0BlockSize; ++j) {
      // Within [-127, 127] for finite blocks. In a block with a NaN, ggml's MAX lets the NaN lose to
      // the values after it, so an earlier one may exceed amax: ggml's (int8_t) cast, as x86 runs it.
      y[2 + j] = quant::low_byte(quant::x86_truncate(std::roundf(x[j] * id)));
    }
  }
}

void dequantize_q8_0(const uint8_t* blocks, uint64_t count, float* out) {
  for (uint64_t block = 0; block < count / kQ8_0BlockSize; ++block) {
    const uint8_t* y = blocks + block * kQ8_0BlockBytes;
    uint16_t half;
    std::memcpy(&half, y, 2);
    const float d = f16_to_f32(half);
    for (uint32_t j = 0; j < kQ8_0BlockSize; ++j)
      out[block * kQ8_0BlockSize + j] = d * static_cast<float>(static_cast<int8_t>(y[2 + j]));
  }
}

}  // namespace peft
