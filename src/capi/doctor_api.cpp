// The adapter doctor of the C API (peft_adapter_doctor, peft_adapter_doctor_fix).
#include <string>

#include "capi/capi_common.hpp"
#include "peft/doctor/adapter_doctor.hpp"

using peft::capi::guarded;
using peft::capi::require_arg;

extern "C" {

peft_error* peft_adapter_doctor(const char* adapter_dir, const char* base_dir, char** out_json) {
  return guarded([&] {
    require_arg(adapter_dir, "adapter_dir");
    require_arg(out_json, "out_json");
    peft::DoctorResult result = peft::diagnose_adapter(adapter_dir, base_dir ? base_dir : "");
    *out_json = peft::capi::copy_string(result.json);
  });
}

peft_error* peft_adapter_doctor_fix(const char* adapter_dir, const char* base_dir, const char* out_dir,
                                    char** out_json) {
  return guarded([&] {
    require_arg(adapter_dir, "adapter_dir");
    require_arg(out_dir, "out_dir");
    peft::DoctorResult result = peft::fix_adapter(adapter_dir, base_dir ? base_dir : "", out_dir);
    if (out_json) *out_json = peft::capi::copy_string(result.json);
  });
}

}  // extern "C"
