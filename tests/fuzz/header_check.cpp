// Prints, for each file named on the command line, the result of peft::parse_safetensors:
//   <file> TAB OK|<CODE_NAME> TAB <message or tensor count>
// differential.py compares this with the reference package. When the header's JSON is reached, it
// is also parsed by nlohmann's SAX parser (parse_header_json_nlohmann); if the two JSON readers
// disagree the code printed is CROSSCHECK_MISMATCH. Exit status 0 unless a file could not be read.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "safetensors/header_json.hpp"
#include "safetensors/header_parser.hpp"

namespace {

// "OK" or the error code name of one JSON reader over the header text.
template <class Parse>
std::string json_outcome(Parse parse, std::string_view text) {
  try {
    const peft::HeaderJson json = parse(text);
    std::string summary = "OK";
    for (const auto& t : json.tensors) {
      summary += "|" + t.name + ":" + std::to_string(static_cast<int>(t.dtype)) + ":" +
                 std::to_string(t.begin) + "-" + std::to_string(t.end) + ":" + std::to_string(t.shape.size());
    }
    if (json.metadata) {
      for (const auto& [k, v] : *json.metadata) summary += "|m:" + k + "=" + v;
    }
    return summary;
  } catch (const peft::Error& e) {
    return peft::code_name(e.code());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int status = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", argv[i]);
      status = 1;
      continue;
    }
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    try {
      const uint64_t n = peft::read_header_length(data, bytes.size() < 8 ? bytes.size() : 8, bytes.size(), {});
      const std::string_view text(bytes.data() + 8, n);
      if (peft::is_valid_utf8(text) &&
          json_outcome(peft::parse_header_json, text) != json_outcome(peft::parse_header_json_nlohmann, text)) {
        std::printf("%s\tCROSSCHECK_MISMATCH\tstrict %s, nlohmann %s\n", argv[i],
                    json_outcome(peft::parse_header_json, text).c_str(),
                    json_outcome(peft::parse_header_json_nlohmann, text).c_str());
        continue;
      }
    } catch (const peft::Error&) {
      // reported below by parse_safetensors
    }
    try {
      const peft::Header header = peft::parse_safetensors(data, bytes.size());
      std::printf("%s\tOK\t%zu tensors\n", argv[i], header.tensors.size());
    } catch (const peft::Error& e) {
      std::printf("%s\t%s\t%s\n", argv[i], peft::code_name(e.code()), e.what());
    }
  }
  return status;
}
