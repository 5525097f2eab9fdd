// Small helpers to print JSON from the CLI (which sees only the C API, so no JSON library is needed).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace peftc {

// The length of the well-formed UTF-8 sequence starting at `text[i]` (1 to 4), or 0 when the bytes
// there are not one (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, cut).
inline size_t utf8_sequence(const unsigned char* text, size_t length, size_t i) {
  const unsigned char c = text[i];
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte (RFC 3629's table)
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  if (n == 0 || length - i < n || text[i + 1] < lo || text[i + 1] > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((text[i + k] & 0xC0) != 0x80) return 0;
  return n;
}

// A JSON string literal of `length` bytes: quotes, backslashes and control characters (NUL
// included) escaped; well-formed UTF-8 passes through, and each byte that is not part of it (a GGUF
// string value is any bytes) becomes U+FFFD, so that the output is always valid UTF-8 JSON.
inline std::string json_string(const char* text, size_t length) {
  std::string out = "\"";
  const auto* bytes = reinterpret_cast<const unsigned char*>(text);
  for (size_t i = 0; i < length; ++i) {
    unsigned char c = bytes[i];
    if (c >= 0x80) {
      const size_t n = utf8_sequence(bytes, length, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";
      } else {
        out.append(text + i, n);
        i += n - 1;
      }
      continue;
    }
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
// A double as JSON: integers without a fraction, everything else with round-trip precision; null
// for an infinity or NaN.
inline std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return buf;
}

inline std::string json_uint_array(const uint64_t* values, size_t count) {
  std::string out = "[";
  for (size_t i = 0; i < count; ++i) {
    if (i) out += ",";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

}  // namespace peftc
