// The C handle of a list of strings (peft_string_list), shared by the C API files that return one.
// Only src/capi includes this.
#pragma once

#include <string>
#include <vector>

#include "peft_c.h"

struct peft_string_list {
  std::vector<std::string> items;
};
