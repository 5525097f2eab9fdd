// ggml's tensor types to and from f32, bit-identical to ggml (ggml-quants.c):
//
// - dequantize_rows gives, for every type ggml_can_dequantize accepts, the floats of ggml's
//   dequantize_row_* (to_float of ggml's type traits): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//   Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL,
//   IQ4_XS, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q2_0.
// - quantize_rows gives, for every type ggml_can_quantize accepts, the bytes of ggml_quantize_chunk
//   without an importance matrix (quantize_row_*_ref for all but IQ4_NL, whose chunk quantizer
//   searches more scales): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
//   Q6_K, IQ4_NL, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q2_0.
//
// Not quantized here: Q8_K (not a storage type: ggml_quantize_chunk refuses it) and the IQ types
// other than IQ4_NL (ggml's quantizers for them need an importance matrix or searches over the grids'
// neighbours). Neither direction: Q8_1 (ggml has no dequantizer for it either; it is an intermediate
// of its dot products) and the integer and F64 types (plain dtypes: core/convert). Those are refused
// with PEFT_ERR_UNSUPPORTED naming the type.
//
// Values in and out are in host (little-endian) order, as GGUF stores them. Non-finite inputs to a
// quantizer give ggml's x86-64 result (the same float -> integer conversions); ggml itself refuses
// such rows when it validates a file. The kernels are scalar C++ compiled without floating-point
// contraction (core/no_fp_contract.hpp), so the results do not depend on the machine or compiler.
#pragma once

#include <cstdint>

namespace peft {

// Whether the type (ggml's number) has a dequantizer / quantizer here.
bool ggml_can_dequantize(uint32_t type);
bool ggml_can_quantize(uint32_t type);

// Bytes of `rows` rows of `cols` values of the type. Fails with PEFT_ERR_INVALID_ARGUMENT for an
// unknown type or a `cols` that is not a multiple of the type's block size, or on overflow.
uint64_t ggml_rows_bytes(uint32_t type, uint64_t rows, uint64_t cols);

// rows x cols values from ggml_rows_bytes(type, rows, cols) bytes at `in`. Fails (before writing)
// with PEFT_ERR_UNSUPPORTED for a type without a dequantizer, or as ggml_rows_bytes.
void dequantize_rows(uint32_t type, const void* in, uint64_t rows, uint64_t cols, float* out);

// rows x cols values into ggml_rows_bytes(type, rows, cols) bytes at `out`. Fails (before writing)
// with PEFT_ERR_UNSUPPORTED for a type without a quantizer, or as ggml_rows_bytes.
void quantize_rows(uint32_t type, const float* in, uint64_t rows, uint64_t cols, void* out);

}  // namespace peft
