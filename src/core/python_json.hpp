// JSON text exactly as Python's json module writes it, byte for byte: what transformers writes for
// model.safetensors.index.json and config.json, and PEFT for adapter_config.json, all with
// `json.dumps(value, indent=2, sort_keys=True)`:
// * keys sorted at every level by code point (UTF-8 byte order); ", " never used: items end with
//   "," and a newline, keys are followed by ": ", two spaces per level, "[]" and "{}" when empty;
// * strings with ensure_ascii: `"` `\` and \b \f \n \r \t escaped by name, other bytes below 0x20,
//   DEL and every non-ASCII character as \uXXXX (lowercase hex; surrogate pairs beyond U+FFFF);
// * floats as Python's repr: the shortest digits that round-trip, fixed notation for decimal
//   exponents -4 ... 15 (always with a fraction: "16.0"), else "1e-05" / "1.5e+16"; NaN and
//   infinities as json writes them (NaN, Infinity, -Infinity); integers in decimal;
// * no trailing newline.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace peft {

// json.dumps(value, indent=2, sort_keys=True). INVALID_ARGUMENT for a string that is not UTF-8.
std::string python_json_dumps(const nlohmann::json& value);
std::string python_json_dumps(const nlohmann::ordered_json& value);

// Appends `text` as json.dumps writes a str with ensure_ascii (see the file comment).
// INVALID_ARGUMENT when `text` is not UTF-8.
void append_python_string(std::string& out, std::string_view text);

// repr(float(value)), e.g. "0.1", "16.0", "1e-05", "1.2345678901234568e+17", "inf".
// (json.dumps writes non-finite values as NaN / Infinity; see python_json_dumps.)
std::string python_float_repr(double value);

}  // namespace peft
