// PythonRegex against Python's re. Every expected value below was produced by CPython 3.11's
// re.fullmatch / re.match / re.search on the same pattern and subject (not written by hand).
#include <doctest/doctest.h>

#include <string>

#include "core/error.hpp"
#include "core/python_regex.hpp"

namespace {

struct Case {
  const char* pattern;
  const char* subject;
  bool fullmatch, match, search;
};

const Case kCases[] = {
    {".*\\.(q_proj|v_proj)", "model.layers.0.self_attn.q_proj", true, true, true},
    {".*\\.(q_proj|v_proj)", "model.layers.0.self_attn.k_proj", false, false, false},
    {"q_proj", "model.layers.0.self_attn.q_proj", false, false, true},
    {"model\\.layers\\.\\d+\\.self_attn\\.(q|v)_proj", "model.layers.12.self_attn.v_proj", true, true, true},
    {"(?P<first>model)\\.(?P=first)", "model.model", true, true, true},
    {"abc\\Z", "abc", true, true, true},
    {"abc$", "abc\x0a""", false, true, true},
    {"abc\\Z", "abc\x0a""", false, false, false},
    {"a{,2}b", "aab", true, true, true},
    {"a{,2}b", "aaab", false, false, true},
    {"a{,}b", "aaaab", true, true, true},
    {"a{}b", "a{}b", true, true, true},
    {"a{x}", "a{x}", true, true, true},
    {"\\d+", "\xd9""\xa1""\xd9""\xa2""", true, true, true},
    {"(?a)\\d+", "\xd9""\xa1""\xd9""\xa2""", false, false, false},
    {"\\w+", "\xc3""\xa9""_1", true, true, true},
    {"(?i)Q_PROJ", "q_proj", true, true, true},
    {"(?x) q _ proj  # comment", "q_proj", true, true, true},
    {"[[:alpha:]]+", "[:a", false, false, false},
    {"[]a]+", "]a]", true, true, true},
    {"\\x41\\u0042\\U00000043", "ABC", true, true, true},
    {"\\101", "A", true, true, true},
    {"(a)\\1", "aa", true, true, true},
    {"a|ab", "ab", true, true, true},
    {"(?:a|ab)(?:c|bcd)", "abcd", true, true, true},
    {"\\v", "\x0b""", true, true, true},
    {"[\\v]", "\x0a""", false, false, false},
    {"\\s", "\x0b""", true, true, true},
    {"(?s:.)", "\x0a""", true, true, true},
    {".", "\x0a""", false, false, false},
    {"a(?#comment)b", "ab", true, true, true},
    {"(?>a+)b", "aab", true, true, true},
    {"a++b", "aab", true, true, true},
    {"(a)?(?(1)b|c)", "ab", true, true, true},
    {"(a)?(?(1)b|c)", "c", true, true, true},
    {"\\.", ".", true, true, true},
    {"\\-", "-", true, true, true},
    {"[\\d\\-]+", "1-2", true, true, true},
    {"[\\b]", "\x08""", true, true, true},
    {"\\bq\\b", "q", true, true, true},
    {"(.*\\.)?(q_proj)$", "model.layers.0.self_attn.q_proj", true, true, true},
    {"(.*\\.)?(^model.layers.0.self_attn.q_proj)$", "model.layers.0.self_attn.q_proj", true, true, true},
    {"(.*\\.)?(^q_proj)$", "model.layers.0.self_attn.q_proj", false, false, false},
    {"(.*\\.)?(layers\\.0\\..*)$", "model.layers.0.self_attn.q_proj", true, true, true},
};

int32_t compile_error(const char* pattern) {
  try {
    peft::PythonRegex regex(pattern, PEFT_ERR_INVALID_CONFIG, "test");
  } catch (const peft::Error& e) {
    return e.code();
  }
  return PEFT_OK;
}

}  // namespace

TEST_CASE("adapter python_regex: fullmatch, match and search agree with CPython re") {
  for (const Case& c : kCases) {
    CAPTURE(c.pattern);
    CAPTURE(c.subject);
    peft::PythonRegex regex(c.pattern, PEFT_ERR_INVALID_CONFIG, "test");
    CHECK(regex.fullmatch(c.subject) == c.fullmatch);
    CHECK(regex.match(c.subject) == c.match);
    CHECK(regex.search(c.subject) == c.search);
  }
}

