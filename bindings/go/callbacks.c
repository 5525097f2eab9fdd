// C halves of the callback trampolines: the library calls these with the cgo.Handle the binding
// passed as user_data, and they call the exported Go functions. No Go pointer crosses into C.
#include <stdint.h>
#include <peft_c.h>
#include "_cgo_export.h"

static int32_t peftc_source_shim(void* user_data, uint64_t offset, void* dst, uint64_t nbytes) {
  return peftcGoTensorSource((uintptr_t)user_data, offset, dst, nbytes);
}

static int32_t peftc_progress_shim(void* user_data, uint64_t done, uint64_t total) {
  return peftcGoProgress((uintptr_t)user_data, done, total);
}

peft_error* peftc_write_from_source(peft_writer* w, const char* name, int32_t src_dtype, uintptr_t handle) {
  return peft_writer_write_from_callback(w, name, src_dtype, peftc_source_shim, (void*)handle);
}

peft_error* peftc_set_progress(peft_merge_options* opts, uintptr_t handle) {
  return peft_merge_options_set_progress(opts, peftc_progress_shim, (void*)handle);
}
