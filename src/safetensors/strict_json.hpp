// A strict JSON reader that drives a SAX handler with nlohmann's SAX method names, accepting
// exactly the JSON that serde_json accepts (RFC 8259; whitespace is space, tab, CR and LF; no byte
// order mark, comments, trailing commas, NaN or leading zeros; strings without raw control
// characters; \u escapes with properly paired surrogates).
//
// Why not nlohmann's own parser: its lexer runs at about 40 MB/s, so a 10,000-tensor header
// (1.2 MB) took 31 ms, more than Python's safe_open. This one scans strings eight bytes at a time
// and parses integers inline, about ten times faster. nlohmann's parser is still run over the same
// handler in the tests and the fuzzer (parse_header_json_nlohmann) as an independent cross-check.
//
// The input must be valid UTF-8 (the caller checks it first, as the reference does), so bytes
// >= 0x80 are copied into strings without looking at them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace peft {

// Handler methods (all return false to stop): null(), boolean(bool), number_unsigned(uint64_t) for
// integers in [0, 2^64-1], number_integer(int64_t) for integers in [-2^63, -1] and "-0",
// number_float(long double, const std::string& text) for every other number (the value passed is 0:
// the handler decides from the text), string(std::string&), key(std::string&),
// start_object(size_t), end_object(), start_array(size_t), end_array(), and
// syntax_error(size_t byte_offset, const char* what).
template <class Handler>
class StrictJsonReader {
 public:
  // The reader's own recursion guard; handlers are expected to enforce a smaller limit.
  static constexpr size_t kMaxDepth = 512;

  StrictJsonReader(std::string_view text, Handler& handler)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()), handler_(handler) {}

  bool parse() {
    skip_whitespace();
    if (!value(0)) return false;
    skip_whitespace();
    if (p_ != end_) return syntax("trailing characters after the JSON value");
    return true;
  }

 private:
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  bool syntax(const char* what) { return handler_.syntax_error(static_cast<size_t>(p_ - begin_), what); }

  void skip_whitespace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  bool value(size_t depth) {
    if (p_ == end_) return syntax("unexpected end of the header, expected a value");
    switch (*p_) {
      case '{': return container<true>(depth + 1);
      case '[': return container<false>(depth + 1);
      case '"':
        ++p_;
        return read_string(scratch_) && handler_.string(scratch_);
      case 't': return literal("true") && handler_.boolean(true);
      case 'f': return literal("false") && handler_.boolean(false);
      case 'n': return literal("null") && handler_.null();
      default:
        if (*p_ == '-' || is_digit(*p_)) return number();
        return syntax("expected a value");
    }
  }

  // An object or an array, from its opening bracket at p_: members "key": value (objects) or values
  // (arrays), separated by commas.
  template <bool kObject>
  bool container(size_t depth) {
    constexpr char kClose = kObject ? '}' : ']';
    if (depth > kMaxDepth) return syntax("nested too deeply");
    ++p_;  // '{' or '['
    if (!(kObject ? handler_.start_object(static_cast<size_t>(-1)) : handler_.start_array(static_cast<size_t>(-1))))
      return false;
    const auto close = [this] {
      ++p_;
      return kObject ? handler_.end_object() : handler_.end_array();
    };
    skip_whitespace();
    if (p_ != end_ && *p_ == kClose) return close();
    while (true) {
      if (kObject && !member_key()) return false;
      if (!value(depth)) return false;
      skip_whitespace();
      if (p_ == end_)
        return syntax(kObject ? "unexpected end of the header inside an object"
                              : "unexpected end of the header inside an array");
      if (*p_ == ',') {
        ++p_;
        skip_whitespace();
        continue;
      }
      if (*p_ == kClose) return close();
      return syntax(kObject ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
    }
  }

  // An object member's key and its colon, up to the value.
  bool member_key() {
    if (p_ == end_ || *p_ != '"') return syntax("expected a string key");
    ++p_;
    if (!read_string(scratch_) || !handler_.key(scratch_)) return false;
    skip_whitespace();
    if (p_ == end_ || *p_ != ':') return syntax("expected ':' after an object key");
    ++p_;
    skip_whitespace();
    return true;
  }

  bool literal(std::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0) {
      return syntax("invalid literal");
    }
    p_ += word.size();
    return true;
  }

  // Advances p_ to the first '"', '\\' or control character (or the end). Sixteen bytes at a time
  // with SSE2 (every x86-64), whose byte mask gives the position at once; then eight at a time with
  // the classic "has a zero byte" / "has a byte below n" bit tricks, exact as yes/no answers.
  void skip_plain_string_bytes() {
#if defined(__SSE2__)
    const __m128i quote16 = _mm_set1_epi8('"'), backslash16 = _mm_set1_epi8('\\'), control16 = _mm_set1_epi8(0x1F);
    while (end_ - p_ >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p_));
      const __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote16), _mm_cmpeq_epi8(v, backslash16)),
                                           _mm_cmpeq_epi8(_mm_min_epu8(v, control16), v));  // v <= 0x1F
      if (const int mask = _mm_movemask_epi8(special)) {
        p_ += __builtin_ctz(static_cast<unsigned>(mask));
        return;
      }
      p_ += 16;
    }
