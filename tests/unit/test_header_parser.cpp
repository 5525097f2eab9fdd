// The safetensors header reader against the reference: the reference's own inline test vectors
// (safetensors/src/tensor.rs and the byte-exact Python vectors), one test per rule of
// SafeTensors::read_metadata, the fixtures made by the reference writer, and the fuzz seed corpus
// with the codes the real package gives for it (tests/fuzz/corpus_codes.json). The expected
// outcomes of the hand-written cases were each confirmed against safetensors 0.8.0
// (tests/fuzz/differential.py runs the same comparison on generated headers).
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "safetensors/header_json.hpp"
#include "safetensors/header_parser.hpp"
#include "safetensors/serde_number.hpp"
#include "peft_test_paths.h"

using namespace std::string_literals;

namespace {

namespace fs = std::filesystem;

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

// A file: the length prefix, the header as given, then `data_len` zero bytes.
std::string framed(const std::string& header, size_t data_len = 0) {
  return le64(header.size()) + header + std::string(data_len, '\0');
}

// The same with the header padded by spaces to a multiple of 8, as the reference writer does.
std::string padded(std::string header, size_t data_len = 0) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return framed(header, data_len);
}

std::string from_bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out += static_cast<char>(b);
  return out;
}

peft::Header parse(const std::string& file, const peft::HeaderLimits& limits = {}) {
  return peft::parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size(), limits);
}

// "OK" or the code name of the error the file gets.
std::string result(const std::string& file, const peft::HeaderLimits& limits = {}) {
  try {
    parse(file, limits);
    return "OK";
  } catch (const peft::Error& e) {
    return peft::code_name(e.code());
  }
}

std::string message(const std::string& file) {
  try {
    parse(file);
    return "";
  } catch (const peft::Error& e) {
    return e.what();
  }
}

// One tensor entry in the reference writer's spelling.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end, const std::string& extra = "") {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]" + extra + "}";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The outcome of one JSON reader as a comparable string.
template <class Parse>
std::string json_outcome(Parse parse_json, std::string_view text) {
  try {
    const peft::HeaderJson json = parse_json(text);
    std::string out = "OK";
    for (const auto& t : json.tensors) {
      out += "|" + t.name + ":" + std::to_string(static_cast<int>(t.dtype)) + ":" + std::to_string(t.begin) +
             "-" + std::to_string(t.end) + ":" + std::to_string(t.shape.size());
    }
    if (json.metadata) {
      for (const auto& [k, v] : *json.metadata) out += "|m:" + k + "=" + v;
    }
    return out;
  } catch (const peft::Error& e) {
    return peft::code_name(e.code());
  }
}

// The fast reader and nlohmann's SAX parser must agree on every header text.
void check_readers_agree(const std::string& file) {
  if (file.size() < 8) return;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  if (n > file.size() - 8) return;
  const std::string_view text(file.data() + 8, n);
  if (!peft::is_valid_utf8(text)) return;
  CHECK(json_outcome(peft::parse_header_json, text) == json_outcome(peft::parse_header_json_nlohmann, text));
}

}  // namespace

// ---- the reference's inline vectors (safetensors/src/tensor.rs, mod tests) ------------------------

TEST_CASE("header reference test_serialization: attn.0 F32 [1,2,3]") {
  const std::string file = from_bytes(
      {64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100, 116, 121, 112, 101,
       34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 50, 44, 51, 93, 44,
       34, 100, 97, 116, 97, 95, 111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125,
       125, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64});
  const peft::Header h = parse(file);
  CHECK(h.header_size == 64);
  CHECK(h.data_start() == 72);
  CHECK(h.data_size == 24);
  CHECK_FALSE(h.metadata.has_value());
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].name == "attn.0");
  CHECK(h.tensors[0].dtype == peft::DType::F32);
  CHECK(h.tensors[0].shape == std::vector<uint64_t>{1, 2, 3});
  CHECK(h.tensors[0].begin == 0);
  CHECK(h.tensors[0].end == 24);
  CHECK(h.tensors[0].nbytes() == 24);
}

TEST_CASE("header reference test_serialization_fp4: F4 [1,2] is one byte") {
  const std::string file = padded(R"({"attn.0":{"dtype":"F4","shape":[1,2],"data_offsets":[0,1]}})", 1);
  CHECK(file.size() == 8 + 64 + 1);
  const peft::Header h = parse(file);
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].dtype == peft::DType::F4);
  CHECK(h.tensors[0].nbytes() == 1);
}

