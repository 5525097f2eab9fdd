// The K-quant sub-block searches across SIMD lanes (ggml_quant_k_lanes.hpp). The bodies below work on
// W sub-blocks at once, transposed so that lane k holds sub-block k: every vector statement is the
// scalar statement of ggml's make_qkx2_quants / make_qx_quants for W independent sub-blocks; ggml's
// branches become per-lane selects of values computed anyway. No lane's arithmetic is reordered or
// fused (this file is compiled without floating-point contraction), so each lane gives the scalar
// reference's bits whatever the vector width. The bodies (ggml_quant_k_lanes.inc) are compiled once
// per instruction set under a target pragma, with W the native vector width (wider generic vectors
// are split by the compiler into scalar compares).
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "core/quant/ggml_quant_k_lanes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/kernel_target.hpp"
#include "core/quant/ggml_quant_support.hpp"

// Vector arguments of the always-inlined helpers below: GCC warns that their ABI would depend on
// the target; they are never called across a target boundary.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace peft::quant {
namespace {

PEFT_INLINE float fl(int v) { return static_cast<float>(v); }

// One table per instruction set: the bodies (ggml_quant_k_lanes.inc) compiled under its target,
// W lanes per body.
#define PEFT_K_LANES_TABLE(NAME)                                                                               \
  void qkx2_32(const float* x, uint64_t groups, int nmax, float rmin, int nstep, uint8_t* L, float* scales,   \
               float* mins) {                                                                                  \
    qkx2_32_groups(x, groups, nmax, rmin, nstep, L, scales, mins);                                             \
  }                                                                                                            \
  void qx_16(const float* x, uint64_t groups, int8_t* L, float* scales) { qx_16_groups(x, groups, L, scales); } \
  void levels_32(const float* x, float d, float dm, int nmax, uint8_t* L) { levels_32_body(x, d, dm, nmax, L); } \
  const KLanes table{NAME, qkx2_32, qx_16, levels_32};

namespace portable_impl {
constexpr int W = 4;
#include "core/quant/ggml_quant_k_lanes.inc"
PEFT_K_LANES_TABLE("portable")
}  // namespace portable_impl

#ifdef PEFT_KERNELS_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
namespace avx2_impl {
constexpr int W = 8;
#include "core/quant/ggml_quant_k_lanes.inc"
PEFT_K_LANES_TABLE("avx2")
}  // namespace avx2_impl
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2")
#endif
namespace avx512_impl {
constexpr int W = 16;
#include "core/quant/ggml_quant_k_lanes.inc"
PEFT_K_LANES_TABLE("avx512")
}  // namespace avx512_impl
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

}  // namespace

const KLanes* k_lanes(kernels::Level level) {
  using kernels::Level;
  if (level == Level::portable) return &portable_impl::table;
#ifdef PEFT_KERNELS_X86
  if (level > kernels::supported_level()) return nullptr;
  if (level == Level::avx2) return &avx2_impl::table;
  if (level == Level::avx512) return &avx512_impl::table;
#endif
  return nullptr;
}

const KLanes& k_lanes_active() {
  static const KLanes& chosen = []() -> const KLanes& {
    const KLanes* t = k_lanes(kernels::chosen_level());
    return t != nullptr ? *t : portable_impl::table;
  }();
  return chosen;
}

}  // namespace peft::quant
