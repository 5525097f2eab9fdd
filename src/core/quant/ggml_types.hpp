// The ggml tensor types a GGUF file may hold: their numbers (ggml.h's `enum ggml_type`, stable in
// the format), names as gguf-py spells them, and storage geometry. A row of `ne[0]` elements takes
// ne[0] / block_size blocks of type_size bytes each; ne[0] must be a multiple of block_size. The one
// table of them: the GGUF reader and writer (gguf/ggml_type.hpp) and the block quantizers
// (core/quant/ggml_quant.hpp) both use it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace peft {

struct GgmlType {
  uint32_t id;
  std::string_view name;  // "F32", "Q4_K", ... (gguf-py's GGMLQuantizationType names)
  uint32_t block_size;    // elements per block (1 for plain element types)
  uint32_t type_size;     // bytes per block
};

// ggml's type numbers of the types the quantizers name directly.
namespace ggml_id {
inline constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
                          Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16,
                          IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
                          IQ4_XS = 23, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
                          NVFP4 = 40, Q1_0 = 41, Q2_0 = 42;
}  // namespace ggml_id

// The type numbered `id`; nullopt for numbers ggml does not define (including removed ones such as
// 4 and 5, the former Q4_2/Q4_3).
std::optional<GgmlType> ggml_type(uint32_t id);
std::optional<GgmlType> ggml_type_by_name(std::string_view name);

// Largest id ggml_type() knows, for tables and tests.
uint32_t ggml_type_max_id();

}  // namespace peft
