// Pieces of the header parser's error messages. Messages are one line; names and shapes come from
// the file, so they are quoted and cut short enough to stay readable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/text.hpp"

namespace peft {

// `"name"` escaped by peft::quoted, cut at a character boundary after 200 bytes.
inline std::string quoted_name(std::string_view name) {
  constexpr size_t kMax = 200;
  if (name.size() <= kMax) return quoted(std::string(name));
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return quoted(std::string(name.substr(0, cut))) + "...";
}

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
