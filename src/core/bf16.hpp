// bfloat16 <-> binary32/binary64, one value at a time. Inline so that merge code and the bulk
// kernels share one definition of the rounding. The bulk paths (core/convert.hpp) are faster.
#pragma once

#include <bit>
#include <cstdint>

#include "core/f32_round_to_odd.hpp"

namespace peft {

// Exact widening. A signalling NaN comes back quiet (quiet bit set, sign and payload kept) so
// that no NaN the library produces can trap; every other pattern is the same bits shifted up.
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) bits |= 0x00400000u;
  return std::bit_cast<float>(bits);
}

// Round to nearest, ties to even. Overflow gives infinity (that is what RNE does here: the
// carry out of the mantissa lands in the exponent). NaN keeps its sign and top payload bits and
// is made quiet; plain truncation could turn a NaN with a low payload into infinity.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// What torch does for float64 -> bfloat16: round to float32 first, then to bfloat16. Two
// roundings, so a value just above a bfloat16 midpoint can land on the midpoint and then tie to
// even. Bulk conversion uses this, so results are bit-identical to torch's .to(torch.bfloat16).
inline uint16_t f64_to_bf16(double d) { return f32_to_bf16(static_cast<float>(d)); }

// Single rounding of the exact double (the mathematically correct result). Rounding to float32
// with round-to-odd first keeps the information that decides the second rounding.
inline uint16_t f64_to_bf16_correctly_rounded(double d) { return f32_to_bf16(f64_to_f32_round_to_odd(d)); }

inline double bf16_to_f64(uint16_t h) { return static_cast<double>(bf16_to_f32(h)); }

}  // namespace peft
