#include "safetensors/header_json.hpp"

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "safetensors/header_sax.hpp"
#include "safetensors/strict_json.hpp"

namespace peft {
namespace {

// For the nlohmann cross-check, floats are lexed as long double so that a number just above
// DBL_MAX reaches number_float (with its text) instead of failing inside nlohmann's lexer:
// serde_json accepts some of those. (80- or 128-bit long double on the platforms we build for.)
using LongDoubleJson = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t,
                                            std::uint64_t, long double>;

HeaderJson finish(HeaderSax& sax, bool ok) {
  if (!ok) fail(PEFT_ERR_INVALID_HEADER, sax.message().empty() ? std::string("invalid JSON") : sax.message());
  return sax.take_result();
}

}  // namespace

HeaderJson parse_header_json(std::string_view text) {
  HeaderSax sax;
  StrictJsonReader<HeaderSax> reader(text, sax);
  const bool ok = reader.parse();
  return finish(sax, ok);
}

HeaderJson parse_header_json_nlohmann(std::string_view text) {
  HeaderSax sax;
  // Two places where nlohmann's lexer is more lenient than serde_json: it skips a UTF-8 byte order
  // mark at the very start, and it takes a NUL byte for the end of the input (so "{}\0" would pass
  // as "{}"). A raw NUL is never valid JSON (inside strings it must be escaped), so any NUL fails.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") {
    sax.syntax_error(0, "a byte order mark is not allowed");
    return finish(sax, false);
  }
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    sax.syntax_error(nul, "a NUL byte (padding must be JSON whitespace)");
    return finish(sax, false);
  }
  const bool ok = LongDoubleJson::sax_parse(text.data(), text.data() + text.size(), &sax,
                                            nlohmann::json::input_format_t::json, /*strict=*/true,
                                            /*ignore_comments=*/false);
  return finish(sax, ok);
}

}  // namespace peft
