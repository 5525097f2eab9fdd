// Pieces of error messages: names quoted so that a message stays on one line, shapes written out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peft {

// Quotes a name for a message: "name" with control characters escaped, so messages stay one line.
std::string quoted(const std::string& text);

// A name from a file for a message: quoted, cut at a character boundary after 200 bytes ("...").
std::string quoted_name(std::string_view name);

// "[2, 3]": a tensor shape for a message. At most `max_dims` dimensions are written out; a longer
// shape ends in ", ... (N dimensions)".
inline constexpr size_t kAllDims = std::numeric_limits<size_t>::max();
std::string shape_text(std::span<const uint64_t> shape, size_t max_dims = kAllDims);
std::string shape_text(std::span<const int64_t> shape, size_t max_dims = kAllDims);

// The text with A-Z lowered (Python's str.lower() on the ASCII names of configs and types).
std::string ascii_lower(std::string text);

// The items joined by `separator`: a list of problems in one message ("a; b; c").
std::string join_text(const std::vector<std::string>& items, std::string_view separator);

}  // namespace peft
