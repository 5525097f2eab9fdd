// The inner loops of the merge math (lora_math.hpp), behind a table of function pointers picked
// once at run time by the kernel level (core/kernel_level.hpp): AVX-512, AVX2 + FMA, or portable
// C++. Every table gives bit-identical results: products are accumulated with explicit fused
// multiply-adds and every other step is one IEEE operation, so the instruction set changes only
// the speed. Internal; exposed so that tests can run every table against the same reference loops
// and the benchmark can name the one in use.
#pragma once

#include <cstddef>
#include <cstdint>

namespace peft::merge::kernels {

enum class Storage { f32, bf16, f16 };

// Bytes of one element stored as `s`.
constexpr size_t storage_bytes(Storage s) { return s == Storage::f32 ? 4 : 2; }

struct Table {
  const char* name;

  // C[rows x cols] = base + coef * (L[rows x rank] @ R[rank x cols]) with base = C when
  // accumulate, else -0. Each element: acc = fma(L[i,k], R[k,j], acc) for k = 0..rank-1 from 0,
  // then fma(coef, acc, base). Row-major, leading dimensions rank, cols and cols.
  void (*lowrank)(const float* L, const float* R, int64_t rows, int64_t cols, int64_t rank, float coef,
                  bool accumulate, float* C);

  // w[j] = round(float(from[j]) + d[j]) for j < n; `from` is w itself for a merge in place, or
  // another buffer of n elements that does not overlap w. Returns whether any w[j] written is
  // infinite or NaN (checked in the same pass). From another buffer, the x86 tables write w's whole
  // cache lines with non-temporal stores (then a store fence): a plain store first reads its line
  // from memory, a third of the traffic of a weight rewritten from its copy. Same bits either way.
  bool (*add_rounded)(Storage s, void* w, const void* from, const float* d, int64_t n);

  // sum over j of double(float(w[j]) + d[j])^2, accumulated in 8 interleaved f64 lanes (element j
  // goes to lane j % 8) that are added pairwise at the end: the same order on every table.
  double (*sum_squares)(Storage s, const void* w, const float* d, int64_t n);

  // acc[j] += double(float(w[j]) + d[j])^2 for j < n.
  void (*accumulate_squares)(Storage s, const void* w, const float* d, double* acc, int64_t n);

  // w[j] = round(f * (float(w[j]) + d[j])) with f = factor[j * factor_stride] (stride 0: one
  // factor for the whole row, 1: one per column). Returns whether any w[j] written is infinite or NaN.
  bool (*dora_apply)(Storage s, void* w, const float* d, const float* factor, int64_t factor_stride, int64_t n);

  // w[j] = round(float(w[j]) / f - d[j]), f as above.
  void (*dora_remove)(Storage s, void* w, const float* d, const float* factor, int64_t factor_stride, int64_t n);

  // memcpy of `bytes` between buffers that do not overlap, for a copy not read back soon (a weight
  // put back from its kept original, or that original taken): the x86 tables write the whole cache
  // lines of `to` with non-temporal stores, then fence, as add_rounded from another buffer does.
  void (*copy)(void* to, const void* from, size_t bytes);
};

const Table& portable();
const Table* x86_avx2();    // nullptr when the CPU lacks AVX2, FMA or F16C, or this is not x86-64
const Table* x86_avx512();  // nullptr when the CPU lacks AVX-512 F/BW/VL/DQ (or AVX2, FMA, F16C)
const Table& active();      // the table of the kernel level in use (core/kernel_level.hpp)

}  // namespace peft::merge::kernels
