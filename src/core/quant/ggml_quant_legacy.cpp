// ggml's blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4), the plain F32/F16/BF16 rows and
// the ternary TQ1_0/TQ2_0 dequantizers: the arithmetic of ggml-quants.c's quantize_row_*_ref /
// quantize_iq4_nl and dequantize_row_*, operation for operation (this file is compiled without
// floating-point contraction), so that the bytes and floats are the same as ggml's.
#include "core/no_fp_contract.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/bf16.hpp"
#include "core/quant/ggml_quant_support.hpp"
#include "core/quant/q8_0.hpp"

namespace peft::quant {
namespace {

constexpr int kQK = 32;

// ggml's best_index_int8: the level of a sorted table nearest to x (the upper one on a tie).
int best_index_int8(int n, const int8_t* values, float x) {
  if (x <= values[0]) return 0;
  if (x >= values[n - 1]) return n - 1;
  int lo = 0, hi = n - 1;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < values[mid]) hi = mid; else lo = mid;
  }
  return x - values[hi - 1] < values[hi] - x ? hi - 1 : hi;
}

}  // namespace

void dequantize_f32(const uint8_t* in, float* out, uint64_t blocks) { std::memcpy(out, in, blocks * 4); }

void dequantize_f16(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t i = 0; i < blocks; ++i) out[i] = load_f16(in + 2 * i);
}

void dequantize_bf16(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t i = 0; i < blocks; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    // ggml widens by shifting the bits (a signalling NaN stays signalling): so do we.
    out[i] = std::bit_cast<float>(uint32_t(h) << 16);
  }
}

void quantize_f32(const float* in, uint8_t* out, uint64_t blocks) { std::memcpy(out, in, blocks * 4); }

void quantize_f16(const float* in, uint8_t* out, uint64_t blocks) {
  for (uint64_t i = 0; i < blocks; ++i) store_f16(out + 2 * i, in[i]);
}

