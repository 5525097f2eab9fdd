#include <string_view>

#include "capi/capi_common.hpp"
#include "core/dtype.hpp"

extern "C" {

const char* peft_dtype_name(int32_t dtype) {
  if (!peft::is_valid_dtype(dtype)) return nullptr;
  return peft::dtype_name(static_cast<peft::DType>(dtype)).data();
}

int32_t peft_dtype_from_name(const char* name) {
  if (name == nullptr) return -1;
  auto dtype = peft::dtype_from_name(name);
  return dtype ? static_cast<int32_t>(*dtype) : -1;
}

uint32_t peft_dtype_bits(int32_t dtype) {
  return peft::is_valid_dtype(dtype) ? peft::dtype_bits(static_cast<peft::DType>(dtype)) : 0;
}

}  // extern "C"