TEST_CASE("header reference test_empty: no tensors, with and without metadata") {
  const peft::Header empty = parse(from_bytes({8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}));
  CHECK(empty.tensors.empty());
  CHECK(empty.data_size == 0);
  CHECK_FALSE(empty.metadata.has_value());

  const std::string with_metadata = from_bytes(
      {40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95, 95, 34, 58, 123,
       34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112, 116, 34, 125, 125, 32, 32, 32, 32, 32});
  const peft::Header h = parse(with_metadata);
  REQUIRE(h.metadata.has_value());
  CHECK(*h.metadata == peft::Metadata{{"framework", "pt"}});
}

TEST_CASE("header reference test_serialization_forced_alignement: attn0, N = 72") {
  const std::string file =
      padded(R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})", 24);
  const peft::Header h = parse(file);
  CHECK(h.header_size == 72);
  CHECK(h.data_start() % 4 == 0);
  CHECK(h.tensors.at(0).shape == std::vector<uint64_t>{1, 1, 2, 3});
}

TEST_CASE("header reference test_empty_shapes_allowed, test_deserialization, test_zero_sized_tensor") {
  const peft::Header scalar =
      parse("8\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}\0\0\0\0"s);
  CHECK(scalar.tensors.at(0).shape.empty());
  CHECK(scalar.tensors.at(0).nbytes() == 4);

  const peft::Header plain = parse(
      "<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"s + std::string(16, '\0'));
  CHECK(plain.tensors.at(0).shape == std::vector<uint64_t>{2, 2});
  CHECK(plain.tensors.at(0).dtype == peft::DType::I32);

  const peft::Header zero =
      parse("<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,0],\"data_offsets\":[0, 0]}}"s);
  CHECK(zero.tensors.at(0).nbytes() == 0);
  CHECK(zero.data_size == 0);
}

TEST_CASE("header reference test_json_attack: ten tensors at [0,16] is INVALID_OFFSET") {
  std::string json = "{";
  for (int i = 0; i < 10; ++i) json += (i ? "," : "") + entry("weight_" + std::to_string(i), "F32", "[2,2]", 0, 16);
  CHECK(result(framed(json + "}", 16)) == "INVALID_OFFSET");
}

TEST_CASE("header reference test_metadata_incomplete_buffer: trailing and missing bytes") {
  const std::string base = "<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"s;
  CHECK(result(base + std::string(16, '\0') + "extra_bogus_data_for_polyglot_file") == "METADATA_INCOMPLETE_BUFFER");
  CHECK(result(base + std::string(14, '\0')) == "METADATA_INCOMPLETE_BUFFER");
}

TEST_CASE("header reference test_header_too_large, too_small, invalid_header_length, non_utf8, not_json") {
  CHECK(result("<\0\0\0\0\xff\xff\xff{\"test\":{}}"s) == "HEADER_TOO_LARGE");
  CHECK(result("") == "HEADER_TOO_SMALL");
  CHECK(result("<\0\0\0\0\0\0\0"s) == "INVALID_HEADER_LENGTH");
  CHECK(result("\x01\0\0\0\0\0\0\0\xff"s) == "INVALID_HEADER_UTF8");
  CHECK(result("\x01\0\0\0\0\0\0\0{"s) == "INVALID_HEADER");
}

TEST_CASE("header reference test_whitespace_padded_header and test_whitespace_leading_padded_header") {
  CHECK(parse("\x06\0\0\0\0\0\0\0{}\x0D\x20\x09\x0A"s).tensors.empty());
  CHECK(parse("\x06\0\0\0\0\0\0\0\x09\x0A{}\x0D\x20"s).tensors.empty());
}

TEST_CASE("header reference test_invalid_info and test_validation_overflow") {
  CHECK(result("<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0, 4]}}"s) ==
        "TENSOR_INVALID_INFO");
  CHECK(result("O\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,18446744073709551614],\"data_offsets\":[0,16]}}"s +
               std::string(16, '\0')) == "VALIDATION_OVERFLOW");
  CHECK(result("N\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,9223372036854775807],\"data_offsets\":[0,16]}}"s +
               std::string(16, '\0')) == "VALIDATION_OVERFLOW");
}

TEST_CASE("header reference Python vectors: I32 [2,2]; I32 + F16 padded to 128; metadata padded to 96") {
  const peft::Header one =
      parse("@\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}    "s +
            std::string(16, '\0'));
  CHECK(one.header_size == 64);

  const std::string two_json =
      R"({"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},"test2":{"dtype":"F16","shape":[2,2],"data_offsets":[16,24]}})";
  CHECK(two_json.size() == 122);
  const peft::Header two = parse(padded(two_json, 24));
  CHECK(two.header_size == 128);
  REQUIRE(two.tensors.size() == 2);
  CHECK(two.tensors[1].name == "test2");
  CHECK(two.data_size == 24);

  const std::string meta_json =
      R"({"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  CHECK(meta_json.size() == 95);
  const peft::Header meta = parse(padded(meta_json, 16));
  CHECK(meta.header_size == 96);
  CHECK(*meta.metadata == peft::Metadata{{"framework", "pt"}});
}

