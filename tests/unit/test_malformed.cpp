// Broken files against the reference. tests/fixtures/malformed/expected.json records, for each file,
// the error the real safetensors package reports (mapped to our code; see tests/fixtures/README.md);
// every file must get exactly that code. Then every truncation and every appended-garbage variant of
// each valid fixture must fail with the code the reference's rules give: HEADER_TOO_SMALL below 8
// bytes, INVALID_HEADER_LENGTH while the header is cut, METADATA_INCOMPLETE_BUFFER after that.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "safetensors/header_parser.hpp"
#include "peft_test_paths.h"

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// "OK" or the code name; the message too, for failure reports.
std::pair<std::string, std::string> outcome(const char* data, size_t size) {
  try {
    peft::parse_safetensors(reinterpret_cast<const uint8_t*>(data), size);
    return {"OK", ""};
  } catch (const peft::Error& e) {
    return {peft::code_name(e.code()), e.what()};
  }
}

// Every *.safetensors under tests/fixtures/safetensors (the sharded and single-file folders too).
std::vector<fs::path> valid_fixtures() {
  const fs::path dir = fs::path(PEFT_TEST_DATA) / "safetensors";
  REQUIRE_MESSAGE(fs::is_directory(dir), "missing fixture directory " << dir);
  std::vector<fs::path> files;
  for (const auto& item : fs::recursive_directory_iterator(dir)) {
    if (item.is_regular_file() && item.path().extension() == ".safetensors") files.push_back(item.path());
  }
  std::sort(files.begin(), files.end());
  REQUIRE_MESSAGE(files.size() >= 40, "expected the committed fixtures in " << dir);
  return files;
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  return n;
}

}  // namespace

TEST_CASE("malformed fixtures: every file gets exactly the code the reference gives") {
  const fs::path dir = fs::path(PEFT_TEST_DATA) / "malformed";
  REQUIRE_MESSAGE(fs::is_directory(dir), "missing fixture directory " << dir);
  const nlohmann::json expected = nlohmann::json::parse(read_file(dir / "expected.json"));
  REQUIRE(expected.size() >= 30);

  std::set<std::string> codes_seen;
  for (const auto& item : expected.items()) {
    const std::string name = item.key();
    const nlohmann::json& entry = item.value();
    CAPTURE(name);
    CAPTURE(entry.value("description", std::string()));
    const std::string file = read_file(dir / name);
    const std::pair<std::string, std::string> result = outcome(file.data(), file.size());
    const std::string& code = result.first;
    const std::string& message = result.second;
    CAPTURE(message);
    CHECK(code == entry.at("code").get<std::string>());
    if (code != "OK") {
      CHECK(message.find('\n') == std::string::npos);
      CHECK_FALSE(message.empty());
    }
    codes_seen.insert(code);
  }
  // Every file in the folder has an expectation, and every format code is exercised.
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() != ".safetensors") continue;
    CHECK_MESSAGE(expected.contains(item.path().filename().string()),
                  "no expectation for " << item.path().filename());
  }
  for (int32_t code = PEFT_ERR_HEADER_TOO_SMALL; code <= PEFT_ERR_METADATA_INCOMPLETE_BUFFER; ++code) {
    CHECK_MESSAGE(codes_seen.count(peft::code_name(code)) == 1, "no fixture for " << peft::code_name(code));
  }
}

TEST_CASE("malformed truncations: every prefix of every valid fixture fails as the reference rules say") {
  size_t prefixes = 0;
  for (const fs::path& path : valid_fixtures()) {
    CAPTURE(path.string());
    const std::string file = read_file(path);
    REQUIRE(outcome(file.data(), file.size()).first == "OK");
    const uint64_t n = header_length(file);
    for (size_t length = 0; length < file.size(); ++length) {
      CAPTURE(length);
      const char* expected = length < 8 ? "HEADER_TOO_SMALL"
                             : 8 + n > length ? "INVALID_HEADER_LENGTH"
                                              : "METADATA_INCOMPLETE_BUFFER";
      // A copy of exactly `length` bytes, so that a read past the end is caught by sanitizers.
      const std::vector<char> prefix(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(length));
      CHECK(outcome(prefix.data(), prefix.size()).first == expected);
      ++prefixes;
    }
  }
  CHECK(prefixes > 5000);
}

TEST_CASE("malformed appended garbage: any bytes after the last tensor are METADATA_INCOMPLETE_BUFFER") {
  const std::vector<std::string> garbage = {
      std::string(1, '\0'), " ", "\n", "{}", "x", std::string(7, '\0'), "extra_bogus_data_for_polyglot_file",
      "\xff\xfe", std::string(4096, 'A'), "PK\x03\x04",
  };
  for (const fs::path& path : valid_fixtures()) {
    CAPTURE(path.string());
    const std::string file = read_file(path);
    for (const std::string& tail : garbage) {
      CAPTURE(tail.size());
      const std::string longer = file + tail;
      CHECK(outcome(longer.data(), longer.size()).first == "METADATA_INCOMPLETE_BUFFER");
    }
  }
}
