// The ggml tensor types of GGUF files: the type table itself, with each plain type's dtype, lives in
// core/quant/ggml_types.hpp (the quantizers need it too); these look the dtypes up both ways.
#pragma once

#include <cstdint>
#include <optional>

#include "core/dtype.hpp"
#include "core/quant/ggml_types.hpp"

namespace peft {

// The safetensors dtype holding the same element encoding (F32, F16, BF16, F64, I8, I16, I32, I64);
// nullopt for block-quantized types.
std::optional<DType> dtype_of_ggml(uint32_t id);

// The ggml type of a dtype; nullopt for dtypes GGUF cannot hold.
std::optional<uint32_t> ggml_of_dtype(DType dtype);

}  // namespace peft