TEST_CASE("adapter python_regex: patterns CPython re rejects are rejected") {
  // Each of these raises re.error in CPython 3.11 (message in the comment).
  const char* invalid[] = {
      "\\h",          // bad escape \h
      "(?<name>a)",   // unknown extension ?<n
      "a(?i)b",       // global flags not at the start of the expression
      "(*FAIL)",      // nothing to repeat
      "(?|a)",        // unknown extension ?|
      "[\\A]",        // bad escape \A
      "(?L)a",        // cannot use 'L' flag with a str pattern
      "a)",           // unbalanced parenthesis
      "(a",           // missing ), unterminated subpattern
      "\\x4",         // incomplete escape \x4
      "\\p{L}",       // bad escape \p
      "(?P>name)",    // unknown extension ?P>
      "a{3,2}",       // min repeat greater than max repeat
  };
  for (const char* pattern : invalid) {
    CAPTURE(pattern);
    CHECK(compile_error(pattern) == PEFT_ERR_INVALID_CONFIG);
  }
}

TEST_CASE("adapter python_regex: errors name the field and the pattern") {
  try {
    peft::PythonRegex regex("\\h", PEFT_ERR_INVALID_CONFIG, "target_modules");
    FAIL("no error");
  } catch (const peft::Error& e) {
    std::string message = e.what();
    CHECK(message.find("target_modules") != std::string::npos);
    CHECK(message.find("bad escape") != std::string::npos);
  }
}

TEST_CASE("adapter python_regex: translation of Python-only syntax") {
  bool ascii = false;
  CHECK(peft::PythonRegex::translate("abc\\Z", &ascii, PEFT_ERR_INVALID_CONFIG, "t") == "abc\\z");
  CHECK(peft::PythonRegex::translate("a{,3}", &ascii, PEFT_ERR_INVALID_CONFIG, "t") == "a{0,3}");
  CHECK_FALSE(ascii);
  peft::PythonRegex::translate("(?a)\\d", &ascii, PEFT_ERR_INVALID_CONFIG, "t");
  CHECK(ascii);
}

namespace {
struct DiffCase {
  const char* pattern;
  long long bits;  // -1: CPython rejects the pattern; else bit 3*i+j for subject i and fullmatch/match/search
};
// The generated cases split string literals after \x escapes on purpose ("\xc3""\xa9""9").
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wstring-concatenation"
#endif
#include "test_adapter_python_regex_cases.inc"
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
}  // namespace

TEST_CASE("adapter python_regex: random patterns are accepted, rejected and matched exactly as CPython does") {
  size_t rejected = 0;
  for (const DiffCase& c : kDiffCases) {
    CAPTURE(c.pattern);
    if (c.bits < 0) {
      CHECK(compile_error(c.pattern) == PEFT_ERR_INVALID_CONFIG);
      ++rejected;
      continue;
    }
    peft::PythonRegex regex(c.pattern, PEFT_ERR_INVALID_CONFIG, "test");
    for (size_t i = 0; i < sizeof kDiffSubjects / sizeof kDiffSubjects[0]; ++i) {
      CAPTURE(kDiffSubjects[i]);
      CHECK(regex.fullmatch(kDiffSubjects[i]) == bool(c.bits >> (3 * i) & 1));
      CHECK(regex.match(kDiffSubjects[i]) == bool(c.bits >> (3 * i + 1) & 1));
      CHECK(regex.search(kDiffSubjects[i]) == bool(c.bits >> (3 * i + 2) & 1));
    }
  }
  CHECK(rejected > 100);  // the sample exercises both sides
}

TEST_CASE("adapter python_regex: catastrophic backtracking fails instead of hanging") {
  peft::PythonRegex regex("(a+)+$", PEFT_ERR_INVALID_CONFIG, "target_modules");
  std::string subject(64, 'a');
  subject += "b";
  CHECK_THROWS_AS(regex.search(subject), peft::Error);
}

TEST_CASE("adapter python_regex: named groups") {
  peft::PythonRegex regex(".*?\\.[^.]*\\.(?P<idx>\\d+)\\.", PEFT_ERR_INVALID_CONFIG, "t");
  auto m = regex.match_groups("model.layers.12.mlp.experts.3.w1");
  REQUIRE(m);
  int group = regex.group_number("idx");
  REQUIRE(group > 0);
  CHECK(m->groups[group] == "12");
}
