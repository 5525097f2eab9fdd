// Small helpers to print JSON from the CLI (which sees only the C API, so no JSON library is needed).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace peftc {

// A JSON string literal of `length` bytes: quotes, backslashes and control characters (NUL
// included) escaped; UTF-8 passes through.
inline std::string json_string(const char* text, size_t length) {
  std::string out = "\"";
  for (size_t i = 0; i < length; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

inline std::string json_string(const char* text) { return json_string(text, std::strlen(text)); }

inline std::string json_string(const std::string& text) { return json_string(text.data(), text.size()); }

// A JSON array of unsigned integers.
inline std::string json_uint_array(const uint64_t* values, size_t count) {
  std::string out = "[";
  for (size_t i = 0; i < count; ++i) {
    if (i) out += ",";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

}  // namespace peftc
