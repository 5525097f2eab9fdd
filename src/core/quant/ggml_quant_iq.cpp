// ggml's lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) to f32, as ggml-quants.c's
// dequantize_row_iq*: each group of 8 (or 4) values is a point of a fixed grid, with signs and a
// scale. The grids are data from ggml (ggml_iq_grids.inc, written by ggml_iq_grids.py), expanded
// here at compile time. This file is compiled without floating-point contraction.
#include "core/no_fp_contract.hpp"

#include <array>
#include <bit>
#include <cstddef>
#include <cstring>

#include "core/quant/ggml_quant_support.hpp"

namespace peft::quant {
namespace {

#include "core/quant/ggml_iq_grids.inc"

template <size_t C, size_t N, size_t L>
constexpr std::array<std::array<uint8_t, C>, N> expand(const uint16_t (&codes)[N], const uint8_t (&levels)[L],
                                                       unsigned bits) {
  std::array<std::array<uint8_t, C>, N> grid{};
  for (size_t k = 0; k < N; ++k)
    for (size_t j = 0; j < C; ++j) grid[k][j] = levels[(codes[k] >> (bits * j)) & ((1u << bits) - 1)];
  return grid;
}

constexpr auto kIq2xxs = expand<8>(kIq2xxsGridCodes, kIq2xxsGridLevels, kIq2xxsGridBits);
constexpr auto kIq2xs = expand<8>(kIq2xsGridCodes, kIq2xsGridLevels, kIq2xsGridBits);
constexpr auto kIq2s = expand<8>(kIq2sGridCodes, kIq2sGridLevels, kIq2sGridBits);
constexpr auto kIq3xxs = expand<4>(kIq3xxsGridCodes, kIq3xxsGridLevels, kIq3xxsGridBits);
constexpr auto kIq3s = expand<4>(kIq3sGridCodes, kIq3sGridLevels, kIq3sGridBits);
constexpr auto kIq1s = expand<8>(kIq1sGridCodes, kIq1sGridLevels, kIq1sGridBits);  // int8 bytes

constexpr float kIq1Delta = 0.125f;  // IQ1S_DELTA, IQ1M_DELTA

// ggml's ksigns_iq2xs: seven stored sign bits, the eighth making the count of minus signs even.
constexpr uint8_t signs7(uint32_t v) {
  const uint32_t s = v & 127;
  return static_cast<uint8_t>(s | ((std::popcount(s) & 1u) << 7));
}
// ggml's `v * (signs & kmask_iq2xs[j] ? -1.f : 1.f)` as a flip of the sign bit: the same for every
// value but a NaN (from a NaN scale), whose sign a real multiply would keep. ggml's release build
// flips the bit (its compiler turns the multiply into that); written as a multiply here, the NaN
// signs would depend on our optimizer (an -O1 build kept some multiplies), so the flip is explicit.
float signed_by(float v, uint8_t signs, int j) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(v) ^ ((signs >> j) & 1u) << 31);
}

uint16_t le16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float fl(int v) { return static_cast<float>(v); }

}  // namespace

// IQ2_XXS: f16 d; per 32 values 8 bytes: 4 grid indices, then 4 x 7 sign bits and a 4-bit scale.
void dequantize_iq2_xxs(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 66) {
    const float d = load_f16(in);
    for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
      const uint8_t* q = in + 2 + 8 * ib32;
      const uint32_t aux = le32(q + 4);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l) {
        const auto& grid = kIq2xxs[q[l]];
        const uint8_t signs = signs7(aux >> (7 * l));
        for (int j = 0; j < 8; ++j) y[j] = signed_by(db * fl(grid[j]), signs, j);
        y += 8;
      }
    }
  }
}

// IQ2_XS: f16 d; 32 uint16 (9-bit grid index, 7 sign bits); 8 bytes of two 4-bit scales.
void dequantize_iq2_xs(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 74) {
    const float d = load_f16(in);
    const uint8_t* scales = in + 66;
    for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
      const float db[2] = {d * (0.5f + fl(scales[ib32] & 0xf)) * 0.25f, d * (0.5f + fl(scales[ib32] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l) {
        const uint16_t q = le16(in + 2 + 2 * (4 * ib32 + l));
        const auto& grid = kIq2xs[q & 511];
        const uint8_t signs = signs7(q >> 9);
        for (int j = 0; j < 8; ++j) y[j] = signed_by(db[l / 2] * fl(grid[j]), signs, j);
        y += 8;
      }
    }
  }
}

// IQ2_S: f16 d; 32 low index bytes, 32 sign bytes, 8 bytes of high index bits, 8 scale bytes.
void dequantize_iq2_s(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 82) {
    const float d = load_f16(in);
    const uint8_t* qs = in + 2;
    const uint8_t* signs = qs + QK_K / 8;
    const uint8_t* qh = in + 66;
    const uint8_t* scales = in + 74;
    for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
      const float db[2] = {d * (0.5f + fl(scales[ib32] & 0xf)) * 0.25f, d * (0.5f + fl(scales[ib32] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l) {
        const float dl = db[l / 2];
        const auto& grid = kIq2s[qs[l] | ((qh[ib32] << (8 - 2 * l)) & 0x300)];
        for (int j = 0; j < 8; ++j) y[j] = signed_by(dl * fl(grid[j]), signs[l], j);
        y += 8;
      }
      qs += 4;
      signs += 4;
    }
  }
}

