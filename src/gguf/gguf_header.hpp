// A parsed GGUF header (ggml/include/gguf.h, versions 2 and 3, little-endian): its typed metadata
// in file order, its tensor infos in file order, and where the data section starts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor_info.hpp"

namespace peft {

// The numbers of gguf.h's `enum gguf_type`, stable in the format.
enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

struct GgufValue;
struct GgufArray {
  GgufValueType element_type = GgufValueType::U8;
  std::vector<GgufValue> items;
};

// One metadata value. `type` says how it is stored; `data` holds unsigned integers as uint64_t,
// signed ones as int64_t, F32 and F64 as double (exact for both), BOOL as bool, STRING as its bytes.
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> data;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

struct GgufHeader {
  uint32_t version = 3;
  std::vector<GgufKeyValue> metadata;  // in file order
  // In file order. Shapes are outermost first (ne reversed); begin/end are relative to the data
  // section, end - begin being the tensor's own bytes (without the padding after it).
  std::vector<TensorInfo> tensors;
  uint64_t alignment = 32;   // general.alignment, or 32
  uint64_t data_start = 0;   // absolute offset of the data section (a multiple of alignment)
  uint64_t data_size = 0;    // bytes the data section needs: the last tensor's end, padded
};

// Reads exactly `count` bytes at absolute `offset` into `dst`; throws (PEFT_ERR_IO) on failure.
using GgufByteReader = std::function<void(uint64_t offset, void* dst, uint64_t count)>;

// Parses and validates the header of a GGUF file of `file_size` bytes, reading it through `read`,
// completely, before any tensor byte is touched; `display_name` names the file in messages. Every
// count and length is checked against the bytes left before it is used, so no input allocates
// more than a small multiple of the file's size. Errors: see docs/gguf.md ("Validation").
GgufHeader parse_gguf_header(const GgufByteReader& read, uint64_t file_size, uint64_t max_header_size,
                             const std::string& display_name);

}  // namespace peft
