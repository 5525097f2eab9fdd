// Python `re` patterns evaluated with PCRE2.
//
// PEFT interprets several adapter_config.json fields (a string `target_modules`, `exclude_modules`,
// the keys of `rank_pattern` / `alpha_pattern`, `layers_pattern`) as Python regular expressions.
// PythonRegex compiles such a pattern so that it means what Python's `re` (3.11, str patterns, default
// flags) makes of it: Python-only syntax is translated (`\Z` -> `\z`, `\v`, `\uXXXX`, `{,n}`, the
// `(?a)` flag, octal and numbered escapes), constructs Python rejects are rejected (unknown escapes
// such as `\h`, PCRE-only groups, `(*VERB)`), and the three entry points reproduce re.match,
// re.fullmatch and re.search. Matching is Unicode-aware as in Python (PCRE2_UTF | PCRE2_UCP) and
// bounded: a pattern that backtracks catastrophically fails with an error instead of hanging.
//
// A compiled PythonRegex is immutable; all const methods may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace peft {

class PythonRegex {
 public:
  // One match: groups[0] is the whole match, groups[k] capture group k (nullopt if it took no part).
  struct Match {
    std::vector<std::optional<std::string>> groups;
  };

  // Compiles a Python pattern. On a pattern Python or PCRE2 rejects, throws peft::Error with
  // `error_code`, a message naming `what` (e.g. "target_modules"), the pattern and the reason.
  PythonRegex(std::string_view pattern, int32_t error_code, const std::string& what);
  ~PythonRegex();
  PythonRegex(PythonRegex&&) noexcept;
  PythonRegex& operator=(PythonRegex&&) noexcept;
  PythonRegex(const PythonRegex&) = delete;
  PythonRegex& operator=(const PythonRegex&) = delete;

  const std::string& pattern() const { return pattern_; }   // as written (Python syntax)
  const std::string& translated() const { return translated_; }  // what PCRE2 compiled

  // re.fullmatch(pattern, subject)
  bool fullmatch(std::string_view subject) const { return run(subject, Anchor::full).has_value(); }
  // re.match(pattern, subject): anchored at the start only.
  bool match(std::string_view subject) const { return run(subject, Anchor::start).has_value(); }
  // re.search(pattern, subject)
  bool search(std::string_view subject) const { return run(subject, Anchor::none).has_value(); }
  // re.match returning the groups.
  std::optional<Match> match_groups(std::string_view subject) const { return run(subject, Anchor::start); }
  // re.search returning the groups.
  std::optional<Match> search_groups(std::string_view subject) const { return run(subject, Anchor::none); }
  // Number of a named group, or -1.
  int group_number(const std::string& name) const;

  // Translates Python syntax to PCRE2 syntax (exposed for tests). Sets *ascii when the pattern
  // carries the global (?a) flag. Throws the same errors as the constructor.
  static std::string translate(std::string_view pattern, bool* ascii, int32_t error_code,
                               const std::string& what);

 private:
  enum class Anchor { none, start, full };
  std::optional<Match> run(std::string_view subject, Anchor anchor) const;

  struct Compiled;
  std::string pattern_;
  std::string translated_;
  std::unique_ptr<Compiled> compiled_;
  int32_t error_code_;
  std::string what_;
};

}  // namespace peft
