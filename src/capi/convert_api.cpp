#include <string>

#include "capi/capi_common.hpp"
#include "core/convert.hpp"

extern "C" {

peft_error* peft_convert(int32_t src_dtype, const void* src, int32_t dst_dtype, void* dst, uint64_t count) {
  return peft::capi::guarded([&] {
    const peft::DType from = peft::capi::dtype_arg(src_dtype, "src_dtype");
    const peft::DType to = peft::capi::dtype_arg(dst_dtype, "dst_dtype");
    if (count != 0) {
      peft::capi::require_arg(src, "src");
      peft::capi::require_arg(dst, "dst");
    }
    peft::convert(from, src, to, dst, count);
  });
}

}  // extern "C"
