// The reference reader's steps, numbered as in SafeTensors::read_metadata (safetensors 0.8):
//  1 fewer than 8 bytes                          -> HEADER_TOO_SMALL
//  2/3 N does not fit usize, or N > the maximum  -> HEADER_TOO_LARGE
//  4 8 + N overflows or is past the end          -> INVALID_HEADER_LENGTH
//  5 the N bytes are not UTF-8                   -> INVALID_HEADER_UTF8
//  6 not the JSON the format needs               -> INVALID_HEADER (header_json.cpp); a tensor name
//    given twice -> INVALID_HEADER too, stricter than the reference (checked after the sort, as the
//    file's name index is built: positions are those of the sorted list)
//  7 in (begin, end) order: contiguity from 0, element count, bit count, whole bytes, byte span
//  8 8 + N + end of the last tensor != file size -> METADATA_INCOMPLETE_BUFFER
#include "safetensors/header_parser.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/error.hpp"
#include "core/text.hpp"
#include "core/utf8.hpp"
#include "safetensors/header_json.hpp"
#include "safetensors/header_messages.hpp"

namespace peft {
namespace {

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }

// Step 7 for one tensor; `expected_begin` is where the previous tensor ended.
void validate_tensor(const TensorInfo& t, uint64_t expected_begin) {
  if (t.begin != expected_begin || t.end < t.begin) {
    const std::string why = t.begin != expected_begin
        ? "must begin at " + std::to_string(expected_begin) +
              (expected_begin == 0 ? " (the first tensor starts the data section)"
                                   : ", where the previous tensor ends (no gaps or overlaps)")
        : "end before they begin";
    fail(PEFT_ERR_INVALID_OFFSET, "tensor " + quoted_name(t.name) + ": data_offsets " +
                                      offsets_text(t.begin, t.end) + " " + why);
  }
  uint64_t elements = 1;  // a scalar (shape []) has one element
  for (uint64_t dim : t.shape) {
    if (!checked_mul(elements, dim, elements)) {
      fail(PEFT_ERR_VALIDATION_OVERFLOW, "tensor " + quoted_name(t.name) + ": shape " +
                                             shape_text(t.shape, kShapeDimsShown) +
                                             " has more elements than fit in 64 bits");
    }
  }
  const uint32_t element_bits = dtype_bits(t.dtype);
  uint64_t bits = 0;
  if (!checked_mul(elements, element_bits, bits)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW,
         "tensor " + quoted_name(t.name) + ": " + std::to_string(elements) + " elements of " +
             std::string(dtype_name(t.dtype)) + " have more bits than fit in 64 bits");
  }
  if (bits % 8 != 0) {
    fail(PEFT_ERR_MISALIGNED_SLICE,
         "tensor " + quoted_name(t.name) + ": " + std::to_string(elements) + " elements of " +
             std::string(dtype_name(t.dtype)) + " (" + std::to_string(element_bits) +
             " bits each) do not fill whole bytes");
  }
  if (t.end - t.begin != bits / 8) {
    fail(PEFT_ERR_TENSOR_INVALID_INFO,
         "tensor " + quoted_name(t.name) + ": shape " + shape_text(t.shape, kShapeDimsShown) + " of " +
             std::string(dtype_name(t.dtype)) + " needs " + std::to_string(bits / 8) +
             " bytes but data_offsets " + offsets_text(t.begin, t.end) + " span " +
             std::to_string(t.end - t.begin));
  }
}

}  // namespace

uint64_t read_header_length(const uint8_t* prefix, size_t prefix_size, uint64_t file_size,
                            const HeaderLimits& limits) {
  if (file_size < 8 || prefix_size < 8 || prefix == nullptr) {
    fail(PEFT_ERR_HEADER_TOO_SMALL, "the file is " + std::to_string(file_size) +
                                        " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];  // little-endian on any host
  bool fits_usize = true;  // the reference's `usize::try_from(n)`: only fails on 32-bit hosts
  if constexpr (sizeof(size_t) < sizeof(uint64_t)) fits_usize = n <= std::numeric_limits<size_t>::max();
  if (!fits_usize || n > limits.max_header_size) {
    fail(PEFT_ERR_HEADER_TOO_LARGE, "the header length " + std::to_string(n) +
                                        " is over the limit of " +
                                        std::to_string(limits.max_header_size) + " bytes");
  }
  uint64_t stop = 0;
  if (!checked_add(n, 8, stop) || stop > file_size) {
    fail(PEFT_ERR_INVALID_HEADER_LENGTH, "the header length " + std::to_string(n) +
                                             " reaches past the end of the " +
                                             std::to_string(file_size) + "-byte file");
  }
  return n;
}

Header parse_header(std::string_view header_bytes, uint64_t file_size) {
  Header header;
  header.header_size = header_bytes.size();

  if (const size_t valid = utf8_valid_prefix(header_bytes); valid != header_bytes.size()) {
    fail(PEFT_ERR_INVALID_HEADER_UTF8,
         "the header is not valid UTF-8 (at header byte " + std::to_string(valid) + ")");
  }

  HeaderJson json = parse_header_json(header_bytes);
  header.metadata = std::move(json.metadata);
  header.tensors = std::move(json.tensors);

  // The reference sorts with a stable sort by (begin, end); tensors with equal offsets stay in the
  // order it collected them. Its order there comes from a HashMap (random), ours is the JSON order,
  // which only matters for which of several bad tensors sharing an offset is reported.
  // Files written by the reference list tensors in data order already, so check before sorting.
  const auto by_offsets = [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  };
  if (!std::is_sorted(header.tensors.begin(), header.tensors.end(), by_offsets)) {
    // Sort positions rather than the (heavy) entries, then move each entry once.
    std::vector<uint32_t> order(header.tensors.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return by_offsets(header.tensors[a], header.tensors[b]);
    });
    std::vector<TensorInfo> sorted;
    sorted.reserve(order.size());
    for (uint32_t i : order) sorted.push_back(std::move(header.tensors[i]));
    header.tensors = std::move(sorted);
  }

  // Stricter than the reference, which keeps the last of two entries with the same name.
  header.names.reserve(header.tensors.size());
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorInfo& tensor = header.tensors[i];
    if (header.names.insert(tensor.name, i, NamesOf(header.tensors))) {
      fail(PEFT_ERR_INVALID_HEADER, "tensor " + quoted_name(tensor.name) +
                                        " is listed twice (stricter than the reference, on purpose)");
    }
  }

  uint64_t data_end = 0;
  for (const TensorInfo& tensor : header.tensors) {
    validate_tensor(tensor, data_end);
    data_end = tensor.end;
  }
  header.data_size = data_end;

  uint64_t total = 0;
  const bool fits = checked_add(8, header.header_size, total) && checked_add(total, data_end, total);
  if (!fits || total != file_size) {
    const std::string expected = fits ? std::to_string(total) + " bytes" : "more than 2^64 bytes";
    fail(PEFT_ERR_METADATA_INCOMPLETE_BUFFER,
         "the file is " + std::to_string(file_size) + " bytes but 8 + header " +
             std::to_string(header.header_size) + " + tensor data " + std::to_string(data_end) +
             " is " + expected + (fits && total < file_size ? " (trailing bytes)" : " (truncated)"));
  }
  return header;
}

Header parse_safetensors(const uint8_t* data, size_t size, const HeaderLimits& limits) {
  const uint64_t n = read_header_length(data, size < 8 ? size : 8, size, limits);
  // read_header_length guarantees 8 + n <= size.
  return parse_header(std::string_view(reinterpret_cast<const char*>(data) + 8, n), size);
}

}  // namespace peft
