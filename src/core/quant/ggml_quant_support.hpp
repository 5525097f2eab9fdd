// Internal to core/quant: the small pieces of ggml's C that the block quantizers reproduce exactly
// (rounding helpers, ggml's own f16 conversion, little-endian field access), and the per-type
// kernels the type table (ggml_types.cpp) lists. A kernel handles `blocks` whole blocks.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/f16.hpp"
#include "core/quant/ggml_block.hpp"

namespace peft::quant {

// ggml's nearest_int: round to nearest, ties to even, by adding 1.5 x 2^23 and reading the mantissa
// bits. For |x| > 2^22 (which ggml asserts against only in debug builds) it gives what ggml's
// release build gives: the same bit pattern arithmetic, never undefined behaviour.
// The element of largest magnitude (the first of equal ones; 0 when all are 0 or NaN), as ggml's
// `if (amax < fabsf(v))` loops.
inline float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

inline int nearest_int(float x) {
  const float biased = x + 12582912.0f;
  const int32_t bits = std::bit_cast<int32_t>(biased);
  return (bits & 0x007FFFFF) - 0x00400000;
}

// C's float -> integer conversion as x86-64 executes it (cvttss2si): truncation toward zero, and
// INT32_MIN ("integer indefinite") for NaN and values outside int32. ggml's `(int8_t)(x + 8.5f)`
// and `(uint8_t)(x + 0.5f)` are this followed by keeping the low byte.
inline int32_t x86_truncate(float x) {
  return (x >= -2147483648.0f && x < 2147483648.0f) ? static_cast<int32_t>(x) : INT32_MIN;
}
inline uint8_t low_byte(int32_t v) { return static_cast<uint8_t>(static_cast<uint32_t>(v) & 0xFFu); }

// ggml's GGML_FP32_TO_FP16 (ggml_compute_fp32_to_fp16): round to nearest even like f32_to_f16,
// except that every NaN becomes the quiet NaN 0x7E00 with its sign (no payload).
inline uint16_t ggml_f16(float f) {
  if (std::isnan(f)) return static_cast<uint16_t>(((std::bit_cast<uint32_t>(f) >> 16) & 0x8000u) | 0x7E00u);
  return f32_to_f16(f);
}

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);  // little-endian hosts only, as the rest of the library
  return f16_to_f32(h);
}
inline void store_f16(uint8_t* p, float f) {
  const uint16_t h = ggml_f16(f);
  std::memcpy(p, &h, 2);
}

// The 16 levels of IQ4_NL / IQ4_XS and of the FP4 (E2M1, doubled) types of ggml-common.h.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kFp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The index of the FP4 level nearest x / e (the first of equals), as ggml's best_index_mxfp4 picks it
// for MXFP4 and NVFP4. Included by kernels compiled without floating-point contraction.
inline int best_index_fp4(float x, float e) {
  int best = 0;
  float best_err = std::fabs(static_cast<float>(kFp4Values[0]) * e - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(kFp4Values[i]) * e - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

// Block-of-32 types and the ternary types (ggml_quant_legacy.cpp).
void dequantize_f16(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_bf16(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_f32(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q4_0(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q4_1(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q5_0(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q5_1(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q8_0(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq4_nl(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_mxfp4(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_tq1_0(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_tq2_0(const uint8_t* in, float* out, uint64_t blocks);
void quantize_f16(const float* in, uint8_t* out, uint64_t blocks);
void quantize_bf16(const float* in, uint8_t* out, uint64_t blocks);
void quantize_f32(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q4_0(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q4_1(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q5_0(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q5_1(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q8_0(const float* in, uint8_t* out, uint64_t blocks);
void quantize_iq4_nl(const float* in, uint8_t* out, uint64_t blocks);
void quantize_mxfp4(const float* in, uint8_t* out, uint64_t blocks);
void quantize_tq1_0(const float* in, uint8_t* out, uint64_t blocks);
void quantize_tq2_0(const float* in, uint8_t* out, uint64_t blocks);

// K-quants, super-blocks of 256 (ggml_quant_k.cpp).
void dequantize_q2_k(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q3_k(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q4_k(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q5_k(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q6_k(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q8_k(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq4_xs(const uint8_t* in, float* out, uint64_t blocks);
void quantize_q2_k(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q3_k(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q4_k(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q5_k(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q6_k(const float* in, uint8_t* out, uint64_t blocks);

// Q1_0, Q2_0, NVFP4 (ggml_quant_low_bit.cpp).
void dequantize_q1_0(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_q2_0(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_nvfp4(const uint8_t* in, float* out, uint64_t blocks);
void quantize_q1_0(const float* in, uint8_t* out, uint64_t blocks);
void quantize_q2_0(const float* in, uint8_t* out, uint64_t blocks);
void quantize_nvfp4(const float* in, uint8_t* out, uint64_t blocks);

// The lattice types (ggml_quant_iq.cpp).
void dequantize_iq2_xxs(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq2_xs(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq2_s(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq3_xxs(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq3_s(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq1_s(const uint8_t* in, float* out, uint64_t blocks);
void dequantize_iq1_m(const uint8_t* in, float* out, uint64_t blocks);

}  // namespace peft::quant