#endif
    constexpr uint64_t kOnes = 0x0101010101010101ULL;
    constexpr uint64_t kHigh = 0x8080808080808080ULL;
    while (end_ - p_ >= 8) {
      uint64_t v;
      std::memcpy(&v, p_, 8);
      const uint64_t quote = v ^ (kOnes * '"');
      const uint64_t backslash = v ^ (kOnes * '\\');
      const uint64_t special = ((quote - kOnes) & ~quote) | ((backslash - kOnes) & ~backslash) |
                               ((v - kOnes * 0x20) & ~v);
      if ((special & kHigh) != 0) break;
      p_ += 8;
    }
    while (p_ != end_ && *p_ != '"' && *p_ != '\\' && static_cast<unsigned char>(*p_) >= 0x20) ++p_;
  }

  // Reads the rest of a string whose opening quote was consumed; the decoded text goes to `out`.
  bool read_string(std::string& out) {
    out.clear();
    while (true) {
      const char* run = p_;
      skip_plain_string_bytes();
      out.append(run, static_cast<size_t>(p_ - run));
      if (p_ == end_) return syntax("unterminated string");
      if (*p_ == '"') {
        ++p_;
        return true;
      }
      if (*p_ != '\\') return syntax("control character in a string (it must be escaped)");
      ++p_;
      if (!escape(out)) return false;
    }
  }

  bool hex4(uint32_t& code) {
    if (end_ - p_ < 4) return syntax("unexpected end of the header in a \\u escape");
    code = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      const char c = *p_;
      uint32_t digit;
      if (c >= '0' && c <= '9') digit = static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') digit = static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') digit = static_cast<uint32_t>(c - 'A' + 10);
      else return syntax("invalid hex digit in a \\u escape");
      code = code * 16 + digit;
    }
    return true;
  }

  bool escape(std::string& out) {
    if (p_ == end_) return syntax("unexpected end of the header in an escape");
    switch (*p_++) {
      case '"': out += '"'; return true;
      case '\\': out += '\\'; return true;
      case '/': out += '/'; return true;
      case 'b': out += '\b'; return true;
      case 'f': out += '\f'; return true;
      case 'n': out += '\n'; return true;
      case 'r': out += '\r'; return true;
      case 't': out += '\t'; return true;
      case 'u': break;
      default: --p_; return syntax("invalid escape");
    }
    uint32_t code = 0;
    if (!hex4(code)) return false;
    if (code >= 0xDC00 && code <= 0xDFFF) return syntax("unpaired surrogate in a \\u escape");
    if (code >= 0xD800 && code <= 0xDBFF) {
      if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return syntax("unpaired surrogate in a \\u escape");
      p_ += 2;
      uint32_t low = 0;
      if (!hex4(low)) return false;
      if (low < 0xDC00 || low > 0xDFFF) return syntax("unpaired surrogate in a \\u escape");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(out, code);
    return true;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  bool number() {
    const char* start = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || !is_digit(*p_)) return syntax("invalid number");
    uint64_t magnitude = 0;
    bool fits = true;  // the integer part fits in a u64
    if (*p_ == '0') {
      ++p_;  // a leading zero stands alone; a digit after it fails as "expected ',' ..."
    } else {
      while (p_ != end_ && is_digit(*p_)) {
        const uint64_t digit = static_cast<uint64_t>(*p_ - '0');
        if (fits && magnitude > (UINT64_MAX - digit) / 10) fits = false;
        if (fits) magnitude = magnitude * 10 + digit;
        ++p_;
      }
    }
    bool integral = true;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (p_ == end_ || !is_digit(*p_)) return syntax("invalid number: no digit after '.'");
      while (p_ != end_ && is_digit(*p_)) ++p_;
      integral = false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !is_digit(*p_)) return syntax("invalid number: no digit in the exponent");
      while (p_ != end_ && is_digit(*p_)) ++p_;
      integral = false;
    }
    if (integral && fits) {
      if (!negative) return handler_.number_unsigned(magnitude);
      constexpr uint64_t kMinMagnitude = uint64_t{1} << 63;
      if (magnitude < kMinMagnitude) return handler_.number_integer(-static_cast<int64_t>(magnitude));
      if (magnitude == kMinMagnitude) return handler_.number_integer(INT64_MIN);
    }
    number_text_.assign(start, static_cast<size_t>(p_ - start));
    return handler_.number_float(0.0L, number_text_);
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  Handler& handler_;
  std::string scratch_;
  std::string number_text_;
};

}  // namespace peft