// ---- steps 1-4: the length prefix ---------------------------------------------------------------

TEST_CASE("header rule: fewer than 8 bytes is HEADER_TOO_SMALL") {
  for (size_t size = 0; size < 8; ++size) {
    CHECK(result(std::string(size, '\x02')) == "HEADER_TOO_SMALL");
  }
  CHECK(result(padded("{}")) == "OK");
}

TEST_CASE("header rule: N over the limit is HEADER_TOO_LARGE; exactly the limit is allowed") {
  CHECK(result(le64(100'000'001) + "{}") == "HEADER_TOO_LARGE");
  CHECK(result(le64(UINT64_MAX)) == "HEADER_TOO_LARGE");
  CHECK(result(le64(uint64_t{1} << 63) + "{}") == "HEADER_TOO_LARGE");
  // N = 100,000,000 passes the cap and then fails because the file is short.
  CHECK(result(le64(100'000'000) + "{}") == "INVALID_HEADER_LENGTH");
  peft::HeaderLimits small;
  small.max_header_size = 16;
  CHECK(result(framed(std::string("{}") + std::string(15, ' ')), small) == "HEADER_TOO_LARGE");
  CHECK(result(framed(std::string("{}") + std::string(14, ' ')), small) == "OK");
}

TEST_CASE("header rule: 8 + N past the end of the file is INVALID_HEADER_LENGTH") {
  CHECK(result(le64(3) + "{}") == "INVALID_HEADER_LENGTH");
  CHECK(result(le64(2) + "{}") == "OK");
  CHECK(result(le64(0)) == "INVALID_HEADER");  // N = 0 fits; an empty header is not JSON
}

TEST_CASE("header read_header_length: reads N and checks it against the limits and the file size") {
  const std::string prefix = le64(40);
  const auto* p = reinterpret_cast<const uint8_t*>(prefix.data());
  CHECK(peft::read_header_length(p, 8, 48, {}) == 40);
  CHECK(peft::read_header_length(p, 8, 1000, {}) == 40);
  CHECK_THROWS_AS(peft::read_header_length(p, 8, 47, {}), peft::Error);
  CHECK_THROWS_AS(peft::read_header_length(p, 7, 7, {}), peft::Error);
  try {
    peft::read_header_length(p, 5, 5, {});
    FAIL("expected HEADER_TOO_SMALL");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_HEADER_TOO_SMALL);
  }
}

// ---- step 5: UTF-8 -------------------------------------------------------------------------------

TEST_CASE("header utf8: the validator follows Rust's from_utf8") {
  CHECK(peft::is_valid_utf8(""));
  CHECK(peft::is_valid_utf8("plain ascii that is longer than sixteen bytes"));
  CHECK(peft::is_valid_utf8("\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\xed\x9f\xbf\x7f"));
  const char* bad[] = {"\x80", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\x80", "\xe0\x9f\xbf", "\xed\xa0\x80",
                       "\xed\xbf\xbf", "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff",
                       "\xc3", "\xe4\xb8", "\xf0\x9f\x98", "\xc3\x28"};
  for (const char* b : bad) {
    CAPTURE(b);
    CHECK_FALSE(peft::is_valid_utf8(b));
  }
  CHECK(peft::utf8_valid_prefix("0123456789abcdefghij\xc3\xa9\xff tail") == 22);
}

