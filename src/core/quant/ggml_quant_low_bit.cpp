// ggml's newest small types, both directions, as ggml-quants.c's quantize_row_*_ref (what
// ggml_quantize_chunk runs) and dequantize_row_*: Q1_0 (128 signs and a mean magnitude), Q2_0 (64
// values in {-1, 0, 1, 2} x d) and NVFP4 (64 E2M1 values with a UE4M3 scale per 16). Compiled
// without floating-point contraction, like the other kernels.
#include "core/no_fp_contract.hpp"

#include <cmath>
#include <cstring>

#include "core/quant/ggml_quant_support.hpp"

namespace peft::quant {
namespace {

// ggml_ue4m3_to_fp32: an unsigned E4M3 scale (bias 7; 0 and 0x7F mean 0), halved to match the
// doubled E2M1 levels. The top bit of the byte is ignored, as there.
float ue4m3_half(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int exp = (x >> 3) & 0xF;
  const int man = x & 0x7;
  const float raw = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return raw * 0.5f;
}

// ggml_fp32_to_ue4m3: clamps to 448, rounds the mantissa half up (on the bit below the third),
// subnormals to the nearest multiple of 2^-9; non-positive and NaN give 0.
uint8_t to_ue4m3(float x) {
  if (!(x > 0.0f)) return 0;
  if (x > 448.0f) x = 448.0f;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int fp32_exp = static_cast<int>((bits >> 23) & 0xFF) - 127;
  const int fp32_man = static_cast<int>((bits >> 20) & 0x7);
  int exp = fp32_exp + 7;
  if (exp <= 0) {
    int man = static_cast<int>(x * 512.0f + 0.5f);
    if (man > 7) man = 7;
    if (man < 1) return 0;
    return static_cast<uint8_t>(man);
  }
  if (exp >= 15) return 0x7E;
  int man = fp32_man + static_cast<int>((bits >> 19) & 1);
  if (man > 7) {
    man = 0;
    if (++exp >= 15) return 0x7E;
  }
  return static_cast<uint8_t>((exp << 3) | man);
}


}  // namespace

// Q1_0: f16 d (the mean |x|), 16 bytes of sign bits (set: x >= 0, value d; clear: value -d).
void quantize_q1_0(const float* x, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, x += 128, out += 18) {
    float sum_abs = 0.0f;
    for (int j = 0; j < 128; ++j) sum_abs += std::fabs(x[j]);
    store_f16(out, sum_abs / 128.0f);
    uint8_t* qs = out + 2;
    std::memset(qs, 0, 16);
    for (int j = 0; j < 128; ++j)
      if (x[j] >= 0.0f) qs[j / 8] = static_cast<uint8_t>(qs[j / 8] | (1 << (j % 8)));
  }
}

void dequantize_q1_0(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 18, y += 128) {
    const float d = load_f16(in);
    const float neg_d = -d;
    for (int j = 0; j < 128; ++j) y[j] = ((in[2 + j / 8] >> (j % 8)) & 1) ? d : neg_d;
  }
}

// Q2_0: f16 d (max |x|), 16 bytes of 2-bit codes q, value (q - 1) x d.
void quantize_q2_0(const float* x, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, x += 64, out += 18) {
    float amax = 0.0f;
    for (int j = 0; j < 64; ++j) {
      const float a = std::fabs(x[j]);
      if (a > amax) amax = a;
    }
    const float id = amax > 0.0f ? 1.0f / amax : 0.0f;
    store_f16(out, amax);
    uint8_t* qs = out + 2;
    std::memset(qs, 0, 16);
    for (int j = 0; j < 64; ++j) {
      int q = x86_truncate(std::round(x[j] * id)) + 1;
      if (q < 0) q = 0;
      if (q > 3) q = 3;
      qs[j / 4] = static_cast<uint8_t>(qs[j / 4] | (q << ((j % 4) * 2)));
    }
  }
}

void dequantize_q2_0(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 18, y += 64) {
    const float d = load_f16(in);
    for (int j = 0; j < 64; ++j) y[j] = static_cast<float>(((in[2 + j / 4] >> ((j % 4) * 2)) & 3) - 1) * d;
  }
}

// NVFP4: 4 UE4M3 scales (one per 16 values), 32 bytes of E2M1 nibbles (per 16 values: 8 bytes, low
// nibbles the first 8).
void quantize_nvfp4(const float* x, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, x += 64, out += 36) {
    for (int s = 0; s < 4; ++s) {
      const float* xb = x + 16 * s;
      float amax = 0.0f;
      for (int j = 0; j < 16; ++j)
        if (amax < std::fabs(xb[j])) amax = std::fabs(xb[j]);
      const uint8_t ue = to_ue4m3(amax / 6.0f);
      out[s] = ue;
      const float d = ue4m3_half(ue);
      for (int j = 0; j < 8; ++j)
        out[4 + 8 * s + j] = static_cast<uint8_t>(best_index_fp4(xb[j], d) | (best_index_fp4(xb[8 + j], d) << 4));
    }
  }
}

void dequantize_nvfp4(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 36) {
    for (int s = 0; s < 4; ++s, y += 16) {
      const float d = ue4m3_half(in[s]);
      const uint8_t* qs = in + 4 + 8 * s;
      for (int j = 0; j < 8; ++j) {
        y[j] = static_cast<float>(kFp4Values[qs[j] & 0x0F]) * d;
        y[j + 8] = static_cast<float>(kFp4Values[qs[j] >> 4]) * d;
      }
    }
  }
}

}  // namespace peft::quant
