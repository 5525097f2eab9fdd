// The sub-block searches of ggml's K-quant reference quantizers, the part where their time goes, run
// on many sub-blocks at once: each SIMD lane carries one sub-block through ggml's sequential scalar
// arithmetic in the same order (same divisions, same nearest_int, no contraction, no reassociation),
// so every lane's result is the scalar reference's bit for bit. One source compiled per instruction
// set (portable, avx2, avx512; ggml_quant_k_lanes.cpp), chosen like the other kernel tables
// (core/kernel_level.hpp). Internal to core/quant.
#pragma once

#include <cstdint>

#include "core/kernel_level.hpp"

namespace peft::quant {

struct KLanes {
  const char* name;
  // Q4_K / Q5_K: `groups` consecutive sub-blocks of 32 values at x. For each, the weights
  // sqrt(mean(x^2)) + |x| and ggml's make_qkx2_quants(32, nmax, x, weights, L, &min, Laux, rmin,
  // 0.1f, nstep, false): levels to L (32 per sub-block), the scale to scales, the negated min to mins.
  void (*qkx2_32)(const float* x, uint64_t groups, int nmax, float rmin, int nstep, uint8_t* L, float* scales,
                  float* mins);
  // Q6_K: `groups` consecutive sub-blocks of 16 values; ggml's make_qx_quants(16, 32, x, L, 1): levels
  // to L (16 per sub-block, stored as l + 32), the scale to scales.
  void (*qx_16)(const float* x, uint64_t groups, int8_t* L, float* scales);
  // Q4_K / Q5_K: the final levels of one sub-block of 32 values at x, from its stored scale d (not 0)
  // and min dm, as quantize_row_q4_K_ref / q5_K_ref: L[i] = clamp(nearest_int((x[i] + dm) / d), 0, nmax).
  void (*levels_32)(const float* x, float d, float dm, int nmax, uint8_t* L);
};

// ggml's reference code, one sub-block after another (ggml_quant_k.cpp).
const KLanes& k_lanes_scalar();

// The lane tables compiled for `level`; nullptr where this CPU or build lacks it (portable: always).
const KLanes* k_lanes(kernels::Level level);

// The table of kernels::chosen_level().
const KLanes& k_lanes_active();

// The K-quant quantizers with a given table (the ones in ggml_quant_support.hpp use k_lanes_active()).
void quantize_q4_k_with(const KLanes& lanes, const float* x, uint8_t* out, uint64_t blocks);
void quantize_q5_k_with(const KLanes& lanes, const float* x, uint8_t* out, uint64_t blocks);
void quantize_q6_k_with(const KLanes& lanes, const float* x, uint8_t* out, uint64_t blocks);

}  // namespace peft::quant
