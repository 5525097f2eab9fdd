// ggml's Q8_0 blocks: 32 values as an f16 scale d and 32 int8 quants q, value = d x q. The
// quantizer is ggml's reference (quantize_row_q8_0_ref, which gguf-py reproduces bit for bit):
// d = max|x| / 127 rounded to f16, q = roundf(x x (1/d)) with the unrounded d; a block of zeros
// has d = 0 and q = 0.
#pragma once

#include <cstdint>

namespace peft {

inline constexpr uint32_t kQ8_0BlockSize = 32;
inline constexpr uint32_t kQ8_0BlockBytes = 34;

// Quantizes `count` values (a multiple of 32) into count / 32 blocks at `out`. Callers pass finite
// values (a block with a NaN or infinity gets quants 0).
void quantize_q8_0(const float* values, uint64_t count, uint8_t* out);

// The values of count / 32 blocks (count a multiple of 32).
void dequantize_q8_0(const uint8_t* blocks, uint64_t count, float* out);

}  // namespace peft
