#include "safetensors/header_writer.hpp"

#include <algorithm>
#include <string_view>

#include "core/error.hpp"
#include "core/text.hpp"
#include "core/utf8.hpp"
#include "safetensors/serde_string.hpp"

namespace peft {
namespace {

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }
bool add_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_add_overflow(a, b, &out); }

void append_uint(std::string& out, uint64_t value) { out += std::to_string(value); }

}  // namespace

TensorDecl make_tensor_decl(std::string name, DType dtype, std::vector<uint64_t> shape) {
  if (!is_valid_dtype(static_cast<int32_t>(dtype))) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(name) + ": unknown dtype " +
                                        std::to_string(static_cast<int32_t>(dtype)));
  }
  if (!is_valid_utf8(name)) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor name " + quoted(name) + " is not valid UTF-8");
  }
  if (name == "__metadata__") {
    fail(PEFT_ERR_INVALID_ARGUMENT,
         "a tensor cannot be named \"__metadata__\": the name is reserved for the metadata entry");
  }
  TensorDecl decl;
  decl.dtype = dtype;
  decl.shape = std::move(shape);
  uint64_t elements = 1;
  for (uint64_t dim : decl.shape) {
    if (mul_overflows(elements, dim, elements)) {
      fail(PEFT_ERR_VALIDATION_OVERFLOW, "tensor " + quoted(name) + ": the shape's element count overflows");
    }
  }
  uint64_t bits;
  if (mul_overflows(elements, dtype_bits(dtype), bits)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, "tensor " + quoted(name) + ": its size in bits overflows");
  }
  if (bits % 8 != 0) {
    fail(PEFT_ERR_MISALIGNED_SLICE, "tensor " + quoted(name) + ": " + std::to_string(elements) + " " +
                                        std::string(dtype_name(dtype)) + " elements do not fill whole bytes");
  }
  decl.elements = elements;
  decl.nbytes = bits / 8;
  decl.name = std::move(name);
  return decl;
}

void check_metadata_entry(const std::string& key, const std::string& value) {
  if (!is_valid_utf8(key)) fail(PEFT_ERR_INVALID_ARGUMENT, "metadata key " + quoted(key) + " is not valid UTF-8");
  if (!is_valid_utf8(value)) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "the value of metadata key " + quoted(key) + " is not valid UTF-8");
  }
}

FileLayout plan_file(const std::vector<TensorDecl>& decls, std::vector<size_t> members,
                     const WriterMetadata& metadata, const std::string& file_name, uint64_t max_header) {
  // The reference's order: dtype rank descending, then name bytes ascending (Rust str Ord).
  std::sort(members.begin(), members.end(), [&](size_t a, size_t b) {
    const TensorDecl& l = decls[a];
    const TensorDecl& r = decls[b];
    if (l.dtype != r.dtype) return dtype_rank(l.dtype) > dtype_rank(r.dtype);
    return std::string_view(l.name) < std::string_view(r.name);
  });
  // A HashMap in the reference cannot hold a name twice; a caller's declaration list can.
  {
    std::vector<std::string_view> names;
    names.reserve(members.size());
    for (size_t m : members) names.emplace_back(decls[m].name);
    std::sort(names.begin(), names.end());
    const auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end()) fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(std::string(*dup)) + " is declared twice");
  }

  FileLayout layout;
  std::string& json = layout.prefix;
  json.assign(8, '\0');
  json += '{';
  bool first = true;
  if (metadata) {
    json += "\"__metadata__\":{";
    bool first_entry = true;
    for (const auto& [key, value] : *metadata) {  // std::map: sorted by key bytes
      if (!first_entry) json += ',';
      first_entry = false;
      json::append_serde_string(json, key);
      json += ':';
      json::append_serde_string(json, value);
    }
    json += '}';
    first = false;
  }
  uint64_t offset = 0;
  layout.order = std::move(members);
  layout.begins.reserve(layout.order.size());
  for (size_t m : layout.order) {
    const TensorDecl& t = decls[m];
    uint64_t end;
    if (add_overflows(offset, t.nbytes, end)) {
      fail(PEFT_ERR_VALIDATION_OVERFLOW, "the data of " + quoted(file_name) + " overflows 64 bits");
    }
    if (!first) json += ',';
    first = false;
    json::append_serde_string(json, t.name);
    json += ":{\"dtype\":\"";
    json += dtype_name(t.dtype);
    json += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) json += ',';
      append_uint(json, t.shape[d]);
    }
    json += "],\"data_offsets\":[";
    append_uint(json, offset);
    json += ',';
    append_uint(json, end);
    json += "]}";
    layout.begins.push_back(offset);
    offset = end;
    if (json.size() - 8 > max_header) break;  // no use rendering further; reported below
  }
  json += '}';
  // Pad with spaces to a multiple of 8 so that the data section starts 8-aligned.
  json.append((8 - (json.size() % 8)) % 8, ' ');
  const uint64_t header_length = json.size() - 8;
  if (header_length > max_header) {
    fail(PEFT_ERR_HEADER_TOO_LARGE, "the header of " + quoted(file_name) + " would be over " +
                                        std::to_string(max_header) + " bytes");
  }
  for (int i = 0; i < 8; ++i) json[i] = static_cast<char>((header_length >> (8 * i)) & 0xFF);
  layout.data_size = offset;
  if (add_overflows(json.size(), offset, layout.file_size)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, "the size of " + quoted(file_name) + " overflows 64 bits");
  }
  return layout;
}

}  // namespace peft
