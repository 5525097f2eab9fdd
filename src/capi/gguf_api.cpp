// The GGUF part of the reading API: file formats, ggml types and typed metadata of GGUF files.
#include <cstdint>
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

// The entry `kv` of file `file_index`; PEFT_ERR_INVALID_ARGUMENT when there is none.
const GgufKeyValue& entry_at(const peft_checkpoint* ckpt, size_t file_index, size_t kv) {
  peft::capi::require_arg(ckpt, "ckpt");
  const GgufKeyValue* entry = kv_or_null(ckpt, file_index, kv);
  if (entry == nullptr)
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, "file " + std::to_string(file_index) + " has no GGUF metadata entry " +
                                              std::to_string(kv));
  return *entry;
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
    *out = peft::gguf_metadata_int(entry_at(ckpt, file_index, kv), element);
  });
}

peft_error* peft_checkpoint_gguf_kv_uint(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element,
                                         uint64_t* out) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out, "out");
    *out = peft::gguf_metadata_uint(entry_at(ckpt, file_index, kv), element);
  });
}

peft_error* peft_checkpoint_gguf_kv_float(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                          uint64_t element, double* out) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out, "out");
    *out = peft::gguf_metadata_float(entry_at(ckpt, file_index, kv), element);
  });
}

peft_error* peft_checkpoint_gguf_kv_string(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                           uint64_t element, const char** out_data, size_t* out_length) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out_data, "out_data");
    const std::string_view text = peft::gguf_metadata_string(entry_at(ckpt, file_index, kv), element);
    *out_data = text.data();
    if (out_length != nullptr) *out_length = text.size();
  });
}

}  // extern "C"
