// Broken GGUF files (tests/fixtures/malformed/gguf, written by tests/fixtures/generator/malformed_gguf.py):
// every file gets exactly the code its expected.json entry names ("OK" for the valid ones), with a
// one-line message naming the file. tests/interop/test_gguf_malformed.py checks the same files against
// gguf-py's reader.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "gguf_test_support.hpp"
#include "peft_test_paths.h"

namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("gguf malformed fixtures: every file gets exactly the code of its manifest entry") {
  const fs::path dir = fs::path(PEFT_TEST_DATA) / "malformed" / "gguf";
  REQUIRE_MESSAGE(fs::is_directory(dir), "missing fixture directory " << dir);
  const nlohmann::json expected = nlohmann::json::parse(read_bytes(dir / "expected.json"));
  REQUIRE(expected.size() >= 60);

  std::set<std::string> codes_seen;
  size_t valid = 0;
  for (const auto& item : expected.items()) {
    const std::string name = item.key();
    CAPTURE(name);
    CAPTURE(item.value().value("description", std::string()));
    std::string message;
    const std::string code = gguf_test::outcome(read_bytes(dir / name), 100'000'000, &message);
    CAPTURE(message);
    CHECK(code == item.value().at("code").get<std::string>());
    if (code == "OK") {
      ++valid;
    } else {
      CHECK(message.rfind("test.gguf: ", 0) == 0);
      CHECK(message.find('\n') == std::string::npos);
    }
    codes_seen.insert(code);
  }
  CHECK(valid >= 2);
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() != ".gguf") continue;
    CHECK_MESSAGE(expected.contains(item.path().filename().string()), "no expectation for " << item.path().filename());
  }
  for (const char* code : {"HEADER_TOO_SMALL", "INVALID_HEADER_LENGTH", "INVALID_HEADER_UTF8", "INVALID_HEADER",
                           "INVALID_OFFSET", "VALIDATION_OVERFLOW", "TENSOR_INVALID_INFO",
                           "METADATA_INCOMPLETE_BUFFER", "UNSUPPORTED"}) {
    CHECK_MESSAGE(codes_seen.count(code) == 1, "no fixture for " << code);
  }
}

TEST_CASE("gguf fuzz corpus: every seed parses or fails with a header code") {
  const fs::path dir = fs::path(PEFT_TEST_DATA).parent_path() / "fuzz" / "corpus" / "gguf_header";
  REQUIRE_MESSAGE(fs::is_directory(dir), "missing seed corpus " << dir);
  size_t seeds = 0, accepted = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    CAPTURE(item.path().filename().string());
    std::string message;
    const std::string code = gguf_test::outcome(read_bytes(item.path()), 100'000'000, &message);
    CAPTURE(message);
    CHECK((code == "OK" || code == "HEADER_TOO_SMALL" || code == "HEADER_TOO_LARGE" || code == "INVALID_HEADER_LENGTH" ||
           code == "INVALID_HEADER_UTF8" || code == "INVALID_HEADER" || code == "INVALID_OFFSET" ||
           code == "VALIDATION_OVERFLOW" || code == "TENSOR_INVALID_INFO" || code == "METADATA_INCOMPLETE_BUFFER" ||
           code == "UNSUPPORTED"));
    accepted += code == "OK";
    ++seeds;
  }
  CHECK(seeds >= 10);
  CHECK(accepted >= 2);
}
