// One source for every table, as in peft/kernels/merge_kernels.cpp: the loop bodies below are
// inlined into wrappers compiled for each instruction set (GCC/Clang target attributes). The tiles
// use the compilers' generic vector types (V f32 lanes: one register of the table's width), so the
// same source becomes SSE2 or NEON, AVX2 or AVX-512 code. a * b + c is contracted into one fused
// multiply-add wherever the target has one (these products promise a bound, not bits).
// The helpers below pass vectors by value; they are always inlined into a wrapper compiled for
// the vectors' instruction set, so no call ever crosses the ABI the compilers warn about (-Wpsabi).
#if defined(__clang__)
#pragma clang fp contract(fast)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include "serve/apply_kernels.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/convert.hpp"
#include "core/f16.hpp"
#include "core/kernel_level.hpp"
#include "core/kernel_target.hpp"

namespace peft::serve::kernels {
namespace {

// Columns of an F16 A widened at a time (NR rows of this length: 16 KiB on the stack).
constexpr int64_t kF16Chunk = 1024;
// shrink: the most bytes of X's rows one column chunk takes (a share of a core's L2 cache), and the
// fewest columns of a chunk (each chunk adds a lane sum per dot product).
constexpr int64_t kShrinkChunkBytes = int64_t(512) << 10;
constexpr int64_t kShrinkMinChunk = 512;
// Below this many rows, expand() takes dot products along B's rows (no transposed panel to build).
constexpr int64_t kDotRows = 4;
// Ranks up to this build the transposed panel on the stack (at most 32 KiB); larger ranks take the
// dot path.
constexpr int64_t kPanelMaxRank = 128;
// From this many rows shrink() builds panels of an F32 or BF16 A too, for ranks that fill a panel
// (fewer rows, or a panel mostly zeros, and building it costs more than the lane sums it saves).
constexpr int64_t kPanelShrinkRows = 32;

// V f32 lanes, and V bf16 values (the attribute needs a literal size: one specialisation per V).
template <int V>
struct Lanes;
template <>
struct Lanes<4> {
  typedef float f32 __attribute__((vector_size(16)));
  typedef uint32_t u32 __attribute__((vector_size(16)));
  typedef uint16_t u16 __attribute__((vector_size(8)));
};
template <>
struct Lanes<8> {
  typedef float f32 __attribute__((vector_size(32)));
  typedef uint32_t u32 __attribute__((vector_size(32)));
  typedef uint16_t u16 __attribute__((vector_size(16)));
};
template <>
struct Lanes<16> {
  typedef float f32 __attribute__((vector_size(64)));
  typedef uint32_t u32 __attribute__((vector_size(64)));
  typedef uint16_t u16 __attribute__((vector_size(32)));
};

// The element types a kernel reads in place: f32, and bf16 (widening is a shift). F16 is widened
// into an f32 buffer first (core/convert.hpp uses F16C where the CPU has it).
struct Bf16 {
  uint16_t bits;
};

template <int V>
PEFT_INLINE typename Lanes<V>::f32 load(const float* p) {
  typename Lanes<V>::f32 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

#if __has_builtin(__builtin_shufflevector)
// V bf16 values as the 2V halves of V f32 lanes: a zero low half under each value (little-endian),
// i.e. the f32 bits value << 16: one interleave with zeros. For 8 and 16 lanes (AVX2, AVX-512) GCC
// lowers the generic widening conversion as halves extracted, widened and put back: a rank-64
// shrink of one row ran at 23.5 GFLOP/s with most of its time in those moves, 43 GFLOP/s this way.
// For 4 lanes (SSE2, NEON) the conversion is one instruction, and with the interleave SSE2's shrink
// ran 2.1x to 2.7x slower, so they keep the conversion.
template <int V, int... I>
PEFT_INLINE typename Lanes<V>::f32 widen_bf16(typename Lanes<V>::u16 h, std::integer_sequence<int, I...>) {
  const typename Lanes<V>::u16 zero{};
  const auto halves = __builtin_shufflevector(zero, h, ((I % 2) != 0 ? V + I / 2 : 0)...);
  typename Lanes<V>::f32 v;
  static_assert(sizeof halves == sizeof v);
  std::memcpy(&v, &halves, sizeof v);
  return v;
}
#endif

template <int V>
PEFT_INLINE typename Lanes<V>::f32 load(const Bf16* p) {
  typename Lanes<V>::u16 h;
  std::memcpy(&h, p, sizeof h);
#if __has_builtin(__builtin_shufflevector)
  if constexpr (V >= 8) return widen_bf16<V>(h, std::make_integer_sequence<int, 2 * V>{});
#endif
  return reinterpret_cast<typename Lanes<V>::f32>(__builtin_convertvector(h, typename Lanes<V>::u32) << 16);
}

PEFT_INLINE float load_one(const float* p) { return *p; }
PEFT_INLINE float load_one(const Bf16* p) { return std::bit_cast<float>(uint32_t(p->bits) << 16); }

// The sum of a vector's lanes, pairwise.
template <int V>
PEFT_INLINE float lane_sum(typename Lanes<V>::f32 v) {
  float lanes[V];
  std::memcpy(lanes, &v, sizeof lanes);
  for (int w = V / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}

#if __has_builtin(__builtin_shufflevector)
// The 4 x 4 transpose of rows r[0..3] in registers: r[q] becomes column q.
PEFT_INLINE void transpose4(Lanes<4>::f32 (&r)[4]) {
  const Lanes<4>::f32 t0 = __builtin_shufflevector(r[0], r[1], 0, 4, 1, 5);
  const Lanes<4>::f32 t1 = __builtin_shufflevector(r[0], r[1], 2, 6, 3, 7);
  const Lanes<4>::f32 t2 = __builtin_shufflevector(r[2], r[3], 0, 4, 1, 5);
  const Lanes<4>::f32 t3 = __builtin_shufflevector(r[2], r[3], 2, 6, 3, 7);
  r[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
  r[1] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
  r[2] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
  r[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
}

// Lane sums of four 4-lane vectors at once, {sum v[0], ..., sum v[3]}: transposed, then added,
// lanes (0 + 2) + (1 + 3).
PEFT_INLINE Lanes<4>::f32 sum4(const Lanes<4>::f32 (&v)[4]) {
  Lanes<4>::f32 r[4] = {v[0], v[1], v[2], v[3]};
  transpose4(r);
  return (r[0] + r[2]) + (r[1] + r[3]);
}

// Lane sums of eight 8-lane vectors at once, {sum v[0], ..., sum v[7]}: three levels that each add
// the two halves of interleaved pairs, so each sum is a balanced tree over its vector's lanes.
PEFT_INLINE Lanes<8>::f32 sum8(const Lanes<8>::f32 (&v)[8]) {
  using vec = Lanes<8>::f32;
  vec pairs[4], quads[2];
  // pairs[p]: v[2p] and v[2p + 1], lanes added in twos: {v2p(0+1), v2p+1(0+1), v2p(2+3), ...}.
  for (int p = 0; p < 4; ++p)
    pairs[p] = __builtin_shufflevector(v[2 * p], v[2 * p + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               __builtin_shufflevector(v[2 * p], v[2 * p + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  // quads[q]: v[4q .. 4q + 3], lanes 0..3 added in lanes 0..3, lanes 4..7 in lanes 4..7.
  for (int q = 0; q < 2; ++q)
    quads[q] = __builtin_shufflevector(pairs[2 * q], pairs[2 * q + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(pairs[2 * q], pairs[2 * q + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(quads[0], quads[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(quads[0], quads[1], 4, 5, 6, 7, 12, 13, 14, 15);
}
#endif

// ---- panels: a factor's rows transposed, multiplied with broadcasts -------------------------------

// C [MR x JW] += scale * T [MR x depth] P, P = a panel [depth x JW] (rows of a factor transposed),
// T row-major with leading dimension ldt; only the first `width` columns are stored. Each C element
// is one chain of fused multiply-adds along the depth, V columns per vector: no lane sums.
template <int V, int MR, int JW>
PEFT_INLINE void panel_tile(const float* t, int64_t ldt, int64_t depth, const float* panel, float scale, float* c,
                            int64_t ldc, int64_t width) {
  using vec = typename Lanes<V>::f32;
  constexpr int Q = JW / V;
  vec acc[MR][Q];
  for (int u = 0; u < MR; ++u)
    for (int q = 0; q < Q; ++q) acc[u][q] = vec{};
  for (int64_t k = 0; k < depth; ++k) {
    vec p[Q];
    for (int q = 0; q < Q; ++q) p[q] = load<V>(panel + k * JW + q * V);
    for (int u = 0; u < MR; ++u) {
      const float tk = t[u * ldt + k];
      for (int q = 0; q < Q; ++q) acc[u][q] += tk * p[q];
    }
  }
  for (int u = 0; u < MR; ++u) {
    float* cu = c + u * ldc;
    if (width == JW) {
      for (int q = 0; q < Q; ++q) {
        vec cv = load<V>(cu + q * V);
        cv += scale * acc[u][q];
        std::memcpy(cu + q * V, &cv, sizeof cv);
      }
    } else {
      float lanes[JW];
      std::memcpy(lanes, acc[u], sizeof lanes);
      for (int64_t w = 0; w < width; ++w) cu[w] += scale * lanes[w];
    }
  }
}

// panel [depth x JW] = the first `depth` elements of `width` rows (leading dimension ld) transposed
// and widened, zero past width. Blocks of 4 x 4 are transposed in registers; the edges one element
// at a time.
template <int JW, class E>
PEFT_INLINE void fill_panel(const E* rows, int64_t ld, int64_t depth, int64_t width, float* panel) {
  int64_t w0 = 0;
#if __has_builtin(__builtin_shufflevector)
  using vec = Lanes<4>::f32;
  for (; w0 + 4 <= width; w0 += 4) {
    const E* four = rows + w0 * ld;
    int64_t k = 0;
    for (; k + 4 <= depth; k += 4) {
      vec columns[4] = {load<4>(four + k), load<4>(four + ld + k), load<4>(four + 2 * ld + k),
                        load<4>(four + 3 * ld + k)};
      transpose4(columns);
      for (int q = 0; q < 4; ++q) std::memcpy(panel + (k + q) * JW + w0, &columns[q], sizeof(vec));
    }
    for (; k < depth; ++k)
      for (int64_t w = w0; w < w0 + 4; ++w) panel[k * JW + w] = load_one(rows + w * ld + k);
  }
#endif
  for (int64_t k = 0; k < depth; ++k) {
    float* p = panel + k * JW;
    for (int64_t w = w0; w < width; ++w) p[w] = load_one(rows + w * ld + k);
    for (int64_t w = width; w < JW; ++w) p[w] = 0.0f;
  }
}

// ---- shrink: T = X A^T --------------------------------------------------------------------------

// T [MR x NR] += X [MR x kc] A [NR x kc]^T, each dot product in V lanes (the tail in lane 0's sum).
template <int V, int MR, int NR, class E>
PEFT_INLINE void shrink_tile(const float* x, int64_t ldx, const E* a, int64_t lda, int64_t kc, float* t,
                             int64_t ldt) {
  using vec = typename Lanes<V>::f32;
  vec acc[MR][NR];
  for (int u = 0; u < MR; ++u)
    for (int v = 0; v < NR; ++v) acc[u][v] = vec{};
  int64_t k = 0;
  for (; k + V <= kc; k += V) {
    vec xv[MR];
    for (int u = 0; u < MR; ++u) xv[u] = load<V>(x + u * ldx + k);
    for (int v = 0; v < NR; ++v) {
      const vec av = load<V>(a + v * lda + k);
      for (int u = 0; u < MR; ++u) acc[u][v] += xv[u] * av;
    }
  }
  float tail[MR][NR] = {};
  for (; k < kc; ++k)
    for (int u = 0; u < MR; ++u)
      for (int v = 0; v < NR; ++v) tail[u][v] += x[u * ldx + k] * load_one(a + v * lda + k);
  for (int u = 0; u < MR; ++u)
    for (int v = 0; v < NR; ++v) t[u * ldt + v] += lane_sum<V>(acc[u][v]) + tail[u][v];
}

// Columns [k0, k0 + kc) of A's rows [r0, r0 + nr) against every row of X.
template <int V, int MR, int NR, class E>
PEFT_INLINE void shrink_block(const E* rows, int64_t lda, int64_t nr, int64_t kc, int64_t ldt, int64_t in,
                              const float* xk, int64_t n, float* tr) {
  if (nr == NR) {
    int64_t i = 0;
    for (; i + MR <= n; i += MR) shrink_tile<V, MR, NR>(xk + i * in, in, rows, lda, kc, tr + i * ldt, ldt);
    for (; i < n; ++i) shrink_tile<V, 1, NR>(xk + i * in, in, rows, lda, kc, tr + i * ldt, ldt);
  } else {
    for (int64_t v = 0; v < nr; ++v)
      for (int64_t i = 0; i < n; ++i) shrink_tile<V, 1, 1>(xk + i * in, in, rows + v * lda, lda, kc, tr + i * ldt + v, ldt);
  }
}

// Columns [k0, k0 + kc) of A (rows [r0, r0 + nr), in its storage dtype) against every row of X.
// F32 and BF16 rows are read in place; F16 rows are widened first into `widened` (NR rows of
// kF16Chunk floats).
template <int V, int MR, int NR>
PEFT_INLINE void shrink_columns(DType a_dtype, const void* a, int64_t r0, int64_t nr, int64_t k0, int64_t kc,
                                int64_t ldt, int64_t in, const float* x, int64_t n, float* t, float* widened) {
  const int64_t offset = r0 * in + k0;
  if (a_dtype == DType::F32)
    return shrink_block<V, MR, NR>(static_cast<const float*>(a) + offset, in, nr, kc, ldt, in, x + k0, n, t + r0);
  if (a_dtype == DType::BF16)
    return shrink_block<V, MR, NR>(static_cast<const Bf16*>(a) + offset, in, nr, kc, ldt, in, x + k0, n, t + r0);
  const auto* halves = static_cast<const uint16_t*>(a) + offset;
  for (int64_t v = 0; v < nr; ++v)
    convert(a_dtype, halves + v * in, DType::F32, widened + v * kF16Chunk, static_cast<uint64_t>(kc));
  shrink_block<V, MR, NR>(static_cast<const float*>(widened), kF16Chunk, nr, kc, ldt, in, x + k0, n, t + r0);
}

// From kPanelShrinkRows rows, and ranks of at least a panel's width: T += X A^T through panels, as
// expand_panel does for B. A's rows [r0, r0 + JW), columns [k0, k0 + kPanelMaxRank), are transposed
// and widened into a panel once; every row of X then multiplies it with broadcasts, and no dot
// product needs a lane sum. While a tile of rows runs, the next tile's X columns are prefetched:
// each tile reads only 512 bytes of each of its rows, too short a stream for the hardware
// prefetcher, and without it a rank-64 shrink of 64 rows of an 11008-wide X waited on memory
// (0.73 to 0.77 ms against 0.61 ms per call, one thread).
template <int V, int MR, int JW, class E>
PEFT_INLINE void shrink_panel(const E* a, int64_t rank, int64_t in, const float* x, int64_t n, float* t, int64_t ldt) {
  alignas(64) float panel[kPanelMaxRank * JW];
  for (int64_t k0 = 0; k0 < in; k0 += kPanelMaxRank) {
    const int64_t depth = std::min(kPanelMaxRank, in - k0);
    for (int64_t r0 = 0; r0 < rank; r0 += JW) {
      const int64_t width = std::min<int64_t>(JW, rank - r0);
      fill_panel<JW>(a + r0 * in + k0, in, depth, width, panel);
      int64_t i = 0;
      for (; i + MR <= n; i += MR) {
        if (i + 2 * MR <= n)
          for (int u = 0; u < MR; ++u)
            for (int64_t k = 0; k < depth; k += 64 / int64_t(sizeof(float)))
              __builtin_prefetch(x + (i + MR + u) * in + k0 + k);
        panel_tile<V, MR, JW>(x + i * in + k0, in, depth, panel, 1.0f, t + i * ldt + r0, ldt, width);
      }
      for (; i < n; ++i) panel_tile<V, 1, JW>(x + i * in + k0, in, depth, panel, 1.0f, t + i * ldt + r0, ldt, width);
    }
  }
}

// Otherwise dot products: NR rows of A at a time against every row of X, over column chunks of A
// and X, so that each chunk of X (at most kShrinkChunkBytes of f32) stays in the cache while every
// row of A passes over it. A block of 64 rows of an 11008-wide X is 2.8 MB: unchunked, it came
// from memory once per NR ranks (a rank-64 shrink of 64 such rows took 1.44 ms, chunked 0.96 ms,
// one thread). F16 A (on this path at any size) is widened kF16Chunk columns at a time, so its
// chunks are at most that wide.
template <int V, int MR, int NR, int PMR, int JW>
PEFT_INLINE void shrink_body(DType a_dtype, const void* a, int64_t rank, int64_t in, const float* x, int64_t n,
                             float* t, int64_t ldt) {
  for (int64_t i = 0; i < n; ++i) std::fill(t + i * ldt, t + i * ldt + rank, 0.0f);
  if (n >= kPanelShrinkRows && rank >= JW && (a_dtype == DType::F32 || a_dtype == DType::BF16)) {
    if (a_dtype == DType::F32) return shrink_panel<V, PMR, JW>(static_cast<const float*>(a), rank, in, x, n, t, ldt);
    return shrink_panel<V, PMR, JW>(static_cast<const Bf16*>(a), rank, in, x, n, t, ldt);
  }
  int64_t chunk = in;
  if (n * in * int64_t(sizeof(float)) > kShrinkChunkBytes)
    chunk = std::max<int64_t>(kShrinkMinChunk, kShrinkChunkBytes / (n * int64_t(sizeof(float))) / 64 * 64);
  if (a_dtype != DType::F32 && a_dtype != DType::BF16) chunk = std::min(chunk, kF16Chunk);
  alignas(64) float widened[NR * kF16Chunk];
  for (int64_t k0 = 0; k0 < in; k0 += chunk) {
    const int64_t kc = std::min(chunk, in - k0);
    for (int64_t r0 = 0; r0 < rank; r0 += NR)
      shrink_columns<V, MR, NR>(a_dtype, a, r0, std::min<int64_t>(NR, rank - r0), k0, kc, ldt, in, x, n, t, widened);
  }
}

// ---- expand: C += scale * T B^T ------------------------------------------------------------------

// Outputs of a dot-product group of expand_dot with V lanes (independent accumulators, whose lane
// sums come out as one vector of V lanes: sum8, sum4).
#if __has_builtin(__builtin_shufflevector)
template <int V>
constexpr int kDotOutputs = V;
#else
template <int V>
constexpr int kDotOutputs = 4;
#endif

// {sum acc[0], ..., sum acc[Q - 1]} as one vector of Q lanes.
template <int V, int Q>
PEFT_INLINE typename Lanes<Q>::f32 lane_sums(const typename Lanes<V>::f32 (&acc)[Q]) {
#if __has_builtin(__builtin_shufflevector)
  static_assert(Q == V && (Q == 4 || Q == 8));
  if constexpr (Q == 8) {
    return sum8(acc);
  } else {
    return sum4(acc);
  }
#else
  float sums[Q];
  for (int w = 0; w < Q; ++w) sums[w] = lane_sum<V>(acc[w]);
  return load<Q>(sums);
#endif
}

// Few rows: C[i, j .. j + Q) += scale * (T[i] . B[j + w]), dot products in V lanes along B's rows, Q
// of them at once; their lane sums and the update of C are vector operations. (A rank-8 row of a
// 4096-wide layer spent 61% of its call here when each output's sum and update were scalar.)
template <int V, class E>
PEFT_INLINE void expand_dot(const E* b, int64_t out, int64_t rank, const float* t, int64_t n, float scale, float* c,
                            int64_t j0, int64_t j1) {
  static_assert(V == 4 || V == 8);
  using vec = typename Lanes<V>::f32;
  constexpr int Q = kDotOutputs<V>;
  using sums = typename Lanes<Q>::f32;
  for (int64_t i = 0; i < n; ++i) {
    const float* ti = t + i * rank;
    float* ci = c + i * out;
    int64_t j = j0;
    for (; j + Q <= j1; j += Q) {
      vec acc[Q];
      for (int w = 0; w < Q; ++w) acc[w] = vec{};
      int64_t k = 0;
      for (; k + V <= rank; k += V) {
        const vec tv = load<V>(ti + k);
        for (int w = 0; w < Q; ++w) acc[w] += tv * load<V>(b + (j + w) * rank + k);
      }
      sums total = lane_sums<V, Q>(acc);
      if (k < rank) {
        float tails[Q];
        for (int w = 0; w < Q; ++w) {
          float tail = 0.0f;
          for (int64_t kt = k; kt < rank; ++kt) tail += ti[kt] * load_one(b + (j + w) * rank + kt);
          tails[w] = tail;
        }
        total += load<Q>(tails);
      }
      sums cv = load<Q>(ci + j);
      cv += scale * total;
      std::memcpy(ci + j, &cv, sizeof cv);
    }
    for (; j < j1; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < rank; ++k) sum += ti[k] * load_one(b + j * rank + k);
      ci[j] += scale * sum;
    }
  }
}

// More rows: JW columns at a time, B's JW rows are transposed once into a panel that every row of
// T then multiplies with broadcasts and V-wide fused multiply-adds.
template <int V, int MR, int JW, class E>
PEFT_INLINE void expand_panel(const E* b, int64_t out, int64_t rank, const float* t, int64_t n, float scale,
                              float* c, int64_t j0, int64_t j1) {
  alignas(64) float panel[kPanelMaxRank * JW];
  for (int64_t jb = j0; jb < j1; jb += JW) {
    const int64_t width = std::min<int64_t>(JW, j1 - jb);
    fill_panel<JW>(b + jb * rank, rank, rank, width, panel);
    float* cb = c + jb;
    int64_t i = 0;
    for (; i + MR <= n; i += MR) panel_tile<V, MR, JW>(t + i * rank, rank, rank, panel, scale, cb + i * out, out, width);
    for (; i < n; ++i) panel_tile<V, 1, JW>(t + i * rank, rank, rank, panel, scale, cb + i * out, out, width);
  }
}

// The dot path with the widest lanes the rank fills (at least 4).
template <int V, class E>
PEFT_INLINE void expand_dot_lanes(const E* b, int64_t out, int64_t rank, const float* t, int64_t n, float scale,
                                  float* c, int64_t j0, int64_t j1) {
  if constexpr (V > 4) {
    if (rank < V) return expand_dot_lanes<V / 2>(b, out, rank, t, n, scale, c, j0, j1);
  }
  expand_dot<V>(b, out, rank, t, n, scale, c, j0, j1);
}

template <int V, int DV, int MR, int JW, class E>
PEFT_INLINE void expand_rows(const E* b, int64_t out, int64_t rank, const float* t, int64_t n, float scale, float* c,
                             int64_t j0, int64_t j1) {
  if (n < kDotRows || rank > kPanelMaxRank)
    expand_dot_lanes<DV>(b, out, rank, t, n, scale, c, j0, j1);
  else
    expand_panel<V, MR, JW>(b, out, rank, t, n, scale, c, j0, j1);
}

template <int V, int DV, int MR, int JW>
PEFT_INLINE void expand_body(DType b_dtype, const void* b, int64_t out, int64_t rank, const float* t, int64_t n,
                             float scale, float* c, int64_t j0, int64_t j1) {
  if (b_dtype == DType::F32) return expand_rows<V, DV, MR, JW>(static_cast<const float*>(b), out, rank, t, n, scale, c, j0, j1);
  if (b_dtype == DType::BF16) return expand_rows<V, DV, MR, JW>(static_cast<const Bf16*>(b), out, rank, t, n, scale, c, j0, j1);
  // F16: rows of B widened into f32 a block at a time (F16C where the CPU has it); each block is
  // a matrix of its own, its columns of C starting at jb.
  alignas(64) float stack[JW * kPanelMaxRank];
  std::vector<float> large;  // only for a rank above the stack buffer
  float* widened = stack;
  int64_t capacity = JW * kPanelMaxRank;
  if (rank > capacity) {
    large.resize(static_cast<size_t>(rank));
    widened = large.data();
    capacity = rank;
  }
  const int64_t rows_per_block = capacity / rank;
  const auto* halves = static_cast<const uint16_t*>(b);
  for (int64_t jb = j0; jb < j1; jb += rows_per_block) {
    const int64_t count = std::min(rows_per_block, j1 - jb);
    convert(b_dtype, halves + jb * rank, DType::F32, widened, static_cast<uint64_t>(count * rank));
    expand_rows<V, DV, MR, JW>(static_cast<const float*>(widened), out, rank, t, n, scale, c + jb, 0, count);
  }
}

// Stamps out a table for one instruction set: V lanes, the MR x NR tile of shrink's dot products,
// the dot path's lanes DV, and the MR x JW tile of the panels (expand, and shrink from
// kPanelShrinkRows rows).
#define PEFT_DEFINE_APPLY_TABLE(NS, NAME, ATTR, V, SMR, SNR, DV, PMR, PJW)                                  \
  namespace NS {                                                                                              \
  ATTR void shrink(DType a_dtype, const void* a, int64_t rank, int64_t in, const float* x, int64_t n,         \
                   float* t, int64_t ldt) {                                                                   \
    shrink_body<V, SMR, SNR, PMR, PJW>(a_dtype, a, rank, in, x, n, t, ldt);                                 \
  }                                                                                                           \
  ATTR void expand(DType b_dtype, const void* b, int64_t out, int64_t rank, const float* t, int64_t n,        \
                   float scale, float* c, int64_t j0, int64_t j1) {                                           \
    expand_body<V, DV, PMR, PJW>(b_dtype, b, out, rank, t, n, scale, c, j0, j1);                            \
  }                                                                                                           \
  const Table table{NAME, shrink, expand};                                                                    \
  }

PEFT_DEFINE_APPLY_TABLE(portable_impl, "portable", , 4, 2, 4, 4, 4, 16)

#ifdef PEFT_KERNELS_X86
PEFT_DEFINE_APPLY_TABLE(avx2_impl, "avx2", __attribute__((target("avx2,fma,f16c"))), 8, 2, 4, 8, 4, 16)
PEFT_DEFINE_APPLY_TABLE(avx512_impl, "avx512",
                        __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), 16, 4, 4, 8, 4, 64)
#endif

}  // namespace

PEFT_KERNEL_TABLE_GETTERS(Table, portable_impl::table, avx2_impl::table, avx512_impl::table)

}  // namespace peft::serve::kernels
