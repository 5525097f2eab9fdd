// The ggml tensor types a GGUF file may hold, one row each: the number (ggml.h's `enum ggml_type`,
// stable in the format), the name as gguf-py spells it, the storage geometry, the kernels to and from
// f32, the safetensors dtype of the same encoding, and where a block's f16 scales sit. A row of
// `ne[0]` elements takes ne[0] / block_size blocks of type_size bytes each; ne[0] must be a multiple
// of block_size. The one table of them: the GGUF reader and writer (gguf/ggml_type.hpp), the block
// quantizers (core/quant/ggml_quant.hpp) and the merge's requantizer read it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/dtype.hpp"
#include "core/quant/ggml_block.hpp"

namespace peft {

struct GgmlType {
  uint32_t id;
  std::string_view name;  // "F32", "Q4_K", ... (gguf-py's GGMLQuantizationType names)
  uint32_t block_size;    // elements per block (1 for plain element types)
  uint32_t type_size;     // bytes per block
  GgmlToFloat to_float = nullptr;      // ggml's dequantize_row_*; nullptr: none here
  GgmlFromFloat from_float = nullptr;  // ggml_quantize_chunk without an importance matrix; nullptr: none
  std::optional<DType> dtype = std::nullopt;  // the safetensors dtype of the same element encoding
  // Bytes from a block's start of its f16 scales, in the types whose stored values are all finite
  // exactly when these are (Q8_0, Q4_K, Q5_K, Q6_K: every value is a finite scale times a small
  // integer, minus a finite min); scale_count 0 for the others.
  uint8_t scale_offsets[2] = {0, 0};
  uint8_t scale_count = 0;
};

// ggml's type numbers of the types the quantizers name directly.
namespace ggml_id {
inline constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
                          Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16,
                          IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
                          IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
                          TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42;
}  // namespace ggml_id

// The type numbered `id`; nullopt for numbers ggml does not define (including removed ones such as
// 4 and 5, the former Q4_2/Q4_3).
std::optional<GgmlType> ggml_type(uint32_t id);
std::optional<GgmlType> ggml_type_by_name(std::string_view name);

// Largest id ggml_type() knows, for tables and tests.
uint32_t ggml_type_max_id();

// The names of the types with a dequantizer (to_float) or a quantizer (from_float), comma-separated
// in id order, for messages.
std::string ggml_dequantizable_names();
std::string ggml_quantizable_names();

}  // namespace peft
