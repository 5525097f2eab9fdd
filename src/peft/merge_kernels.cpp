// One source for every kernel table: the loop bodies below are inlined into wrappers compiled
// for each instruction set (GCC/Clang target attributes), so the compiler vectorises the same
// arithmetic three times. No floating-point contraction: the only fused operations are the
// explicit std::fma calls, which round once on every target, hence bit-identical tables.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "peft/merge_kernels.hpp"

#include <cmath>
#include <cstring>

#include "core/bf16.hpp"
#include "core/f16.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define PEFT_INLINE [[gnu::always_inline]] inline
#else
#define PEFT_INLINE inline
#endif

namespace peft::merge::kernels {
namespace {

// ---- storage access ---------------------------------------------------------------------------

template <Storage S>
PEFT_INLINE float load(const void* p, int64_t j) {
  if constexpr (S == Storage::f32) {
    return static_cast<const float*>(p)[j];
  } else if constexpr (S == Storage::bf16) {
    return bf16_to_f32(static_cast<const uint16_t*>(p)[j]);
  } else {
    return f16_to_f32(static_cast<const uint16_t*>(p)[j]);
  }
}

template <Storage S>
PEFT_INLINE void store(void* p, int64_t j, float v) {
  if constexpr (S == Storage::f32) {
    static_cast<float*>(p)[j] = v;
  } else if constexpr (S == Storage::bf16) {
    static_cast<uint16_t*>(p)[j] = f32_to_bf16(v);
  } else {
    static_cast<uint16_t*>(p)[j] = f32_to_f16(v);
  }
}

// ---- low-rank product -------------------------------------------------------------------------

// RB rows of C, W columns at a time held in registers; the tail columns one at a time with the
// same sequence of fmas, so every element is computed identically wherever it falls.
template <int RB, int W>
PEFT_INLINE void lowrank_rows(const float* L, const float* R, int64_t cols, int64_t rank, float coef,
                              bool accumulate, float* C) {
  int64_t j = 0;
  for (; j + W <= cols; j += W) {
    float acc[RB][W];
    for (int u = 0; u < RB; ++u)
      for (int v = 0; v < W; ++v) acc[u][v] = 0.0f;
    for (int64_t k = 0; k < rank; ++k) {
      const float* r = R + k * cols + j;
      for (int u = 0; u < RB; ++u) {
        const float l = L[u * rank + k];
        for (int v = 0; v < W; ++v) acc[u][v] = std::fma(l, r[v], acc[u][v]);
      }
    }
    if (accumulate) {
      for (int u = 0; u < RB; ++u)
        for (int v = 0; v < W; ++v) C[u * cols + j + v] = std::fma(coef, acc[u][v], C[u * cols + j + v]);
    } else {
      for (int u = 0; u < RB; ++u)
        for (int v = 0; v < W; ++v) C[u * cols + j + v] = std::fma(coef, acc[u][v], -0.0f);
    }
  }
  for (; j < cols; ++j) {
    for (int u = 0; u < RB; ++u) {
      float acc = 0.0f;
      for (int64_t k = 0; k < rank; ++k) acc = std::fma(L[u * rank + k], R[k * cols + j], acc);
      float& c = C[u * cols + j];
      c = std::fma(coef, acc, accumulate ? c : -0.0f);
    }
  }
}

template <int RB, int W>
PEFT_INLINE void lowrank_body(const float* L, const float* R, int64_t rows, int64_t cols, int64_t rank,
                              float coef, bool accumulate, float* C) {
  int64_t i = 0;
  for (; i + RB <= rows; i += RB) lowrank_rows<RB, W>(L + i * rank, R, cols, rank, coef, accumulate, C + i * cols);
  for (; i < rows; ++i) lowrank_rows<1, W>(L + i * rank, R, cols, rank, coef, accumulate, C + i * cols);
}

// ---- element-wise passes ----------------------------------------------------------------------

template <Storage S>
PEFT_INLINE void add_rounded_body(void* w, const float* d, int64_t n) {
  for (int64_t j = 0; j < n; ++j) store<S>(w, j, load<S>(w, j) + d[j]);
}

template <Storage S>
PEFT_INLINE double sum_squares_body(const void* w, const float* d, int64_t n) {
  // x is a float, so x * x is exact in double: whether the add is fused or not cannot matter.
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) {
      const double x = static_cast<double>(load<S>(w, j + l) + d[j + l]);
      lane[l] += x * x;
    }
  }
  for (int l = 0; j < n; ++j, ++l) {
    const double x = static_cast<double>(load<S>(w, j) + d[j]);
    lane[l] += x * x;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

template <Storage S>
PEFT_INLINE void accumulate_squares_body(const void* w, const float* d, double* acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const double x = static_cast<double>(load<S>(w, j) + d[j]);
    acc[j] += x * x;
  }
}

template <Storage S>
PEFT_INLINE void dora_apply_body(void* w, const float* d, const float* factor, int64_t stride, int64_t n) {
  if (stride == 0) {
    const float f = factor[0];
    for (int64_t j = 0; j < n; ++j) store<S>(w, j, f * (load<S>(w, j) + d[j]));
  } else {
    for (int64_t j = 0; j < n; ++j) store<S>(w, j, factor[j] * (load<S>(w, j) + d[j]));
  }
}

template <Storage S>
PEFT_INLINE void dora_remove_body(void* w, const float* d, const float* factor, int64_t stride, int64_t n) {
  if (stride == 0) {
    const float f = factor[0];
    for (int64_t j = 0; j < n; ++j) store<S>(w, j, load<S>(w, j) / f - d[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) store<S>(w, j, load<S>(w, j) / factor[j] - d[j]);
  }
}

// Dispatches on the storage dtype inside the target-specific wrapper, so each instantiation is
// compiled (and vectorised) for that target.
#define PEFT_STORAGE_SWITCH(s, fn, ...)                         \
  switch (s) {                                                  \
    case Storage::f32: return fn<Storage::f32>(__VA_ARGS__);    \
    case Storage::bf16: return fn<Storage::bf16>(__VA_ARGS__);  \
    case Storage::f16: return fn<Storage::f16>(__VA_ARGS__);    \
  }

// Stamps out a kernel table for one instruction set. RB x W is the register tile of lowrank.
#define PEFT_DEFINE_TABLE(NS, ATTR, RB, W)                                                                 \
  namespace NS {                                                                                           \
  ATTR void lowrank(const float* L, const float* R, int64_t rows, int64_t cols, int64_t rank, float coef, \
                    bool accumulate, float* C) {                                                           \
    lowrank_body<RB, W>(L, R, rows, cols, rank, coef, accumulate, C);                                      \
  }                                                                                                        \
  ATTR void add_rounded(Storage s, void* w, const float* d, int64_t n) {                                   \
    PEFT_STORAGE_SWITCH(s, add_rounded_body, w, d, n);                                                     \
  }                                                                                                        \
  ATTR double sum_squares(Storage s, const void* w, const float* d, int64_t n) {                           \
    PEFT_STORAGE_SWITCH(s, sum_squares_body, w, d, n);                                                     \
    return 0.0;                                                                                            \
  }                                                                                                        \
  ATTR void accumulate_squares(Storage s, const void* w, const float* d, double* acc, int64_t n) {         \
    PEFT_STORAGE_SWITCH(s, accumulate_squares_body, w, d, acc, n);                                         \
  }                                                                                                        \
  ATTR void dora_apply(Storage s, void* w, const float* d, const float* f, int64_t stride, int64_t n) {    \
    PEFT_STORAGE_SWITCH(s, dora_apply_body, w, d, f, stride, n);                                           \
  }                                                                                                        \
  ATTR void dora_remove(Storage s, void* w, const float* d, const float* f, int64_t stride, int64_t n) {   \
    PEFT_STORAGE_SWITCH(s, dora_remove_body, w, d, f, stride, n);                                          \
  }                                                                                                        \
  const Table table{#NS, lowrank, add_rounded, sum_squares, accumulate_squares, dora_apply, dora_remove};  \
  }

PEFT_DEFINE_TABLE(portable_impl, , 4, 16)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PEFT_MERGE_X86 1
PEFT_DEFINE_TABLE(avx2_impl, __attribute__((target("avx2,fma"))), 4, 16)
PEFT_DEFINE_TABLE(avx512_impl, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))), 4, 64)
#endif

}  // namespace

const Table& portable() {
  static const Table t = [] {
    Table copy = portable_impl::table;
    copy.name = "portable";
    return copy;
  }();
  return t;
}

const Table* x86_avx2() {
#ifdef PEFT_MERGE_X86
  static const Table t = [] {
    Table copy = avx2_impl::table;
    copy.name = "avx2";
    return copy;
  }();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &t;
#endif
  return nullptr;
}

const Table* x86_avx512() {
#ifdef PEFT_MERGE_X86
  static const Table t = [] {
    Table copy = avx512_impl::table;
    copy.name = "avx512";
    return copy;
  }();
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma"))
    return &t;
#endif
  return nullptr;
}

const Table& active() {
  static const Table& chosen = [] () -> const Table& {
    if (const Table* t = x86_avx512()) return *t;
    if (const Table* t = x86_avx2()) return *t;
    return portable();
  }();
  return chosen;
}

}  // namespace peft::merge::kernels
