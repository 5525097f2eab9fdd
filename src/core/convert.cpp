#include "core/convert.hpp"

#include <cstring>
#include <string>

#include "core/bf16.hpp"
#include "core/convert_kernels.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "core/f8.hpp"

namespace peft {
namespace {

using Bytes = const unsigned char*;
using MutableBytes = unsigned char*;

// Elements per pass when a conversion goes through float32 on the stack (integers, F64, F8 and
// the other 16-bit type into F16/BF16): 16 KiB stays in L1 and needs no allocation.
constexpr size_t kBlock = 4096;

bool is_wide_target(DType d) { return d == DType::F64 || d == DType::F32 || d == DType::F16 || d == DType::BF16; }

bool is_convertible_source(DType d) {
  switch (d) {
    case DType::F4: case DType::F6_E2M3: case DType::F6_E3M2: case DType::C64:
      return false;
    default:
      return true;
  }
}

template <class In, class Out, class Fn>
inline void map_elements(Bytes src, MutableBytes dst, size_t n, Fn fn) {
  for (size_t i = 0; i < n; ++i) {
    In in;
    std::memcpy(&in, src + i * sizeof(In), sizeof(In));
    const Out out = fn(in);
    std::memcpy(dst + i * sizeof(Out), &out, sizeof(Out));
  }
}

// An element of an integer or BOOL dtype, as C converts it (one rounding for the wide integers).
template <class Float, class Int>
void integers_to(Bytes src, MutableBytes dst, size_t n) {
  map_elements<Int, Float>(src, dst, n, [](Int v) { return static_cast<Float>(v); });
}

template <class Float>
void bools_to(Bytes src, MutableBytes dst, size_t n) {
  // torch stores bool as one byte 0/1; any nonzero byte counts as true.
  map_elements<uint8_t, Float>(src, dst, n, [](uint8_t v) { return v != 0 ? Float(1) : Float(0); });
}

// The integer and BOOL sources, into float or double. Returns false for other dtypes.
template <class Float>
bool integer_source_to(DType src, Bytes s, MutableBytes d, size_t n) {
  switch (src) {
    case DType::BOOL: bools_to<Float>(s, d, n); return true;
    case DType::U8: integers_to<Float, uint8_t>(s, d, n); return true;
    case DType::I8: integers_to<Float, int8_t>(s, d, n); return true;
    case DType::I16: integers_to<Float, int16_t>(s, d, n); return true;
    case DType::U16: integers_to<Float, uint16_t>(s, d, n); return true;
    case DType::I32: integers_to<Float, int32_t>(s, d, n); return true;
    case DType::U32: integers_to<Float, uint32_t>(s, d, n); return true;
    case DType::I64: integers_to<Float, int64_t>(s, d, n); return true;
    case DType::U64: integers_to<Float, uint64_t>(s, d, n); return true;
    default: return false;
  }
}

// Any supported source into float32 (exact except F64 and wide integers, rounded once).
void to_f32(DType src, Bytes s, MutableBytes d, size_t n) {
  const auto& kernels = convert_kernels::active();
  switch (src) {
    case DType::F32: std::memcpy(d, s, n * 4); return;
    case DType::BF16: kernels.bf16_to_f32(s, d, n); return;
    case DType::F16: kernels.f16_to_f32(s, d, n); return;
    case DType::F64:
      map_elements<double, float>(s, d, n, [](double v) { return static_cast<float>(v); });
      return;
    default: break;
  }
  if (is_f8(src)) {
    const auto& table = f8_table(src);
    map_elements<uint8_t, uint32_t>(s, d, n, [&table](uint8_t v) { return table[v]; });
    return;
  }
  if (!integer_source_to<float>(src, s, d, n)) fail(PEFT_ERR_INTERNAL, "to_f32: unexpected source dtype");
}

void to_f64(DType src, Bytes s, MutableBytes d, size_t n) {
  switch (src) {
    case DType::F32:
      map_elements<float, double>(s, d, n, [](float v) { return static_cast<double>(v); });
      return;
    case DType::BF16:
      map_elements<uint16_t, double>(s, d, n, [](uint16_t v) { return bf16_to_f64(v); });
      return;
    case DType::F16:
      map_elements<uint16_t, double>(s, d, n, [](uint16_t v) { return f16_to_f64(v); });
      return;
    default: break;
  }
  if (is_f8(src)) {
    const auto& table = f8_table(src);
    map_elements<uint8_t, double>(s, d, n, [&table](uint8_t v) {
      return static_cast<double>(std::bit_cast<float>(table[v]));
    });
    return;
  }
  if (!integer_source_to<double>(src, s, d, n)) fail(PEFT_ERR_INTERNAL, "to_f64: unexpected source dtype");
}

// Into F16 or BF16: round from float32 (torch rounds everything through float32 too; see
// convert.hpp). Non-F32 sources go through a float32 block on the stack.
void to_16(DType src, Bytes s, DType dst, MutableBytes d, size_t n) {
  const auto& kernels = convert_kernels::active();
  const auto narrow = dst == DType::BF16 ? kernels.f32_to_bf16 : kernels.f32_to_f16;
  if (src == DType::F32) {
    narrow(s, d, n);
    return;
  }
  const size_t in_size = dtype_bits(src) / 8;
  alignas(64) unsigned char block[kBlock * 4];
  for (size_t done = 0; done < n;) {
    const size_t m = n - done < kBlock ? n - done : kBlock;
    to_f32(src, s + done * in_size, block, m);
    narrow(block, d + done * 2, m);
    done += m;
  }
}

}  // namespace

bool can_convert(DType src, DType dst) {
  if (!is_valid_dtype(static_cast<int32_t>(src)) || !is_valid_dtype(static_cast<int32_t>(dst))) return false;
  return src == dst || (is_wide_target(dst) && is_convertible_source(src));
}

uint64_t converted_byte_size(DType dtype, uint64_t count) {
  const uint64_t bits = dtype_bits(dtype);
  if (count > UINT64_MAX / bits) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW,
         std::to_string(count) + " elements of " + std::string(dtype_name(dtype)) + " overflow 64 bits");
  }
  if (count * bits % 8 != 0) {
    fail(PEFT_ERR_INVALID_ARGUMENT, std::to_string(count) + " elements of " + std::string(dtype_name(dtype)) +
                                        " are not a whole number of bytes");
  }
  return count * bits / 8;
}

