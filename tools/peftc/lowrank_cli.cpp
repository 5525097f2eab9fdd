#include "lowrank_cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <optional>

#include "command.hpp"
#include "json_text.hpp"

namespace peftc {

int apply_lowrank_option(Arguments& a, peft_lowrank_options* opts, bool& rank_given, const char* usage) {
  const std::string& arg = a.name();
  peft_error* err = nullptr;
  if (arg == "--rank" || arg == "--energy") {
    if (rank_given) return usage_error("give one of --rank and --energy", usage), -1;
    const auto v = a.value();
    const double n = v ? parse_number(*v).value_or(-1.0) : -1.0;
    if (arg == "--rank") {
      if (n < 1 || n > 1e9 || n != std::floor(n)) return usage_error("--rank needs a whole number >= 1", usage), -1;
      err = peft_lowrank_options_set_rank(opts, static_cast<int64_t>(n));
    } else {
      if (!(n > 0 && n <= 1)) return usage_error("--energy needs a fraction in (0, 1]", usage), -1;
      err = peft_lowrank_options_set_energy(opts, n);
    }
    rank_given = true;
  } else if (arg == "--svd") {
    const auto v = a.value();
    if (v && *v == "exact") err = peft_lowrank_options_set_svd(opts, PEFT_SVD_EXACT);
    else if (v && *v == "randomized") err = peft_lowrank_options_set_svd(opts, PEFT_SVD_RANDOMIZED);
    else return usage_error("--svd must be exact or randomized", usage), -1;
  } else if (arg == "--threads") {
    const auto v = a.value();
    const double n = v ? parse_number(*v).value_or(-1.0) : -1.0;
    if (n < 0 || n > 4096 || n != std::floor(n))
      return usage_error("--threads must be a whole number from 0 (all cores) to 4096, not '" + v.value_or("") + "'",
                         usage),
             -1;
    err = peft_lowrank_options_set_threads(opts, static_cast<uint32_t>(n));
  } else if (arg == "--dtype") {
    const auto v = a.value();
    const std::optional<int32_t> d = v ? parse_float_dtype(*v) : std::nullopt;
    if (!d) return usage_error("--dtype must be f32, bf16 or f16", usage), -1;
    err = peft_lowrank_options_set_dtype(opts, *d);
  } else {
    return 0;
  }
  if (err != nullptr) return report(err), -1;
  return 1;
}

void print_lowrank_report(const peft_lowrank_report* report, bool json) {
  const size_t n = peft_lowrank_report_module_count(report);
  if (json) {
    std::printf("{\"modules\": [");
    for (size_t i = 0; i < n; ++i)
      std::printf("%s{\"name\": %s, \"rank\": %lld, \"relative_error\": %.17g}", i ? ", " : "",
                  json_string(peft_lowrank_report_module_name(report, i), std::strlen(peft_lowrank_report_module_name(report, i))).c_str(),
                  static_cast<long long>(peft_lowrank_report_module_rank(report, i)),
                  peft_lowrank_report_module_error(report, i));
    std::printf("]}\n");
    return;
  }
  std::printf("%6s  %-12s  %s\n", "rank", "rel. error", "module");
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = peft_lowrank_report_module_error(report, i);
    worst = std::max(worst, e);
    std::printf("%6lld  %-12.6g  %s\n", static_cast<long long>(peft_lowrank_report_module_rank(report, i)), e,
                peft_lowrank_report_module_name(report, i));
  }
  std::printf("%zu module(s); largest relative error %.6g\n", n, worst);
}

}  // namespace peftc
