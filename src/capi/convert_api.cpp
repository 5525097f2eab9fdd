#include <string>

#include "capi/capi_common.hpp"
#include "core/convert.hpp"

extern "C" {

peft_error* peft_convert(int32_t src_dtype, const void* src, int32_t dst_dtype, void* dst, uint64_t count) {
  return peft::capi::guarded([&] {
    if (!peft::is_valid_dtype(src_dtype)) {
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "src_dtype " + std::to_string(src_dtype) + " is not a dtype");
    }
    if (!peft::is_valid_dtype(dst_dtype)) {
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "dst_dtype " + std::to_string(dst_dtype) + " is not a dtype");
    }
    if (count != 0) {
      peft::capi::require_arg(src, "src");
      peft::capi::require_arg(dst, "dst");
    }
    peft::convert(static_cast<peft::DType>(src_dtype), src, static_cast<peft::DType>(dst_dtype), dst, count);
  });
}

}  // extern "C"