TEST_CASE("header rule: all N bytes must be UTF-8, padding included, before any JSON check") {
  CHECK(result(framed("{\"\xff\":1}")) == "INVALID_HEADER_UTF8");
  CHECK(result(framed("{\"\xed\xa0\x80\":1}")) == "INVALID_HEADER_UTF8");  // an encoded surrogate
  CHECK(result(framed("{}     \xc3")) == "INVALID_HEADER_UTF8");
  CHECK(result(framed("{\xff")) == "INVALID_HEADER_UTF8");  // not JSON either: UTF-8 comes first
  // Bytes after the header are tensor data and are never looked at.
  CHECK(result(padded(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})") + "\xff") == "OK");
}

// ---- step 6: the JSON ----------------------------------------------------------------------------

TEST_CASE("header rule: JSON the reference rejects is INVALID_HEADER") {
  const std::vector<std::string> cases = {
      "", " ", "{", "}", "[]", "null", "\"s\"", "1", "{}{}", "{}x", "{} x", "{}\x0c", "\x0c{}", "\x0b{}",
      "\xef\xbb\xbf{}", "{}\0"s, "{}\0      "s, "\0{}"s, "{}/**/", "{'a':1}", "{\"a\":1,}", "{,}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,],\"data_offsets\":[0,4]}}",
      // root entries that are not tensors
      "{\"t\":null}", "{\"t\":5}", "{\"t\":\"x\"}", "{\"t\":true}", "{\"t\":[]}",
      // __metadata__
      "{\"__metadata__\":{\"a\":1}}", "{\"__metadata__\":[]}", "{\"__metadata__\":\"x\"}",
      "{\"__metadata__\":{\"a\":{}}}", "{\"__metadata__\":{\"a\":null}}", "{\"__metadata__\":5}",
      "{\"__metadata__\":null,\"__metadata__\":null}", "{\"__metadata__\":{},\"__metadata__\":{}}",
      // dtype
      "{" + entry("t", "f32", "[1]", 0, 4) + "}", "{" + entry("t", "F8_E4M3FN", "[1]", 0, 1) + "}",
      "{" + entry("t", "", "[1]", 0, 1) + "}", "{" + entry("t", "F32 ", "[1]", 0, 4) + "}",
      "{\"t\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,4]}}",
      "{\"t\":{\"dtype\":[\"F32\"],\"shape\":[1],\"data_offsets\":[0,4]}}",
      // fields: missing, duplicate
      "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", "{\"t\":{}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"dtype\":\"F32\"}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"shape\":[1]}}",
      // numbers in shape and offsets
      "{" + entry("t", "F32", "[-1]", 0, 4) + "}", "{" + entry("t", "F32", "[-0]", 0, 0) + "}",
      "{" + entry("t", "F32", "[1.0]", 0, 4) + "}", "{" + entry("t", "F32", "[1e0]", 0, 4) + "}",
      "{" + entry("t", "F32", "[18446744073709551616,0]", 0, 0) + "}",
      "{" + entry("t", "F32", "[01]", 0, 4) + "}", "{" + entry("t", "F32", "[\"1\"]", 0, 4) + "}",
      "{" + entry("t", "F32", "[true]", 0, 4) + "}", "{" + entry("t", "F32", "1", 0, 4) + "}",
      "{" + entry("t", "F32", "{}", 0, 4) + "}", "{" + entry("t", "F32", "[[1]]", 0, 4) + "}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-0,4]}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[]}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"0\":0,\"1\":4}}}",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":null}}",
      // strings
      "{\"a\x01\":1}", "{\"a\nb\":1}", "{\"\\ud800\":1}", "{\"\\udc00\":1}", "{\"\\ud800\\u0041\":1}",
      "{\"\\ud800\\ud800\":1}", "{\"\\x41\":1}", "{\"\\u12\":1}", "{\"\\u00g0\":1}", "{\"a\\\":1}", "{\"a",
      // unknown fields must still be JSON the reference accepts
      "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":NaN") + "}", "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":01") + "}",
      "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":1.") + "}", "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":.5") + "}",
      "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":+1") + "}", "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":tru") + "}",
      "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":1e309") + "}",
      "{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":[1,]") + "}",
  };
  for (const std::string& json : cases) {
    CAPTURE(json);
    const std::string file = framed(json, 4);
    CHECK(result(file) == "INVALID_HEADER");
    check_readers_agree(file);
    const std::string text = message(file);
    CHECK(text.find('\n') == std::string::npos);
  }
}

