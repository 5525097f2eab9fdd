// One validated GGUF file: its parsed header (typed metadata, tensor infos) and, through
// TensorFile, access to its tensors' bytes. F32/F16/BF16 and the integer types read as any dtype
// they convert to; block-quantized tensors read as raw bytes only.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/tensor_file.hpp"
#include "gguf/gguf_header.hpp"

namespace peft {

class GgufFile : public TensorFile {
 public:
  // Opens and validates `path` completely (parse_gguf_header against the real file size) before any
  // tensor byte is touched. `display_path` names the file in messages (defaults to `path`).
  static std::unique_ptr<const GgufFile> open(const std::string& path, const OpenOptions& options = {},
                                              const std::string& display_path = {});
  // Copies `size` bytes and validates them; the copy is owned by the result. `use_pread` is ignored.
  static std::unique_ptr<const GgufFile> from_memory(const void* data, size_t size, const OpenOptions& options = {},
                                                     const std::string& display_name = "<memory>");

  const GgufHeader& header() const { return header_; }

 private:
  GgufFile() = default;
  GgufHeader header_;
};

// True when the bytes start with GGUF's magic ("GGUF"); a safetensors file never does (its first
// eight bytes would be a header length far beyond any cap).
bool has_gguf_magic(const void* data, size_t size);

// True when `path` is a regular file that starts with GGUF's magic (false when it cannot be read).
bool is_gguf_path(const std::string& path);

}  // namespace peft
