// ggml's K-quants (super-blocks of 256 values): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K quantized as
// ggml-quants.c's quantize_row_*_ref (what ggml_quantize_chunk runs without an importance matrix)
// and dequantized as dequantize_row_*, plus the Q8_K and IQ4_XS dequantizers. Operation for
// operation the same C arithmetic (int -> float conversions where C makes them, the same
// evaluation order; this file is compiled without floating-point contraction), so the results are
// ggml's bytes and floats.
#include "core/no_fp_contract.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant/ggml_quant_k_lanes.hpp"
#include "core/quant/ggml_quant_support.hpp"

namespace peft::quant {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

float fl(int v) { return static_cast<float>(v); }

// ggml's make_qx_quants with qw = NULL (symmetric levels -nmax..nmax-1 stored as L + nmax; rmse_type
// 1 weighs by x^2, the only form the reference quantizers use).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  auto weight = [&](int i) {
    return rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1.0f : rmse_type == 3 ? std::fabs(x[i]) : std::sqrt(std::fabs(x[i]));
  };
  float iscale = fl(-nmax) / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) {
      const int l = nearest_int(iscale * x[i]);
      L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
    }
    return 1.0f / iscale;
  }
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * fl(l);
    suml2 += w * fl(l) * fl(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(fl(nmax) + 0.1f * fl(is)) / max;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = weight(i);
      sumlx += w * x[i] * fl(l);
      suml2 += w * fl(l) * fl(l);
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's make_q3_quants with do_rmse = true.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.0f;
  }
  const float iscale = fl(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * fl(l);
    suml2 += w * fl(l) * fl(l);
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * fl(L[i]);
      if (slx > 0.0f) {
        float sl2 = suml2 - w * fl(L[i]) * fl(L[i]);
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * fl(new_l);
          sl2 += w * fl(new_l) * fl(new_l);
          if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// ggml's make_qkx2_quants: levels 0..nmax with a scale and a min, searched over nstep + 1 candidate
// scales; returns the scale and stores -min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = fl(nmax) / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * fl(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * fl(is) + fl(nmax)) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * fl(l);
      sum_l2 += w * fl(l) * fl(l);
      sum_xl += w * fl(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * fl(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// Q4_K and Q5_K share the 12-byte scale packing and the final levels; nmax 15 or 31. scales and mins:
// the super-block's eight sub-block results of make_qkx2_quants (KLanes::qkx2_32).
void finish_k_scales(const KLanes& lanes, const float* x, int nmax, const float* scales, const float* mins, uint8_t* L,
                     uint8_t* d_out, uint8_t* scales_out) {
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < QK_K / 32; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      scales_out[j] = ls;
      scales_out[j + 4] = lm;
    } else {
      scales_out[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      scales_out[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      scales_out[j - 0] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  store_f16(d_out, max_scale / 63.0f);
  store_f16(d_out + 2, max_min / 63.0f);
  const float d_all = load_f16(d_out);
  const float dmin_all = load_f16(d_out + 2);
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, scales_out, &sc, &m);
    const float d = d_all * fl(sc);
    if (d == 0.0f) continue;
    lanes.levels_32(x + 32 * j, d, dmin_all * fl(m), nmax, L + 32 * j);
  }
}

// The reference sub-block searches, one sub-block after another, as ggml's quantize_row_*_ref.
void scalar_qkx2_32(const float* x, uint64_t groups, int nmax, float rmin, int nstep, uint8_t* L, float* scales,
                    float* mins) {
  uint8_t Laux[32];
  float weights[32];
  for (uint64_t g = 0; g < groups; ++g, x += 32, L += 32) {
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += x[l] * x[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[l]);
    scales[g] = make_qkx2_quants(32, nmax, x, weights, L, &mins[g], Laux, rmin, 0.1f, nstep, false);
  }
}

void scalar_qx_16(const float* x, uint64_t groups, int8_t* L, float* scales) {
  for (uint64_t g = 0; g < groups; ++g) scales[g] = make_qx_quants(16, 32, x + 16 * g, L + 16 * g, 1);
}

void scalar_levels_32(const float* x, float d, float dm, int nmax, uint8_t* L) {
  for (int ii = 0; ii < 32; ++ii) {
    int l = nearest_int((x[ii] + dm) / d);
    L[ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
  }
}

// The scale and min of sub-blocks `is` and `is + 1` of a Q4_K or Q5_K block: d·scale, dmin·min.
struct SubBlockPair {
  float d1, m1, d2, m2;
};
SubBlockPair sub_block_pair(const uint8_t* scales, int is, float d, float dmin) {
  uint8_t sc1, mn1, sc2, mn2;
  scale_min_k4(is, scales, &sc1, &mn1);
  scale_min_k4(is + 1, scales, &sc2, &mn2);
  return {d * fl(sc1), dmin * fl(mn1), d * fl(sc2), dmin * fl(mn2)};
}

// Q4_K and Q5_K values: d·scale·q − dmin·min for each 32-value sub-block, q the nibble (plus 16 where
// Q5_K's qh holds the fifth bit). Q4_K: header, qs[128]; Q5_K: header, qh[32], qs[128].
template <bool kFifthBit>
void dequantize_k_nibbles(const uint8_t* in, float* y, uint64_t blocks) {
  constexpr uint64_t kBlockBytes = kFifthBit ? 176 : 144;
  for (uint64_t b = 0; b < blocks; ++b, in += kBlockBytes) {
    const float d = load_f16(in);
    const float min = load_f16(in + 2);
    const uint8_t* scales = in + 4;
    const uint8_t* qh = in + 16;  // Q5_K only
    const uint8_t* ql = in + (kFifthBit ? 48 : 16);
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32) {
      const auto [d1, m1, d2, m2] = sub_block_pair(scales, is, d, min);
      for (int l = 0; l < 32; ++l) *y++ = d1 * fl((ql[l] & 0xF) + (kFifthBit && (qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * fl((ql[l] >> 4) + (kFifthBit && (qh[l] & u2) ? 16 : 0)) - m2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

// Super-blocks are searched in chunks of this many: the lanes run over all their sub-blocks at once.
constexpr uint64_t kChunkBlocks = 16;

// Q4_K and Q5_K: searches the super-blocks a chunk at a time (the lanes run over all its sub-blocks at
// once), writes each block's header (d, dmin, scales[12]), then hands its levels to pack(L, block).
template <class Pack>
void quantize_k_blocks(const KLanes& lanes, const float* x, uint8_t* out, uint64_t blocks, int nmax, float rmin,
                       int nstep, uint64_t block_bytes, Pack&& pack) {
  uint8_t Ls[kChunkBlocks * QK_K];
  float scales[kChunkBlocks * 8], mins[kChunkBlocks * 8];
  for (uint64_t first = 0; first < blocks; first += kChunkBlocks) {
    const uint64_t count = std::min(kChunkBlocks, blocks - first);
    const float* chunk = x + first * QK_K;
    lanes.qkx2_32(chunk, count * 8, nmax, rmin, nstep, Ls, scales, mins);
    for (uint64_t b = 0; b < count; ++b) {
      uint8_t* L = Ls + b * QK_K;
      uint8_t* block = out + (first + b) * block_bytes;
      finish_k_scales(lanes, chunk + b * QK_K, nmax, scales + 8 * b, mins + 8 * b, L, block, block + 4);
      pack(L, block);
    }
  }
}

}  // namespace

const KLanes& k_lanes_scalar() {
  static const KLanes table{"scalar", scalar_qkx2_32, scalar_qx_16, scalar_levels_32};
  return table;
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] (2 bits), f16 d, f16 dmin.
void quantize_q2_k(const float* x, uint8_t* out, uint64_t blocks) {
  uint8_t L[QK_K], Laux[16];
  float weights[16], mins[QK_K / 16], scales[QK_K / 16];
  constexpr float q4scale = 15.0f;
  for (uint64_t b = 0; b < blocks; ++b, x += QK_K, out += 84) {
    uint8_t* y_scales = out;
    uint8_t* qs = out + 16;
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < QK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0.0f) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) y_scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      store_f16(out + 80, max_scale / q4scale);
    } else {
      for (int j = 0; j < QK_K / 16; ++j) y_scales[j] = 0;
      store_f16(out + 80, 0.0f);
    }
    if (max_min > 0.0f) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < QK_K / 16; ++j) {
        const int l = nearest_int(iscale * mins[j]);
        y_scales[j] = static_cast<uint8_t>(y_scales[j] | (l << 4));
      }
      store_f16(out + 82, max_min / q4scale);
    } else {
      store_f16(out + 82, 0.0f);
    }
    const float d_all = load_f16(out + 80);
    const float dmin_all = load_f16(out + 82);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = d_all * fl(y_scales[j] & 0xF);
      if (d == 0.0f) continue;
      const float dm = dmin_all * fl(y_scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    for (int j = 0; j < QK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

void dequantize_q2_k(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 84) {
    const uint8_t* scales = in;
    const uint8_t* q = in + 16;
    const float d = load_f16(in + 80);
    const float min = load_f16(in + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc = scales[is++];
        float dl = d * fl(sc & 0xF), ml = min * fl(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * fl((q[l] >> shift) & 3) - ml;
        sc = scales[is++];
        dl = d * fl(sc & 0xF);
        ml = min * fl(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * fl((q[l + 16] >> shift) & 3) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

// Q3_K: hmask[32] (third bits), qs[64] (low 2 bits), scales[12] (6-bit signed scales), f16 d.
void quantize_q3_k(const float* x, uint8_t* out, uint64_t blocks) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (uint64_t b = 0; b < blocks; ++b, x += QK_K, out += 110) {
    uint8_t* hmask = out;
    uint8_t* qs = out + 32;
    uint8_t* y_scales = out + 96;
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y_scales, 0, 12);
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) {
        int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<int8_t>(std::max(-32, std::min(31, int(l))) + 32);
        if (j < 8) {
          y_scales[j] = static_cast<uint8_t>(l & 0xF);
        } else {
          y_scales[j - 8] = static_cast<uint8_t>(y_scales[j - 8] | ((l & 0xF) << 4));
        }
        l = static_cast<int8_t>(l >> 4);
        y_scales[j % 4 + 8] = static_cast<uint8_t>(y_scales[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      store_f16(out + 108, 1.0f / iscale);
    } else {
      store_f16(out + 108, 0.0f);
    }
    const float d_all = load_f16(out + 108);
    for (int j = 0; j < QK_K / 16; ++j) {
      int8_t sc = static_cast<int8_t>(j < 8 ? y_scales[j] & 0xF : y_scales[j - 8] >> 4);
      sc = static_cast<int8_t>((sc | (((y_scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
      const float d = d_all * fl(sc);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-4, std::min(3, l));
        L[16 * j + ii] = static_cast<int8_t>(l + 4);
      }
    }
    std::memset(hmask, 0, QK_K / 8);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; ++j) {
      if (L[j] > 3) {
        hmask[m] |= hm;
        L[j] = static_cast<int8_t>(L[j] - 4);
      }
      if (++m == QK_K / 8) {
        m = 0;
        hm = static_cast<uint8_t>(hm << 1);
      }
    }
    for (int j = 0; j < QK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

void dequantize_q3_k(const uint8_t* in, float* y, uint64_t blocks) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  for (uint64_t b = 0; b < blocks; ++b, in += 110) {
    const uint8_t* hm = in;
    const uint8_t* q = in + 32;
    const float d_all = load_f16(in + 108);
    uint32_t aux[4];
    std::memcpy(aux, in + 96, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = d_all * fl(scales[is++] - 32);
        for (int l = 0; l < 16; ++l) *y++ = dl * fl(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        dl = d_all * fl(scales[is++] - 32);
        for (int l = 0; l < 16; ++l) *y++ = dl * fl(((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
        shift += 2;
        m = static_cast<uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

// Q4_K: f16 d, f16 dmin, scales[12] (6-bit scales and mins), qs[128] (nibbles).
void quantize_q4_k_with(const KLanes& lanes, const float* x, uint8_t* out, uint64_t blocks) {
  quantize_k_blocks(lanes, x, out, blocks, 15, -1.0f, 20, 144, [](const uint8_t* L, uint8_t* block) {
    uint8_t* q = block + 16;
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  });
}

void quantize_q4_k(const float* x, uint8_t* out, uint64_t blocks) { quantize_q4_k_with(k_lanes_active(), x, out, blocks); }

void dequantize_q4_k(const uint8_t* in, float* y, uint64_t blocks) { dequantize_k_nibbles<false>(in, y, blocks); }

// Q5_K: f16 d, f16 dmin, scales[12], qh[32] (fifth bits), qs[128] (nibbles).
void quantize_q5_k_with(const KLanes& lanes, const float* x, uint8_t* out, uint64_t blocks) {
  quantize_k_blocks(lanes, x, out, blocks, 31, -0.5f, 15, 176, [](const uint8_t* L, uint8_t* block) {
    uint8_t* qh = block + 16;
    uint8_t* ql = qh + 32;
    std::memset(qh, 0, QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  });
}

void quantize_q5_k(const float* x, uint8_t* out, uint64_t blocks) { quantize_q5_k_with(k_lanes_active(), x, out, blocks); }

void dequantize_q5_k(const uint8_t* in, float* y, uint64_t blocks) { dequantize_k_nibbles<true>(in, y, blocks); }

// Q6_K: ql[128] (low nibbles), qh[64] (high 2 bits), int8 scales[16], f16 d.
void quantize_q6_k_with(const KLanes& lanes, const float* x, uint8_t* out, uint64_t blocks) {
  int8_t Ls[kChunkBlocks * QK_K];
  float all_scales[kChunkBlocks * (QK_K / 16)];
  for (uint64_t b = 0; b < blocks; ++b, x += QK_K, out += 210) {
    if (b % kChunkBlocks == 0) lanes.qx_16(x, std::min(kChunkBlocks, blocks - b) * (QK_K / 16), Ls, all_scales);
    int8_t* L = Ls + (b % kChunkBlocks) * QK_K;
    const float* scales = all_scales + (b % kChunkBlocks) * (QK_K / 16);
    float max_scale = 0.0f, max_abs_scale = 0.0f;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const float scale = scales[ib];
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(out, 0, 210);
      continue;
    }
    auto* y_scales = reinterpret_cast<int8_t*>(out + 192);
    const float iscale = -128.0f / max_scale;
    store_f16(out + 208, 1.0f / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) y_scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    const float d_all = load_f16(out + 208);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = d_all * fl(y_scales[j]);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = std::max(-32, std::min(31, l));
        L[16 * j + ii] = static_cast<int8_t>(l + 32);
      }
    }
    uint8_t* ql = out;
    uint8_t* qh = out + 128;
    for (int j = 0; j < QK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF;
        const uint8_t q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF;
        const uint8_t q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                     ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
  }
}

void quantize_q6_k(const float* x, uint8_t* out, uint64_t blocks) { quantize_q6_k_with(k_lanes_active(), x, out, blocks); }

void dequantize_q6_k(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 210) {
    const uint8_t* ql = in;
    const uint8_t* qh = in + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(in + 192);
    const float d = load_f16(in + 208);
    for (int n = 0; n < QK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>(((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        const int8_t q2 = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        const int8_t q3 = static_cast<int8_t>(((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        const int8_t q4 = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        y[l + 0] = d * fl(sc[is + 0]) * fl(q1);
        y[l + 32] = d * fl(sc[is + 2]) * fl(q2);
        y[l + 64] = d * fl(sc[is + 4]) * fl(q3);
        y[l + 96] = d * fl(sc[is + 6]) * fl(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// Q8_K: f32 d, int8 qs[256], int16 bsums[16] (unused here). value = d x q.
void dequantize_q8_k(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 292) {
    float d;
    std::memcpy(&d, in, 4);
    for (int j = 0; j < QK_K; ++j) *y++ = d * fl(static_cast<int8_t>(in[4 + j]));
  }
}

// IQ4_XS: f16 d, u16 scales_h, scales_l[4], qs[128]; 6-bit sub-block scales, IQ4_NL levels.
void dequantize_iq4_xs(const uint8_t* in, float* y, uint64_t blocks) {
  for (uint64_t b = 0; b < blocks; ++b, in += 136) {
    const float d = load_f16(in);
    uint16_t scales_h;
    std::memcpy(&scales_h, in + 2, 2);
    const uint8_t* scales_l = in + 4;
    const uint8_t* qs = in + 8;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
      const float dl = d * fl(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j + 0] = dl * fl(kIq4nlValues[qs[j] & 0xf]);
        y[j + 16] = dl * fl(kIq4nlValues[qs[j] >> 4]);
      }
      y += 32;
      qs += 16;
    }
  }
}

}  // namespace peft::quant
