// What `peftc adapter combine`, `peftc model combine` and `peftc merge --combine` share: the weighted inputs (DIR:WEIGHT),
// the combination method's name, and the pruning settings (--density, --majority-sign, --seed),
// applied to export options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "arguments.hpp"
#include "peft_c.h"

namespace peftc {

// The PEFT_COMBINE_* names, in their order.
inline constexpr const char* kCombineMethods[] = {"cat",       "linear",          "ties",           "dare_linear",
                                                  "dare_ties", "magnitude_prune", "svd",            "ties_svd",
                                                  "dare_linear_svd", "dare_ties_svd", "magnitude_prune_svd"};

// "DIR:WEIGHT", split at the last colon (folder names may hold colons); the weight is a finite number.
bool parse_weighted(const std::string& text, std::string& dir, double& weight);

// The PEFT_COMBINE_* value of a method name, or nothing.
std::optional<int32_t> combine_method(const std::string& name);

// The pruning settings as given (unset: the library's defaults).
struct PruningArgs {
  std::optional<double> density;
  std::optional<int32_t> majority_sign;
  std::optional<uint64_t> seed;
};

// Takes --density, --majority-sign or --seed into `p`. Returns 1 when `a` was one of them, 0 when it
// is another option, -1 (after printing the usage error) when its value is bad.
int apply_pruning_option(Arguments& a, PruningArgs& p, const char* usage);

// Sets the given settings on `opts`; the first error, or NULL.
peft_error* set_pruning(peft_export_options* opts, const PruningArgs& p);

}  // namespace peftc