void quantize_bf16(const float* in, uint8_t* out, uint64_t blocks) {
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint16_t h = f32_to_bf16(in[i]);  // ggml_compute_fp32_to_bf16: the same rule, NaN included
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// Q4_0: f16 d, 16 bytes of nibbles (low nibbles the first 16 values). value = (q - 8) x d.
void dequantize_q4_0(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 18, out += kQK) {
    const float d = load_f16(in);
    const uint8_t* qs = in + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (qs[j] & 0x0F) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      out[j] = static_cast<float>(x0) * d;
      out[j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

void quantize_q4_0(const float* in, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += kQK, out += 18) {
    const float max = signed_absmax(in, kQK);
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(out, d);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = in[j] * id;
      const float x1 = in[kQK / 2 + j] * id;
      const int xi0 = std::min(15, int(static_cast<int8_t>(low_byte(x86_truncate(x0 + 8.5f)))));
      const int xi1 = std::min(15, int(static_cast<int8_t>(low_byte(x86_truncate(x1 + 8.5f)))));
      out[2 + j] = static_cast<uint8_t>(static_cast<uint8_t>(xi0) | static_cast<uint8_t>(xi1 << 4));
    }
  }
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles. value = q x d + m.
void dequantize_q4_1(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 20, out += kQK) {
    const float d = load_f16(in);
    const float m = load_f16(in + 2);
    const uint8_t* qs = in + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      out[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      out[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

void quantize_q4_1(const float* in, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += kQK, out += 20) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (in[j] < min) min = in[j];
      if (in[j] > max) max = in[j];
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(out, d);
    store_f16(out + 2, min);
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (in[j] - min) * id;
      const float x1 = (in[kQK / 2 + j] - min) * id;
      const int xi0 = std::min(15, int(static_cast<int8_t>(low_byte(x86_truncate(x0 + 0.5f)))));
      const int xi1 = std::min(15, int(static_cast<int8_t>(low_byte(x86_truncate(x1 + 0.5f)))));
      out[4 + j] = static_cast<uint8_t>(static_cast<uint8_t>(xi0) | static_cast<uint8_t>(xi1 << 4));
    }
  }
}

// Q5_0: f16 d, 4 bytes of fifth bits (bit j for value j), 16 bytes of nibbles. value = (q - 16) x d.
void dequantize_q5_0(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 22, out += kQK) {
    const float d = load_f16(in);
    uint32_t qh;
    std::memcpy(&qh, in + 2, 4);
    const uint8_t* qs = in + 6;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int32_t x0 = ((qs[j] & 0x0F) | xh0) - 16;
      const int32_t x1 = ((qs[j] >> 4) | xh1) - 16;
      out[j] = static_cast<float>(x0) * d;
      out[j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

void quantize_q5_0(const float* in, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += kQK, out += 22) {
    const float max = signed_absmax(in, kQK);
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(out, d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = in[j] * id;
      const float x1 = in[kQK / 2 + j] * id;
      const uint8_t xi0 = static_cast<uint8_t>(std::min(31, int(static_cast<int8_t>(low_byte(x86_truncate(x0 + 16.5f))))));
      const uint8_t xi1 = static_cast<uint8_t>(std::min(31, int(static_cast<int8_t>(low_byte(x86_truncate(x1 + 16.5f))))));
      out[6 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << j;
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(out + 2, &qh, 4);
  }
}

// Q5_1: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles. value = q x d + m.
void dequantize_q5_1(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 24, out += kQK) {
    const float d = load_f16(in);
    const float m = load_f16(in + 2);
    uint32_t qh;
    std::memcpy(&qh, in + 4, 4);
    const uint8_t* qs = in + 8;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = (qs[j] & 0x0F) | xh0;
      const int x1 = (qs[j] >> 4) | xh1;
      out[j] = static_cast<float>(x0) * d + m;
      out[j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

void quantize_q5_1(const float* in, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += kQK, out += 24) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (in[j] < min) min = in[j];
      if (in[j] > max) max = in[j];
    }
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(out, d);
    store_f16(out + 2, min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (in[j] - min) * id;
      const float x1 = (in[kQK / 2 + j] - min) * id;
      const uint8_t xi0 = low_byte(x86_truncate(x0 + 0.5f));
      const uint8_t xi1 = low_byte(x86_truncate(x1 + 0.5f));
      out[8 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << j;
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(out + 4, &qh, 4);
  }
}

// Q8_0: core/quant/q8_0 holds it.
void dequantize_q8_0(const uint8_t* in, float* out, uint64_t blocks) { peft::dequantize_q8_0(in, blocks * kQK, out); }
void quantize_q8_0(const float* in, uint8_t* out, uint64_t blocks) { peft::quantize_q8_0(in, blocks * kQK, out); }

// IQ4_NL: f16 d, 16 bytes of nibbles indexing the non-linear levels. value = d x level.
void dequantize_iq4_nl(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 18, out += kQK) {
    const float d = load_f16(in);
    const uint8_t* qs = in + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      out[j] = d * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      out[j + kQK / 2] = d * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

// What ggml_quantize_chunk does for IQ4_NL without an importance matrix (quantize_iq4_nl, weights
// x^2, ntry 7: the scale searched among 15 candidates, then the levels chosen again for the f32
// scale). Note that this is not quantize_row_iq4_nl_ref (ntry -1), which llama-quantize never runs.
void quantize_iq4_nl(const float* in, uint8_t* out, uint64_t blocks) {
  constexpr int ntry = 7;
  const int8_t* values = kIq4nlValues;
  uint8_t L[kQK];
  float weight[kQK];
  for (uint64_t b = 0; b < blocks; ++b, in += kQK, out += 18) {
    const float* xb = in;
    uint8_t* q4 = out + 2;
    std::memset(q4, 0, kQK / 2);
    for (int j = 0; j < kQK; ++j) weight[j] = xb[j] * xb[j];
    const float max = signed_absmax(xb, kQK);
    const float amax = std::fabs(max);
    float scale;
    if (amax < 1e-15f) {  // GROUP_MAX_EPS
      scale = 0.0f;
    } else {
      float d = -max / static_cast<float>(values[0]);
      float id = 1.0f / d;
      float sumqx = 0.0f, sumq2 = 0.0f;
      for (int j = 0; j < kQK; ++j) {
        const float al = id * xb[j];
        const int l = best_index_int8(16, values, al);
        L[j] = static_cast<uint8_t>(l);
        const float q = values[l];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
      float best = d * sumqx;
      for (int itry = -ntry; itry <= ntry; ++itry) {
        id = static_cast<float>(itry + values[0]) / max;
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < kQK; ++j) {
          const float al = id * xb[j];
          const int l = best_index_int8(16, values, al);
          const float q = values[l];
          const float w = weight[j];
          sumqx += w * q * xb[j];
          sumq2 += w * q * q;
        }
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
          d = sumqx / sumq2;
          best = d * sumqx;
        }
      }
      scale = d;
    }
    store_f16(out, scale);
    const float id = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < kQK; ++j) L[j] = static_cast<uint8_t>(best_index_int8(16, values, id * in[j]));
    for (int j = 0; j < 16; ++j) q4[j] = static_cast<uint8_t>(L[j] | (L[16 + j] << 4));
  }
}

// MXFP4: one E8M0 exponent e, 16 bytes of E2M1 nibbles. value = level x 2^(e - 128) (the levels are
// doubled E2M1 values, hence the half).
namespace {
float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
  return std::bit_cast<float>(bits);
}
}  // namespace

void dequantize_mxfp4(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 17, out += kQK) {
    const float d = e8m0_half(in[0]);
    const uint8_t* qs = in + 1;
    for (int j = 0; j < kQK / 2; ++j) {
      out[j] = static_cast<float>(kFp4Values[qs[j] & 0x0F]) * d;
      out[j + kQK / 2] = static_cast<float>(kFp4Values[qs[j] >> 4]) * d;
    }
  }
}

void quantize_mxfp4(const float* in, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += kQK, out += 17) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(in[j])) amax = std::fabs(in[j]);
    }
    const uint8_t e = amax > 0.0f ? low_byte(x86_truncate(std::floor(std::log2(amax)) - 2.0f + 127.0f)) : 0;
    const float d = e8m0_half(e);
    out[0] = e;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = best_index_fp4(in[j], d);
      const int x1 = best_index_fp4(in[kQK / 2 + j], d);
      out[1 + j] = static_cast<uint8_t>(x0 | (x1 << 4));
    }
  }
}

