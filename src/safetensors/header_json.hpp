// Step 6 of the reference reader: the header JSON into tensor entries and metadata, accepting and
// rejecting exactly what serde_json + serde_derive accept and reject for the reference's types
// (see header_json.cpp for the list). Internal to header_parser.cpp and its tests.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "safetensors/header_parser.hpp"

namespace peft {

struct HeaderJson {
  std::vector<TensorInfo> tensors;  // in the order the JSON lists them
  std::optional<Metadata> metadata; // sorted by key; for a key given twice the last value wins
};

// The reference's JSON nesting limit: serde_json fails with "recursion limit exceeded" when an
// object or array opens at depth 128 (the root object is depth 1).
inline constexpr size_t kMaxJsonDepth = 127;

// Parses header text that is already known to be valid UTF-8. Throws INVALID_HEADER, naming the
// tensor or key at fault, for anything the reference rejects at this step and for a tensor name
// that occurs twice.
HeaderJson parse_header_json(std::string_view text);

}  // namespace peft
