#include "core/python_json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void append_u_escape(std::string& out, uint32_t unit) {
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(unit >> shift) & 0xF];
}

[[noreturn]] void not_utf8(std::string_view text) {
  fail(PEFT_ERR_INVALID_ARGUMENT, "a string to write as JSON is not valid UTF-8: " + quoted(std::string(text)));
}

// Decodes one UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF); advances i.
uint32_t next_code_point(std::string_view text, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length;
  uint32_t cp;
  uint32_t min;
  if (lead < 0x80) {
    ++i;
    return lead;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, cp = lead & 0x1F, min = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, cp = lead & 0x0F, min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, cp = lead & 0x07, min = 0x10000;
  } else {
    not_utf8(text);  // continuation byte, overlong two-byte lead (C0, C1) or out of range (F5..FF)
  }
  if (text.size() - i < length) not_utf8(text);
  for (size_t k = 1; k < length; ++k) {
    const unsigned char c = byte(i + k);
    if ((c & 0xC0) != 0x80) not_utf8(text);
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) not_utf8(text);
  i += length;
  return cp;
}

void append_float(std::string& out, double value) {
  // json.encoder's floatstr: allow_nan=True spellings.
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "Infinity" : "-Infinity";
  } else {
    out += python_float_repr(value);
  }
}

void newline(std::string& out, size_t level) {
  out += '\n';
  out.append(level * 2, ' ');
}

template <class Json>
void append_value(std::string& out, const Json& value, size_t level) {
  switch (value.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += value.template get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_integer: out += std::to_string(value.template get<int64_t>()); return;
    case Json::value_t::number_unsigned: out += std::to_string(value.template get<uint64_t>()); return;
    case Json::value_t::number_float: append_float(out, value.template get<double>()); return;
    case Json::value_t::string: append_python_string(out, value.template get_ref<const std::string&>()); return;
    case Json::value_t::array: {
      if (value.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Json& item : value) {
        if (!first) out += ',';
        first = false;
        newline(out, level + 1);
        append_value(out, item, level + 1);
      }
      newline(out, level);
      out += ']';
      return;
    }
    case Json::value_t::object: {
      if (value.empty()) {
        out += "{}";
        return;
      }
      // sort_keys: Python compares str by code point, which is the byte order of UTF-8.
      std::vector<const std::string*> keys;
      for (auto it = value.begin(); it != value.end(); ++it) keys.push_back(&it.key());
      std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
      out += '{';
      bool first = true;
      for (const std::string* key : keys) {
        if (!first) out += ',';
        first = false;
        newline(out, level + 1);
        append_python_string(out, *key);
        out += ": ";
        append_value(out, value.at(*key), level + 1);
      }
      newline(out, level);
      out += '}';
      return;
    }
    case Json::value_t::binary:
    case Json::value_t::discarded:
      break;
  }
  fail(PEFT_ERR_INTERNAL, "a JSON value of a kind Python's json cannot write");
}

template <class Json>
std::string dumps(const Json& value) {
  std::string out;
  append_value(out, value, 0);
  return out;
}

}  // namespace

// json.encoder.py_encode_basestring_ascii
void append_python_string(std::string& out, std::string_view text) {
  out += '"';
  for (size_t i = 0; i < text.size();) {
    const uint32_t cp = next_code_point(text, i);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      default: break;
    }
    if (cp >= 0x20 && cp <= 0x7E) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      append_u_escape(out, cp);
    } else {
      const uint32_t v = cp - 0x10000;
      append_u_escape(out, 0xD800 | (v >> 10));
      append_u_escape(out, 0xDC00 | (v & 0x3FF));
    }
  }
  out += '"';
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, "d[.ddd]e[+-]X", then laid out as float_repr
  // does: fixed notation for exponents -4 ... 15, scientific with at least two exponent digits else.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  if (ec != std::errc()) fail(PEFT_ERR_INTERNAL, "cannot format a float");
  std::string text(buf, end);
  std::string sign;
  if (!text.empty() && text[0] == '-') {
    sign = "-";
    text.erase(0, 1);
  }
  const size_t e_pos = text.find('e');
  std::string digits = text.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(text.substr(e_pos + 1));
  if (digits == "0") return sign + "0.0";
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (exponent + 1 >= n) {
      out = digits + std::string(static_cast<size_t>(exponent + 1 - n), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent + 1)) + "." + digits.substr(static_cast<size_t>(exponent + 1));
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    const int magnitude = exponent < 0 ? -exponent : exponent;
    out += exponent < 0 ? "e-" : "e+";
    if (magnitude < 10) out += '0';
    out += std::to_string(magnitude);
  }
  return sign + out;
}

std::string python_json_dumps(const nlohmann::json& value) { return dumps(value); }
std::string python_json_dumps(const nlohmann::ordered_json& value) { return dumps(value); }

}  // namespace peft
