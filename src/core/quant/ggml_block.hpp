// What the ggml type table (ggml_types.hpp) and the block kernels (ggml_quant_support.hpp) both
// name: the K-quant super-block size and the kernels' signatures.
#pragma once

#include <cstdint>

namespace peft {

// Elements of a K-quant (and IQ) super-block, ggml's QK_K.
inline constexpr int QK_K = 256;

// A kernel handles `blocks` whole blocks.
using GgmlToFloat = void (*)(const uint8_t* in, float* out, uint64_t blocks);
using GgmlFromFloat = void (*)(const float* in, uint8_t* out, uint64_t blocks);

}  // namespace peft
