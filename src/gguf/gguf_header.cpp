#include "gguf/gguf_header.hpp"

#include <cstring>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {

uint64_t gguf_value_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::BOOL: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    case GgufValueType::STRING: case GgufValueType::ARRAY: return 0;
  }
  return 0;
}

GgufValue gguf_scalar_from_bits(GgufValueType type, uint64_t bits) {
  GgufValue value;
  value.type = type;
  switch (type) {
    case GgufValueType::U8: case GgufValueType::U16: case GgufValueType::U32: case GgufValueType::U64:
      value.data = bits;
      break;
    case GgufValueType::I8: value.data = int64_t{static_cast<int8_t>(bits)}; break;
    case GgufValueType::I16: value.data = int64_t{static_cast<int16_t>(bits)}; break;
    case GgufValueType::I32: value.data = int64_t{static_cast<int32_t>(bits)}; break;
    case GgufValueType::I64: value.data = static_cast<int64_t>(bits); break;
    case GgufValueType::F32: {
      float f;
      const auto low = static_cast<uint32_t>(bits);
      std::memcpy(&f, &low, 4);
      value.data = static_cast<double>(f);
      break;
    }
    case GgufValueType::F64: {
      double d;
      std::memcpy(&d, &bits, 8);
      value.data = d;
      break;
    }
    case GgufValueType::BOOL: value.data = bits != 0; break;
    case GgufValueType::STRING: case GgufValueType::ARRAY: break;
  }
  return value;
}

GgufArray::GgufArray(const GgufArray& other)
    : element_type(other.element_type), raw(other.raw),
      parts_(other.parts_ ? std::make_unique<Parts>(*other.parts_) : nullptr) {}

GgufArray& GgufArray::operator=(const GgufArray& other) {
  if (this != &other) *this = GgufArray(other);
  return *this;
}

GgufArray::~GgufArray() = default;

const GgufArray::Parts& GgufArray::parts() const {
  static const Parts kNone;
  return parts_ ? *parts_ : kNone;
}

GgufArray::Parts& GgufArray::parts() {
  if (!parts_) parts_ = std::make_unique<Parts>();
  return *parts_;
}

const std::vector<uint64_t>& GgufArray::string_starts() const { return parts().string_starts; }
std::vector<uint64_t>& GgufArray::string_starts() { return parts().string_starts; }
const std::vector<GgufArray>& GgufArray::arrays() const { return parts().arrays; }
std::vector<GgufArray>& GgufArray::arrays() { return parts().arrays; }

size_t GgufArray::size() const {
  if (element_type == GgufValueType::STRING) return string_starts().size();
  if (element_type == GgufValueType::ARRAY) return arrays().size();
  const uint64_t width = gguf_value_size(element_type);
  return width == 0 ? 0 : raw.size() / width;
}

std::string_view GgufArray::string_at(size_t index) const {
  const std::vector<uint64_t>& string_starts = this->string_starts();
  const uint64_t start = string_starts[index];
  const uint64_t end = index + 1 < string_starts.size() ? string_starts[index + 1] : raw.size();
  return {reinterpret_cast<const char*>(raw.data()) + start, static_cast<size_t>(end - 1 - start)};
}

GgufValue GgufArray::at(size_t index) const {
  if (element_type == GgufValueType::STRING) {
    GgufValue value;
    value.type = GgufValueType::STRING;
    value.data = std::string(string_at(index));
    return value;
  }
  if (element_type == GgufValueType::ARRAY) {
    GgufValue value;
    value.type = GgufValueType::ARRAY;
    value.data = arrays()[index];
    return value;
  }
  const uint64_t width = gguf_value_size(element_type);
  const uint8_t* bytes = raw.data() + index * width;
  uint64_t bits = 0;
  for (uint64_t i = width; i-- > 0;) bits = (bits << 8) | bytes[i];
  return gguf_scalar_from_bits(element_type, bits);
}

bool GgufArray::well_formed() const {
  const std::vector<uint64_t>& string_starts = this->string_starts();
  const std::vector<GgufArray>& arrays = this->arrays();
  if (element_type == GgufValueType::ARRAY) {
    if (!raw.empty() || !string_starts.empty()) return false;
    for (const GgufArray& array : arrays) {
      if (!array.well_formed()) return false;
    }
    return true;
  }
  if (!arrays.empty()) return false;
  if (element_type != GgufValueType::STRING) {
    const uint64_t width = gguf_value_size(element_type);
    if (width == 0 || raw.size() % width != 0 || !string_starts.empty()) return false;
    if (element_type != GgufValueType::BOOL) return true;
    for (uint8_t b : raw) {
      if (b > 1) return false;
    }
    return true;
  }
  if (string_starts.empty()) return raw.empty();
  if (string_starts[0] != 0 || string_starts.back() >= raw.size() || raw.back() != 0) return false;
  for (size_t k = 1; k < string_starts.size(); ++k) {  // each element ends with its NUL before the next
    if (string_starts[k] <= string_starts[k - 1] || string_starts[k] > raw.size()) return false;
    if (raw[string_starts[k] - 1] != 0) return false;
  }
  return true;
}

