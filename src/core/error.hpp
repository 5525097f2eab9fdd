// The internal error type. Every failure inside the library is a peft::Error carrying one of the
// stable PEFT_ERR_* codes of the public header; src/capi turns it into a peft_error object.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "peft_c.h"

namespace peft {

class Error : public std::runtime_error {
 public:
  Error(int32_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int32_t code() const noexcept { return code_; }

 private:
  int32_t code_;
};

[[noreturn]] inline void fail(int32_t code, const std::string& message) { throw Error(code, message); }

// Name of a code, e.g. "INVALID_OFFSET"; "UNKNOWN" for a value that is not a code.
const char* code_name(int32_t code) noexcept;

}  // namespace peft
