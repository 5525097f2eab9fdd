#define PCRE2_CODE_UNIT_WIDTH 8
#include "core/python_regex.hpp"

#include <pcre2.h>

#include <cstdio>
#include <vector>

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

// Bounds on one match: Python would backtrack forever on a pathological pattern; we fail instead.
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr uint32_t kDepthLimit = 100'000;

}  // namespace

struct PythonRegex::Compiled {
  pcre2_code* code = nullptr;
  pcre2_match_context* match_context = nullptr;
  ~Compiled() {
    pcre2_match_context_free(match_context);
    pcre2_code_free(code);
  }
};

PythonRegex::PythonRegex(std::string_view pattern, int32_t error_code, const std::string& what)
    : pattern_(pattern), compiled_(std::make_unique<Compiled>()), error_code_(error_code), what_(what) {
  bool ascii = false;
  translated_ = translate(pattern, &ascii, error_code, what);
  uint32_t options = PCRE2_UTF | (ascii ? 0u : PCRE2_UCP);
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  if (context == nullptr) throw std::bad_alloc();
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);  // Python's "$" and "." know only "\n"
  int error_number = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated_.data()), translated_.size(),
                                  options, &error_number, &error_offset, context);
  pcre2_compile_context_free(context);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_number, buffer, sizeof buffer);
    fail(error_code, what + ": invalid regular expression " + peft::quoted(pattern_) + " (" +
                         reinterpret_cast<const char*>(buffer) + ")");
  }
  compiled_->match_context = pcre2_match_context_create(nullptr);
  if (compiled_->match_context == nullptr) throw std::bad_alloc();
  pcre2_set_match_limit(compiled_->match_context, kMatchLimit);
  pcre2_set_depth_limit(compiled_->match_context, kDepthLimit);
}

PythonRegex::~PythonRegex() = default;
PythonRegex::PythonRegex(PythonRegex&&) noexcept = default;
PythonRegex& PythonRegex::operator=(PythonRegex&&) noexcept = default;

int PythonRegex::group_number(const std::string& name) const {
  int n = pcre2_substring_number_from_name(compiled_->code, reinterpret_cast<PCRE2_SPTR>(name.c_str()));
  return n > 0 ? n : -1;
}

std::optional<PythonRegex::Match> PythonRegex::run(std::string_view subject, Anchor anchor) const {
  uint32_t options = anchor == Anchor::none    ? 0u
                     : anchor == Anchor::start ? PCRE2_ANCHORED
                                               : (PCRE2_ANCHORED | PCRE2_ENDANCHORED);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  if (data == nullptr) throw std::bad_alloc();
  int rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                       options, data, compiled_->match_context);
  if (rc == PCRE2_ERROR_NOMATCH) {
    pcre2_match_data_free(data);
    return std::nullopt;
  }
  if (rc < 0) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(rc, buffer, sizeof buffer);
    pcre2_match_data_free(data);
    fail(error_code_, what_ + ": regular expression " + peft::quoted(pattern_) + " failed on " +
                          peft::quoted(std::string(subject)) + " (" + reinterpret_cast<const char*>(buffer) + ")");
  }
  Match match;
  uint32_t count = pcre2_get_ovector_count(data);
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  match.groups.resize(count);
  for (uint32_t k = 0; k < count; ++k) {
    if (k < static_cast<uint32_t>(rc) && ovector[2 * k] != PCRE2_UNSET)
      match.groups[k] = std::string(subject.substr(ovector[2 * k], ovector[2 * k + 1] - ovector[2 * k]));
  }
  pcre2_match_data_free(data);
  return match;
}

}  // namespace peft
