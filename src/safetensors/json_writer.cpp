#include "safetensors/json_writer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

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

// The short escapes both serde_json and Python use; 0 when the byte has none.
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

// Decodes one UTF-8 sequence starting at text[i]; returns its length (0 if malformed).
size_t decode_utf8(std::string_view text, size_t i, uint32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length;
  uint32_t cp;
  uint32_t min;
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, cp = lead & 0x1F, min = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, cp = lead & 0x0F, min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, cp = lead & 0x07, min = 0x10000;
  } else {
    return 0;  // continuation byte, overlong two-byte lead (C0, C1) or out of range (F5..FF)
  }
  if (text.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    const unsigned char c = byte(i + k);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  code_point = cp;
  return length;
}

// Python's float repr (shortest round trip) for the few floats an index's metadata may hold.
std::string python_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  // nlohmann prints the shortest round-trip form with the same exponent style as Python repr
  // ("1e-05", "1e+16", "0.1", "1.0").
  return nlohmann::json(value).dump();
}

void dump_python(std::string& out, const nlohmann::json& value, size_t depth) {
  const auto newline = [&](size_t level) {
    out += '\n';
    out.append(level * 2, ' ');
  };
  switch (value.type()) {
    case nlohmann::json::value_t::object: {
      if (value.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::string*> keys;
      for (auto it = value.begin(); it != value.end(); ++it) keys.push_back(&it.key());
      std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) {
        return std::string_view(*a) < std::string_view(*b);  // byte order = code point order
      });
      out += '{';
      for (size_t k = 0; k < keys.size(); ++k) {
        if (k > 0) out += ',';
        newline(depth + 1);
        append_python_string(out, *keys[k]);
        out += ": ";
        dump_python(out, value.at(*keys[k]), depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case nlohmann::json::value_t::array: {
      if (value.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < value.size(); ++k) {
        if (k > 0) out += ',';
        newline(depth + 1);
        dump_python(out, value[k], depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case nlohmann::json::value_t::string:
      append_python_string(out, value.get_ref<const std::string&>());
      return;
    case nlohmann::json::value_t::number_float:
      out += python_float(value.get<double>());
      return;
    default:  // null, booleans and integers print the same in both
      out += value.dump();
      return;
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

void append_python_string(std::string& out, std::string_view text) {
  out += '"';
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (const char e = short_escape(c)) {
      out += '\\';
      out += e;
      ++i;
      continue;
    }
    uint32_t cp;
    size_t n = decode_utf8(text, i, cp);
    if (n == 0) {  // callers validate first; never emit malformed output
      cp = 0xFFFD;
      n = 1;
    }
    i += n;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      append_u_escape(out, 0xD800 + (cp >> 10));
      append_u_escape(out, 0xDC00 + (cp & 0x3FF));
    } else {
      append_u_escape(out, cp);
    }
  }
  out += '"';
}

std::string python_dumps_indent2_sorted(const nlohmann::json& value) {
  std::string out;
  dump_python(out, value, 0);
  return out;
}

}  // namespace peft::json
