#include "gguf/ggml_type.hpp"

namespace peft {

std::optional<DType> dtype_of_ggml(uint32_t id) {
  const auto type = ggml_type(id);
  return type ? type->dtype : std::nullopt;
}

std::optional<uint32_t> ggml_of_dtype(DType dtype) {
  for (uint32_t id = 0; id <= ggml_type_max_id(); ++id) {
    if (const auto type = ggml_type(id); type && type->dtype == dtype) return id;
  }
  return std::nullopt;
}

}  // namespace peft
