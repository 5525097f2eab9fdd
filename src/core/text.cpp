#include "core/text.hpp"

#include <cstdio>

namespace peft {
namespace {

template <class Int>
std::string dims_text(std::span<const Int> shape, size_t max_dims) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size() && i < max_dims; ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() > max_dims) out += ", ... (" + std::to_string(shape.size()) + " dimensions)";
  return out + "]";
}

}  // namespace

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string quoted_name(std::string_view name) {
  constexpr size_t kMax = 200;
  if (name.size() <= kMax) return quoted(std::string(name));
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return quoted(std::string(name.substr(0, cut))) + "...";
}

std::string join_text(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += separator;
    out += items[i];
  }
  return out;
}

std::string shape_text(std::span<const uint64_t> shape, size_t max_dims) { return dims_text(shape, max_dims); }
std::string shape_text(std::span<const int64_t> shape, size_t max_dims) { return dims_text(shape, max_dims); }

std::string ascii_lower(std::string text) {
  for (char& c : text)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return text;
}

}  // namespace peft
