// The two products of unmerged LoRA (serve/lora_apply.hpp), behind a table of function pointers
// picked once at run time by the kernel level (core/kernel_level.hpp): AVX-512, AVX2 + FMA, or
// portable C++ (NEON on aarch64 through the compiler). Factors are read in their storage dtype
// (F32, BF16 or F16), widened to f32 a small block at a time in the cache; all arithmetic is f32.
//
// Unlike the merge kernels these tables are not bit-identical: each sums a dot product in its own
// number of lanes. Every result is still a sum of the same f32 products in some order, so the
// error bound of peft_lora_apply() (at most in + rank + 6 rounded operations deep) holds on every
// table; tests/unit/test_serve_apply.cpp checks each table against a float64 reference.
//
// Internal; exposed so that the tests can run every table and the benchmark can name the one in use.
#pragma once

#include <cstdint>

#include "core/dtype.hpp"

namespace peft::serve::kernels {

struct Table {
  const char* name;

  // T [n x rank] = X [n x in] A^T, A [rank x in] row-major in a_dtype (F32, BF16 or F16); X and T
  // row-major f32 with leading dimensions in and ldt >= rank (callers split the ranks between
  // threads; the error bound holds for any split). Single-threaded.
  void (*shrink)(DType a_dtype, const void* a, int64_t rank, int64_t in, const float* x, int64_t n, float* t,
                 int64_t ldt);

  // C [n x out] += scale * (T [n x rank] B^T), B [out x rank] row-major in b_dtype; T and C
  // row-major f32 with leading dimensions rank and out. Only the output columns [j0, j1) are
  // computed (callers split the columns between threads). Single-threaded.
  void (*expand)(DType b_dtype, const void* b, int64_t out, int64_t rank, const float* t, int64_t n, float scale,
                 float* c, int64_t j0, int64_t j1);
};

const Table& portable();
const Table* x86_avx2();    // nullptr when the CPU lacks AVX2, FMA or F16C, or this is not x86-64
const Table* x86_avx512();  // nullptr when the CPU lacks AVX-512 F/BW/VL/DQ (or AVX2, FMA, F16C)
const Table& active();      // the table of the kernel level in use

}  // namespace peft::serve::kernels
