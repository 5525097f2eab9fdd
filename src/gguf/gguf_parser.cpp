// The strict GGUF header reader. It refuses everything llama.cpp's reader (ggml/src/gguf.cpp,
// gguf_init_from_reader) refuses, in the same order, plus what could make a later read leave the
// file; docs/gguf.md ("Validation") lists every check with its code. The header is read through a
// small buffered cursor, and every count and length is compared with the bytes left in the file
// (and under the header cap) before anything is allocated for it.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/name_index.hpp"
#include "core/text.hpp"
#include "core/utf8.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_header.hpp"

namespace peft {
namespace {

constexpr uint64_t kPrefixSize = 4 + 4 + 8 + 8;          // magic, version, tensor count, KV count
constexpr uint64_t kMinKeyValueSize = (8 + 1) + 4 + 1;   // a 1-byte key, the type, a 1-byte value
constexpr uint64_t kMinTensorInfoSize = 8 + 4 + 4 + 8;   // an empty name, n_dims 0, type, offset
constexpr uint64_t kMaxStringLength = uint64_t{1} << 30;  // gguf.cpp's GGUF_MAX_STRING_LENGTH
constexpr uint64_t kMaxArrayLength = uint64_t{1} << 30;   // gguf.cpp's GGUF_MAX_ARRAY_ELEMENTS
constexpr uint32_t kMaxDims = 4;                          // GGML_MAX_DIMS
constexpr size_t kMaxTensorNameBytes = 63;                // GGML_MAX_NAME (64) with its NUL
constexpr uint64_t kDefaultAlignment = 32;                // GGUF_DEFAULT_ALIGNMENT
constexpr uint64_t kChunk = 64 * 1024;                    // bytes the cursor reads at once
constexpr uint32_t kLastValueType = static_cast<uint32_t>(GgufValueType::F64);
constexpr char kAlignmentKey[] = "general.alignment";

std::string num(uint64_t value) { return std::to_string(value); }

const char* type_name(GgufValueType type) {
  static constexpr std::array<const char*, 13> kNames{
      "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  return kNames[static_cast<uint32_t>(type)];
}

uint32_t byte_swapped(uint32_t v) { return __builtin_bswap32(v); }

class Parser {
 public:
  Parser(const GgufByteReader& read, uint64_t file_size, uint64_t max_header_size, const std::string& name)
      : read_(read), size_(file_size), max_header_(max_header_size), name_(name) {}

  GgufHeader parse() {
    GgufHeader header;
    const auto [n_tensors, n_kv] = read_prefix(header);
    metadata(header, n_kv);
    alignment(header);
    std::vector<uint64_t> nbytes;
    // Reserved, as the metadata: the count fits in the file and under the cap.
    header.tensors.reserve(static_cast<size_t>(n_tensors));
    nbytes.reserve(static_cast<size_t>(n_tensors));
    tensor_at_.reserve(static_cast<size_t>(n_tensors));
    header.tensor_names.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) header.tensors.push_back(tensor_info(i, nbytes, header));
    data_section(header, nbytes);
    return header;
  }

 private:
  // What is being read, for messages. The text is made only when a message is (where()): formatting
  // it for every tensor took a fifth of the time to open a 10,000-tensor file.
  struct Place {
    enum Kind { kHeader, kPair, kKey, kTensorInfo, kTensor, kDataSection } kind = kHeader;
    uint64_t number = 0;  // the pair's or tensor info's index
    uint64_t at = 0;      // its byte offset
    std::string name;     // the key or the tensor name (its capacity kept from item to item)
  };

  [[noreturn]] void bad(int32_t code, const std::string& what) const { fail(code, name_ + ": " + what); }

  void at_place(Place::Kind kind, uint64_t number = 0, uint64_t at = 0, std::string_view name = {}) {
    place_.kind = kind;
    place_.number = number;
    place_.at = at;
    place_.name.assign(name);
  }

  std::string where() const {
    const std::string at = " (at byte " + num(place_.at) + ")";
    switch (place_.kind) {
      case Place::kHeader: return "the GGUF header";
      case Place::kPair: return "key-value pair #" + num(place_.number) + at;
      case Place::kKey: return "key " + quoted_name(place_.name) + at;
      case Place::kTensorInfo: return "tensor info #" + num(place_.number) + at;
      case Place::kTensor: return "tensor " + quoted_name(place_.name) + at;
      case Place::kDataSection: break;
    }
    return "the data section";
  }

  uint64_t file_left() const { return size_ - pos_; }
  uint64_t header_left() const { return max_header_ > pos_ ? max_header_ - pos_ : 0; }

  // Fails unless `n` more bytes of `field` lie in the file and under the header cap.
  void need(uint64_t n, std::string_view field) const {
    if (n > file_left()) {
      bad(PEFT_ERR_INVALID_HEADER_LENGTH, where() + ": " + std::string(field) + " at byte " + num(pos_) + " needs " + num(n) +
                                              " bytes, but the file ends at byte " + num(size_));
    }
    if (n > header_left()) {
      bad(PEFT_ERR_HEADER_TOO_LARGE, where() + ": " + std::string(field) + " at byte " + num(pos_) + " (" + num(n) +
                                         " bytes) runs past the header size limit of " + num(max_header_) +
                                         " bytes");
    }
  }

  // Fails unless `count` items of at least `min_size` bytes each can fit in what is left; `field`,
  // at byte `at`, holds the count.
  void need_items(uint64_t count, uint64_t min_size, std::string_view field, uint64_t at) const {
    if (count > file_left() / min_size) {
      bad(PEFT_ERR_INVALID_HEADER_LENGTH, where() + ": " + std::string(field) + " at byte " + num(at) + " is " + num(count) +
                                              ", but " + num(count) + " items of at least " + num(min_size) +
                                              " bytes do not fit in the " + num(file_left()) +
                                              " bytes left in the file");
    }
    if (count > header_left() / min_size) {
      bad(PEFT_ERR_HEADER_TOO_LARGE, where() + ": " + std::string(field) + " at byte " + num(at) + " is " + num(count) +
                                         ", which runs past the header size limit of " + num(max_header_) +
                                         " bytes");
    }
  }

  // Copies `n` bytes at the cursor (already checked by need()) and moves past them.
  void take(void* dst, uint64_t n) {
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (pos_ < buf_at_ || pos_ >= buf_at_ + buf_.size()) fill();
      const uint64_t offset = pos_ - buf_at_;
      const uint64_t step = std::min<uint64_t>(n, buf_.size() - offset);
      std::memcpy(out, buf_.data() + offset, step);
      out += step;
      n -= step;
      pos_ += step;
    }
  }

