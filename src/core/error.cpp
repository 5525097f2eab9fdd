#include "core/error.hpp"

namespace peft {

const char* code_name(int32_t code) noexcept {
  switch (code) {
    case PEFT_OK: return "OK";
    case PEFT_ERR_HEADER_TOO_SMALL: return "HEADER_TOO_SMALL";
    case PEFT_ERR_HEADER_TOO_LARGE: return "HEADER_TOO_LARGE";
    case PEFT_ERR_INVALID_HEADER_LENGTH: return "INVALID_HEADER_LENGTH";
    case PEFT_ERR_INVALID_HEADER_UTF8: return "INVALID_HEADER_UTF8";
    case PEFT_ERR_INVALID_HEADER: return "INVALID_HEADER";
    case PEFT_ERR_INVALID_OFFSET: return "INVALID_OFFSET";
    case PEFT_ERR_VALIDATION_OVERFLOW: return "VALIDATION_OVERFLOW";
    case PEFT_ERR_MISALIGNED_SLICE: return "MISALIGNED_SLICE";
    case PEFT_ERR_TENSOR_INVALID_INFO: return "TENSOR_INVALID_INFO";
    case PEFT_ERR_METADATA_INCOMPLETE_BUFFER: return "METADATA_INCOMPLETE_BUFFER";
    case PEFT_ERR_IO: return "IO";
    case PEFT_ERR_NOT_FOUND: return "NOT_FOUND";
    case PEFT_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case PEFT_ERR_UNRESOLVED_KEY: return "UNRESOLVED_KEY";
    case PEFT_ERR_SHAPE_MISMATCH: return "SHAPE_MISMATCH";
    case PEFT_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case PEFT_ERR_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case PEFT_ERR_CANCELLED: return "CANCELLED";
    case PEFT_ERR_INVALID_CONFIG: return "INVALID_CONFIG";
    case PEFT_ERR_INVALID_CHECKPOINT: return "INVALID_CHECKPOINT";
    case PEFT_ERR_OVER_BUDGET: return "OVER_BUDGET";
    case PEFT_ERR_NON_FINITE: return "NON_FINITE";
    case PEFT_ERR_INTERNAL: return "INTERNAL";
    default: return "UNKNOWN";
  }
}

}  // namespace peft
