// Portable kernels: the scalar conversions in plain loops. Loads and stores go through memcpy so
// that any alignment is legal; GCC turns them into vector loads and vectorises the loops (SSE2 on
// baseline x86-64; check with -fopt-info-vec).
//
// The binary16 conversions compute a float on every path and then select; with the default
// -ftrapping-math GCC will not evaluate float operations it may skip, so it keeps branches and does
// not vectorise. Nothing here reads the floating-point exception flags, so this file drops that
// guarantee (before the includes, so that it covers the inlined scalar functions too).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <cstdint>
#include <cstring>

#include "core/bf16.hpp"
#include "core/convert_kernels.hpp"
#include "core/f16.hpp"
#include "core/kernel_level.hpp"

namespace peft::convert_kernels {
namespace {

template <class In, class Out, class Fn>
inline void map_elements(const unsigned char* src, unsigned char* dst, size_t n, Fn fn) {
  for (size_t i = 0; i < n; ++i) {
    In in;
    std::memcpy(&in, src + i * sizeof(In), sizeof(In));
    const Out out = fn(in);
    std::memcpy(dst + i * sizeof(Out), &out, sizeof(Out));
  }
}

// The float results travel as bit patterns so that no NaN passes through a float register copy.
void bf16_to_f32(const unsigned char* src, unsigned char* dst, size_t n) {
  map_elements<uint16_t, uint32_t>(src, dst, n, [](uint16_t h) { return std::bit_cast<uint32_t>(peft::bf16_to_f32(h)); });
}

void f32_to_bf16(const unsigned char* src, unsigned char* dst, size_t n) {
  map_elements<uint32_t, uint16_t>(src, dst, n, [](uint32_t f) { return peft::f32_to_bf16(std::bit_cast<float>(f)); });
}

void f16_to_f32(const unsigned char* src, unsigned char* dst, size_t n) {
  map_elements<uint16_t, uint32_t>(src, dst, n, [](uint16_t h) { return std::bit_cast<uint32_t>(peft::f16_to_f32(h)); });
}

void f32_to_f16(const unsigned char* src, unsigned char* dst, size_t n) {
  map_elements<uint32_t, uint16_t>(src, dst, n, [](uint32_t f) { return peft::f32_to_f16(std::bit_cast<float>(f)); });
}

}  // namespace

const Kernels& portable() {
  static constexpr Kernels kernels{"portable", bf16_to_f32, f32_to_bf16, f16_to_f32, f32_to_f16};
  return kernels;
}

const Kernels& active() {
  static const Kernels& chosen =
      peft::kernels::chosen_level() >= peft::kernels::Level::avx2 && x86_avx2() != nullptr ? *x86_avx2() : portable();
  return chosen;
}

}  // namespace peft::convert_kernels
