#include "gguf/ggml_type.hpp"

#include <array>

namespace peft {
namespace {

struct DTypePair {
  uint32_t id;
  DType dtype;
};
constexpr std::array<DTypePair, 8> kPlain{{
    {0, DType::F32}, {1, DType::F16}, {30, DType::BF16}, {28, DType::F64},
    {24, DType::I8}, {25, DType::I16}, {26, DType::I32}, {27, DType::I64},
}};

}  // namespace

std::optional<DType> dtype_of_ggml(uint32_t id) {
  for (const auto& pair : kPlain) {
    if (pair.id == id) return pair.dtype;
  }
  return std::nullopt;
}

std::optional<uint32_t> ggml_of_dtype(DType dtype) {
  for (const auto& pair : kPlain) {
    if (pair.dtype == dtype) return pair.id;
  }
  return std::nullopt;
}

}  // namespace peft
