// The hot loops of core/convert.cpp, behind a table of function pointers picked once at run time:
// AVX2 + F16C at the kernel level core/kernel_level.hpp chooses, otherwise portable C++ that the compiler vectorises with the
// baseline instruction set. Internal; exposed so that tests can run every implementation against
// the same reference tables and the benchmark can compare them.
#pragma once

#include <cstddef>

namespace peft::convert_kernels {

// Each function converts n elements from src to dst. Any alignment; no overlap.
using Kernel = void (*)(const unsigned char* src, unsigned char* dst, size_t n);

struct Kernels {
  const char* name;
  Kernel bf16_to_f32;
  Kernel f32_to_bf16;
  Kernel f16_to_f32;
  Kernel f32_to_f16;
};

// Plain C++ (the scalar functions of core/bf16.hpp and core/f16.hpp in vectorisable loops).
const Kernels& portable();

// AVX2 + F16C with intrinsics, or nullptr when the CPU (or OS) lacks them or this is not x86-64.
const Kernels* x86_avx2();

// The set of the kernel level in use (kernels::chosen_level()); chosen on first use.
const Kernels& active();

// Output size from which the x86 kernels write with non-temporal stores (output that large is
// past the caches anyway, and streaming it saves reading the destination first).
inline constexpr size_t kStreamingThresholdBytes = size_t(16) << 20;

}  // namespace peft::convert_kernels
