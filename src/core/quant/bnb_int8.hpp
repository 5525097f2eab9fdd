// bitsandbytes' LLM.int8() weights (Int8Params, as transformers saves them: `weight` I8 [out, in] and
// `SCB` F32 [out]), bit-identical to bitsandbytes 0.50 on CPU.
//
// Quantizing (int8_vectorwise_quant, threshold 0): SCB[r] = max |row r|, q = round-half-even(x x
// (127 / SCB[r])) in f32; a row of zeros gets SCB 0 and quants 0.
// Dequantizing (int8_vectorwise_dequant): x = (q x SCB[r]) x 0.007874016 (1/127 as an f32), two f32
// products.
#pragma once

#include <cstdint>

namespace peft::bnb {

void dequantize_int8(const int8_t* q, const float* scb, uint64_t rows, uint64_t cols, float* values);

// `scb` receives `rows` values.
void quantize_int8(const float* values, uint64_t rows, uint64_t cols, int8_t* q, float* scb);

}  // namespace peft::bnb
