// The five 8-bit float formats of safetensors, decoded to binary32. Every 8-bit value is exactly
// representable in float32, so decoding is exact; the bulk path uses 256-entry tables built from
// these same functions at compile time.
//
//   F8_E4M3      (torch float8_e4m3fn)    bias 7,  no infinities, NaN = S.1111.111, max 448
//   F8_E5M2      (torch float8_e5m2)      bias 15, IEEE-like: infinities and NaNs at exponent 31
//   F8_E8M0      (torch float8_e8m0fnu)   2^(e-127), unsigned, no zero, 0xFF = NaN
//   F8_E4M3FNUZ  (torch float8_e4m3fnuz)  bias 8,  no infinities, no -0, 0x80 = NaN
//   F8_E5M2FNUZ  (torch float8_e5m2fnuz)  bias 16, no infinities, no -0, 0x80 = NaN
#pragma once

#include <array>
#include <bit>
#include <cstdint>

#include "core/dtype.hpp"

namespace peft {

namespace f8_detail {

inline constexpr uint32_t kQuietNaN = 0x7FC00000u;

// A finite sign/exponent/mantissa pattern with the given field widths and bias, as float32 bits.
constexpr uint32_t finite_bits(uint8_t value, int exponent_bits, int mantissa_bits, int bias) {
  const uint32_t sign = uint32_t(value >> 7) << 31;
  const uint32_t mantissa_mask = (1u << mantissa_bits) - 1u;
  uint32_t mantissa = value & mantissa_mask;
  const int exponent_field = (value >> mantissa_bits) & ((1 << exponent_bits) - 1);
  if (exponent_field != 0) {
    return sign | uint32_t(exponent_field - bias + 127) << 23 | mantissa << (23 - mantissa_bits);
  }
  if (mantissa == 0) return sign;
  // Subnormal: normalise, since float32 has the range to hold it as a normal number.
  int exponent = 1 - bias;
  while ((mantissa & (1u << mantissa_bits)) == 0) {
    mantissa <<= 1;
    --exponent;
  }
  return sign | uint32_t(exponent + 127) << 23 | (mantissa & mantissa_mask) << (23 - mantissa_bits);
}

constexpr uint32_t e4m3fn_bits(uint8_t v) {
  if ((v & 0x7Fu) == 0x7Fu) return (uint32_t(v >> 7) << 31) | kQuietNaN;
  return finite_bits(v, 4, 3, 7);
}

constexpr uint32_t e5m2_bits(uint8_t v) {
  const uint32_t sign = uint32_t(v >> 7) << 31;
  if ((v & 0x7Cu) == 0x7Cu) return sign | ((v & 0x03u) == 0 ? 0x7F800000u : kQuietNaN);
  return finite_bits(v, 5, 2, 15);
}

constexpr uint32_t e8m0_bits(uint8_t v) {
  if (v == 0xFFu) return kQuietNaN;
  if (v == 0) return 0x00400000u;  // 2^-127 is a float32 subnormal
  return uint32_t(v) << 23;
}

constexpr uint32_t e4m3fnuz_bits(uint8_t v) { return v == 0x80u ? kQuietNaN : finite_bits(v, 4, 3, 8); }

constexpr uint32_t e5m2fnuz_bits(uint8_t v) { return v == 0x80u ? kQuietNaN : finite_bits(v, 5, 2, 16); }

template <uint32_t (*Decode)(uint8_t)>
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (int i = 0; i < 256; ++i) table[i] = Decode(uint8_t(i));
  return table;
}

}  // namespace f8_detail

inline constexpr bool is_f8(DType d) {
  return d == DType::F8_E4M3 || d == DType::F8_E5M2 || d == DType::F8_E8M0 || d == DType::F8_E4M3FNUZ ||
         d == DType::F8_E5M2FNUZ;
}

// float32 bit patterns of all 256 values of an 8-bit float dtype, indexed by the byte. Only for
// the five F8 dtypes (is_f8); NaNs are quiet.
inline const std::array<uint32_t, 256>& f8_table(DType dtype) {
  using namespace f8_detail;
  static constexpr std::array<uint32_t, 256> e4m3 = make_table<e4m3fn_bits>();
  static constexpr std::array<uint32_t, 256> e5m2 = make_table<e5m2_bits>();
  static constexpr std::array<uint32_t, 256> e8m0 = make_table<e8m0_bits>();
  static constexpr std::array<uint32_t, 256> e4m3fnuz = make_table<e4m3fnuz_bits>();
  static constexpr std::array<uint32_t, 256> e5m2fnuz = make_table<e5m2fnuz_bits>();
  switch (dtype) {
    case DType::F8_E5M2: return e5m2;
    case DType::F8_E8M0: return e8m0;
    case DType::F8_E4M3FNUZ: return e4m3fnuz;
    case DType::F8_E5M2FNUZ: return e5m2fnuz;
    default: return e4m3;
  }
}

// The value of one 8-bit float. dtype must be one of the five F8 dtypes.
inline float f8_to_f32(DType dtype, uint8_t value) { return std::bit_cast<float>(f8_table(dtype)[value]); }

}  // namespace peft
