// The reading section of the C API: open options and checkpoints. Each handle wraps the C++
// object; a checkpoint handle shares ownership so children (adapters, merge jobs) can keep it alive.
#include <cstring>
#include <cstdint>
#include <memory>

#include "capi/capi_common.hpp"
#include "capi/checkpoint_handle.hpp"
#include "core/dtype.hpp"
#include "core/text.hpp"
#include "checkpoint/checkpoint.hpp"

struct peft_open_options {
  peft::OpenOptions impl;
};

namespace {

using peft::Checkpoint;

// Getters that report "out of range" as a sentinel rather than an error.
const peft::TensorInfo* tensor_or_null(const peft_checkpoint* ckpt, size_t index) {
  if (ckpt == nullptr || index >= ckpt->impl->tensor_count()) return nullptr;
  return &ckpt->impl->tensor(index);
}

const peft::Metadata* metadata_or_null(const peft_checkpoint* ckpt, size_t file_index) {
  if (ckpt == nullptr || file_index >= ckpt->impl->file_count()) return nullptr;
  const std::optional<peft::Metadata>& metadata = ckpt->impl->file_metadata(file_index);
  return metadata ? &*metadata : nullptr;
}

// The checkpoint behind `ckpt` (not NULL) once `index` is one of its tensors.
const peft::Checkpoint& require_tensor(const peft_checkpoint* ckpt, size_t index) {
  peft::capi::require_arg(ckpt, "ckpt");
  if (index >= ckpt->impl->tensor_count())
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, "tensor index " + std::to_string(index) +
                                              " is out of range (the checkpoint has " +
                                              std::to_string(ckpt->impl->tensor_count()) + " tensors)");
  return *ckpt->impl;
}

}  // namespace

extern "C" {

peft_error* peft_open_options_new(peft_open_options** out) { return peft::capi::new_handle(out); }

void peft_open_options_free(peft_open_options* opts) { delete opts; }

peft_error* peft_open_options_set_max_header_size(peft_open_options* opts, uint64_t max_bytes) {
  return peft::capi::set_option(opts, [&](auto& o) { o.max_header_size = max_bytes; });
}

peft_error* peft_open_options_set_use_pread(peft_open_options* opts, int32_t use_pread) {
  return peft::capi::set_option(opts, [&](auto& o) { o.use_pread = use_pread != 0; });
}

peft_error* peft_checkpoint_open(const char* path, const peft_open_options* opts, peft_checkpoint** out) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(path, "path");
    peft::capi::require_arg(out, "out");
    auto handle = std::make_unique<peft_checkpoint>();
    handle->impl = Checkpoint::open(path, peft::capi::options_of(opts));
    *out = handle.release();
  });
}

peft_error* peft_checkpoint_open_memory(const void* data, size_t size, const peft_open_options* opts,
                                        peft_checkpoint** out) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(out, "out");
    if (size != 0) peft::capi::require_arg(data, "data");
    auto handle = std::make_unique<peft_checkpoint>();
    handle->impl = Checkpoint::open_memory(data, size, peft::capi::options_of(opts));
    *out = handle.release();
  });
}

void peft_checkpoint_free(peft_checkpoint* ckpt) { delete ckpt; }

size_t peft_checkpoint_file_count(const peft_checkpoint* ckpt) {
  return ckpt != nullptr ? ckpt->impl->file_count() : 0;
}

const char* peft_checkpoint_file_path(const peft_checkpoint* ckpt, size_t file_index) {
  if (ckpt == nullptr || file_index >= ckpt->impl->file_count()) return nullptr;
  return ckpt->impl->file_path(file_index).c_str();
}

int32_t peft_checkpoint_has_metadata(const peft_checkpoint* ckpt, size_t file_index) {
  return metadata_or_null(ckpt, file_index) != nullptr ? 1 : 0;
}

size_t peft_checkpoint_metadata_count(const peft_checkpoint* ckpt, size_t file_index) {
  const peft::Metadata* metadata = metadata_or_null(ckpt, file_index);
  return metadata != nullptr ? metadata->size() : 0;
}

const char* peft_checkpoint_metadata_key(const peft_checkpoint* ckpt, size_t file_index, size_t entry) {
  const peft::Metadata* metadata = metadata_or_null(ckpt, file_index);
  if (metadata == nullptr || entry >= metadata->size()) return nullptr;
  return (*metadata)[entry].first.c_str();
}

const char* peft_checkpoint_metadata_value(const peft_checkpoint* ckpt, size_t file_index, size_t entry) {
  const peft::Metadata* metadata = metadata_or_null(ckpt, file_index);
  if (metadata == nullptr || entry >= metadata->size()) return nullptr;
  return (*metadata)[entry].second.c_str();
}

