#include "safetensors/serde_string.hpp"

#include <cstdint>

namespace peft::json {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void append_u_escape(std::string& out, uint32_t unit) {
  out += "\\u";
  out += kHex[(unit >> 12) & 0xF];
  out += kHex[(unit >> 8) & 0xF];
  out += kHex[(unit >> 4) & 0xF];
  out += kHex[unit & 0xF];
}

// serde_json's short escapes; 0 when the byte has none.
char short_escape(unsigned char c) {
  switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case 0x08: return 'b';
    case 0x09: return 't';
    case 0x0A: return 'n';
    case 0x0C: return 'f';
    case 0x0D: return 'r';
    default: return 0;
  }
}

}  // namespace

void append_serde_string(std::string& out, std::string_view text) {
  out += '"';
  size_t run = 0;  // start of the pending run of bytes copied verbatim
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(text.substr(run, i - run));
    run = i + 1;
    if (const char e = short_escape(c)) {
      out += '\\';
      out += e;
    } else {
      append_u_escape(out, c);
    }
  }
  out.append(text.substr(run));
  out += '"';
}

}  // namespace peft::json
