// Reading and validating a safetensors header exactly as the reference Rust reader
// (`SafeTensors::read_metadata`, safetensors 0.8) does: the same checks in the same order, so a file
// gets the same error kind here as there. The one deliberate difference: a tensor name given twice
// is INVALID_HEADER here, where the reference silently keeps the last entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.hpp"

namespace peft {

struct TensorInfo {
  std::string name;
  DType dtype = DType::BOOL;
  std::vector<uint64_t> shape;  // empty for a scalar
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
  uint64_t nbytes() const { return end - begin; }
};

using Metadata = std::vector<std::pair<std::string, std::string>>;  // sorted by key bytes

struct Header {
  uint64_t header_size = 0;         // N, the JSON length including padding
  std::vector<TensorInfo> tensors;  // in data order: stable sort by (begin, end) as the reference does
  std::optional<Metadata> metadata; // nullopt when "__metadata__" is absent or null; {} when it is {}
  uint64_t data_size = 0;           // end of the last tensor (0 without tensors)
  uint64_t data_start() const { return 8 + header_size; }
};

struct HeaderLimits {
  uint64_t max_header_size = 100'000'000;  // the reference's MAX_HEADER_SIZE (decimal, inclusive)
};

// The reference's largest accepted header length.
inline constexpr uint64_t kDefaultMaxHeaderSize = 100'000'000;

// Steps 1-4 of the reference: reads the 8-byte little-endian N from `prefix` (which holds the first
// min(8, file_size) bytes of the file) and checks it against the limits and the file size.
// Throws HEADER_TOO_SMALL, HEADER_TOO_LARGE, INVALID_HEADER_LENGTH.
uint64_t read_header_length(const uint8_t* prefix, size_t prefix_size, uint64_t file_size,
                            const HeaderLimits& limits);

// Steps 5-8: validates the N header bytes (UTF-8, JSON, fields, offsets, sizes) and the total file
// size. Throws INVALID_HEADER_UTF8, INVALID_HEADER, INVALID_OFFSET, VALIDATION_OVERFLOW,
// MISALIGNED_SLICE, TENSOR_INVALID_INFO, METADATA_INCOMPLETE_BUFFER.
Header parse_header(std::string_view header_bytes, uint64_t file_size);

// Both steps over a whole file held in memory.
Header parse_safetensors(const uint8_t* data, size_t size, const HeaderLimits& limits = {});

}  // namespace peft