void convert(DType src, const void* src_data, DType dst, void* dst_data, uint64_t count) {
  if (!can_convert(src, dst)) {
    if (!is_valid_dtype(static_cast<int32_t>(src)) || !is_valid_dtype(static_cast<int32_t>(dst))) {
      fail(PEFT_ERR_INVALID_ARGUMENT, "convert: unknown dtype value");
    }
    fail(PEFT_ERR_UNSUPPORTED,
         "cannot convert " + std::string(dtype_name(src)) + " to " + std::string(dtype_name(dst)));
  }
  const uint64_t in_bytes = converted_byte_size(src, count);
  const uint64_t out_bytes = converted_byte_size(dst, count);
  if (count == 0) return;
  if (src_data == nullptr || dst_data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "convert: null buffer");
  const auto s = static_cast<Bytes>(src_data);
  const auto d = static_cast<MutableBytes>(dst_data);
  const auto s_begin = reinterpret_cast<uintptr_t>(s);
  const auto d_begin = reinterpret_cast<uintptr_t>(d);
  if (s_begin < d_begin + out_bytes && d_begin < s_begin + in_bytes) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "convert: source and destination buffers overlap");
  }
  const auto n = static_cast<size_t>(count);
  if (src == dst) {
    std::memcpy(d, s, in_bytes);
    return;
  }
  switch (dst) {
    case DType::F64: to_f64(src, s, d, n); return;
    case DType::F32: to_f32(src, s, d, n); return;
    default: to_16(src, s, dst, d, n); return;
  }
}

}  // namespace peft
