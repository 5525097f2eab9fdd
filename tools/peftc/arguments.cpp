// The shared command-line helpers of peftc's subcommands (arguments.hpp).
#include "arguments.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "peft_c.h"

namespace peftc {

bool Arguments::next() {
  if (started_) ++index_;
  started_ = true;
  if (index_ >= args_.size()) return false;
  const std::string& argument = args_[index_];
  const size_t eq = argument.find('=');
  if (argument.rfind("--", 0) == 0 && eq != std::string::npos) {
    name_ = argument.substr(0, eq);
    inline_value_ = argument.substr(eq + 1);
  } else {
    name_ = argument;
    inline_value_.reset();
  }
  return true;
}

std::optional<std::string> Arguments::value() {
  if (inline_value_) return inline_value_;
  if (index_ + 1 < args_.size()) return args_[++index_];
  return std::nullopt;
}

bool is_option(const std::string& argument) { return argument.rfind("--", 0) == 0 && argument.size() > 2; }

std::optional<double> parse_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* stop = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &stop);
  if (stop != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<uint64_t> parse_size(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  const std::string s = text.substr(begin, end - begin);
  if (s.empty()) return std::nullopt;
  if (s.find_first_not_of("0123456789") == std::string::npos) {
    errno = 0;
    const unsigned long long bytes = std::strtoull(s.c_str(), nullptr, 10);
    if (errno == ERANGE || bytes == 0) return std::nullopt;
    return bytes;
  }
  if (s.size() < 3) return std::nullopt;
  std::string unit = s.substr(s.size() - 2);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double multiplier;
  if (unit == "TB") multiplier = 1e12;
  else if (unit == "GB") multiplier = 1e9;
  else if (unit == "MB") multiplier = 1e6;
  else if (unit == "KB") multiplier = 1e3;
  else return std::nullopt;
  std::string number = s.substr(0, s.size() - 2);
  while (!number.empty() && std::isspace(static_cast<unsigned char>(number.back()))) number.pop_back();
  if (number.empty() || number.find_first_not_of("0123456789.eE+-") != std::string::npos) return std::nullopt;
  const std::optional<double> value = parse_number(number);
  if (!value) return std::nullopt;
  const double bytes = *value * multiplier;  // the same double product Python computes
  if (!(bytes >= 1.0) || bytes >= 18446744073709551616.0) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::optional<int32_t> parse_float_dtype(const std::string& name) {
  if (name == "f32" || name == "F32" || name == "float32") return PEFT_DTYPE_F32;
  if (name == "f16" || name == "F16" || name == "float16") return PEFT_DTYPE_F16;
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return PEFT_DTYPE_BF16;
  return std::nullopt;
}

}  // namespace peftc