// TQ1_0: 48 bytes of five base-3 digits each, 4 bytes of four digits each, f16 d. Digit t gives
// (t - 1) x d; a byte's digits come out by multiplying by powers of 3 (mod 256) and taking the top.
void dequantize_tq1_0(const uint8_t* in, float* out, uint64_t blocks) {
  constexpr uint8_t pow3[6] = {1, 3, 9, 27, 81, 243};
  constexpr int kQs = 48, kQh = 4;
  auto digit = [](uint8_t byte, uint8_t power) {
    const uint8_t q = static_cast<uint8_t>(byte * power);
    return static_cast<int16_t>((uint16_t(q) * 3) >> 8);
  };
  for (uint64_t b = 0; b < blocks; ++b, in += 54) {
    const uint8_t* qs = in;
    const uint8_t* qh = in + kQs;
    const float d = load_f16(in + kQs + kQh);
    for (int j = 0; j < kQs - kQs % 32; j += 32)
      for (int n = 0; n < 5; ++n)
        for (int m = 0; m < 32; ++m) *out++ = static_cast<float>(digit(qs[j + m], pow3[n]) - 1) * d;
    for (int j = kQs - kQs % 32; j < kQs; j += 16)
      for (int n = 0; n < 5; ++n)
        for (int m = 0; m < 16; ++m) *out++ = static_cast<float>(digit(qs[j + m], pow3[n]) - 1) * d;
    for (int n = 0; n < 4; ++n)
      for (int j = 0; j < kQh; ++j) *out++ = static_cast<float>(digit(qh[j], pow3[n]) - 1) * d;
  }
}

// ggml's ternary quantizers: d = max |x|, digits lroundf(x / d) + 1 (glibc's lroundf, as ggml calls it).
namespace {
float ternary_scale(const float* x, uint8_t* d_out) {
  float amax = 0.0f;
  for (int j = 0; j < 256; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
  store_f16(d_out, amax);
  return amax != 0.0f ? 1.0f / amax : 0.0f;
}
int ternary_digit(float x, float id) { return static_cast<int>(std::lround(x * id)) + 1; }
// Five (or four, then shifted up) base-3 digits, most significant first, stored as the ceiling of
// value x 256 / 243 so that multiplying by a power of 3 brings each digit to the top.
uint8_t pack_trits(uint8_t q) { return static_cast<uint8_t>((uint16_t(q) * 256 + (243 - 1)) / 243); }
}  // namespace

void quantize_tq1_0(const float* x, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, out += 54) {
    const float id = ternary_scale(x, out + 52);
    uint8_t* qs = out;
    uint8_t* qh = out + 48;
    for (int m = 0; m < 32; ++m) {
      uint8_t q = 0;
      for (int n = 0; n < 5; ++n) q = static_cast<uint8_t>(q * 3 + ternary_digit(x[m + n * 32], id));
      qs[m] = pack_trits(q);
    }
    x += 160;
    for (int m = 0; m < 16; ++m) {
      uint8_t q = 0;
      for (int n = 0; n < 5; ++n) q = static_cast<uint8_t>(q * 3 + ternary_digit(x[m + n * 16], id));
      qs[32 + m] = pack_trits(q);
    }
    x += 80;
    for (int j = 0; j < 4; ++j) {
      uint8_t q = 0;
      for (int m = 0; m < 4; ++m) q = static_cast<uint8_t>(q * 3 + ternary_digit(x[j + m * 4], id));
      qh[j] = pack_trits(static_cast<uint8_t>(q * 3));
    }
    x += 16;
  }
}

void quantize_tq2_0(const float* x, uint8_t* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, out += 66) {
    const float id = ternary_scale(x, out + 64);
    for (int j = 0; j < 64; j += 32) {
      for (int m = 0; m < 32; ++m) {
        uint8_t q = 0;
        for (int n = 0; n < 4; ++n) q = static_cast<uint8_t>(q + ((ternary_digit(x[m + n * 32], id) & 3) << (2 * n)));
        out[j + m] = q;
      }
      x += 128;
    }
  }
}

// TQ2_0: 64 bytes of four 2-bit digits each, f16 d. Digit t gives (t - 1) x d.
void dequantize_tq2_0(const uint8_t* in, float* out, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 66) {
    const float d = load_f16(in + 64);
    for (int j = 0; j < 64; j += 32)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m) *out++ = static_cast<float>(((in[j + m] >> (l * 2)) & 3) - 1) * d;
  }
}

}  // namespace peft::quant