  void fill() {
    const uint64_t count = std::min(kChunk, file_left());
    buf_.resize(count);
    buf_at_ = pos_;
    read_(pos_, buf_.data(), count);
  }

  uint64_t little_endian(uint64_t n, std::string_view field) {
    need(n, field);
    uint8_t bytes[8];
    take(bytes, n);
    uint64_t value = 0;
    for (uint64_t i = n; i-- > 0;) value = (value << 8) | bytes[i];
    return value;
  }
  uint32_t u32(std::string_view field) { return static_cast<uint32_t>(little_endian(4, field)); }
  uint64_t u64(std::string_view field) { return little_endian(8, field); }

  // Reads a string's length and checks that its bytes lie in the file, under the header cap and
  // under llama.cpp's limit; the cursor is left at the bytes.
  uint64_t string_length(std::string_view field) {
    const uint64_t at = pos_;
    const uint64_t length = u64(field);
    if (length > file_left()) {
      bad(PEFT_ERR_INVALID_HEADER_LENGTH, where() + ": " + std::string(field) + " at byte " + num(at) + " has length " +
                                              num(length) + ", past the end of the file (" + num(file_left()) +
                                              " bytes left)");
    }
    need(length, field);
    if (length > kMaxStringLength) {
      bad(PEFT_ERR_INVALID_HEADER, where() + ": " + std::string(field) + " at byte " + num(at) + " has length " + num(length) +
                                       ", over llama.cpp's limit of " + num(kMaxStringLength) + " bytes");
    }
    return length;
  }

  std::string read_string(std::string_view field) {
    const uint64_t length = string_length(field);
    std::string out(static_cast<size_t>(length), '\0');
    take(out.data(), length);
    return out;
  }

