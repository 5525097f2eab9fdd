// The first pass of writing: from tensor declarations alone (name, dtype, shape) and the metadata,
// compute the order, the offsets and the exact header bytes the reference writer
// (safetensors' Rust `prepare` + serde_json) would produce for the same tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace peft {

inline constexpr uint64_t kMaxHeaderSize = 100'000'000;  // the reference's MAX_HEADER_SIZE

// A tensor as declared to a writer. nbytes and elements are derived from dtype and shape.
struct TensorDecl {
  std::string name;
  DType dtype = DType::U8;
  std::vector<uint64_t> shape;
  uint64_t elements = 1;
  uint64_t nbytes = 0;
};

// Metadata keys sorted by bytes (the reference's order is random; sorted is what one key gives and
// what safetensors#790 proposes). nullopt writes no "__metadata__" entry; an empty map writes
// "__metadata__":{}.
using WriterMetadata = std::optional<std::map<std::string, std::string>>;

// Checks a declaration and computes its sizes: INVALID_ARGUMENT for a name that is not UTF-8 or is
// "__metadata__", VALIDATION_OVERFLOW when elements x bits overflows 64 bits, MISALIGNED_SLICE when
// a sub-byte dtype does not fill whole bytes (all as the reference's validate()).
TensorDecl make_tensor_decl(std::string name, DType dtype, std::vector<uint64_t> shape);

// INVALID_ARGUMENT naming the key when a metadata key or value is not valid UTF-8.
void check_metadata_entry(const std::string& key, const std::string& value);

// One file's layout: which declarations it holds, in the reference's order, and its header.
struct FileLayout {
  std::vector<size_t> order;     // indices into the declaration list, in data order
  std::vector<uint64_t> begins;  // data_offsets begin of each entry of `order`
  std::string prefix;            // 8-byte little-endian length + JSON + space padding
  uint64_t data_size = 0;        // sum of the tensors' nbytes
  uint64_t file_size = 0;        // prefix.size() + data_size
};

// Orders `members` (indices into `decls`) by dtype rank descending then name bytes ascending, and
// renders the header. INVALID_ARGUMENT for a duplicate name, HEADER_TOO_LARGE when the padded JSON
// exceeds `max_header`, VALIDATION_OVERFLOW when offsets overflow. `file_name` names the file in
// messages.
FileLayout plan_file(const std::vector<TensorDecl>& decls, std::vector<size_t> members,
                     const WriterMetadata& metadata, const std::string& file_name,
                     uint64_t max_header = kMaxHeaderSize);

}  // namespace peft
