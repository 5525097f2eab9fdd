#include "gguf/gguf_writer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "core/utf8.hpp"
#include "gguf/ggml_type.hpp"

namespace peft {
namespace {

constexpr char kAlignmentKey[] = "general.alignment";

constexpr uint32_t kLastValueType = static_cast<uint32_t>(GgufValueType::F64);

std::string value_type_name(GgufValueType type) {
  static constexpr const char* kNames[] = {"U8",  "I8",   "U16",    "I16",   "U32", "I32", "F32",
                                           "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"};
  const auto n = static_cast<uint32_t>(type);
  return n <= kLastValueType ? kNames[n] : "type " + std::to_string(n);
}

// The variant alternative a value type is held in (gguf_header.hpp).
size_t alternative_of(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: case GgufValueType::U16: case GgufValueType::U32: case GgufValueType::U64:
      return 0;
    case GgufValueType::I8: case GgufValueType::I16: case GgufValueType::I32: case GgufValueType::I64:
      return 1;
    case GgufValueType::F32: case GgufValueType::F64:
      return 2;
    case GgufValueType::BOOL:
      return 3;
    case GgufValueType::STRING:
      return 4;
    case GgufValueType::ARRAY:
      return 5;
  }
  return std::variant_npos;
}

bool in_range(const GgufValue& value) {
  switch (value.type) {
    case GgufValueType::U8: return std::get<uint64_t>(value.data) <= UINT8_MAX;
    case GgufValueType::U16: return std::get<uint64_t>(value.data) <= UINT16_MAX;
    case GgufValueType::U32: return std::get<uint64_t>(value.data) <= UINT32_MAX;
    case GgufValueType::I8: {
      const int64_t v = std::get<int64_t>(value.data);
      return v >= INT8_MIN && v <= INT8_MAX;
    }
    case GgufValueType::I16: {
      const int64_t v = std::get<int64_t>(value.data);
      return v >= INT16_MIN && v <= INT16_MAX;
    }
    case GgufValueType::I32: {
      const int64_t v = std::get<int64_t>(value.data);
      return v >= INT32_MIN && v <= INT32_MAX;
    }
    case GgufValueType::F32: {  // as struct.pack('<f'): finite values that round to infinity fail
      // 2^128 - 2^103, halfway between FLT_MAX and 2^128: from there on, rounding gives infinity.
      const double v = std::get<double>(value.data);
      return !std::isfinite(v) || std::fabs(v) < 0x1.ffffffp127;
    }
    default: return true;
  }
}

// Checks a value (and an array's storage); `where` names it in messages.
void check_value(const GgufValue& value, const std::string& where) {
  if (static_cast<uint32_t>(value.type) > kLastValueType) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + " has an unknown value type " +
                                        std::to_string(static_cast<uint32_t>(value.type)));
  }
  if (value.data.index() != alternative_of(value.type)) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + " is declared " + value_type_name(value.type) +
                                        " but holds a value of another kind");
  }
  if (!in_range(value)) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + " is out of the range of " + value_type_name(value.type));
  }
  if (value.type != GgufValueType::ARRAY) return;
  const GgufArray& array = std::get<GgufArray>(value.data);
  if (static_cast<uint32_t>(array.element_type) > kLastValueType) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + " is an array of an unknown value type " +
                                        std::to_string(static_cast<uint32_t>(array.element_type)));
  }
  if (!array.well_formed()) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + " is an array of " + value_type_name(array.element_type) +
                                        " whose storage is inconsistent (see GgufArray)");
  }
}

bool is_power_of_two(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

// `n` rounded up to a multiple of `alignment` (a power of two); false when that overflows.
bool padded(uint64_t n, uint64_t alignment, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(n, alignment - 1, &sum)) return false;
  *out = sum & ~(alignment - 1);
  return true;
}

// Elements of a shape (outermost first), checked as gguf.cpp checks ne (innermost first): every
// running product must stay within INT64_MAX.
bool element_count(const std::vector<uint64_t>& shape, uint64_t* out) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t count = 1;
  for (auto it = shape.rbegin(); it != shape.rend(); ++it) {
    if (*it > kMax || (*it > 1 && count > kMax / *it)) return false;
    count *= *it;
  }
  *out = count;
  return true;
}