const char* peft_checkpoint_index_metadata_json(const peft_checkpoint* ckpt) {
  if (ckpt == nullptr) return nullptr;
  const auto& json = ckpt->impl->index_metadata_json();
  return json ? json->c_str() : nullptr;
}

size_t peft_checkpoint_tensor_count(const peft_checkpoint* ckpt) {
  return ckpt != nullptr ? ckpt->impl->tensor_count() : 0;
}

peft_error* peft_checkpoint_find(const peft_checkpoint* ckpt, const char* name, size_t* out_index) {
  return peft_checkpoint_find_n(ckpt, name, name ? std::strlen(name) : 0, out_index);
}

peft_error* peft_checkpoint_find_n(const peft_checkpoint* ckpt, const char* name, size_t name_length,
                                   size_t* out_index) {
  return peft::capi::guarded([&] {
    peft::capi::require_arg(ckpt, "ckpt");
    peft::capi::require_arg(name, "name");
    peft::capi::require_arg(out_index, "out_index");
    const std::string_view wanted(name, name_length);
    const auto found = ckpt->impl->find(wanted);
    if (!found) {
      peft::fail(PEFT_ERR_NOT_FOUND, "tensor " + peft::quoted(std::string(wanted)) + " is not in the checkpoint");
    }
    *out_index = *found;
  });
}

const char* peft_checkpoint_tensor_name(const peft_checkpoint* ckpt, size_t index) {
  const peft::TensorInfo* info = tensor_or_null(ckpt, index);
  return info != nullptr ? info->name.c_str() : nullptr;
}

size_t peft_checkpoint_tensor_name_length(const peft_checkpoint* ckpt, size_t index) {
  const peft::TensorInfo* info = tensor_or_null(ckpt, index);
  return info != nullptr ? info->name.size() : 0;
}

int32_t peft_checkpoint_tensor_dtype(const peft_checkpoint* ckpt, size_t index) {
  const peft::TensorInfo* info = tensor_or_null(ckpt, index);
  return info != nullptr && !info->block_quantized ? static_cast<int32_t>(info->dtype) : -1;
}

size_t peft_checkpoint_tensor_ndim(const peft_checkpoint* ckpt, size_t index) {
  const peft::TensorInfo* info = tensor_or_null(ckpt, index);
  return info != nullptr ? info->shape.size() : 0;
}

const uint64_t* peft_checkpoint_tensor_shape(const peft_checkpoint* ckpt, size_t index) {
  const peft::TensorInfo* info = tensor_or_null(ckpt, index);
  return info != nullptr && !info->shape.empty() ? info->shape.data() : nullptr;
}

peft_error* peft_checkpoint_tensor_offsets(const peft_checkpoint* ckpt, size_t index, uint64_t* out_begin,
                                           uint64_t* out_end) {
  return peft::capi::guarded([&] {
    const peft::TensorInfo& info = require_tensor(ckpt, index).tensor(index);
    peft::capi::require_arg(out_begin, "out_begin");
    peft::capi::require_arg(out_end, "out_end");
    *out_begin = info.begin;
    *out_end = info.end;
  });
}

size_t peft_checkpoint_tensor_file(const peft_checkpoint* ckpt, size_t index) {
  if (ckpt == nullptr || index >= ckpt->impl->tensor_count()) return SIZE_MAX;
  return ckpt->impl->tensor_file(index);
}

peft_error* peft_checkpoint_tensor_view(const peft_checkpoint* ckpt, size_t index, const void** out_data,
                                        uint64_t* out_nbytes) {
  return peft::capi::guarded([&] {
    const peft::Checkpoint& file = require_tensor(ckpt, index);
    peft::capi::require_arg(out_data, "out_data");
    peft::capi::require_arg(out_nbytes, "out_nbytes");
    const auto bytes = file.view(index);
    *out_data = bytes.data();
    *out_nbytes = bytes.size();
  });
}

peft_error* peft_checkpoint_tensor_read(const peft_checkpoint* ckpt, size_t index, int32_t dtype, void* dst,
                                        uint64_t dst_nbytes) {
  return peft::capi::guarded([&] {
    const peft::Checkpoint& file = require_tensor(ckpt, index);
    const peft::DType as = peft::capi::dtype_arg(dtype, "dtype");
    // A zero-size tensor needs no buffer; the size check below still runs.
    if (dst_nbytes != 0) peft::capi::require_arg(dst, "dst");
    file.read(index, as, dst, dst_nbytes);
  });
}

}  // extern "C"
