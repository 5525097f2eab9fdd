// One source for every kernel table: the loop bodies below are inlined into wrappers compiled
// for each instruction set (GCC/Clang target attributes), so the compiler vectorises the same
// arithmetic three times. No floating-point contraction: the only fused operations are the
// explicit std::fma calls, which round once on every target, hence bit-identical tables.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/kernels/merge_kernels.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/bf16.hpp"
#include "core/f16.hpp"
#include "core/kernel_level.hpp"

#include "core/kernel_target.hpp"

#ifdef PEFT_KERNELS_X86
#include <immintrin.h>
#endif

namespace peft::merge::kernels {
namespace {

// ---- storage access ---------------------------------------------------------------------------

// Element-wise passes run over a row in chunks: convert kChunk elements to f32 on the stack,
// compute there, convert back. Separate conversion loops vectorise better than mixed ones, and
// the f16 conversion can use the F16C instructions where the table's target has them. (add_rounded,
// the merges' hot pass, fuses its loop for f32 and bf16, which measured faster.)
constexpr int kChunk = 256;

// f16 <-> f32 in portable C++ (core/f16.hpp).
struct SoftHalf {
  PEFT_INLINE static void to_f32(const uint16_t* p, int n, float* out) {
    for (int i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
  }
  PEFT_INLINE static void from_f32(const float* in, int n, uint16_t* p) {
    for (int i = 0; i < n; ++i) p[i] = f32_to_f16(in[i]);
  }
};

template <Storage S, class Half>
PEFT_INLINE void load_chunk(const void* w, int64_t j0, int n, float* x) {
  if constexpr (S == Storage::f32) {
    const float* p = static_cast<const float*>(w) + j0;
    for (int i = 0; i < n; ++i) x[i] = p[i];
  } else if constexpr (S == Storage::bf16) {
    const uint16_t* p = static_cast<const uint16_t*>(w) + j0;
    for (int i = 0; i < n; ++i) x[i] = bf16_to_f32(p[i]);
  } else {
    Half::to_f32(static_cast<const uint16_t*>(w) + j0, n, x);
  }
}

template <Storage S, class Half>
PEFT_INLINE void store_chunk(void* w, int64_t j0, int n, const float* x) {
  if constexpr (S == Storage::f32) {
    float* p = static_cast<float*>(w) + j0;
    for (int i = 0; i < n; ++i) p[i] = x[i];
  } else if constexpr (S == Storage::bf16) {
    uint16_t* p = static_cast<uint16_t*>(w) + j0;
    for (int i = 0; i < n; ++i) p[i] = f32_to_bf16(x[i]);
  } else {
    Half::from_f32(x, n, static_cast<uint16_t*>(w) + j0);
  }
}

inline int chunk_size(int64_t j0, int64_t n) { return static_cast<int>(n - j0 < kChunk ? n - j0 : kChunk); }

// The smallest magnitude that is stored as an infinity (round to nearest even: the halfway point
// above the largest finite value rounds up, its last mantissa bit being odd). An f32 x is stored
// as an infinity or NaN exactly when !(|x| < limit), NaN included: one compare per element in the
// loop that stores it.
template <Storage S>
constexpr float non_finite_limit() {
  if constexpr (S == Storage::f32) return __builtin_huge_valf();
  else if constexpr (S == Storage::bf16) return 0x1.FFp127f;  // bf16 max 0x1.FEp127 + half an ulp
  else return 65520.0f;                                        // f16 max 65504 + half an ulp
}

// 1 when any of x[0..m) is stored as an infinity or NaN in S.
template <Storage S>
PEFT_INLINE unsigned any_non_finite(const float* x, int m) {
  constexpr float limit = non_finite_limit<S>();
  unsigned bad = 0;
  for (int i = 0; i < m; ++i) bad |= static_cast<unsigned>(!(std::fabs(x[i]) < limit));
  return bad;
}

// ---- low-rank product -------------------------------------------------------------------------

// One RB x W tile of C: the accumulators stay in registers while k runs over the rank.
template <int RB, int W>
PEFT_INLINE void lowrank_tile(const float* L, const float* R, int64_t cols, int64_t rank, float coef,
                              bool accumulate, float* C) {
  // k = 0 peeled: fma(l, r, +0) as from a zeroed tile, without the zeroing, which GCC made a memset
  // of the tile on the stack (6% to 12% of the kernel's time at rank 16).
  float acc[RB][W];
  for (int u = 0; u < RB; ++u) {
    const float l = rank > 0 ? L[u * rank] : 0.0f;
    for (int v = 0; v < W; ++v) acc[u][v] = std::fma(l, rank > 0 ? R[v] : 0.0f, 0.0f);
  }
  for (int64_t k = 1; k < rank; ++k) {
    const float* r = R + k * cols;
    for (int u = 0; u < RB; ++u) {
      const float l = L[u * rank + k];
      for (int v = 0; v < W; ++v) acc[u][v] = std::fma(l, r[v], acc[u][v]);
    }
  }
  if (accumulate) {
    for (int u = 0; u < RB; ++u)
      for (int v = 0; v < W; ++v) C[u * cols + v] = std::fma(coef, acc[u][v], C[u * cols + v]);
  } else {
    for (int u = 0; u < RB; ++u)
      for (int v = 0; v < W; ++v) C[u * cols + v] = std::fma(coef, acc[u][v], -0.0f);
  }
}

// Column tiles outermost, so that one W-wide panel of R (rank x W floats) is reused from L1/L2
// by every row of the block; the columns that do not fill a tile go one at a time through the
// same sequence of fmas, so every element is computed identically wherever it falls.
template <int RB, int W>
PEFT_INLINE void lowrank_body(const float* L, const float* R, int64_t rows, int64_t cols, int64_t rank,
                              float coef, bool accumulate, float* C) {
  const int64_t full_rows = rows / RB * RB;
  int64_t j = 0;
  for (; j + W <= cols; j += W) {
    for (int64_t i = 0; i < full_rows; i += RB)
      lowrank_tile<RB, W>(L + i * rank, R + j, cols, rank, coef, accumulate, C + i * cols + j);
    for (int64_t i = full_rows; i < rows; ++i)
      lowrank_tile<1, W>(L + i * rank, R + j, cols, rank, coef, accumulate, C + i * cols + j);
  }
  for (; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      float acc = 0.0f;
      for (int64_t k = 0; k < rank; ++k) acc = std::fma(L[i * rank + k], R[k * cols + j], acc);
      float& c = C[i * cols + j];
      c = std::fma(coef, acc, accumulate ? c : -0.0f);
    }
  }
}

// ---- element-wise passes ----------------------------------------------------------------------

// How a table writes a buffer that is not read back soon (add_rounded from another buffer, copy):
// Out::stream stores whole cache lines past the caches where the target has such stores (StreamOut,
// x86), since a plain store first reads each line from memory; PlainOut (the portable table) has
// plain stores only.
struct PlainOut {
  static constexpr bool streams = false;
  PEFT_INLINE static void stream(void*, const void*, size_t) {}
  PEFT_INLINE static void fence() {}
};

template <Storage S, class Half, class Out>
PEFT_INLINE bool add_rounded_body(void* w, const void* from, const float* d, int64_t n) {
  constexpr size_t esize = storage_bytes(S);
  float x[kChunk];
  unsigned bad = 0;
  // Streamed: each chunk but the first starts on a cache line of w, so that whole lines are streamed.
  const bool stream = Out::streams && from != w && reinterpret_cast<uintptr_t>(w) % esize == 0;
  int64_t first = kChunk;
  if (stream) first = static_cast<int64_t>((64 - reinterpret_cast<uintptr_t>(w) % 64) % 64 / esize);
  alignas(64) unsigned char staged[kChunk * esize];
  for (int64_t j0 = 0; j0 < n;) {
    const int m = j0 == 0 && first > 0 ? chunk_size(0, std::min<int64_t>(first, n)) : chunk_size(j0, n);
    void* to = stream ? static_cast<void*>(staged) : static_cast<unsigned char*>(w) + static_cast<size_t>(j0) * esize;
    if constexpr (S == Storage::f16) {  // through Half's conversions (F16C on x86)
      load_chunk<S, Half>(from, j0, m, x);
      for (int i = 0; i < m; ++i) x[i] = x[i] + d[j0 + i];
      bad |= any_non_finite<S>(x, m);
      store_chunk<S, Half>(to, 0, m, x);
    } else {
      // One fused pass (twice the speed of the chunk's passes for f32, 10% to 15% for bf16). A bf16
      // value widens by a shift alone: the add makes a signalling NaN quiet, as bf16_to_f32 would.
      constexpr float limit = non_finite_limit<S>();
      for (int i = 0; i < m; ++i) {
        float v;
        if constexpr (S == Storage::f32) v = static_cast<const float*>(from)[j0 + i] + d[j0 + i];
        else v = std::bit_cast<float>(uint32_t{static_cast<const uint16_t*>(from)[j0 + i]} << 16) + d[j0 + i];
        bad |= static_cast<unsigned>(!(std::fabs(v) < limit));
        if constexpr (S == Storage::f32) static_cast<float*>(to)[i] = v;
        else static_cast<uint16_t*>(to)[i] = f32_to_bf16(v);
      }
    }
    if (stream) Out::stream(static_cast<unsigned char*>(w) + static_cast<size_t>(j0) * esize, staged, static_cast<size_t>(m) * esize);
    j0 += m;
  }
  if (stream) Out::fence();
  return bad != 0;
}

template <class Out>
PEFT_INLINE void copy_body(void* to, const void* from, size_t bytes) {
  if (!Out::streams) {
    std::memcpy(to, from, bytes);
    return;
  }
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(to) % 64) % 64);
  std::memcpy(to, from, head);
  Out::stream(static_cast<unsigned char*>(to) + head, static_cast<const unsigned char*>(from) + head, bytes - head);
  Out::fence();
}