  // Reads the `count` elements of an array (count checked by need_items) into its compact form.
  GgufArray read_array(GgufValueType items, uint64_t count) {
    GgufArray array;
    array.element_type = items;
    const std::string field = std::string("an element of the ") + type_name(items) + " array";
    if (items != GgufValueType::STRING) {
      const uint64_t n = count * gguf_value_size(items);  // fits: need_items checked it
      need(n, field);
      array.raw.resize(static_cast<size_t>(n));
      take(array.raw.data(), n);
      if (items == GgufValueType::BOOL) {
        const auto bad_bool = std::find_if(array.raw.begin(), array.raw.end(), [](uint8_t b) { return b > 1; });
        if (bad_bool != array.raw.end()) {
          const auto index = static_cast<uint64_t>(bad_bool - array.raw.begin());
          not_a_bool(*bad_bool, pos_ - n + index, "element " + num(index) + " of the bool array");
        }
      }
      return array;
    }
    // values are bytes: not checked for UTF-8 (see docs/gguf.md)
    std::vector<uint64_t>& starts = array.string_starts();
    starts.reserve(static_cast<size_t>(count));
    for (uint64_t k = 0; k < count; ++k) {
      const uint64_t length = string_length(field);
      const size_t start = array.raw.size();
      starts.push_back(start);
      array.raw.resize(start + static_cast<size_t>(length) + 1);  // the bytes and a NUL
      take(array.raw.data() + start, length);
    }
    array.raw.shrink_to_fit();
    return array;
  }

  std::pair<uint64_t, uint64_t> read_prefix(GgufHeader& header) {
    if (size_ < kPrefixSize) {
      bad(PEFT_ERR_HEADER_TOO_SMALL, "the file has " + num(size_) + " bytes, fewer than the " + num(kPrefixSize) +
                                         " of a GGUF header's fixed part (magic, version, tensor and key-value "
                                         "counts)");
    }
    at_place(Place::kHeader);
    need(kPrefixSize, "the fixed part");
    char magic[4];
    take(magic, 4);
    if (std::memcmp(magic, "GGUF", 4) != 0) {
      bad(PEFT_ERR_INVALID_HEADER, "not a GGUF file: the first 4 bytes are " + quoted(std::string(magic, 4)) +
                                       ", not \"GGUF\"");
    }
    const uint32_t version = u32("the version");
    if (version != 0 && (version & 0xFFFF) == 0) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", version);
      bad(PEFT_ERR_UNSUPPORTED, std::string("the version field reads ") + hex + ", which is version " +
                                    num(byte_swapped(version)) +
                                    " byte-swapped: a big-endian GGUF file, which is not supported");
    }
    if (version == 1) {
      bad(PEFT_ERR_UNSUPPORTED, "GGUF version 1 is obsolete and not supported (versions 2 and 3 are)");
    }
    if (version != 2 && version != 3) {
      bad(PEFT_ERR_UNSUPPORTED, "GGUF version " + num(version) + " is not supported (versions 2 and 3 are)");
    }
    header.version = version;
    const uint64_t n_tensors = u64("the tensor count");
    const uint64_t n_kv = u64("the key-value count");
    // Both counts against the bytes after the prefix, before anything is read for them.
    const uint64_t left = file_left();
    const bool fits = n_kv <= left / kMinKeyValueSize && n_tensors <= left / kMinTensorInfoSize &&
                      n_kv * kMinKeyValueSize + n_tensors * kMinTensorInfoSize <= left;
    const std::string counts = num(n_kv) + " key-value pairs (at least " + num(kMinKeyValueSize) +
                               " bytes each) and " + num(n_tensors) + " tensor infos (at least " +
                               num(kMinTensorInfoSize) + " bytes each)";
    if (!fits) {
      bad(PEFT_ERR_INVALID_HEADER_LENGTH, "the header declares " + counts + ", which do not fit in the " +
                                              num(left) + " bytes after its fixed part");
    }
    if (n_kv * kMinKeyValueSize + n_tensors * kMinTensorInfoSize > header_left()) {
      bad(PEFT_ERR_HEADER_TOO_LARGE, "the header declares " + counts + ", more than the header size limit of " +
                                         num(max_header_) + " bytes allows");
    }
    return {n_tensors, n_kv};
  }

  GgufValue scalar(GgufValueType type, std::string_view field) {
    const uint64_t at = pos_;
    const uint64_t bits = little_endian(gguf_value_size(type), field);
    if (type == GgufValueType::BOOL && bits > 1) not_a_bool(bits, at, "the bool value");
    return gguf_scalar_from_bits(type, bits);
  }

