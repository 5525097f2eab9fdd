// The C API of the "hub" section: model ids resolved offline in the Hugging Face hub cache.
#include "capi/capi_common.hpp"
#include "checkpoint/hub_cache.hpp"

using peft::capi::copy_string;
using peft::capi::guarded;
using peft::capi::require_arg;

extern "C" {

peft_error* peft_hub_resolve(const char* id_or_path, char** out_dir) {
  return guarded([&] {
    require_arg(id_or_path, "id_or_path");
    require_arg(out_dir, "out_dir");
    *out_dir = copy_string(peft::resolve_path_or_hub_id(id_or_path));
  });
}

peft_error* peft_hub_cache_dir(char** out_dir) {
  return guarded([&] {
    require_arg(out_dir, "out_dir");
    *out_dir = copy_string(peft::hub_cache_dir());
  });
}

}  // extern "C"