uint64_t element_bytes(DType dtype) { return dtype_bits(dtype) / 8; }

// A number or bool as GGUF stores it: put(x) receives it in its stored width (bool as a byte 0 or 1).
// False for a string or an array.
template <class Put>
bool put_scalar(const GgufValue& value, Put&& put) {
  switch (value.type) {
    case GgufValueType::U8: put(static_cast<uint8_t>(std::get<uint64_t>(value.data))); return true;
    case GgufValueType::U16: put(static_cast<uint16_t>(std::get<uint64_t>(value.data))); return true;
    case GgufValueType::U32: put(static_cast<uint32_t>(std::get<uint64_t>(value.data))); return true;
    case GgufValueType::U64: put(std::get<uint64_t>(value.data)); return true;
    case GgufValueType::I8: put(static_cast<int8_t>(std::get<int64_t>(value.data))); return true;
    case GgufValueType::I16: put(static_cast<int16_t>(std::get<int64_t>(value.data))); return true;
    case GgufValueType::I32: put(static_cast<int32_t>(std::get<int64_t>(value.data))); return true;
    case GgufValueType::I64: put(std::get<int64_t>(value.data)); return true;
    case GgufValueType::F32: put(static_cast<float>(std::get<double>(value.data))); return true;
    case GgufValueType::F64: put(std::get<double>(value.data)); return true;
    case GgufValueType::BOOL: put(static_cast<uint8_t>(std::get<bool>(value.data) ? 1 : 0)); return true;
    case GgufValueType::STRING:
    case GgufValueType::ARRAY: return false;
  }
  return false;
}

}  // namespace

// Where header bytes go: counted only (data_start()), or counted and appended to a string.
class GgufWriter::Sink {
 public:
  explicit Sink(std::string* out) : out_(out) {}
  void put(const void* data, size_t size) {
    if (out_ != nullptr) out_->append(static_cast<const char*>(data), size);
    count_ += size;
  }
  template <class T>
  void put_le(T value) {  // little-endian host (core/convert.hpp)
    put(&value, sizeof value);
  }
  void put_string(const std::string& text) {
    put_le<uint64_t>(text.size());
    put(text.data(), text.size());
  }
  void put_value(const GgufValue& value) {
    if (put_scalar(value, [this](auto x) { put_le(x); })) return;
    if (value.type == GgufValueType::STRING)
      put_string(std::get<std::string>(value.data));
    else
      put_array(std::get<GgufArray>(value.data));
  }
  void put_array(const GgufArray& array) {  // elements carry no type of their own
    put_le(static_cast<uint32_t>(array.element_type));
    put_le<uint64_t>(array.size());
    if (array.element_type == GgufValueType::ARRAY) {
      for (const GgufArray& item : array.arrays()) put_array(item);
    } else if (array.element_type == GgufValueType::STRING) {
      for (size_t k = 0; k < array.size(); ++k) {
        const std::string_view text = array.string_at(k);
        put_le<uint64_t>(text.size());
        put(text.data(), text.size());
      }
    } else {
      put(array.raw.data(), array.raw.size());  // little-endian, as in a GGUF file
    }
  }
  void put_padding(uint64_t alignment) {
    const uint64_t pad = (alignment - count_ % alignment) % alignment;
    if (out_ != nullptr) out_->append(static_cast<size_t>(pad), '\0');
    count_ += pad;
  }
  uint64_t count() const { return count_; }

 private:
  std::string* out_;
  uint64_t count_ = 0;
};