TEST_CASE("header rule: JSON the reference accepts") {
  struct Case {
    std::string json;
    size_t data;
  };
  const std::vector<Case> cases = {
      {" \t\r\n{} \t\r\n", 0},
      {"{\"__metadata__\":null}", 0},
      {"{\"__metadata__\":{}}", 0},
      {"{\"\\u005f_metadata__\":{\"a\":\"\\u0000\"}}", 0},
      {"{\"t\":{\"data_offsets\":[0,4],\"shape\":[1],\"dtype\":\"F32\"}}", 4},
      {"{\"t\":{\"d\\u0074ype\":\"F\\u00332\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4},
      {"{ \"t\" : { \"dtype\" : \"F32\" , \"shape\" : [ 1 ] , \"data_offsets\" : [ 0 , 4 ] } }", 4},
      {"{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":[null,true,false,-5,1.5,-0,-0.0,1e-400,\"\\ud83d\\ude00\\/\",{\"k\":[]}]") + "}", 4},
      {"{" + entry("t", "F32", "[1]", 0, 4, ",\"u\":1,\"u\":2,\"x\":18446744073709551616,\"y\":-9223372036854775809") + "}", 4},
      {"{" + entry("t", "F32", "[1]", 0, 4, ",\"f\":1.7976931348623157e308,\"g\":1.79769313486231581e308") + "}", 4},
      {"{" + entry("t", "F32", "[1]", 0, 4, ",\"f\":0e99999999999,\"g\":1e-99999999999,\"h\":-1e-400") + "}", 4},
      {"{" + entry("t", "U8", "[18446744073709551615,0]", 0, 0) + "}", 0},
      {"{" + entry("", "U8", "[1]", 0, 1) + "}", 1},
      {"{" + entry("__metadata", "U8", "[1]", 0, 1) + "}", 1},
      {"{\"\x7f\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1},
  };
  for (const Case& c : cases) {
    CAPTURE(c.json);
    const std::string file = framed(c.json, c.data);
    CHECK(result(file) == "OK");
    check_readers_agree(file);
  }
}

TEST_CASE("header rule: __metadata__ keeps the last of repeated keys, sorted by key bytes") {
  const peft::Header h = parse(framed(R"({"__metadata__":{"b":"1","a":"x","\u00e9":"e","B":"2","a":"y"}})"));
  REQUIRE(h.metadata.has_value());
  const peft::Metadata expected = {{"B", "2"}, {"a", "y"}, {"b", "1"}, {"\xc3\xa9", "e"}};
  CHECK(*h.metadata == expected);
  CHECK_FALSE(parse(framed(R"({"__metadata__":null})")).metadata.has_value());
  CHECK(parse(framed(R"({"__metadata__":{}})")).metadata == peft::Metadata{});
}

TEST_CASE("header rule: strings are decoded (escapes, surrogate pairs) and kept as UTF-8") {
  const peft::Header h = parse(framed(R"({"a\"b\\c\/\n\t\u00e9\ud83d\ude00":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})", 1));
  CHECK(h.tensors.at(0).name == "a\"b\\c/\n\t\xc3\xa9\xf0\x9f\x98\x80");
}

TEST_CASE("header rule: nesting is limited to 127 levels like serde_json; deep input costs nothing") {
  const auto with_depth = [](size_t arrays) {  // root object + tensor object + `arrays` arrays
    return framed("{" + entry("t", "U8", "[]", 0, 1, ",\"u\":" + std::string(arrays, '[') + std::string(arrays, ']')) + "}", 1);
  };
  CHECK(result(with_depth(125)) == "OK");
  CHECK(result(with_depth(126)) == "INVALID_HEADER");
  CHECK(result(framed("{\"x\":" + std::string(126, '[') + std::string(126, ']') + "}")) == "INVALID_HEADER");
  CHECK(result(with_depth(10'000)) == "INVALID_HEADER");
  CHECK(message(with_depth(10'000)).find("nested deeper than 127") != std::string::npos);
  // Unbalanced and enormous: stops at depth 128 without reading further.
  const std::string open_arrays = framed("{\"t\":{\"u\":" + std::string(1'000'000, '['));
  CHECK(result(open_arrays) == "INVALID_HEADER");
  CHECK(message(open_arrays).find("nested deeper than 127") != std::string::npos);
  check_readers_agree(open_arrays);
  check_readers_agree(with_depth(125));
  check_readers_agree(with_depth(126));
  check_readers_agree(with_depth(10'000));
}

TEST_CASE("header serde numbers: the out-of-range rule of serde_json 1.0.150") {
  // Each outcome was observed with safetensors 0.8.0: serde_json's float parsing is not correctly
  // rounded, so these differ from what strtod would say.
  CHECK(peft::serde_json_number_in_range("1.7976931348623157e308"));
  CHECK_FALSE(peft::serde_json_number_in_range("1.7976931348623158e308"));
  CHECK_FALSE(peft::serde_json_number_in_range("1.7976931348623159e308"));
  CHECK_FALSE(peft::serde_json_number_in_range("1.797693134862315799999e308"));
  CHECK(peft::serde_json_number_in_range("1.79769313486231581e308"));
  CHECK(peft::serde_json_number_in_range("17976931348623157e292"));
  CHECK_FALSE(peft::serde_json_number_in_range("1e309"));
  CHECK_FALSE(peft::serde_json_number_in_range("-1e309"));
  CHECK(peft::serde_json_number_in_range("1e-400"));
  CHECK(peft::serde_json_number_in_range("0e999999999999999999999"));
  CHECK(peft::serde_json_number_in_range("1e-999999999999999999999"));
  CHECK_FALSE(peft::serde_json_number_in_range("1e999999999999999999999"));
  CHECK_FALSE(peft::serde_json_number_in_range(std::string(320, '9')));
  CHECK(peft::serde_json_number_in_range(std::string(300, '9')));
  CHECK(peft::serde_json_number_in_range("18446744073709551616"));
  CHECK(peft::serde_json_number_in_range("-0"));
  CHECK(peft::serde_json_number_in_range("0.5"));
}

TEST_CASE("header stricter than the reference: duplicate names, array-form tensors, dtype objects") {
  // The reference accepts all three (it keeps the last duplicate; serde reads structs from arrays
  // and enums from {"NAME": null}); we reject them on purpose, and say so.
  const std::string t = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  const std::vector<std::string> cases = {
      "{\"t\":" + t + ",\"t\":" + t + "}",
      "{\"ab\":" + t + ",\"\\u0061b\":" + t + "}",
      R"({"t":["U8",[1],[0,1]]})",
      R"({"t":{"dtype":{"U8":null},"shape":[1],"data_offsets":[0,1]}})",
  };
  for (const std::string& json : cases) {
    CAPTURE(json);
    const std::string file = framed(json, 1);
    CHECK(result(file) == "INVALID_HEADER");
    CHECK(message(file).find("stricter than the reference") != std::string::npos);
    check_readers_agree(file);
  }
}

// ---- step 7: offsets and sizes, in (begin, end) order ---------------------------------------------

TEST_CASE("header rule: tensors are ordered by (begin, end), stably; JSON order does not matter") {
  const std::string json = "{" + entry("c", "U8", "[2]", 2, 4) + "," + entry("z2", "U8", "[0]", 2, 2) + "," +
                           entry("a", "U8", "[2]", 0, 2) + "," + entry("z1", "U8", "[0]", 2, 2) + "," +
                           entry("e", "U8", "[0]", 4, 4) + "}";
  const peft::Header h = parse(framed(json, 4));
  std::vector<std::string> names;
  for (const auto& t : h.tensors) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"a", "z2", "z1", "c", "e"});
  CHECK(h.data_size == 4);
}

TEST_CASE("header rule: INVALID_OFFSET for a first tensor not at 0, a gap, an overlap, end < begin") {
  CHECK(result(framed("{" + entry("t", "F32", "[1]", 4, 8) + "}", 8)) == "INVALID_OFFSET");
  CHECK(result(framed("{" + entry("a", "U8", "[1]", 0, 1) + "," + entry("b", "U8", "[1]", 2, 3) + "}", 3)) ==
        "INVALID_OFFSET");
  CHECK(result(framed("{" + entry("a", "U8", "[2]", 0, 2) + "," + entry("b", "U8", "[2]", 1, 3) + "}", 3)) ==
        "INVALID_OFFSET");
  CHECK(result(framed("{" + entry("a", "U8", "[1]", 0, 1) + "," + entry("b", "U8", "[0]", 1, 0) + "}", 1)) ==
        "INVALID_OFFSET");
  const std::string text = message(framed("{" + entry("weird name", "F32", "[1]", 4, 8) + "}", 8));
  CHECK(text.find("\"weird name\"") != std::string::npos);
  CHECK(text.find("[4, 8]") != std::string::npos);
}

TEST_CASE("header rule: VALIDATION_OVERFLOW in the element count, then in the bit count") {
  CHECK(result(framed("{" + entry("t", "U8", "[4294967296,4294967296]", 0, 0) + "}")) == "VALIDATION_OVERFLOW");
  // Multiplied dimension by dimension: the overflow comes before the 0.
  CHECK(result(framed("{" + entry("t", "U8", "[18446744073709551615,18446744073709551615,0]", 0, 0) + "}")) ==
        "VALIDATION_OVERFLOW");
  CHECK(result(framed("{" + entry("t", "U8", "[0,18446744073709551615,18446744073709551615]", 0, 0) + "}")) == "OK");
  CHECK(result(framed("{" + entry("t", "U16", "[2305843009213693952]", 0, 0) + "}")) == "VALIDATION_OVERFLOW");
  CHECK(result(framed("{" + entry("t", "U8", "[2305843009213693952]", 0, 0) + "}")) == "VALIDATION_OVERFLOW");
  CHECK(result(framed("{" + entry("t", "U8", "[1152921504606846976]", 0, 0) + "}")) == "TENSOR_INVALID_INFO");
}

TEST_CASE("header rule: MISALIGNED_SLICE when sub-byte elements do not fill whole bytes") {
  CHECK(result(framed("{" + entry("t", "F4", "[]", 0, 1) + "}", 1)) == "MISALIGNED_SLICE");
  CHECK(result(framed("{" + entry("t", "F4", "[3]", 0, 2) + "}", 2)) == "MISALIGNED_SLICE");
  CHECK(result(framed("{" + entry("t", "F6_E2M3", "[2]", 0, 2) + "}", 2)) == "MISALIGNED_SLICE");
  CHECK(result(framed("{" + entry("t", "F6_E3M2", "[6]", 0, 5) + "}", 5)) == "MISALIGNED_SLICE");
  CHECK(result(framed("{" + entry("t", "F6_E3M2", "[4]", 0, 3) + "}", 3)) == "OK");
  CHECK(result(framed("{" + entry("t", "F4", "[0]", 0, 0) + "}")) == "OK");
}

TEST_CASE("header rule: TENSOR_INVALID_INFO when the byte span is not elements x dtype size") {
  CHECK(result(framed("{" + entry("t", "F32", "[2]", 0, 4) + "}", 4)) == "TENSOR_INVALID_INFO");
  CHECK(result(framed("{" + entry("t", "F32", "[]", 0, 0) + "}")) == "TENSOR_INVALID_INFO");
  CHECK(result(framed("{" + entry("t", "F32", "[0]", 0, 4) + "}", 4)) == "TENSOR_INVALID_INFO");
  CHECK(result(framed("{" + entry("t", "C64", "[1]", 0, 8) + "}", 8)) == "OK");
  const std::string text = message(framed("{" + entry("t", "I32", "[2,2]", 0, 4) + "}", 4));
  CHECK(text.find("needs 16 bytes") != std::string::npos);
  CHECK(text.find("span 4") != std::string::npos);
}

TEST_CASE("header rule: checks run tensor by tensor in offset order; the first problem wins") {
  // "a" has a wrong size, "b" a gap after it: a comes first in offset order.
  CHECK(result(framed("{" + entry("b", "U8", "[1]", 5, 6) + "," + entry("a", "U8", "[1]", 0, 4) + "}", 6)) ==
        "TENSOR_INVALID_INFO");
  // The offset check of a tensor comes before its size checks.
  CHECK(result(framed("{" + entry("a", "U8", "[18446744073709551615,2]", 1, 2) + "}", 2)) == "INVALID_OFFSET");
  // All JSON errors come before any offset error, UTF-8 before JSON.
  CHECK(result(framed("{" + entry("a", "U8", "[1]", 7, 9) + ",\"b\":5}", 9)) == "INVALID_HEADER");
}

// ---- step 8: the file size ------------------------------------------------------------------------

TEST_CASE("header rule: the file must end exactly at the last tensor (METADATA_INCOMPLETE_BUFFER)") {
  const std::string json = "{" + entry("t", "U8", "[4]", 0, 4) + "}";
  CHECK(result(padded(json, 4)) == "OK");
  CHECK(result(padded(json, 3)) == "METADATA_INCOMPLETE_BUFFER");
  CHECK(result(padded(json, 5)) == "METADATA_INCOMPLETE_BUFFER");
  CHECK(result(padded("{}", 1)) == "METADATA_INCOMPLETE_BUFFER");
  CHECK(result(padded("{" + entry("t", "U8", "[0]", 0, 0) + "}", 1)) == "METADATA_INCOMPLETE_BUFFER");
  CHECK(message(padded(json, 5)).find("trailing") != std::string::npos);
}

TEST_CASE("header parse_header: steps 5-8 on the header bytes and the file size") {
  const std::string json = "{" + entry("t", "U8", "[4]", 0, 4) + "}";
  const peft::Header h = peft::parse_header(json, 8 + json.size() + 4);
  CHECK(h.header_size == json.size());
  CHECK(h.data_size == 4);
  CHECK_THROWS_AS(peft::parse_header(json, 8 + json.size() + 5), peft::Error);
}

TEST_CASE("header messages: one line, the tensor named, long names cut") {
  const std::string long_name(5000, 'x');
  const std::string text = message(framed("{" + entry(long_name, "F32", "[2]", 0, 4) + "}", 4));
  CHECK(text.size() < 600);
  CHECK(text.find("\"xxxx") != std::string::npos);
  const std::string control = message(framed("{" + entry("a\\nb", "F32", "[2]", 0, 4) + "}", 4));
  CHECK(control.find('\n') == std::string::npos);
  CHECK(control.find("a\\x0ab") != std::string::npos);
}

TEST_CASE("header 10,000 tensors: all found, in data order") {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t offset = 0;
  for (int i = 0; i < 10'000; ++i) {
    json += "," + entry("model.layers." + std::to_string(i) + ".weight", "BF16", "[16,8]", offset, offset + 256);
    offset += 256;
  }
  json += "}";
  const peft::Header h = parse(padded(json, offset));
  REQUIRE(h.tensors.size() == 10'000);
  CHECK(h.tensors.back().name == "model.layers.9999.weight");
  CHECK(h.data_size == offset);
}

// ---- files written by the reference, and the fuzz corpus ----------------------------------------

TEST_CASE("header fixtures: every valid fixture parses to the reference's view of it") {
  const fs::path dir = fs::path(PEFT_TEST_DATA) / "safetensors";
  REQUIRE_MESSAGE(fs::is_directory(dir), "missing fixture directory " << dir);
  size_t checked = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() != ".safetensors") continue;
    const fs::path view_path = fs::path(item.path()).replace_extension(".json");
    REQUIRE_MESSAGE(fs::exists(view_path), "no reference view " << view_path);
    CAPTURE(item.path().filename().string());
    const nlohmann::json view = nlohmann::json::parse(read_file(view_path));
    const std::string file = read_file(item.path());
    check_readers_agree(file);
    const peft::Header h = parse(file);
    if (view["metadata"].is_null()) {
      CHECK_FALSE(h.metadata.has_value());
    } else {
      REQUIRE(h.metadata.has_value());
      CHECK(h.metadata->size() == view["metadata"].size());
      for (const auto& [key, value] : *h.metadata) CHECK(view["metadata"].at(key) == value);
    }
    REQUIRE(h.tensors.size() == view["tensors"].size());
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      const auto& expected = view["tensors"][i];
      CHECK(h.tensors[i].name == expected["name"].get<std::string>());
      CHECK(peft::dtype_name(h.tensors[i].dtype) == expected["dtype"].get<std::string>());
      CHECK(h.tensors[i].shape == expected["shape"].get<std::vector<uint64_t>>());
      CHECK(h.tensors[i].begin == expected["data_offsets"][0].get<uint64_t>());
      CHECK(h.tensors[i].end == expected["data_offsets"][1].get<uint64_t>());
    }
    ++checked;
  }
  CHECK(checked >= 40);
}

TEST_CASE("header corpus: the fuzz seeds get the reference's codes, and never crash") {
  const fs::path dir = fs::path(PEFT_TEST_DATA) / ".." / "fuzz" / "corpus" / "header";
  const fs::path codes_path = fs::path(PEFT_TEST_DATA) / ".." / "fuzz" / "corpus_codes.json";
  REQUIRE_MESSAGE(fs::is_directory(dir), "missing fuzz corpus " << dir);
  REQUIRE_MESSAGE(fs::exists(codes_path), "missing " << codes_path);
  const nlohmann::json codes = nlohmann::json::parse(read_file(codes_path));
  size_t files = 0, compared = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    CAPTURE(name);
    const std::string file = read_file(item.path());
    std::string got;
    try {  // a peft::Error or success; anything else escapes and fails the test
      parse(file);
      got = "OK";
    } catch (const peft::Error& e) {
      CHECK(e.code() >= PEFT_ERR_HEADER_TOO_SMALL);
      CHECK(e.code() <= PEFT_ERR_METADATA_INCOMPLETE_BUFFER);
      got = peft::code_name(e.code());
    }
    check_readers_agree(file);
    ++files;
    if (!codes.contains(name)) continue;  // a fuzzer finding not yet run through the reference
    ++compared;
    if (name.rfind("stricter_", 0) == 0) {
      CHECK(got == "INVALID_HEADER");
    } else {
      CHECK(got == codes[name].get<std::string>());
    }
  }
  CHECK(files >= 50);
  CHECK(compared >= 50);
}

TEST_CASE("header strings: a quote, backslash, control or UTF-8 byte at every place of the scan's windows") {
  // The string scan reads 16 bytes at a time (SSE2), then 8, then one: a special byte at each
  // position of names of 0 to 40 bytes must end or escape the string where nlohmann's parser says.
  const std::string specials[] = {"\"", "\\\\", "\\n", "\\u00e9", std::string(1, '\x01'), std::string(1, '\x1f'),
                                  "\xc3\xa9", " ", "\x7f", "\\", "\"x\":1,\""};
  size_t agreed = 0;
  for (size_t length = 0; length <= 40; ++length)
    for (size_t at = 0; at <= length; ++at)
      for (const std::string& special : specials) {
        const std::string name = std::string(at, 'a') + special + std::string(length - at, 'b');
        const std::string json = "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
        const std::string text = json + std::string((8 - json.size() % 8) % 8, ' ');
        if (!peft::is_valid_utf8(text)) continue;
        CAPTURE(text);
        const std::string outcome = json_outcome(peft::parse_header_json, text);
        CHECK(outcome == json_outcome(peft::parse_header_json_nlohmann, text));
        agreed += outcome.starts_with("OK|");
      }
  CHECK(agreed > 1000);  // most of them are names that parse
}
