// The GGUF part of the reading API: file formats, ggml types and typed metadata of GGUF files.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <variant>

#include "capi/capi_common.hpp"
#include "capi/checkpoint_handle.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_header.hpp"

namespace {

using peft::GgufKeyValue;
using peft::GgufValue;
using peft::GgufValueType;

const peft::GgufHeader* gguf_or_null(const peft_checkpoint* ckpt, size_t file_index) {
  if (ckpt == nullptr || file_index >= ckpt->impl->file_count()) return nullptr;
  return ckpt->impl->gguf_header(file_index);
}

const GgufKeyValue* kv_or_null(const peft_checkpoint* ckpt, size_t file_index, size_t kv) {
  const peft::GgufHeader* header = gguf_or_null(ckpt, file_index);
  return header != nullptr && kv < header->metadata.size() ? &header->metadata[kv] : nullptr;
}

std::optional<peft::GgmlType> ggml_or_null(int32_t ggml_type) {
  if (ggml_type < 0) return std::nullopt;
  return peft::ggml_type(static_cast<uint32_t>(ggml_type));
}

// What a getter reads: the entry itself (element 0 of a scalar) or element `index` of an array entry.
struct Element {
  const GgufKeyValue* entry;
  const peft::GgufArray* array;  // null for a scalar
  size_t index;
};

Element element_at(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element) {
  peft::capi::require_arg(ckpt, "ckpt");
  const GgufKeyValue* entry = kv_or_null(ckpt, file_index, kv);
  if (entry == nullptr)
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, "file " + std::to_string(file_index) + " has no GGUF metadata entry " +
                                              std::to_string(kv));
  const std::string what = "GGUF metadata " + peft::quoted(entry->key);
  if (const auto* array = std::get_if<peft::GgufArray>(&entry->value.data)) {
    if (element >= array->size())
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, what + ": element " + std::to_string(element) +
                                                " is out of range (the array has " +
                                                std::to_string(array->size()) + ")");
    return {entry, array, static_cast<size_t>(element)};
  }
  if (element != 0)
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, what + " is a scalar: element " + std::to_string(element) +
                                              " does not exist");
  return {entry, nullptr, 0};
}

// The scalar a numeric getter reads (an array element decoded from the array's bytes).
GgufValue value_at(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element) {
  const Element e = element_at(ckpt, file_index, kv, element);
  return e.array != nullptr ? e.array->at(e.index) : e.entry->value;
}

[[noreturn]] void wrong_type(const peft_checkpoint* ckpt, size_t file_index, size_t kv, const char* wanted) {
  peft::fail(PEFT_ERR_INVALID_ARGUMENT, "GGUF metadata " + peft::quoted(kv_or_null(ckpt, file_index, kv)->key) +
                                            " does not hold " + wanted);
}

// Integers and booleans as a signed 128-bit-free pair: magnitude and sign.
struct IntegerValue {
  bool negative;
  uint64_t magnitude;
};

IntegerValue integer_of(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element) {
  const GgufValue value = value_at(ckpt, file_index, kv, element);
  if (const auto* u = std::get_if<uint64_t>(&value.data)) return {false, *u};
  if (const auto* i = std::get_if<int64_t>(&value.data))
    return *i < 0 ? IntegerValue{true, 0 - static_cast<uint64_t>(*i)} : IntegerValue{false, static_cast<uint64_t>(*i)};
  if (const auto* b = std::get_if<bool>(&value.data)) return {false, *b ? 1u : 0u};
  wrong_type(ckpt, file_index, kv, "an integer or boolean");
}

}  // namespace

extern "C" {

int32_t peft_checkpoint_file_format(const peft_checkpoint* ckpt, size_t file_index) {
  if (ckpt == nullptr || file_index >= ckpt->impl->file_count()) return -1;
  return ckpt->impl->gguf_header(file_index) != nullptr ? PEFT_FORMAT_GGUF : PEFT_FORMAT_SAFETENSORS;
}

uint32_t peft_checkpoint_gguf_version(const peft_checkpoint* ckpt, size_t file_index) {
  const peft::GgufHeader* header = gguf_or_null(ckpt, file_index);
  return header != nullptr ? header->version : 0;
}

int32_t peft_checkpoint_tensor_ggml_type(const peft_checkpoint* ckpt, size_t index) {
  if (ckpt == nullptr || index >= ckpt->impl->tensor_count()) return -1;
  return ckpt->impl->tensor(index).ggml_type;
}

const char* peft_ggml_type_name(int32_t ggml_type) {
  const auto type = ggml_or_null(ggml_type);
  return type ? type->name.data() : nullptr;  // the table's names are string literals
}

int32_t peft_ggml_type_from_name(const char* name) {
  if (name == nullptr) return -1;
  const auto type = peft::ggml_type_by_name(name);
  return type ? static_cast<int32_t>(type->id) : -1;
}

peft_error* peft_ggml_type_geometry(int32_t ggml_type, uint32_t* out_block_size, uint32_t* out_type_size) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out_block_size, "out_block_size");
    peft::capi::require_arg(out_type_size, "out_type_size");
    const auto type = ggml_or_null(ggml_type);
    if (!type) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "ggml type " + std::to_string(ggml_type) + " does not exist");
    *out_block_size = type->block_size;
    *out_type_size = type->type_size;
  });
}

