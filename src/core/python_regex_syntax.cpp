// Python `re` syntax -> PCRE2 syntax (see python_regex.hpp): a one-pass translator that follows
// CPython 3.11's sre_parse closely enough to decide, for every construct a user writes, whether Python
// accepts it and what it means.
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/python_regex.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_octal(char c) { return c >= '0' && c <= '7'; }
bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool is_ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string code_point(uint32_t value) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\x{%X}", value);
  return buf;
}

// A one-pass translator that follows CPython's sre_parse closely enough to decide, for every
// construct a user writes, whether Python accepts it and what it means.
class Translator {
 public:
  Translator(std::string_view pattern, int32_t code, const std::string& what)
      : p_(pattern), code_(code), what_(what) {}

  std::string run(bool* ascii) {
    verbose_stack_.push_back({prescan_global_verbose(), 0});
    while (i_ < p_.size()) step();
    if (verbose_stack_.size() != 1) error("missing ), unterminated subpattern");
    if (ascii) *ascii = ascii_;
    return out_;
  }

 private:
  [[noreturn]] void error(const std::string& reason) const {
    fail(code_, what_ + ": invalid regular expression " + peft::quoted(std::string(p_)) + " (Python re: " +
                    reason + " at position " + std::to_string(i_) + ")");
  }
  bool verbose() const { return verbose_stack_.back().verbose; }
  void open_group(bool verbose, bool capturing) {
    int number = 0;
    if (capturing) {
      number = ++groups_opened_;
      group_closed_.push_back(false);
    }
    verbose_stack_.push_back({verbose, number});
  }
  // Python refers only to groups that exist and are closed; PCRE2 would accept more.
  void check_reference(int number) {
    if (number <= 0 || number > groups_opened_) error("invalid group reference " + std::to_string(number));
    if (!group_closed_[static_cast<size_t>(number)]) error("cannot refer to an open group");
  }
  char peek(size_t ahead = 0) const { return i_ + ahead < p_.size() ? p_[i_ + ahead] : '\0'; }
  bool has(size_t ahead) const { return i_ + ahead < p_.size(); }

  // Global (?x) anywhere in the leading flag groups switches verbose mode for the whole pattern.
  bool prescan_global_verbose() const {
    size_t j = 0;
    bool verbose = false;
    while (j + 1 < p_.size() && p_[j] == '(' && p_[j + 1] == '?') {
      size_t k = j + 2;
      bool x = false;
      while (k < p_.size() && std::string_view("aiLmsux").find(p_[k]) != std::string_view::npos) {
        x = x || p_[k] == 'x';
        ++k;
      }
      if (k == j + 2 || k >= p_.size() || p_[k] != ')') break;
      verbose = verbose || x;
      j = k + 1;
    }
    return verbose;
  }

  void step() {
    char c = p_[i_];
    if (verbose() && is_space(c)) {
      ++i_;
      return;
    }
    if (verbose() && c == '#') {
      while (i_ < p_.size() && p_[i_] != '\n') ++i_;
      return;
    }
    if (c != '(') at_start_ = false;
    switch (c) {
      case '\\': escape(false); break;
      case '[': char_class(); break;
      case '(': group(); break;
      case ')':
        if (verbose_stack_.size() == 1) error("unbalanced parenthesis");
        if (int number = verbose_stack_.back().capture; number > 0) group_closed_[static_cast<size_t>(number)] = true;
        verbose_stack_.pop_back();
        out_ += ')';
        ++i_;
        break;
      case '{': brace(); break;
      case '}': out_ += "\\}"; ++i_; break;
      default: out_ += c; ++i_; break;
    }
  }

  // A backslash escape at i_, inside a character class or outside one: the escapes both read alike
  // here, the rest in escape_outside_class / escape_inside_class.
  void escape(bool in_class) {
    if (!has(1)) error("bad escape (end of pattern)");
    const char c = p_[i_ + 1];
    const size_t start = i_;
    i_ += 2;
    if (shared_escape(c, start)) return;
    if (in_class)
      escape_inside_class(c);
    else
      escape_outside_class(c);
  }

