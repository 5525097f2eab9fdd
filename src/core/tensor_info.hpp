// One tensor of a checkpoint file, whatever its format: name, element type, shape and where its
// bytes lie in the file's data section.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace peft {

struct TensorInfo {
  std::string name;
  DType dtype = DType::BOOL;
  std::vector<uint64_t> shape;  // outermost first (PyTorch's order; GGUF's ne reversed); empty for a scalar
  uint64_t begin = 0, end = 0;  // byte range relative to the data section
  // GGUF tensors: the ggml type as stored (gguf/ggml_type.hpp); -1 for safetensors tensors.
  int32_t ggml_type = -1;
  // A block-quantized GGUF tensor (Q8_0, Q4_K, ...) has no dtype of its own: `dtype` is then U8,
  // meaningless, and only its raw bytes can be read.
  bool block_quantized = false;
  uint64_t nbytes() const { return end - begin; }
};

}  // namespace peft
