// IEEE binary16 <-> binary32/binary64, one value at a time. Written without branches on the
// value so that the same code, inlined into a loop, vectorises (the portable bulk kernel uses
// it); on x86 with F16C the bulk kernels use the hardware instructions, which agree bit for bit.
// Assumes the default floating-point environment (round to nearest); FTZ/DAZ do not change the
// results because no intermediate here is a float32 subnormal that matters.
#pragma once

#include <bit>
#include <cstdint>

#include "core/f32_round_to_odd.hpp"

namespace peft {

// Exact widening. A signalling NaN comes back quiet (sign and payload kept).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7FFFu;
  // Normal numbers: move exponent and mantissa up and add the bias difference 127 - 15.
  const uint32_t normal = (magnitude << 13) + 0x38000000u;
  // Infinity and NaN: exponent 31 becomes 255; quiet bit set for NaN.
  const uint32_t special = ((magnitude << 13) + 0x70000000u) | (magnitude > 0x7C00u ? 0x00400000u : 0u);
  // Zero and subnormals: value = mantissa * 2^-24, exact in float32 (and never a float32 subnormal).
  const uint32_t small = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-24f);
  uint32_t bits = magnitude >= 0x7C00u ? special : normal;
  bits = magnitude < 0x0400u ? small : bits;
  return std::bit_cast<float>(sign | bits);
}

// Round to nearest, ties to even; 65520 and above become infinity; NaN keeps its sign and top
// payload bits and is made quiet.
inline uint16_t f32_to_f16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  // Normal results (|f| >= 2^-14): rebias, then round the 13 dropped mantissa bits to even. A
  // carry out of the mantissa correctly bumps the exponent.
  const uint32_t rebiased = magnitude - 0x38000000u;
  const uint32_t normal = (rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13;
  // Subnormal results: adding 0.5 puts the value's multiple of 2^-24 in the last mantissa bits of
  // the sum, rounded to nearest even by the FPU.
  const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
  const uint32_t subnormal = std::bit_cast<uint32_t>(shifted) - 0x3F000000u;
  uint32_t result = magnitude >= 0x38800000u ? normal : subnormal;
  result = magnitude >= 0x477FF000u ? 0x7C00u : result;  // 65520 = halfway to 65536: ties to inf
  result = magnitude > 0x7F800000u ? (0x7E00u | ((magnitude >> 13) & 0x03FFu)) : result;
  return uint16_t(sign | result);
}

// What torch does for float64 -> float16: through float32, two roundings (see f64_to_bf16).
inline uint16_t f64_to_f16(double d) { return f32_to_f16(static_cast<float>(d)); }

// Single rounding of the exact double (the mathematically correct result).
inline uint16_t f64_to_f16_correctly_rounded(double d) { return f32_to_f16(f64_to_f32_round_to_odd(d)); }

inline double f16_to_f64(uint16_t h) { return static_cast<double>(f16_to_f32(h)); }

}  // namespace peft
