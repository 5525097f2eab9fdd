// One validated safetensors file: its parsed header, and (through TensorFile) access to its
// tensors' bytes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/tensor_file.hpp"
#include "safetensors/header_parser.hpp"

namespace peft {

class SafetensorsFile : public TensorFile {
 public:
  // Opens and validates `path` completely (reference steps 1-8 against the real file size) before
  // any tensor byte is touched. `display_path` names the file in messages (defaults to `path`).
  static std::unique_ptr<const SafetensorsFile> open(const std::string& path, const OpenOptions& options = {},
                                                     const std::string& display_path = {});
  // Copies `size` bytes and validates them; the copy is owned by the result. `use_pread` is ignored.
  static std::unique_ptr<const SafetensorsFile> from_memory(const void* data, size_t size,
                                                            const OpenOptions& options = {},
                                                            const std::string& display_name = "<memory>");

  const Header& header() const { return header_; }

 private:
  SafetensorsFile() = default;
  Header header_;
};

}  // namespace peft