  // A stored bool is the byte 0 or 1 (gguf-py and gguf.cpp write nothing else): any other byte would
  // read as true and be written back as 1, so the file would not round-trip.
  [[noreturn]] void not_a_bool(uint64_t byte, uint64_t at, std::string_view field) const {
    bad(PEFT_ERR_INVALID_HEADER, where() + ": " + std::string(field) + " at byte " + num(at) + " is " + num(byte) +
                                     ", not a bool (0 or 1)");
  }

  GgufValue element(GgufValueType type, std::string_view field) {
    if (type != GgufValueType::STRING) return scalar(type, field);
    GgufValue value;
    value.type = type;
    value.data = read_string(field);  // values are bytes: not checked for UTF-8 (see docs/gguf.md)
    return value;
  }

  GgufValueType value_type(uint32_t raw, std::string_view field, uint64_t at) const {
    if (raw > kLastValueType) {
      bad(PEFT_ERR_INVALID_HEADER, where() + ": " + std::string(field) + " at byte " + num(at) + " is " + num(raw) +
                                       ", not a GGUF value type (0 to " + num(kLastValueType) + ")");
    }
    return static_cast<GgufValueType>(raw);
  }

  void metadata(GgufHeader& header, uint64_t n_kv) {
    // n_kv pairs fit in the file and under the cap (read_prefix): reserving them avoids a vector
    // growth's slack and the two copies it holds while it moves (docs/gguf.md, "Memory").
    header.metadata.reserve(static_cast<size_t>(n_kv));
    std::vector<uint64_t> at_of;  // byte offset of each pair, for the duplicate message
    at_of.reserve(static_cast<size_t>(n_kv));
    const auto key_at = [&pairs = header.metadata](size_t k) { return std::string_view(pairs[k].key); };
    NameIndex seen;
    seen.reserve(static_cast<size_t>(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
      const uint64_t at = pos_;
      at_place(Place::kPair, i, at);
      std::string key = read_string("the key");
      if (key.empty()) bad(PEFT_ERR_INVALID_HEADER, where() + ": the key is empty");
      if (!is_valid_utf8(key)) {
        bad(PEFT_ERR_INVALID_HEADER_UTF8, where() + ": the key " + quoted_name(key) + " is not valid UTF-8");
      }
      // Added at the position the pair will take, pushed below.
      if (const std::optional<size_t> first = seen.insert(key, header.metadata.size(), key_at)) {
        bad(PEFT_ERR_INVALID_HEADER, where() + ": duplicate key " + quoted_name(key) + " (first at byte " +
                                         num(at_of[*first]) + ")");
      }
      at_place(Place::kKey, i, at, key);
      uint64_t type_at = pos_;
      const GgufValueType type = value_type(u32("the value type"), "the value type", type_at);
      GgufValue value;
      if (type == GgufValueType::ARRAY) {
        type_at = pos_;
        const GgufValueType items = value_type(u32("the array's element type"), "the array's element type", type_at);
        if (items == GgufValueType::ARRAY) {
          bad(PEFT_ERR_INVALID_HEADER, where() + ": an array of arrays (element type at byte " + num(type_at) +
                                           "); nested arrays are refused, as llama.cpp refuses them");
        }
        const uint64_t count_at = pos_;
        const uint64_t count = u64("the array's length");
        const uint64_t min_size = items == GgufValueType::STRING ? 8 : gguf_value_size(items);
        need_items(count, min_size, "the array's length", count_at);
        if (count > kMaxArrayLength) {
          bad(PEFT_ERR_INVALID_HEADER, where() + ": the array's length at byte " + num(count_at) + " is " +
                                           num(count) + ", over llama.cpp's limit of " + num(kMaxArrayLength));
        }
        value.type = GgufValueType::ARRAY;
        value.data = read_array(items, count);
      } else {
        value = element(type, std::string("the ") + type_name(type) + " value");
      }
      header.metadata.push_back(GgufKeyValue{std::move(key), std::move(value)});
      at_of.push_back(at);
    }
  }

  void alignment(GgufHeader& header) {
    header.alignment = kDefaultAlignment;
    for (const GgufKeyValue& kv : header.metadata) {
      if (kv.key != kAlignmentKey) continue;
      if (kv.value.type != GgufValueType::U32) {
        const std::string found = kv.value.type == GgufValueType::ARRAY
            ? std::string("an array of ") + type_name(std::get<GgufArray>(kv.value.data).element_type)
            : std::string(type_name(kv.value.type));
        bad(PEFT_ERR_INVALID_HEADER, "key \"general.alignment\" must be a u32, not " + found);
      }
      const uint64_t value = std::get<uint64_t>(kv.value.data);
      if (value == 0 || (value & (value - 1)) != 0) {
        bad(PEFT_ERR_INVALID_HEADER, "key \"general.alignment\" is " + num(value) + ", not a power of two");
      }
      header.alignment = value;
    }
  }

  // Reads tensor info #i, which the caller pushes as header.tensors[i], and adds its name to
  // header.tensor_names.
  TensorInfo tensor_info(uint64_t i, std::vector<uint64_t>& nbytes, GgufHeader& header) {
    const uint64_t at = pos_;
    at_place(Place::kTensorInfo, i, at);
    TensorInfo t;
    t.name = read_string("the tensor name");
    if (t.name.size() > kMaxTensorNameBytes) {
      bad(PEFT_ERR_INVALID_HEADER, where() + ": the tensor name " + quoted_name(t.name) + " has " +
                                       num(t.name.size()) + " bytes, over llama.cpp's limit of " +
                                       num(kMaxTensorNameBytes));
    }
    if (!is_valid_utf8(t.name)) {
      bad(PEFT_ERR_INVALID_HEADER_UTF8, where() + ": the tensor name " + quoted_name(t.name) + " is not valid UTF-8");
    }
    if (const std::optional<size_t> first =
            header.tensor_names.insert(t.name, static_cast<size_t>(i), NamesOf(header.tensors))) {
      bad(PEFT_ERR_INVALID_HEADER, where() + ": duplicate tensor name " + quoted_name(t.name) +
                                       " (first at byte " + num(tensor_at_[*first]) + ")");
    }
    tensor_at_.push_back(at);
    at_place(Place::kTensor, i, at, t.name);
    const uint64_t dims_at = pos_;
    const uint32_t n_dims = u32("the dimension count");
    if (n_dims > kMaxDims) {
      bad(PEFT_ERR_INVALID_HEADER, where() + ": the dimension count at byte " + num(dims_at) + " is " + num(n_dims) +
                                       ", over ggml's limit of " + num(kMaxDims));
    }
    uint64_t ne[kMaxDims] = {1, 1, 1, 1};
    uint64_t elements = 1;
    for (uint32_t j = 0; j < n_dims; ++j) {
      const uint64_t dim_at = pos_;
      static constexpr std::array<const char*, kMaxDims> kDimField{"ne[0]", "ne[1]", "ne[2]", "ne[3]"};
      ne[j] = u64(kDimField[j]);
      if (ne[j] > static_cast<uint64_t>(INT64_MAX)) {
        bad(PEFT_ERR_VALIDATION_OVERFLOW, where() + ": ne[" + num(j) + "] at byte " + num(dim_at) + " is " +
                                              num(ne[j]) + ", negative as ggml's int64_t");
      }
      // As gguf.cpp: the running product in file order must stay within int64.
      if (__builtin_mul_overflow(elements, ne[j], &elements) || elements > static_cast<uint64_t>(INT64_MAX)) {
        bad(PEFT_ERR_VALIDATION_OVERFLOW, where() + ": ne " + shape_text(std::span<const uint64_t>(ne, j + 1)) +
                                              " has more elements than fit in int64");
      }
    }
    const uint64_t type_at = pos_;
    const uint32_t type_id = u32("the ggml type");
    const std::optional<GgmlType> type = ggml_type(type_id);
    if (!type) {
      bad(PEFT_ERR_INVALID_HEADER, where() + ": the ggml type at byte " + num(type_at) + " is " + num(type_id) +
                                       ", not a type ggml defines (unknown or removed)");
    }
    if (ne[0] % type->block_size != 0) {
      bad(PEFT_ERR_TENSOR_INVALID_INFO, where() + ": its rows have " + num(ne[0]) + " elements (ne[0]), not a multiple of " +
                                            std::string(type->name) + "'s block size " + num(type->block_size));
    }
    uint64_t size = 0;
    if (__builtin_mul_overflow(elements / type->block_size, uint64_t{type->type_size}, &size)) {
      bad(PEFT_ERR_VALIDATION_OVERFLOW, where() + ": " + num(elements) + " elements of " + std::string(type->name) +
                                            " take more bytes than fit in 64 bits");
    }
    nbytes.push_back(size);
    t.begin = u64("the data offset");  // checked in data_section()
    t.shape.assign(std::rbegin(ne) + (kMaxDims - n_dims), std::rend(ne));
    t.ggml_type = static_cast<int32_t>(type_id);
    const std::optional<DType> dtype = dtype_of_ggml(type_id);
    t.block_quantized = !dtype;
    t.dtype = dtype.value_or(DType::U8);
    return t;
  }

  void data_section(GgufHeader& header, const std::vector<uint64_t>& nbytes) {
    at_place(Place::kDataSection);
    const uint64_t align = header.alignment;
    const uint64_t infos_end = pos_;
    const uint64_t padding = (align - infos_end % align) % align;
    if (padding > file_left() && !header.tensors.empty()) {
      bad(PEFT_ERR_METADATA_INCOMPLETE_BUFFER,
          "the data section starts at byte " + num(infos_end + padding) + " (the tensor infos end at byte " +
              num(infos_end) + ", padded to the alignment of " + num(align) + "), past the end of the file at byte " +
              num(size_));
    }
    // A file without tensors need not hold the padding (llama.cpp reads none): data_start stays in the file.
    header.data_start = infos_end + std::min(padding, file_left());
    if (header.data_start > max_header_) {
      bad(PEFT_ERR_HEADER_TOO_LARGE, "the header, padded to the alignment of " + num(align) + ", ends at byte " +
                                         num(header.data_start) + ", past the header size limit of " +
                                         num(max_header_) + " bytes");
    }
    uint64_t expected = 0;
    for (size_t i = 0; i < header.tensors.size(); ++i) {
      TensorInfo& t = header.tensors[i];
      const auto name = [&t] { return "tensor " + quoted_name(t.name); };
      if (t.begin != expected) {
        std::string why;
        if (t.begin % align != 0) {
          why = "not a multiple of the alignment " + num(align);
        } else if (t.begin < expected) {
          why = "overlapping the previous tensor's bytes (with padding)";
        } else {
          why = "leaving a gap of " + num(t.begin - expected) + " bytes";
        }
        bad(PEFT_ERR_INVALID_OFFSET, name() + ": data offset " + num(t.begin) + ", expected " + num(expected) +
                                         (i == 0 ? " (the first tensor starts the data section)"
                                                 : " (where the previous tensor's padded bytes end)") +
                                         ": " + why);
      }
      uint64_t padded = 0;
      if (__builtin_add_overflow(nbytes[i], align - 1, &padded) || __builtin_add_overflow(expected, padded / align * align, &expected)) {
        bad(PEFT_ERR_VALIDATION_OVERFLOW, name() + ": its " + num(nbytes[i]) + " bytes at data offset " + num(t.begin) +
                                              ", padded to the alignment " + num(align) + ", overflow 64 bits");
      }
      t.end = t.begin + nbytes[i];
    }
    header.data_size = expected;
    for (const TensorInfo& t : header.tensors) {
      if (t.end > size_ - header.data_start) {
        bad(PEFT_ERR_METADATA_INCOMPLETE_BUFFER,
            "tensor " + quoted_name(t.name) + ": its bytes [" + num(t.begin) + ", " + num(t.end) +
                ") of the data section at byte " + num(header.data_start) + " run past the end of the file (" +
                num(size_) + " bytes)");
      }
    }
  }

  const GgufByteReader& read_;
  const uint64_t size_;
  const uint64_t max_header_;
  const std::string& name_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;  // the file's bytes [buf_at_, buf_at_ + buf_.size())
  uint64_t buf_at_ = 0;
  Place place_;  // what is being read, for messages
  std::vector<uint64_t> tensor_at_;  // byte offset of each tensor info, for the duplicate message
};

}  // namespace

GgufHeader parse_gguf_header(const GgufByteReader& read, uint64_t file_size, uint64_t max_header_size,
                             const std::string& display_name) {
  return Parser(read, file_size, max_header_size, display_name).parse();
}

}  // namespace peft
