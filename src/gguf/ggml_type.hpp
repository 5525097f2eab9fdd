// The ggml tensor types a GGUF file may hold: their numbers (ggml.h's `enum ggml_type`, stable in
// the format), names as gguf-py spells them, and storage geometry. A row of `ne[0]` elements takes
// ne[0] / block_size blocks of type_size bytes each; ne[0] must be a multiple of block_size.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/dtype.hpp"

namespace peft {

struct GgmlType {
  uint32_t id;
  std::string_view name;  // "F32", "Q4_K", ... (gguf-py's GGMLQuantizationType names)
  uint32_t block_size;    // elements per block (1 for plain element types)
  uint32_t type_size;     // bytes per block
};

// The type numbered `id`; nullopt for numbers ggml does not define (including removed ones such as
// 4 and 5, the former Q4_2/Q4_3).
std::optional<GgmlType> ggml_type(uint32_t id);
std::optional<GgmlType> ggml_type_by_name(std::string_view name);

// Largest id ggml_type() knows, for tables and tests.
uint32_t ggml_type_max_id();

// The safetensors dtype holding the same element encoding (F32, F16, BF16, F64, I8, I16, I32, I64);
// nullopt for block-quantized types.
std::optional<DType> dtype_of_ggml(uint32_t id);

// The ggml type of a dtype; nullopt for dtypes GGUF cannot hold.
std::optional<uint32_t> ggml_of_dtype(DType dtype);

}  // namespace peft
