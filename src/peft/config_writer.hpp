// adapter_config.json exactly as PEFT writes it: Python's `json.dumps(d, indent=2, sort_keys=True)`
// (PeftConfigMixin.save_pretrained), byte for byte, so that a config read and written again by
// peft_c is the file PEFT would have written:
// * keys sorted at every level by code point (UTF-8 byte order), ", " never used: items end with
//   "," and a newline, keys are followed by ": ", two spaces per level, "[]" and "{}" when empty;
// * strings with ensure_ascii: `"` `\` and \b \f \n \r \t escaped by name, other bytes below 0x20,
//   DEL and every non-ASCII character as \uXXXX (lowercase hex; surrogate pairs beyond U+FFFF);
// * floats as Python's repr: the shortest digits that round-trip, fixed notation for decimal
//   exponents -4 ... 15 (always with a fraction: "16.0"), else "1e-05" / "1.5e+16"; NaN and
//   infinities as Python writes them (NaN, Infinity, -Infinity); integers in decimal;
// * no trailing newline.
//
// Pure functions; thread-safe.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/atomic_file.hpp"

namespace peft {

// json.dumps(value, indent=2, sort_keys=True). INVALID_CONFIG for a string that is not UTF-8.
std::string python_json_dumps(const nlohmann::ordered_json& value);

// repr(float(value)), e.g. "0.1", "16.0", "1e-05", "1.2345678901234568e+17", "inf" -> "inf".
// (json.dumps writes non-finite values as NaN / Infinity; see python_json_dumps.)
std::string python_float_repr(double value);

// Writes `text` to a temporary next to `path`, flushed and closed but not yet renamed: the caller
// commits it (AtomicFile::commit) once everything else that belongs with it is written too.
// PEFT_ERR_IO naming the path on failure.
std::unique_ptr<AtomicFile> stage_text_file(const std::string& path, const std::string& text);

}  // namespace peft