// IQ3_XXS: f16 d; 64 grid index bytes; per 32 values a uint32 of 4 x 7 sign bits and a 4-bit scale.
void dequantize_iq3_xxs(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 98) {
    const float d = load_f16(in);
    const uint8_t* qs = in + 2;
    const uint8_t* scales_and_signs = in + 2 + QK_K / 4;
    for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
      const uint32_t aux = le32(scales_and_signs + 4 * ib32);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = signs7(aux >> (7 * l));
        const auto& grid1 = kIq3xxs[qs[2 * l + 0]];
        const auto& grid2 = kIq3xxs[qs[2 * l + 1]];
        for (int j = 0; j < 4; ++j) {
          y[j + 0] = signed_by(db * fl(grid1[j]), signs, j);
          y[j + 4] = signed_by(db * fl(grid2[j]), signs, j + 4);
        }
        y += 8;
      }
      qs += 8;
    }
  }
}

// IQ3_S: f16 d; 64 low index bytes; 8 bytes of ninth index bits; 32 sign bytes; 4 bytes of scales.
void dequantize_iq3_s(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 110) {
    const float d = load_f16(in);
    const uint8_t* qs = in + 2;
    const uint8_t* qh = in + 66;
    const uint8_t* signs = in + 74;
    const uint8_t* scales = in + 106;
    for (int ib32 = 0; ib32 < QK_K / 32; ib32 += 2) {
      const float db[2] = {d * fl(1 + 2 * (scales[ib32 / 2] & 0xf)), d * fl(1 + 2 * (scales[ib32 / 2] >> 4))};
      for (int half = 0; half < 2; ++half) {
        for (int l = 0; l < 4; ++l) {
          const auto& grid1 = kIq3s[qs[2 * l + 0] | ((qh[half] << (8 - 2 * l)) & 256)];
          const auto& grid2 = kIq3s[qs[2 * l + 1] | ((qh[half] << (7 - 2 * l)) & 256)];
          for (int j = 0; j < 4; ++j) {
            y[j + 0] = signed_by(db[half] * fl(grid1[j]), signs[l], j);
            y[j + 4] = signed_by(db[half] * fl(grid2[j]), signs[l], j + 4);
          }
          y += 8;
        }
        qs += 8;
        signs += 4;
      }
      qh += 2;
    }
  }
}

// IQ1_S: f16 d; 32 low index bytes; per 32 values a uint16: 4 x 3 high index bits, a 3-bit scale
// and the sign of the shift.
void dequantize_iq1_s(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 50) {
    const float d = load_f16(in);
    const uint8_t* qs = in + 2;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const uint16_t qh = le16(in + 34 + 2 * ib);
      const float dl = d * fl(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l) {
        const auto& grid = kIq1s[qs[l] | (((qh >> 3 * l) & 7) << 8)];
        for (int j = 0; j < 8; ++j) y[j] = dl * (fl(static_cast<int8_t>(grid[j])) + delta);
        y += 8;
      }
      qs += 4;
    }
  }
}

// IQ1_M: 32 low index bytes; 16 bytes of high index bits and shift signs; 8 bytes holding 3-bit
// scales and, in their top nibbles, the f16 super-block scale.
void dequantize_iq1_m(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 56) {
    uint16_t sc[4];
    std::memcpy(sc, in + 48, 8);
    const uint16_t scale = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                                 (sc[3] & 0xf000));
    const float d = f16_to_f32(scale);
    const uint8_t* qs = in;
    const uint8_t* qh = in + 32;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const float dl1 = d * fl(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1);
      const float dl2 = d * fl(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1);
      const uint16_t idx[4] = {static_cast<uint16_t>(qs[0] | ((qh[0] << 8) & 0x700)),
                               static_cast<uint16_t>(qs[1] | ((qh[0] << 4) & 0x700)),
                               static_cast<uint16_t>(qs[2] | ((qh[1] << 8) & 0x700)),
                               static_cast<uint16_t>(qs[3] | ((qh[1] << 4) & 0x700))};
      const float delta[4] = {qh[0] & 0x08 ? -kIq1Delta : kIq1Delta, qh[0] & 0x80 ? -kIq1Delta : kIq1Delta,
                              qh[1] & 0x08 ? -kIq1Delta : kIq1Delta, qh[1] & 0x80 ? -kIq1Delta : kIq1Delta};
      for (int l = 0; l < 4; ++l) {
        const float dl = l < 2 ? dl1 : dl2;
        const auto& grid = kIq1s[idx[l]];
        for (int j = 0; j < 8; ++j) y[j] = dl * (fl(static_cast<int8_t>(grid[j])) + delta[l]);
        y += 8;
      }
      qs += 4;
      qh += 2;
    }
  }
}

}  // namespace peft::quant
