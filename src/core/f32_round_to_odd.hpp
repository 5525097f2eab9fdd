// float64 -> float32 with round-to-odd: the helper that makes float64 -> 16-bit conversions
// correctly rounded. If the double is not exactly a float, the result is the neighbouring float
// toward zero with its last mantissa bit forced to 1. Rounding that float to any format with at
// least two fewer mantissa bits and the same or narrower exponent range (bfloat16, binary16)
// gives the same result as rounding the double directly (Boldo & Melquiond, "round to odd").
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace peft {

inline float f64_to_f32_round_to_odd(double d) {
  float nearest = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(nearest) == d) return nearest;
  uint32_t bits = std::bit_cast<uint32_t>(nearest);
  // Rounding went away from zero (this includes overflow to infinity): step one ulp back.
  if (std::fabs(static_cast<double>(nearest)) > std::fabs(d)) bits -= 1;
  return std::bit_cast<float>(bits | 1u);
}

}  // namespace peft