  // The escapes that mean the same inside and outside a character class: the classes \d \s \w and
  // their negations, control characters, code points by number or name. False for any other.
  bool shared_escape(char c, size_t start) {
    switch (c) {
      case 'd': case 'D': case 's': case 'S': case 'w': case 'W': case 'f': case 'n': case 'r': case 't':
        out_ += '\\';
        out_ += c;
        return true;
      case 'a': out_ += "\\x{7}"; return true;
      case 'v': out_ += "\\x{B}"; return true;
      case 'x': case 'u': case 'U': case 'N':
        i_ = start;
        out_ += code_point(hex_escape());
        return true;
      default: return false;
    }
  }

  void escape_outside_class(char c) {
    switch (c) {
      case 'A': case 'b': case 'B':
        out_ += '\\';
        out_ += c;
        return;
      case 'Z': out_ += "\\z"; return;
      default: break;
    }
    if (c == '0') {
      uint32_t value = 0;
      for (int k = 0; k < 2 && is_octal(peek()); ++k) value = value * 8 + static_cast<uint32_t>(p_[i_++] - '0');
      out_ += code_point(value);
      return;
    }
    if (is_digit(c)) {
      std::string digits(1, c);
      if (is_digit(peek())) {
        digits += p_[i_++];
        if (is_octal(digits[0]) && is_octal(digits[1]) && is_octal(peek())) {
          digits += p_[i_++];
          uint32_t value = static_cast<uint32_t>(std::stoul(digits, nullptr, 8));
          if (value > 0377) error("octal escape value outside of range 0-0o377");
          out_ += code_point(value);
          return;
        }
      }
      check_reference(std::stoi(digits));
      out_ += "\\g{" + digits + "}";
      return;
    }
    if (is_ascii_alpha(c)) error(std::string("bad escape \\") + c);
    // Escaped punctuation is the character itself; an escaped non-ASCII byte starts a literal
    // UTF-8 sequence whose remaining bytes follow as ordinary characters.
    if (static_cast<unsigned char>(c) >= 0x80) {
      out_ += c;
    } else if (is_space(c) || is_digit(c) || is_ascii_alpha(c)) {
      out_ += code_point(static_cast<unsigned char>(c));
    } else {
      out_ += '\\';
      out_ += c;
    }
  }

