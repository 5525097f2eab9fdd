// Reading a JSON document the library did not write itself (adapter and model configs, shard
// indexes, translation tables, metadata handed over by callers): nesting bounded, time linear in size.
//
// Why not nlohmann's parse: its parser is iterative, but the documents it builds are copied, dumped
// and destroyed by recursion, so a document nested 100,000 deep overflows the stack later; and its
// ordered_json finds each key by a linear scan, so an object with n keys takes O(n^2) to build
// (160k index entries: 21 s). The safetensors header has its own reader (safetensors/strict_json.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace peft {

// Deepest nesting of arrays and objects accepted. Real configs nest a handful of levels, Python's json
// gives up near 1000; at this depth every recursive walk over a document is harmless.
inline constexpr size_t kMaxJsonDepth = 256;

// Parses `text` as one JSON value (nlohmann's grammar, the whole text). An object keeps its keys in
// file order in the ordered form; a repeated key keeps its first position and its last value, as
// Python's json does. Fails with `code` and a message starting with `source` when the text is not
// JSON or nests deeper than kMaxJsonDepth.
nlohmann::ordered_json parse_json_ordered(std::string_view text, int32_t code, const std::string& source);
nlohmann::json parse_json(std::string_view text, int32_t code, const std::string& source);

}  // namespace peft