void gguf_array_append(GgufArray& array, const GgufValue& item) {
  check_value(item, std::string("an item of an array of ") + value_type_name(array.element_type));
  if (item.type != array.element_type) {
    fail(PEFT_ERR_INVALID_ARGUMENT, std::string("an item of type ") + value_type_name(item.type) +
                                        " cannot go into an array of " + value_type_name(array.element_type));
  }
  const bool scalar = put_scalar(item, [&](auto v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);  // little-endian host (core/convert.hpp)
    array.raw.insert(array.raw.end(), p, p + sizeof v);
  });
  if (scalar) return;
  if (item.type == GgufValueType::STRING) {
    const std::string& text = std::get<std::string>(item.data);
    array.string_starts().push_back(array.raw.size());
    array.raw.insert(array.raw.end(), text.begin(), text.end());
    array.raw.push_back(0);
  } else {
    array.arrays().push_back(std::get<GgufArray>(item.data));
  }
}

GgufWriter::GgufWriter(std::string path) : StreamingWriter("declaration order"), path_(std::move(path)) {
  if (path_.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output path must not be empty");
}

// ---- declarations ------------------------------------------------------------------------------

void GgufWriter::add_metadata(std::string key, GgufValue value) {
  add_metadata(GgufKeyValue{std::move(key), std::move(value)});
}

void GgufWriter::add_metadata(GgufKeyValue entry) {
  require_declaring("add metadata");
  const std::string where = "metadata key " + quoted(entry.key);
  if (!is_valid_utf8(entry.key)) fail(PEFT_ERR_INVALID_ARGUMENT, where + " is not valid UTF-8");
  if (keys_.count(entry.key) != 0) fail(PEFT_ERR_INVALID_ARGUMENT, where + " is declared twice");
  check_value(entry.value, where);
  uint64_t alignment = alignment_;
  if (entry.key == kAlignmentKey) {
    if (entry.value.type != GgufValueType::U32) {
      fail(PEFT_ERR_INVALID_ARGUMENT, where + " must be U32, not " + value_type_name(entry.value.type));
    }
    alignment = std::get<uint64_t>(entry.value.data);
    if (!is_power_of_two(alignment)) {
      fail(PEFT_ERR_INVALID_ARGUMENT, where + " must be a nonzero power of two, not " + std::to_string(alignment));
    }
  }
  const uint64_t old_alignment = alignment_;
  alignment_ = alignment;
  try {
    if (alignment != old_alignment) place_tensors();
    keys_.insert(entry.key);
    metadata_.push_back(std::move(entry));
  } catch (...) {
    keys_.erase(entry.key);
    alignment_ = old_alignment;
    place_tensors();
    throw;
  }
}

void GgufWriter::place_tensors() {
  uint64_t offset = 0;
  for (TensorInfo& tensor : tensors_) {
    const uint64_t nbytes = tensor.nbytes();
    uint64_t end;
    if (__builtin_add_overflow(offset, nbytes, &end) || !padded(end, alignment_, &offset)) {
      fail(PEFT_ERR_VALIDATION_OVERFLOW, "tensor " + quoted(tensor.name) + ": the data offsets overflow 64 bits");
    }
    tensor.begin = end - nbytes;
    tensor.end = end;
  }
  data_size_ = offset;
}

void GgufWriter::add_tensor(std::string name, uint32_t type_id, std::vector<uint64_t> shape) {
  require_declaring("declare a tensor");
  const std::string where = "tensor " + quoted(name);
  if (!is_valid_utf8(name)) fail(PEFT_ERR_INVALID_ARGUMENT, where + ": the name is not valid UTF-8");
  if (name.size() > kGgufMaxTensorName) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + ": the name has " + std::to_string(name.size()) +
                                        " bytes; ggml reads at most " + std::to_string(kGgufMaxTensorName));
  }
  if (by_name_.count(name) != 0) fail(PEFT_ERR_INVALID_ARGUMENT, where + " is declared twice");
  const std::optional<GgmlType> type = ggml_type(type_id);
  if (!type) fail(PEFT_ERR_INVALID_ARGUMENT, where + ": unknown ggml type " + std::to_string(type_id));
  if (shape.size() > kGgufMaxDims) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + " has " + std::to_string(shape.size()) + " dimensions; GGUF allows " +
                                        std::to_string(kGgufMaxDims));
  }
  const uint64_t row = shape.empty() ? 1 : shape.back();
  if (row % type->block_size != 0) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + " of type " + std::string(type->name) + ": its innermost dimension " +
                                        std::to_string(row) + " is not a multiple of the block size " +
                                        std::to_string(type->block_size));
  }
  uint64_t elements, nbytes;
  if (!element_count(shape, &elements)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, where + ": the element count of shape " + shape_text(shape) +
                                           " exceeds INT64_MAX");
  }
  if (__builtin_mul_overflow(elements / type->block_size, uint64_t{type->type_size}, &nbytes)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, where + ": its size in bytes overflows 64 bits");
  }
  uint64_t end, next;
  if (__builtin_add_overflow(data_size_, nbytes, &end) || !padded(end, alignment_, &next)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, where + ": the data offsets overflow 64 bits");
  }
  TensorInfo tensor;
  tensor.dtype = dtype_of_ggml(type_id).value_or(DType::U8);
  tensor.block_quantized = !dtype_of_ggml(type_id).has_value();
  tensor.ggml_type = static_cast<int32_t>(type_id);
  tensor.shape = std::move(shape);
  tensor.begin = data_size_;
  tensor.end = end;
  tensor.name = std::move(name);
  append_indexed(tensors_, by_name_, std::move(tensor));
  data_size_ = next;
}

