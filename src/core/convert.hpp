// Bulk dtype conversion: the one pass that turns tensor bytes of one dtype into another, e.g. a
// bf16 weight into the caller's f32 buffer. Results are bit-identical to torch's Tensor.to(dtype)
// (tests/unit/test_convert.cpp checks them against tables made with torch).
//
// Supported: any of F64, F32, F16, BF16, the five F8 dtypes, BOOL, U8, I8, I16, U16, I32, U32, I64,
// U64 into F64, F32, F16 or BF16; and any dtype into itself (a byte copy).
//
// Rounding is to nearest, ties to even; NaN stays NaN (made quiet), infinities stay infinite,
// overflow gives infinity. Into F16 and BF16 the value is first rounded to F32 and then to the
// 16-bit type, as torch does: for F64 and for integers wider than 24 bits that is two roundings
// (torch: static_cast<float> then c10::BFloat16/c10::Half(float)), which can differ from a single
// rounding in the last bit. Integers into F32/F64 are C conversions (one rounding).
#pragma once

#include <bit>
#include <cstdint>

#include "core/dtype.hpp"

namespace peft {

// Little-endian host: tensor bytes are little-endian and are loaded as native integers.
static_assert(std::endian::native == std::endian::little, "peft_c assumes a little-endian host");

// True when convert() handles src -> dst.
bool can_convert(DType src, DType dst);

// Converts count elements. src_data and dst_data may have any alignment and must not overlap
// (INVALID_ARGUMENT if they do). Throws UNSUPPORTED ("cannot convert X to Y") for other pairs,
// INVALID_ARGUMENT when a same-dtype copy of a sub-byte dtype is not whole bytes, and
// VALIDATION_OVERFLOW when the byte count does not fit 64 bits. count 0 does nothing (pointers may
// then be null). Allocates nothing; single-threaded; safe to call from many threads at once.
void convert(DType src, const void* src_data, DType dst, void* dst_data, uint64_t count);

// Bytes that count elements of dtype occupy; throws as convert() does for partial bytes/overflow.
uint64_t converted_byte_size(DType dtype, uint64_t count);

}  // namespace peft
