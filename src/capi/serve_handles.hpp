// The C handles of the serving section, shared by the registry, apply and host-model C API files.
// Only src/capi includes this.
#pragma once

#include <memory>

#include "peft_c.h"
#include "serve/registry.hpp"

struct peft_registry {
  std::unique_ptr<peft::serve::Registry> impl;
};

struct peft_lease {
  std::unique_ptr<peft::serve::Lease> impl;
};