void GgufWriter::declare(const GgufHeader& header) {
  require_declaring("declare a header");
  const size_t metadata_before = metadata_.size();
  const size_t tensors_before = tensors_.size();
  const uint64_t alignment_before = alignment_;
  try {
    for (const GgufKeyValue& entry : header.metadata) add_metadata(entry);
    for (const TensorInfo& tensor : header.tensors) {
      if (tensor.ggml_type < 0) {
        fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(tensor.name) + " has no ggml type");
      }
      add_tensor(tensor.name, static_cast<uint32_t>(tensor.ggml_type), tensor.shape);
    }
  } catch (...) {  // all or nothing
    while (tensors_.size() > tensors_before) {
      by_name_.erase(tensors_.back().name);
      tensors_.pop_back();
    }
    while (metadata_.size() > metadata_before) {
      keys_.erase(metadata_.back().key);
      metadata_.pop_back();
    }
    alignment_ = alignment_before;
    place_tensors();  // the offsets as they were: cannot overflow
    throw;
  }
}

// ---- layout ------------------------------------------------------------------------------------

void GgufWriter::write_header(Sink& sink) const {
  sink.put("GGUF", 4);
  sink.put_le<uint32_t>(kGgufVersion);
  sink.put_le<uint64_t>(tensors_.size());
  sink.put_le<uint64_t>(metadata_.size());
  for (const GgufKeyValue& entry : metadata_) {
    sink.put_string(entry.key);
    sink.put_le(static_cast<uint32_t>(entry.value.type));
    sink.put_value(entry.value);
  }
  for (const TensorInfo& tensor : tensors_) {
    sink.put_string(tensor.name);
    sink.put_le(static_cast<uint32_t>(tensor.shape.size()));
    for (auto it = tensor.shape.rbegin(); it != tensor.shape.rend(); ++it) sink.put_le<uint64_t>(*it);
    sink.put_le(static_cast<uint32_t>(tensor.ggml_type));
    sink.put_le<uint64_t>(tensor.begin);
  }
  sink.put_padding(alignment_);
}

uint64_t GgufWriter::data_start() const {
  Sink counter(nullptr);
  write_header(counter);
  return counter.count();
}

uint64_t GgufWriter::file_size() const {
  uint64_t size;
  if (__builtin_add_overflow(data_start(), data_size_, &size)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, "the size of " + quoted(path_) + " overflows 64 bits");
  }
  return size;
}

GgufHeader GgufWriter::layout() const {
  GgufHeader header;
  header.version = kGgufVersion;
  header.metadata = metadata_;
  header.tensors = tensors_;
  header.alignment = alignment_;
  header.data_start = data_start();
  header.data_size = data_size_;
  return header;
}

// ---- streaming ---------------------------------------------------------------------------------