template <Storage S, class Half>
PEFT_INLINE double sum_squares_body(const void* w, const float* d, int64_t n) {
  // x is a float, so x * x is exact in double: whether the add is fused or not cannot matter.
  // Chunks are multiples of 8, so element j always lands in lane j % 8.
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float x[kChunk];
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int m = chunk_size(j0, n);
    load_chunk<S, Half>(w, j0, m, x);
    for (int i = 0; i < m; ++i) x[i] = x[i] + d[j0 + i];
    int i = 0;
    for (; i + 8 <= m; i += 8)
      for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
    for (int l = 0; i < m; ++i, ++l) lane[l] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

template <Storage S, class Half>
PEFT_INLINE void accumulate_squares_body(const void* w, const float* d, double* acc, int64_t n) {
  float x[kChunk];
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int m = chunk_size(j0, n);
    load_chunk<S, Half>(w, j0, m, x);
    for (int i = 0; i < m; ++i) {
      const double v = static_cast<double>(x[i] + d[j0 + i]);
      acc[j0 + i] += v * v;
    }
  }
}

// stride 0: one factor for the row; 1: one per column.
template <Storage S, class Half>
PEFT_INLINE bool dora_apply_body(void* w, const float* d, const float* factor, int64_t stride, int64_t n) {
  float x[kChunk];
  unsigned bad = 0;
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int m = chunk_size(j0, n);
    load_chunk<S, Half>(w, j0, m, x);
    if (stride == 0) {
      const float f = factor[0];
      for (int i = 0; i < m; ++i) x[i] = f * (x[i] + d[j0 + i]);
    } else {
      for (int i = 0; i < m; ++i) x[i] = factor[j0 + i] * (x[i] + d[j0 + i]);
    }
    bad |= any_non_finite<S>(x, m);
    store_chunk<S, Half>(w, j0, m, x);
  }
  return bad != 0;
}

