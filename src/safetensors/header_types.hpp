// The plain types of a parsed safetensors header: its tensor entries, metadata and sizes, and what
// the header JSON step yields. Shared by the parser's steps (header_parser, header_json,
// header_sax) and by everything that reads a parsed header.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "core/name_index.hpp"
#include "core/tensor_info.hpp"

namespace peft {

using Metadata = std::vector<std::pair<std::string, std::string>>;  // sorted by key bytes

struct Header {
  uint64_t header_size = 0;         // N, the JSON length including padding
  std::vector<TensorInfo> tensors;  // in data order: stable sort by (begin, end) as the reference does
  std::optional<Metadata> metadata; // nullopt when "__metadata__" is absent or null; {} when it is {}
  uint64_t data_size = 0;           // end of the last tensor (0 without tensors)
  NameIndex names;                  // positions in `tensors` by name (NamesOf(tensors))
  uint64_t data_start() const { return 8 + header_size; }
};

// What step 6 (header_json.hpp) yields.
struct HeaderJson {
  std::vector<TensorInfo> tensors;  // in the order the JSON lists them
  std::optional<Metadata> metadata; // sorted by key; for a key given twice the last value wins
};

}  // namespace peft
