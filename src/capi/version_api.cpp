#include "capi/capi_common.hpp"
#include "core/kernel_level.hpp"

static_assert(PEFT_VERSION_NUMBER == PEFT_VERSION_MAJOR * 10000 + PEFT_VERSION_MINOR * 100 + PEFT_VERSION_PATCH);

extern "C" {

const char* peft_version(void) { return PEFT_VERSION_STRING; }

uint32_t peft_version_number(void) { return PEFT_VERSION_NUMBER; }

uint32_t peft_abi_version(void) { return PEFT_ABI_VERSION; }

const char* peft_kernels(void) { return peft::kernels::level_name(peft::kernels::chosen_level()); }

}  // extern "C"