template <Storage S, class Half>
PEFT_INLINE void dora_remove_body(void* w, const float* d, const float* factor, int64_t stride, int64_t n) {
  float x[kChunk];
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int m = chunk_size(j0, n);
    load_chunk<S, Half>(w, j0, m, x);
    if (stride == 0) {
      const float f = factor[0];
      for (int i = 0; i < m; ++i) x[i] = x[i] / f - d[j0 + i];
    } else {
      for (int i = 0; i < m; ++i) x[i] = x[i] / factor[j0 + i] - d[j0 + i];
    }
    store_chunk<S, Half>(w, j0, m, x);
  }
}

// Dispatches on the storage dtype inside the target-specific wrapper, so each instantiation is
// compiled (and vectorised) for that target.
#define PEFT_STORAGE_SWITCH(s, fn, ...)                               \
  switch (s) {                                                        \
    case Storage::f32: return fn<Storage::f32, Half>(__VA_ARGS__);    \
    case Storage::bf16: return fn<Storage::bf16, Half>(__VA_ARGS__);  \
    case Storage::f16: return fn<Storage::f16, Half>(__VA_ARGS__);    \
  }

#define PEFT_STORAGE_SWITCH_OUT(s, fn, ...)                                \
  switch (s) {                                                             \
    case Storage::f32: return fn<Storage::f32, Half, Out>(__VA_ARGS__);    \
    case Storage::bf16: return fn<Storage::bf16, Half, Out>(__VA_ARGS__);  \
    case Storage::f16: return fn<Storage::f16, Half, Out>(__VA_ARGS__);    \
  }