size_t peft_checkpoint_gguf_kv_count(const peft_checkpoint* ckpt, size_t file_index) {
  const peft::GgufHeader* header = gguf_or_null(ckpt, file_index);
  return header != nullptr ? header->metadata.size() : 0;
}

const char* peft_checkpoint_gguf_kv_key(const peft_checkpoint* ckpt, size_t file_index, size_t kv) {
  const GgufKeyValue* entry = kv_or_null(ckpt, file_index, kv);
  return entry != nullptr ? entry->key.c_str() : nullptr;
}

peft_error* peft_checkpoint_gguf_kv_find(const peft_checkpoint* ckpt, size_t file_index, const char* key,
                                         size_t* out_kv) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(ckpt, "ckpt");
    peft::capi::require_arg(key, "key");
    peft::capi::require_arg(out_kv, "out_kv");
    if (file_index >= ckpt->impl->file_count())
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "file index " + std::to_string(file_index) +
                                                " is out of range (the checkpoint has " +
                                                std::to_string(ckpt->impl->file_count()) + " files)");
    const peft::GgufHeader* header = ckpt->impl->gguf_header(file_index);
    if (header != nullptr)
      for (size_t k = 0; k < header->metadata.size(); ++k)
        if (header->metadata[k].key == key) {
          *out_kv = k;
          return;
        }
    peft::fail(PEFT_ERR_NOT_FOUND, ckpt->impl->file_path(file_index) + ": no GGUF metadata key " + peft::quoted(key));
  });
}

int32_t peft_checkpoint_gguf_kv_type(const peft_checkpoint* ckpt, size_t file_index, size_t kv) {
  const GgufKeyValue* entry = kv_or_null(ckpt, file_index, kv);
  return entry != nullptr ? static_cast<int32_t>(entry->value.type) : -1;
}

int32_t peft_checkpoint_gguf_kv_array_type(const peft_checkpoint* ckpt, size_t file_index, size_t kv) {
  const GgufKeyValue* entry = kv_or_null(ckpt, file_index, kv);
  const auto* array = entry != nullptr ? std::get_if<peft::GgufArray>(&entry->value.data) : nullptr;
  return array != nullptr ? static_cast<int32_t>(array->element_type) : -1;
}

uint64_t peft_checkpoint_gguf_kv_array_length(const peft_checkpoint* ckpt, size_t file_index, size_t kv) {
  const GgufKeyValue* entry = kv_or_null(ckpt, file_index, kv);
  const auto* array = entry != nullptr ? std::get_if<peft::GgufArray>(&entry->value.data) : nullptr;
  return array != nullptr ? array->size() : 0;
}

peft_error* peft_checkpoint_gguf_kv_int(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element,
                                        int64_t* out) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out, "out");
    const IntegerValue value = integer_of(ckpt, file_index, kv, element);
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (!value.negative && value.magnitude > kMax)
      wrong_type(ckpt, file_index, kv, "a value that fits int64_t (read it as unsigned)");
    *out = value.negative ? static_cast<int64_t>(0 - value.magnitude) : static_cast<int64_t>(value.magnitude);
  });
}

peft_error* peft_checkpoint_gguf_kv_uint(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element,
                                         uint64_t* out) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out, "out");
    const IntegerValue value = integer_of(ckpt, file_index, kv, element);
    if (value.negative && value.magnitude != 0) wrong_type(ckpt, file_index, kv, "a value that is not negative");
    *out = value.magnitude;
  });
}

peft_error* peft_checkpoint_gguf_kv_float(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                          uint64_t element, double* out) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out, "out");
    const GgufValue value = value_at(ckpt, file_index, kv, element);
    const auto* f = std::get_if<double>(&value.data);
    if (f == nullptr) wrong_type(ckpt, file_index, kv, "a floating-point value");
    *out = *f;
  });
}

peft_error* peft_checkpoint_gguf_kv_string(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                           uint64_t element, const char** out_data, size_t* out_length) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out_data, "out_data");
    const Element e = element_at(ckpt, file_index, kv, element);
    if (e.array != nullptr) {
      if (e.array->element_type != peft::GgufValueType::STRING) wrong_type(ckpt, file_index, kv, "a string");
      const std::string_view text = e.array->string_at(e.index);  // a NUL follows it in the array
      *out_data = text.data();
      if (out_length != nullptr) *out_length = text.size();
      return;
    }
    const auto* text = std::get_if<std::string>(&e.entry->value.data);
    if (text == nullptr) wrong_type(ckpt, file_index, kv, "a string");
    *out_data = text->c_str();
    if (out_length != nullptr) *out_length = text->size();
  });
}

}  // extern "C"
