// The safetensors dtypes: names, bit sizes and the writer's sort rank. The numeric values are the
// public PEFT_DTYPE_* constants, which follow the reference's declaration order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "peft_c.h"

namespace peft {

enum class DType : int32_t {
  BOOL = PEFT_DTYPE_BOOL,
  F4 = PEFT_DTYPE_F4,
  F6_E2M3 = PEFT_DTYPE_F6_E2M3,
  F6_E3M2 = PEFT_DTYPE_F6_E3M2,
  U8 = PEFT_DTYPE_U8,
  I8 = PEFT_DTYPE_I8,
  F8_E5M2 = PEFT_DTYPE_F8_E5M2,
  F8_E4M3 = PEFT_DTYPE_F8_E4M3,
  F8_E8M0 = PEFT_DTYPE_F8_E8M0,
  F8_E4M3FNUZ = PEFT_DTYPE_F8_E4M3FNUZ,
  F8_E5M2FNUZ = PEFT_DTYPE_F8_E5M2FNUZ,
  I16 = PEFT_DTYPE_I16,
  U16 = PEFT_DTYPE_U16,
  F16 = PEFT_DTYPE_F16,
  BF16 = PEFT_DTYPE_BF16,
  I32 = PEFT_DTYPE_I32,
  U32 = PEFT_DTYPE_U32,
  F32 = PEFT_DTYPE_F32,
  C64 = PEFT_DTYPE_C64,
  F64 = PEFT_DTYPE_F64,
  I64 = PEFT_DTYPE_I64,
  U64 = PEFT_DTYPE_U64,
};

inline constexpr int32_t kDTypeCount = PEFT_DTYPE_COUNT;

inline bool is_valid_dtype(int32_t value) { return value >= 0 && value < kDTypeCount; }

// The exact safetensors name ("BF16").
std::string_view dtype_name(DType dtype);

// The dtype of an exact, case-sensitive name; nullopt for anything else.
std::optional<DType> dtype_from_name(std::string_view name);

// Bits per element: 4 (F4), 6 (F6_*), otherwise 8 x bytes.
uint32_t dtype_bits(DType dtype);

// The reference writer orders tensors by this rank, descending (then by name bytes).
inline int32_t dtype_rank(DType dtype) { return static_cast<int32_t>(dtype); }

inline bool is_float(DType d) {
  switch (d) {
    case DType::F64: case DType::F32: case DType::F16: case DType::BF16:
    case DType::F8_E4M3: case DType::F8_E5M2: case DType::F8_E8M0:
    case DType::F8_E4M3FNUZ: case DType::F8_E5M2FNUZ:
      return true;
    default:
      return false;
  }
}

}  // namespace peft
