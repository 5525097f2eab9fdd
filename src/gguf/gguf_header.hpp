// A parsed GGUF header (ggml/include/gguf.h, versions 2 and 3, little-endian): its typed metadata
// in file order, its tensor infos in file order, and where the data section starts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <string_view>
#include <variant>
#include <vector>

#include "core/name_index.hpp"
#include "core/tensor_info.hpp"

namespace peft {

// The numbers of gguf.h's `enum gguf_type`, stable in the format.
enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

// Bytes of one stored value of a fixed-size type (1, 2, 4 or 8); 0 for STRING and ARRAY.
uint64_t gguf_value_size(GgufValueType type);

struct GgufValue;

// An array value, stored compactly so that a header costs about its own bytes in memory (see
// docs/gguf.md, "Memory"): elements of a fixed-size type are `raw`, their little-endian bytes as in
// the file, back to back (size() * gguf_value_size(element_type) bytes; BOOL as 0 or 1); STRING elements are `raw`,
// each string's bytes followed by one NUL, with `string_starts()[k]` the offset of element k (its
// bytes end one before the next start, or before the last byte of `raw`). An array of N empty
// strings (8 bytes each in the file) thus costs N * 9 bytes. ARRAY elements (arrays of arrays,
// which gguf-py writes and the writer supports; the parser refuses them, as llama.cpp does) are
// `arrays()`, one GgufArray each. The string offsets and the nested arrays live behind one pointer,
// allocated only for the arrays that use them, so that a GgufArray, and with it every GgufValue,
// stays small (40 bytes). gguf_array_append (gguf_writer.hpp) builds an array from values.
struct GgufArray {
  struct Parts;

  GgufValueType element_type = GgufValueType::U8;
  std::vector<uint8_t> raw;

  GgufArray() = default;
  explicit GgufArray(GgufValueType type) : element_type(type) {}
  GgufArray(const GgufArray& other);
  GgufArray(GgufArray&& other) noexcept = default;
  GgufArray& operator=(const GgufArray& other);
  GgufArray& operator=(GgufArray&& other) noexcept = default;
  ~GgufArray();

  // STRING arrays only: the offset in `raw` of each element (the mutable form allocates the parts).
  const std::vector<uint64_t>& string_starts() const;
  std::vector<uint64_t>& string_starts();
  // ARRAY arrays only: the elements.
  const std::vector<GgufArray>& arrays() const;
  std::vector<GgufArray>& arrays();

  size_t size() const;
  bool empty() const { return size() == 0; }
  // Element `index` (< size()) as a value of type element_type (strings and arrays copied).
  GgufValue at(size_t index) const;
  // The bytes of element `index` (< size()) of a STRING array; a NUL follows them in memory.
  std::string_view string_at(size_t index) const;
  // Whether the members are consistent as described above (what the parser builds); the writer
  // refuses an array that is not.
  bool well_formed() const;

 private:
  const Parts& parts() const;  // an empty Parts while parts_ is null
  Parts& parts();              // made on first write
  std::unique_ptr<Parts> parts_;  // null until string_starts() or arrays() is written
};

struct GgufArray::Parts {
  std::vector<uint64_t> string_starts;
  std::vector<GgufArray> arrays;
};

// One metadata value. `type` says how it is stored; `data` holds unsigned integers as uint64_t,
// signed ones as int64_t, F32 and F64 as double (exact for both), BOOL as bool, STRING as its bytes.
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> data;
};

// The scalar of fixed-size `type` whose little-endian bytes, zero-extended, are `bits` (BOOL: any
// nonzero byte is true; the parser refuses a stored bool other than 0 and 1).
GgufValue gguf_scalar_from_bits(GgufValueType type, uint64_t bits);

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
  NameIndex tensor_names;    // positions in `tensors` by name (NamesOf(tensors)), built by the parser
  uint64_t alignment = 32;   // general.alignment, or 32
  uint64_t data_start = 0;   // absolute offset of the data section (a multiple of alignment)
  uint64_t data_size = 0;    // bytes the data section needs: the last tensor's end, padded
};

// Metadata lookups by key (first match in file order): the value or null; a string value; a
// single non-negative integer value (nullopt when absent, of another type, negative, or an array).
const GgufValue* find_metadata(const GgufHeader& header, std::string_view key);
std::optional<std::string> metadata_string(const GgufHeader& header, std::string_view key);
std::optional<uint64_t> metadata_count(const GgufHeader& header, std::string_view key);

// One metadata entry read as a value of the asked-for kind: element `element` of an array entry, or
// the value of a scalar entry (element 0). Integers and booleans read as integers when the value fits
// the asked-for type; F32 and F64 as double. Each fails with PEFT_ERR_INVALID_ARGUMENT naming the
// key for an element out of range, an element other than 0 of a scalar, or a value of another kind.
int64_t gguf_metadata_int(const GgufKeyValue& entry, uint64_t element);
uint64_t gguf_metadata_uint(const GgufKeyValue& entry, uint64_t element);
double gguf_metadata_float(const GgufKeyValue& entry, uint64_t element);
// A string's bytes; a NUL follows them in memory; they live as long as `entry`.
std::string_view gguf_metadata_string(const GgufKeyValue& entry, uint64_t element);

// Reads exactly `count` bytes at absolute `offset` into `dst`; throws (PEFT_ERR_IO) on failure.
using GgufByteReader = std::function<void(uint64_t offset, void* dst, uint64_t count)>;

// Parses and validates the header of a GGUF file of `file_size` bytes, reading it through `read`,
// completely, before any tensor byte is touched; `display_name` names the file in messages. Every
// count and length is checked against the bytes left before it is used, so no input allocates
// more than a small multiple of the file's size (arrays: see GgufArray). Errors: see docs/gguf.md ("Validation").
GgufHeader parse_gguf_header(const GgufByteReader& read, uint64_t file_size, uint64_t max_header_size,
                             const std::string& display_name);

}  // namespace peft
