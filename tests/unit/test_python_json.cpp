// core/python_json: Python's json.dumps(indent=2, sort_keys=True) and repr(float), byte for byte.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/python_json.hpp"

// Expected strings are Python 3.11's repr() of the same doubles.
TEST_CASE("python json: floats are written as Python's repr") {
  const struct {
    uint64_t bits;
    const char* repr;
  } cases[] = {
      {0x0000000000000000ull, "0.0"},
      {0x8000000000000000ull, "-0.0"},
      {0x3ff0000000000000ull, "1.0"},
      {0x4030000000000000ull, "16.0"},
      {0x3fb999999999999aull, "0.1"},
      {0x3ee4f8b588e368f1ull, "1e-05"},
      {0x3f1a36e2eb1c432dull, "0.0001"},
      {0x3f202e4b6ce5dc68ull, "0.00012345"},
      {0x4341c37937e08000ull, "1e+16"},
      {0x430c6bf526340000ull, "1000000000000000.0"},
      {0x43118b54f22aeb00ull, "1234567890123456.0"},
      {0x4345ee2a2eb5a5c4ull, "1.2345678901234568e+16"},
      {0x3e8421f5f40d8376ull, "1.5e-07"},
      {0xc004000000000000ull, "-2.5"},
      {0x0000000000000001ull, "5e-324"},
      {0x7fefffffffffffffull, "1.7976931348623157e+308"},
      {0x3ff6a09e667f3bcdull, "1.4142135623730951"},
      {0x3fd5555555555555ull, "0.3333333333333333"},
      {0x4059000000000000ull, "100.0"},
      {0x4480f0cf064dd592ull, "1e+22"},
      {0x40fe240c9fbe76c9ull, "123456.789"},
      {0x3fd3333333333334ull, "0.30000000000000004"},
      {0x3eb0000000000000ull, "9.5367431640625e-07"},
      {0x4026a09e667f3bcdull, "11.313708498984761"},
      {0x0010000000000000ull, "2.2250738585072014e-308"},
  };
  for (const auto& c : cases) {
    double value;
    std::memcpy(&value, &c.bits, sizeof value);
    CHECK(peft::python_float_repr(value) == c.repr);
  }
}

// The expected text is Python's json.dumps(d, indent=2, sort_keys=True) of the same document.
TEST_CASE("python json: dumps matches Python's indent=2, sort_keys=True, ensure_ascii") {
  const char* source = R"({"b":[1,2.0,{"z":null,"a":true}],"a":"caf\u00e9 \u2603 \ud83d\ude00 \"q\" \\ / \n\t\u0001\u007f",)"
                       R"("c":{},"d":[],"\u00e9":1,"Z":-3,"e":1e-05,"f":{"y":[[]],"x":"x"}})";
  const std::string expected =
      "{\n  \"Z\": -3,\n  \"a\": \"caf\\u00e9 \\u2603 \\ud83d\\ude00 \\\"q\\\" \\\\ / \\n\\t\\u0001\\u007f\",\n  "
      "\"b\": [\n    1,\n    2.0,\n    {\n      \"a\": true,\n      \"z\": null\n    }\n  ],\n  \"c\": {},\n  "
      "\"d\": [],\n  \"e\": 1e-05,\n  \"f\": {\n    \"x\": \"x\",\n    \"y\": [\n      []\n    ]\n  },\n  "
      "\"\\u00e9\": 1\n}";
  CHECK(peft::python_json_dumps(nlohmann::ordered_json::parse(source)) == expected);
}

TEST_CASE("python json: an index-style document of every value kind") {
  const auto value = nlohmann::json::parse(R"({"b": [1, 2.5, "x\u00e9\ud83d\ude00", null, true, {}], "a": {}, "c": []})");
  CHECK(peft::python_json_dumps(value) ==
        "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5,\n    \"x\\u00e9\\ud83d\\ude00\",\n    null,\n    true,\n"
        "    {}\n  ],\n  \"c\": []\n}");
}

TEST_CASE("python json: strings with ensure_ascii") {
  std::string out;
  peft::append_python_string(out, "\xc3\xa9\xf0\x9f\x98\x80\x7f\x01/\"");
  CHECK(out == "\"\\u00e9\\ud83d\\ude00\\u007f\\u0001/\\\"\"");
  out.clear();
  CHECK_THROWS_AS(peft::append_python_string(out, "\xc3("), peft::Error);  // not UTF-8
}

// The expected text is CPython 3.11's json.dumps({"floats": [...], "nan": float("nan"),
// "neg_inf": float("-inf")}, indent=2, sort_keys=True), copied from its output. Floats in
// [1e15, 1e16) are written in fixed notation ("1000000000000000.0"), 1e16 and up in exponent form.
TEST_CASE("python json: floats around the fixed/exponent boundary, as CPython's json.dumps writes them") {
  nlohmann::json doc = nlohmann::json::object();
  doc["floats"] = {1e15, 1.5e15, 9.999999999999998e15, 1e16, 1e-5, 0.1, 123456789012345.6};
  doc["nan"] = std::nan("");
  doc["neg_inf"] = -HUGE_VAL;
  CHECK(peft::python_json_dumps(doc) ==
        "{\n  \"floats\": [\n    1000000000000000.0,\n    1500000000000000.0,\n    9999999999999998.0,\n    1e+16,\n"
        "    1e-05,\n    0.1,\n    123456789012345.6\n  ],\n  \"nan\": NaN,\n  \"neg_inf\": -Infinity\n}");
}
