// JSON output that matches two reference writers byte for byte:
//  - serde_json's compact form, which the Rust safetensors writer uses for file headers;
//  - Python's json.dumps(indent=2, sort_keys=True, ensure_ascii=True), which transformers uses for
//    model.safetensors.index.json.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace peft::json {

// Appends text as a JSON string with serde_json's escaping: \" \\ \b \t \n \f \r, other bytes
// below 0x20 as \u00xx (lowercase hex), everything else verbatim (0x7F and non-ASCII included).
void append_serde_string(std::string& out, std::string_view text);

// Appends text as a JSON string the way Python's json module does with ensure_ascii=True:
// short escapes as above, other controls, 0x7F and all non-ASCII as \uxxxx (lowercase hex,
// surrogate pairs above U+FFFF). The text must be valid UTF-8 (see
// safetensors/utf8.hpp); a malformed byte would come out as U+FFFD.
void append_python_string(std::string& out, std::string_view text);

// json.dumps(value, indent=2, sort_keys=True) with Python's default separators (", " becomes ","
// at line ends, ": " between key and value) and ensure_ascii. Keys are sorted by code point, which
// for UTF-8 is byte order. No trailing newline.
std::string python_dumps_indent2_sorted(const nlohmann::json& value);

}  // namespace peft::json