  // \xhh, \uhhhh, \Uhhhhhhhh (exact digit counts as Python requires); \N{...} is not supported.
  uint32_t hex_escape() {
    char kind = p_[i_ + 1];
    i_ += 2;
    if (kind == 'N') error("\\N{...} named characters are not supported by peft_c");
    size_t digits = kind == 'x' ? 2 : kind == 'u' ? 4 : 8;
    uint32_t value = 0;
    for (size_t k = 0; k < digits; ++k) {
      if (!is_hex(peek())) error(std::string("incomplete escape \\") + kind);
      char h = p_[i_++];
      value = value * 16 + static_cast<uint32_t>(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    if (value > 0x10FFFF) error("bad escape: code point out of range");
    return value;
  }

  void char_class() {
    out_ += '[';
    ++i_;
    if (peek() == '^') {
      out_ += '^';
      ++i_;
    }
    // PCRE2 reads "[:", "[." and "[=" at the start of a class as POSIX syntax; Python does not.
    bool first = true;
    if (peek() == ':' || peek() == '.' || peek() == '=') {
      out_ += '\\';
      out_ += p_[i_++];
      first = false;
    }
    while (true) {
      if (!has(0)) error("unterminated character set");
      char c = p_[i_];
      if (c == ']' && !first) {
        out_ += ']';
        ++i_;
        return;
      }
      first = false;
      if (c == ']') {
        out_ += "\\]";
        ++i_;
      } else if (c == '[') {
        out_ += "\\[";  // Python has no POSIX classes: "[:alpha:]" is literal text
        ++i_;
      } else if (c == '\\') {
        escape(true);
      } else {
        out_ += c;
        ++i_;
      }
    }
  }

  void escape_inside_class(char c) {
    if (c == 'b') {  // backspace inside a class
      out_ += "\\x{8}";
      return;
    }
    if (is_octal(c)) {
      uint32_t value = static_cast<uint32_t>(c - '0');
      for (int k = 0; k < 2 && is_octal(peek()); ++k) value = value * 8 + static_cast<uint32_t>(p_[i_++] - '0');
      if (value > 0377) error("octal escape value outside of range 0-0o377");
      out_ += code_point(value);
      return;
    }
    if (is_digit(c) || is_ascii_alpha(c)) error(std::string("bad escape \\") + c);
    if (static_cast<unsigned char>(c) >= 0x80) {
      out_ += c;
    } else {
      out_ += '\\';
      out_ += c;
    }
  }

  void group() {
    bool was_at_start = at_start_;
    at_start_ = false;
    if (peek(1) != '?') {
      if (peek(1) == '*') error("nothing to repeat");  // PCRE2 would read a (*VERB)
      out_ += '(';
      ++i_;
      open_group(verbose(), true);
      return;
    }
    char c = peek(2);
    if (c == ':' || c == '=' || c == '!' || c == '>') {
      out_.append(p_.substr(i_, 3));
      i_ += 3;
      open_group(verbose(), false);
      return;
    }
    if (c == '<') {
      if (peek(3) == '=' || peek(3) == '!') {
        out_.append(p_.substr(i_, 4));
        i_ += 4;
        open_group(verbose(), false);
        return;
      }
      error("unknown extension ?<" + std::string(1, peek(3)));
    }
    if (c == 'P') {
      char d = peek(3);
      if (d == '<') {  // (?P<name>...): PCRE2 accepts the same spelling
        size_t close = p_.find('>', i_ + 4);
        if (close == std::string_view::npos) error("missing >, unterminated name");
        std::string name(p_.substr(i_ + 4, close - (i_ + 4)));
        check_group_name(name);
        for (const auto& [known, number] : group_names_)
          if (known == name) error("redefinition of group name " + peft::quoted(name));
        out_.append(p_.substr(i_, close + 1 - i_));
        i_ = close + 1;
        open_group(verbose(), true);
        group_names_.emplace_back(name, groups_opened_);
        return;
      }
      if (d == '=') {  // (?P=name): a back reference, same spelling in PCRE2
        size_t close = p_.find(')', i_ + 4);
        if (close == std::string_view::npos) error("missing ), unterminated name");
        std::string name(p_.substr(i_ + 4, close - (i_ + 4)));
        check_group_name(name);
        int number = 0;
        for (const auto& [known, n] : group_names_)
          if (known == name) number = n;
        if (number == 0) error("unknown group name " + peft::quoted(name));
        check_reference(number);
        out_.append(p_.substr(i_, close + 1 - i_));
        i_ = close + 1;
        return;
      }
      error("unknown extension ?P" + std::string(1, d));
    }
    if (c == '#') {
      size_t close = p_.find(')', i_);
      if (close == std::string_view::npos) error("missing ), unterminated comment");
      i_ = close + 1;  // dropped: Python ignores comments entirely
      at_start_ = was_at_start;
      return;
    }
    if (c == '(') {  // conditional (?(id/name)yes|no)
      size_t close = p_.find(')', i_ + 3);
      if (close == std::string_view::npos) error("missing ), unterminated name");
      std::string_view cond = p_.substr(i_ + 3, close - (i_ + 3));
      bool numeric = !cond.empty();
      for (char ch : cond) numeric = numeric && is_digit(ch);
      if (!numeric) check_group_name(cond);
      out_ += "(?(";
      if (numeric) {
        out_ += cond;
      } else {
        out_ += '<';
        out_ += cond;
        out_ += '>';
      }
      out_ += ')';
      i_ = close + 1;
      open_group(verbose(), false);
      return;
    }
    flags(was_at_start);
  }

  // (?aiLmsux) global flags, or (?aiLmsux-imsx:...) scoped flags.
  void flags(bool was_at_start) {
    size_t j = i_ + 2;
    std::string add, remove;
    while (j < p_.size() && std::string_view("aiLmsux").find(p_[j]) != std::string_view::npos) add += p_[j++];
    bool has_minus = j < p_.size() && p_[j] == '-';
    if (has_minus) {
      ++j;
      while (j < p_.size() && std::string_view("imsx").find(p_[j]) != std::string_view::npos) remove += p_[j++];
      if (remove.empty()) error("missing flag after -");
    }
    if (j >= p_.size()) error("missing -, : or )");
    char end = p_[j];
    if (add.empty() && remove.empty()) error("unknown extension ?" + std::string(1, p_[i_ + 2]));
    if (add.find('L') != std::string::npos) error("bad inline flag: cannot use 'L' flag with a str pattern");
    if (add.find('a') != std::string::npos && add.find('u') != std::string::npos)
      error("bad inline flag: flags 'a', 'u' and 'L' are incompatible");
    auto pcre_flags = [](const std::string& letters) {
      std::string kept;
      for (char ch : letters)
        if (ch == 'i' || ch == 'm' || ch == 's') kept += ch;  // x is applied by this translator
      return kept;
    };
    if (end == ')') {
      if (has_minus) error("missing :");
      if (!was_at_start) error("global flags not at the start of the expression");
      if (add.find('a') != std::string::npos) ascii_ = true;
      std::string kept = pcre_flags(add);
      if (!kept.empty()) out_ += "(?" + kept + ")";
      i_ = j + 1;
      at_start_ = true;
      return;
    }
    if (end != ':') error("missing -, : or )");
    if (add.find('a') != std::string::npos)
      error("scoped (?a:...) is not supported by peft_c; use a global (?a)");
    bool scoped_verbose = verbose();
    if (add.find('x') != std::string::npos) scoped_verbose = true;
    if (remove.find('x') != std::string::npos) scoped_verbose = false;
    std::string kept_add = pcre_flags(add), kept_remove = pcre_flags(remove);
    out_ += "(?" + kept_add + (kept_remove.empty() ? "" : "-" + kept_remove) + ":";
    i_ = j + 1;
    open_group(scoped_verbose, false);
  }

  void check_group_name(std::string_view name) {
    bool ok = !name.empty() && !is_digit(name[0]);
    for (char ch : name) ok = ok && (is_ascii_alpha(ch) || is_digit(ch) || ch == '_');
    if (!ok) error("bad character in group name " + peft::quoted(std::string(name)));
  }

  // "{m,n}" quantifiers as Python reads them: "{,n}" means {0,n}, "{,}" means {0,}, and anything
  // that is not a quantifier is a literal "{".
  void brace() {
    size_t j = i_ + 1;
    std::string lo, hi;
    while (j < p_.size() && is_digit(p_[j])) lo += p_[j++];
    bool comma = j < p_.size() && p_[j] == ',';
    if (comma) {
      ++j;
      while (j < p_.size() && is_digit(p_[j])) hi += p_[j++];
    }
    bool quantifier = j < p_.size() && p_[j] == '}' && (comma || !lo.empty());
    if (!quantifier) {
      out_ += "\\{";
      ++i_;
      return;
    }
    // Counts too large for PCRE2 (> 65535) are left for pcre2_compile to reject.
    if (!lo.empty() && !hi.empty() && lo.size() <= 9 && hi.size() <= 9 && std::stoul(hi) < std::stoul(lo))
      error("min repeat greater than max repeat");
    out_ += '{';
    out_ += lo.empty() ? std::string("0") : lo;
    if (comma) {
      out_ += ',';
      out_ += hi;
    }
    out_ += '}';
    i_ = j + 1;
  }

  std::string_view p_;
  int32_t code_;
  const std::string& what_;
  size_t i_ = 0;
  std::string out_;
  // One frame per open parenthesis: its verbose mode and, for a capturing group, its number.
  struct Frame {
    bool verbose;
    int capture;  // 0 for a non-capturing group
  };
  std::vector<Frame> verbose_stack_;
  int groups_opened_ = 0;
  std::vector<bool> group_closed_{false};  // index = group number (0 unused)
  std::vector<std::pair<std::string, int>> group_names_;
  bool at_start_ = true;
  bool ascii_ = false;
};

}  // namespace

std::string PythonRegex::translate(std::string_view pattern, bool* ascii, int32_t error_code,
                                   const std::string& what) {
  return Translator(pattern, error_code, what).run(ascii);
}

}  // namespace peft
