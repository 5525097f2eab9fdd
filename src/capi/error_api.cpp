#include "capi/capi_common.hpp"

namespace peft::capi {

// Returned when even the error object cannot be allocated; peft_error_free() never frees it.
static peft_error g_out_of_memory{PEFT_ERR_OUT_OF_MEMORY, "out of memory"};

peft_error* make_error(int32_t code, const std::string& message) noexcept {
  try {
    return new peft_error{code, message};
  } catch (...) {
    return &g_out_of_memory;
  }
}

}  // namespace peft::capi

extern "C" {

int32_t peft_error_code(const peft_error* err) { return err ? err->code : PEFT_OK; }

const char* peft_error_message(const peft_error* err) { return err ? err->message.c_str() : ""; }

void peft_error_free(peft_error* err) {
  if (err != &peft::capi::g_out_of_memory) delete err;
}

const char* peft_error_code_name(int32_t code) { return peft::code_name(code); }

}  // extern "C"