// Stamps out a kernel table for one instruction set. RB x W is the register tile of lowrank.
#define PEFT_DEFINE_TABLE(NS, NAME, ATTR, RB, W, HALF, OUT)                                                      \
  namespace NS {                                                                                           \
  using Half = HALF;                                                                                       \
  using Out = OUT;                                                                                         \
  ATTR void lowrank(const float* L, const float* R, int64_t rows, int64_t cols, int64_t rank, float coef, \
                    bool accumulate, float* C) {                                                           \
    lowrank_body<RB, W>(L, R, rows, cols, rank, coef, accumulate, C);                                      \
  }                                                                                                        \
  ATTR bool add_rounded(Storage s, void* w, const void* from, const float* d, int64_t n) {                 \
    PEFT_STORAGE_SWITCH_OUT(s, add_rounded_body, w, from, d, n);                                           \
    return false;                                                                                          \
  }                                                                                                        \
  ATTR double sum_squares(Storage s, const void* w, const float* d, int64_t n) {                           \
    PEFT_STORAGE_SWITCH(s, sum_squares_body, w, d, n);                                                     \
    return 0.0;                                                                                            \
  }                                                                                                        \
  ATTR void accumulate_squares(Storage s, const void* w, const float* d, double* acc, int64_t n) {         \
    PEFT_STORAGE_SWITCH(s, accumulate_squares_body, w, d, acc, n);                                         \
  }                                                                                                        \
  ATTR bool dora_apply(Storage s, void* w, const float* d, const float* f, int64_t stride, int64_t n) {    \
    PEFT_STORAGE_SWITCH(s, dora_apply_body, w, d, f, stride, n);                                           \
    return false;                                                                                          \
  }                                                                                                        \
  ATTR void dora_remove(Storage s, void* w, const float* d, const float* f, int64_t stride, int64_t n) {   \
    PEFT_STORAGE_SWITCH(s, dora_remove_body, w, d, f, stride, n);                                          \
  }                                                                                                        \
  ATTR void copy(void* to, const void* from, size_t bytes) { copy_body<Out>(to, from, bytes); }             \
  const Table table{NAME, lowrank, add_rounded, sum_squares, accumulate_squares, dora_apply, dora_remove,   \
                    copy};                                                                                 \
  }

PEFT_DEFINE_TABLE(portable_impl, "portable", , 4, 16, SoftHalf, PlainOut)

#ifdef PEFT_KERNELS_X86
// f16 <-> f32 with the F16C instructions: IEEE conversions, round to nearest even, NaN made quiet
// with its top payload bits kept, i.e. the same bits as core/f16.hpp. Plain calls (once per chunk):
// GCC will not inline a function with more target features into the generic chunk helpers.
struct F16cHalf {
  __attribute__((target("avx,f16c"))) static void to_f32(const uint16_t* p, int n, float* out) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
    for (; i < n; ++i) out[i] = _cvtsh_ss(p[i]);
  }
  __attribute__((target("avx,f16c"))) static void from_f32(const float* in, int n, uint16_t* p) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; ++i) p[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

// Non-temporal stores of the whole 32-byte pieces (AVX) when `to` is 32-byte aligned, plain stores
// of the rest; callers start `to` on a cache line (add_rounded_body after its first chunk, copy_body
// after its head). The fence orders the streamed stores before whatever the thread does next (the
// hand-back to the thread that started the loop included).
struct StreamOut {
  static constexpr bool streams = true;
  __attribute__((target("avx"))) static void stream(void* to, const void* from, size_t bytes) {
    auto* out = static_cast<unsigned char*>(to);
    const auto* in = static_cast<const unsigned char*>(from);
    size_t i = 0;
    if (reinterpret_cast<uintptr_t>(out) % 32 == 0)
      for (; i + 32 <= bytes; i += 32)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    std::memcpy(out + i, in + i, bytes - i);
  }
  static void fence() { _mm_sfence(); }
};

PEFT_DEFINE_TABLE(avx2_impl, "avx2", __attribute__((target("avx2,fma,f16c"))), 4, 16, F16cHalf, StreamOut)
PEFT_DEFINE_TABLE(avx512_impl, "avx512", __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))),
                  4, 64, F16cHalf, StreamOut)
#endif

}  // namespace

PEFT_KERNEL_TABLE_GETTERS(Table, portable_impl::table, avx2_impl::table, avx512_impl::table)

}  // namespace peft::merge::kernels