const GgufValue* find_metadata(const GgufHeader& header, std::string_view key) {
  for (const GgufKeyValue& kv : header.metadata)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

std::optional<std::string> metadata_string(const GgufHeader& header, std::string_view key) {
  const GgufValue* value = find_metadata(header, key);
  const auto* text = value != nullptr ? std::get_if<std::string>(&value->data) : nullptr;
  if (text == nullptr) return std::nullopt;
  return *text;
}

std::optional<uint64_t> metadata_count(const GgufHeader& header, std::string_view key) {
  const GgufValue* value = find_metadata(header, key);
  if (value == nullptr) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&value->data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&value->data); i && *i >= 0) return static_cast<uint64_t>(*i);
  return std::nullopt;
}

namespace {

// What a reading reads: the entry itself (element 0 of a scalar) or element `index` of an array entry.
struct Element {
  const GgufKeyValue* entry;
  const GgufArray* array;  // null for a scalar
  size_t index;
};

Element element_at(const GgufKeyValue& entry, uint64_t element) {
  const std::string what = "GGUF metadata " + quoted(entry.key);
  if (const auto* array = std::get_if<GgufArray>(&entry.value.data)) {
    if (element >= array->size())
      fail(PEFT_ERR_INVALID_ARGUMENT, what + ": element " + std::to_string(element) + " is out of range (the array has " +
                                          std::to_string(array->size()) + ")");
    return {&entry, array, static_cast<size_t>(element)};
  }
  if (element != 0)
    fail(PEFT_ERR_INVALID_ARGUMENT, what + " is a scalar: element " + std::to_string(element) + " does not exist");
  return {&entry, nullptr, 0};
}

// The scalar a numeric reading reads (an array element decoded from the array's bytes).
GgufValue value_at(const GgufKeyValue& entry, uint64_t element) {
  const Element e = element_at(entry, element);
  return e.array != nullptr ? e.array->at(e.index) : entry.value;
}

[[noreturn]] void wrong_type(const GgufKeyValue& entry, const char* wanted) {
  fail(PEFT_ERR_INVALID_ARGUMENT, "GGUF metadata " + quoted(entry.key) + " does not hold " + wanted);
}

// Integers and booleans as a magnitude and a sign.
struct IntegerValue {
  bool negative;
  uint64_t magnitude;
};

IntegerValue integer_at(const GgufKeyValue& entry, uint64_t element) {
  const GgufValue value = value_at(entry, element);
  if (const auto* u = std::get_if<uint64_t>(&value.data)) return {false, *u};
  if (const auto* i = std::get_if<int64_t>(&value.data))
    return *i < 0 ? IntegerValue{true, 0 - static_cast<uint64_t>(*i)} : IntegerValue{false, static_cast<uint64_t>(*i)};
  if (const auto* b = std::get_if<bool>(&value.data)) return {false, *b ? 1u : 0u};
  wrong_type(entry, "an integer or boolean");
}

}  // namespace

int64_t gguf_metadata_int(const GgufKeyValue& entry, uint64_t element) {
  const IntegerValue value = integer_at(entry, element);
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!value.negative && value.magnitude > kMax) wrong_type(entry, "a value that fits int64_t (read it as unsigned)");
  return value.negative ? static_cast<int64_t>(0 - value.magnitude) : static_cast<int64_t>(value.magnitude);
}

uint64_t gguf_metadata_uint(const GgufKeyValue& entry, uint64_t element) {
  const IntegerValue value = integer_at(entry, element);
  if (value.negative && value.magnitude != 0) wrong_type(entry, "a value that is not negative");
  return value.magnitude;
}

double gguf_metadata_float(const GgufKeyValue& entry, uint64_t element) {
  const GgufValue value = value_at(entry, element);
  const auto* f = std::get_if<double>(&value.data);
  if (f == nullptr) wrong_type(entry, "a floating-point value");
  return *f;
}

std::string_view gguf_metadata_string(const GgufKeyValue& entry, uint64_t element) {
  const Element e = element_at(entry, element);
  if (e.array != nullptr) {
    if (e.array->element_type != GgufValueType::STRING) wrong_type(entry, "a string");
    return e.array->string_at(e.index);  // a NUL follows it in the array
  }
  const auto* text = std::get_if<std::string>(&entry.value.data);
  if (text == nullptr) wrong_type(entry, "a string");
  return *text;
}

}  // namespace peft