StreamingWriter::StreamPlan GgufWriter::plan_stream() {
  StreamPlan plan;
  StreamFile file;
  file.path = path_;
  file.size = file_size();
  Sink sink(&file.header);
  write_header(sink);
  file.open_at_start = true;
  plan.files.push_back(std::move(file));
  for (const TensorInfo& tensor : tensors_)
    plan.tensors.push_back({tensor.name, 0, tensor.dtype, (alignment_ - tensor.end % alignment_) % alignment_});
  return plan;
}

uint64_t GgufWriter::source_bytes(size_t position, std::optional<DType> src) const {
  const TensorInfo& tensor = tensors_[position];
  if (!src) return tensor.nbytes();
  const DType src_dtype = *src;
  const std::string where = "tensor " + quoted(tensor.name);
  const std::string type_name(ggml_type(static_cast<uint32_t>(tensor.ggml_type))->name);
  if (!is_valid_dtype(static_cast<int32_t>(src_dtype))) {
    fail(PEFT_ERR_INVALID_ARGUMENT, where + ": unknown source dtype " + std::to_string(static_cast<int32_t>(src_dtype)));
  }
  if (tensor.block_quantized) {
    fail(PEFT_ERR_UNSUPPORTED, where + " is " + type_name + ", a block-quantized type: it takes its raw bytes only, " +
                                   "not " + std::string(dtype_name(src_dtype)) + " elements");
  }
  if (src_dtype == tensor.dtype) return tensor.nbytes();
  if (dtype_bits(src_dtype) % 8 != 0 || !can_convert(src_dtype, tensor.dtype)) {
    fail(PEFT_ERR_UNSUPPORTED, where + ": cannot convert " + std::string(dtype_name(src_dtype)) + " to " + type_name);
  }
  uint64_t elements = 0, bytes;
  element_count(tensor.shape, &elements);  // checked by add_tensor
  if (__builtin_mul_overflow(elements, element_bytes(src_dtype), &bytes)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, where + ": its size in " + std::string(dtype_name(src_dtype)) +
                                           " overflows 64 bits");
  }
  return bytes;
}

void GgufWriter::write_tensor(std::string_view name, const void* data, uint64_t nbytes) {
  require_streaming("write a tensor");
  start();
  if (is_next(name) && nbytes != tensors_[next_position()].nbytes()) {
    const TensorInfo& tensor = tensors_[next_position()];
    fail(PEFT_ERR_TENSOR_INVALID_INFO, "tensor " + quoted(tensor.name) + ": " + std::to_string(nbytes) +
                                           " bytes given but its shape and type make " + std::to_string(tensor.nbytes()));
  }
  begin_tensor(name);  // reports the order errors
  if (in_tensor()) write(data, nbytes);
}

void GgufWriter::write_tensor(std::string_view name, DType src_dtype, const void* data, uint64_t nbytes) {
  require_streaming("write a tensor");
  start();
  if (is_next(name)) {
    const uint64_t expected = source_bytes(next_position(), src_dtype);
    if (nbytes != expected) {
      fail(PEFT_ERR_TENSOR_INVALID_INFO, "tensor " + quoted(tensors_[next_position()].name) + ": " +
                                             std::to_string(nbytes) + " bytes given but its shape makes " +
                                             std::to_string(expected) + " bytes of " +
                                             std::string(dtype_name(src_dtype)));
    }
  }
  begin_tensor(name, src_dtype);
  if (in_tensor()) write(data, nbytes);
}

void GgufWriter::finish_staged() {
  staged_ = true;
  finish();
}

void GgufWriter::commit_files() {
  if (!staged_) StreamingWriter::commit_files();  // staged: closed and flushed, renamed by commit_together
}

void GgufWriter::commit_together(const std::vector<std::unique_ptr<GgufWriter>>& writers) {
  for (const auto& writer : writers)
    if (!writer->staged_ || !writer->finished())
      fail(PEFT_ERR_INVALID_ARGUMENT, "GGUF file " + quoted(writer->path_) + " was not finished staged");
  size_t done = 0;
  try {
    for (; done < writers.size(); ++done) writers[done]->output_file(0).commit();
  } catch (...) {
    for (size_t k = 0; k < done; ++k) remove_file(writers[k]->path_);
    throw;
  }
}

}  // namespace peft
