#include "core/utf8.hpp"

#include <cstdint>
#include <cstring>

namespace peft {
namespace {

constexpr uint64_t kHighBits = 0x8080808080808080ULL;

inline bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the valid multi-byte sequence starting at p[0] (a byte >= 0x80), or 0 when invalid.
// The ranges of the second byte are the ones from the Unicode standard's table 3-7, which is what
// Rust checks: they exclude overlong forms, surrogates and code points above U+10FFFF.
inline size_t sequence_length(const unsigned char* p, size_t available) {
  const unsigned char lead = p[0];
  if (lead >= 0xC2 && lead <= 0xDF) {
    return available >= 2 && is_continuation(p[1]) ? 2 : 0;
  }
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (available < 3) return 0;
    const unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned char high = lead == 0xED ? 0x9F : 0xBF;
    if (p[1] < low || p[1] > high || !is_continuation(p[2])) return 0;
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (available < 4) return 0;
    const unsigned char low = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;
    if (p[1] < low || p[1] > high || !is_continuation(p[2]) || !is_continuation(p[3])) return 0;
    return 4;
  }
  return 0;  // a stray continuation byte, C0/C1 (always overlong) or F5..FF
}

}  // namespace

size_t utf8_valid_prefix(std::string_view bytes) noexcept {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  size_t i = 0;
  while (i < size) {
    // Fast path: skip whole blocks of ASCII.
    while (i + 16 <= size) {
      uint64_t a, b;
      std::memcpy(&a, data + i, 8);
      std::memcpy(&b, data + i + 8, 8);
      if (((a | b) & kHighBits) != 0) break;
      i += 16;
    }
    if (i >= size) break;
    if (data[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t length = sequence_length(data + i, size - i);
    if (length == 0) return i;
    i += length;
  }
  return size;
}

}  // namespace peft
