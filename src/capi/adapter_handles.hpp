// The C handles of the adapter section, shared with other C API files (the merge section takes a
// peft_adapter* and uses its C++ Adapter). Only src/capi includes this.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "peft/adapter/adapter.hpp"
#include "peft/arch/translator.hpp"
#include "peft_c.h"

struct peft_adapter {
  std::shared_ptr<const peft::Adapter> impl;
  // Strings handed out as borrowed `const char*`, computed once when the handle is made.
  std::string config_json;
  std::map<std::string, std::string, std::less<>> field_json;
  std::string family;  // "" when the adapter has no architecture table
};

struct peft_adapter_options {
  peft::Adapter::Options impl;
};

struct peft_translator {
  peft::Translator impl;
};
