// JSON strings as serde_json writes them, byte for byte: the Rust safetensors writer's header uses
// serde_json's compact form, and the header writer (header_writer.hpp) matches it.
#pragma once

#include <string>
#include <string_view>

namespace peft::json {

// Appends text as a JSON string with serde_json's escaping: \" \\ \b \t \n \f \r, other bytes
// below 0x20 as \u00xx (lowercase hex), everything else verbatim (0x7F and non-ASCII included).
void append_serde_string(std::string& out, std::string_view text);

}  // namespace peft::json
