// What `peftc adapter extract` and `peftc adapter convert --to lora` share: the options of the
// truncated SVD (--rank, --energy, --svd, --threads, --dtype) and the per-module report, printed
// as a table or as JSON.
#pragma once

#include <string>

#include "arguments.hpp"
#include "peft_c.h"

namespace peftc {

// Applies the option `a` names to `opts` when it is one of the SVD options. Returns 1 when it
// was, 0 when it is another option, -1 (after printing the usage error) when its value is bad.
int apply_lowrank_option(Arguments& a, peft_lowrank_options* opts, bool& rank_given, const char* usage);

// Prints the report: one line per module ("<rank> <error> <name>") and a summary, or JSON.
void print_lowrank_report(const peft_lowrank_report* report, bool json);

}  // namespace peftc
