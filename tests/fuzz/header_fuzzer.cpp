// libFuzzer target over the safetensors header reader. Per input it
//  1. runs parse_safetensors on the bytes as a whole file;
//  2. treats the bytes after the 8-byte prefix as header text (whatever the prefix says), so that
//     mutations reach the JSON and validation code even when they break the length;
//  3. parses that text with both JSON readers (StrictJsonReader and nlohmann's SAX parser) and
//     traps if they disagree;
// and checks that every accepted header satisfies the format's invariants, and that every failure
// is a peft::Error with one of the format codes. Anything else (a crash, a sanitizer report, another
// exception type escaping) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "safetensors/header_json.hpp"
#include "safetensors/header_parser.hpp"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

bool is_format_code(int32_t code) {
  return code >= PEFT_ERR_HEADER_TOO_SMALL && code <= PEFT_ERR_METADATA_INCOMPLETE_BUFFER;
}

void check_accepted(const peft::Header& header, uint64_t file_size) {
  require(8 + header.header_size + header.data_size == file_size);
  uint64_t expected_begin = 0;
  for (const peft::TensorInfo& t : header.tensors) {
    require(t.begin == expected_begin && t.end >= t.begin);
    unsigned __int128 bits = peft::dtype_bits(t.dtype);
    for (uint64_t dim : t.shape) bits *= dim;  // cannot overflow 128 bits after validation passed
    require(bits % 8 == 0 && bits / 8 == t.nbytes());
    expected_begin = t.end;
  }
  require(expected_begin == header.data_size);
  if (header.metadata) {
    for (size_t i = 1; i < header.metadata->size(); ++i) {
      require((*header.metadata)[i - 1].first < (*header.metadata)[i].first);
    }
  }
}

// A comparable summary of one JSON reader's result, or the error code.
template <class Parse>
std::string json_outcome(Parse parse, std::string_view text) {
  try {
    const peft::HeaderJson json = parse(text);
    std::string summary = "ok";
    for (const peft::TensorInfo& t : json.tensors) {
      summary += '\0' + t.name + '\0' + std::to_string(static_cast<int>(t.dtype)) + ':' +
                 std::to_string(t.begin) + ':' + std::to_string(t.end);
      for (uint64_t dim : t.shape) summary += ',' + std::to_string(dim);
    }
    if (json.metadata) {
      summary += std::string("\0meta", 5);
      for (const auto& [key, value] : *json.metadata) summary += '\0' + key + '\0' + value;
    }
    return summary;
  } catch (const peft::Error& e) {
    require(e.code() == PEFT_ERR_INVALID_HEADER);
    return "error";
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check_accepted(peft::parse_safetensors(data, size), size);
  } catch (const peft::Error& e) {
    require(is_format_code(e.code()));
  }

  if (size < 8) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 8, size - 8);
  try {
    check_accepted(peft::parse_header(text, size), size);
  } catch (const peft::Error& e) {
    require(is_format_code(e.code()) && e.code() != PEFT_ERR_HEADER_TOO_SMALL);
  }
  if (peft::is_valid_utf8(text)) {
    require(json_outcome(peft::parse_header_json, text) ==
            json_outcome(peft::parse_header_json_nlohmann, text));
  }
  return 0;
}
