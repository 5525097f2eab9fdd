// Reading and validating a safetensors header exactly as the reference Rust reader
// (`SafeTensors::read_metadata`, safetensors 0.8) does: the same checks in the same order, so a file
// gets the same error kind here as there. The one deliberate difference: a tensor name given twice
// is INVALID_HEADER here, where the reference silently keeps the last entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "safetensors/header_types.hpp"

namespace peft {

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
