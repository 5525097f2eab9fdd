// UTF-8 validation with exactly the rules of Rust's core::str::from_utf8 (RFC 3629: no overlong
// forms, no surrogates U+D800..U+DFFF, nothing above U+10FFFF). The reference reader checks all N
// header bytes with it before it looks at the JSON, and writers must reject names that fail it; the
// GGUF reader checks keys and tensor names with it.
#pragma once

#include <cstddef>
#include <string_view>

namespace peft {

// Length of the longest prefix of `bytes` that is valid UTF-8 ending on a character boundary;
// equals bytes.size() exactly when the whole input is valid. ASCII runs are checked 16 bytes at a
// time, so a typical header costs well under a millisecond per megabyte.
size_t utf8_valid_prefix(std::string_view bytes) noexcept;

inline bool is_valid_utf8(std::string_view bytes) noexcept {
  return utf8_valid_prefix(bytes) == bytes.size();
}

}  // namespace peft
