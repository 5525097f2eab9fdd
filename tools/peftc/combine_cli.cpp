#include "combine_cli.hpp"

#include <cerrno>
#include <cstdlib>
#include <iterator>

#include "command.hpp"

namespace peftc {

bool parse_weighted(const std::string& text, std::string& dir, double& weight) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return false;
  const std::optional<double> number = parse_number(text.substr(colon + 1));
  if (!number) return false;
  weight = *number;
  dir = text.substr(0, colon);
  return true;
}

std::optional<int32_t> combine_method(const std::string& name) {
  for (int32_t m = 0; m < static_cast<int32_t>(std::size(kCombineMethods)); ++m)
    if (name == kCombineMethods[m]) return m;
  return std::nullopt;
}

int apply_pruning_option(Arguments& a, PruningArgs& p, const char* usage) {
  const std::string& arg = a.name();
  if (arg == "--density") {
    const auto v = a.value();
    p.density = v ? parse_number(*v) : std::nullopt;
    if (!p.density || *p.density < 0 || *p.density > 1) return usage_error("--density needs a number from 0 to 1", usage), -1;
  } else if (arg == "--majority-sign") {
    const auto v = a.value();
    if (v && *v == "total") p.majority_sign = PEFT_MAJORITY_SIGN_TOTAL;
    else if (v && *v == "frequency") p.majority_sign = PEFT_MAJORITY_SIGN_FREQUENCY;
    else return usage_error("--majority-sign must be total or frequency", usage), -1;
  } else if (arg == "--seed") {
    const auto v = a.value();
    char* end = nullptr;
    if (!v || v->empty() || (*v)[0] == '-') return usage_error("--seed needs a whole number", usage), -1;
    errno = 0;
    const unsigned long long parsed = std::strtoull(v->c_str(), &end, 10);
    if (errno != 0 || end != v->c_str() + v->size()) return usage_error("--seed needs a whole number below 2^64", usage), -1;
    p.seed = parsed;
  } else {
    return 0;
  }
  return 1;
}

peft_error* set_pruning(peft_export_options* opts, const PruningArgs& p) {
  if (p.density)
    if (peft_error* err = peft_export_options_set_combine_density(opts, *p.density)) return err;
  if (p.majority_sign)
    if (peft_error* err = peft_export_options_set_combine_majority_sign(opts, *p.majority_sign)) return err;
  if (p.seed)
    if (peft_error* err = peft_export_options_set_combine_seed(opts, *p.seed)) return err;
  return nullptr;
}

}  // namespace peftc
