// The code a call fails with, for tests that check error codes: one helper for every unit test.
#pragma once

#include <cstdint>

#include "core/error.hpp"
#include "peft_c.h"

namespace error_test {

// The code of the peft::Error `body` throws; PEFT_OK when it returns.
template <class Body>
int32_t code_of(const Body& body) {
  try {
    body();
  } catch (const peft::Error& e) {
    return e.code();
  }
  return PEFT_OK;
}

}  // namespace error_test
