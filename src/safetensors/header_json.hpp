// Step 6 of the reference reader: the header JSON into tensor entries and metadata, accepting and
// rejecting exactly what serde_json + serde_derive accept and reject for the reference's types
// (the rules are listed in header_sax.hpp). Internal to header_parser.cpp, the tests and the fuzzer.
#pragma once

#include <string_view>

#include "safetensors/header_types.hpp"

namespace peft {

// Parses header text that is already known to be valid UTF-8. Throws INVALID_HEADER, naming the
// tensor or key at fault, for anything the reference rejects at this step and for a tensor name
// that occurs twice.
HeaderJson parse_header_json(std::string_view text);

// The same, parsed by nlohmann's SAX parser instead of StrictJsonReader, for tests and the fuzzer to
// cross-check the fast reader against an independent JSON implementation. Slower (about 40 MB/s).
HeaderJson parse_header_json_nlohmann(std::string_view text);

}  // namespace peft
