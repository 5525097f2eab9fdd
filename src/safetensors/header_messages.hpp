// Pieces of the header parser's error messages. Messages are one line; names and shapes come from
// the file, so they are quoted and cut short enough to stay readable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/text.hpp"

namespace peft {

// A shape in a header message writes out at most this many dimensions (shape_text's max_dims).
inline constexpr size_t kShapeDimsShown = 16;

inline std::string offsets_text(uint64_t begin, uint64_t end) {
  std::string out = "[";  // appended piecewise: GCC 12 warns falsely on "[" + std::string&&
  out += std::to_string(begin);
  out += ", ";
  out += std::to_string(end);
  return out + "]";
}

}  // namespace peft
