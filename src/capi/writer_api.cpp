// The writing section of the C API: one handle type for both a one-file writer and a checkpoint
// writer; the few checkpoint-only calls check which one they got.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capi/capi_common.hpp"
#include "capi/checkpoint_handle.hpp"
#include "core/dtype.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/sharded_writer.hpp"
#include "safetensors/writer.hpp"


struct peft_writer {
  std::unique_ptr<peft::TensorWriter> impl;
  peft::ShardedWriter* sharded = nullptr;  // set for a checkpoint writer
};

namespace {

using peft::capi::guarded;
using peft::capi::require_arg;

peft::DType checked_dtype(int32_t dtype, const char* what) {
  if (!peft::is_valid_dtype(dtype)) {
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, std::string(what) + " " + std::to_string(dtype) + " is not a dtype");
  }
  return static_cast<peft::DType>(dtype);
}

peft::ShardedWriter& require_sharded(peft_writer* writer, const char* what) {
  require_arg(writer, "writer");
  if (writer->sharded == nullptr) {
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, std::string(what) + " applies to checkpoint writers only");
  }
  return *writer->sharded;
}

// The tensor a write call names: `name`, or the next one in the writer's order when it is NULL (the
// only way to write a name that holds NUL bytes).
std::string_view target_name(peft_writer* writer, const char* name) {
  if (name != nullptr) return name;
  writer->impl->start();
  const size_t next = writer->impl->next_position();
  if (next >= writer->impl->tensor_count()) {
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, "every declared tensor is already written");
  }
  return writer->impl->tensor_at(next).name;
}

void add_tensor(peft_writer* writer, std::string name, int32_t dtype, const uint64_t* shape, size_t ndim) {
  require_arg(writer, "writer");
  if (ndim > 0) require_arg(shape, "shape");
  std::vector<uint64_t> dims(shape, shape + ndim);
  writer->impl->add_tensor(std::move(name), checked_dtype(dtype, "dtype"), std::move(dims));
}

}  // namespace

extern "C" {

peft_error* peft_writer_new(const char* path, peft_writer** out) {
  return guarded([&] {
    require_arg(path, "path");
    require_arg(out, "out");
    auto writer = std::make_unique<peft_writer>();
    writer->impl = std::make_unique<peft::FileWriter>(path);
    *out = writer.release();
  });
}

peft_error* peft_writer_new_checkpoint(const char* folder, uint64_t max_shard_size, peft_writer** out) {
  return guarded([&] {
    require_arg(folder, "folder");
    require_arg(out, "out");
    auto writer = std::make_unique<peft_writer>();
    auto sharded = std::make_unique<peft::ShardedWriter>(folder, max_shard_size);
    writer->sharded = sharded.get();
    writer->impl = std::move(sharded);
    *out = writer.release();
  });
}

void peft_writer_free(peft_writer* writer) { delete writer; }

peft_error* peft_writer_add_tensor(peft_writer* writer, const char* name, int32_t dtype, const uint64_t* shape,
                                   size_t ndim) {
  return guarded([&] {
    require_arg(name, "name");
    add_tensor(writer, name, dtype, shape, ndim);
  });
}

peft_error* peft_writer_add_tensor_n(peft_writer* writer, const char* name, size_t name_length, int32_t dtype,
                                     const uint64_t* shape, size_t ndim) {
  return guarded([&] {
    if (name_length > 0) require_arg(name, "name");
    add_tensor(writer, std::string(name == nullptr ? "" : name, name_length), dtype, shape, ndim);
  });
}

peft_error* peft_writer_set_metadata_present(peft_writer* writer, int32_t present) {
  return guarded([&] {
    require_arg(writer, "writer");
    writer->impl->set_metadata_present(present != 0);
  });
}

peft_error* peft_writer_set_metadata(peft_writer* writer, const char* key, const char* value) {
  return guarded([&] {
    require_arg(writer, "writer");
    require_arg(key, "key");
    require_arg(value, "value");
    writer->impl->set_metadata(key, value);
  });
}

peft_error* peft_writer_break_shard(peft_writer* writer) {
  return guarded([&] { require_sharded(writer, "peft_writer_break_shard").break_shard(); });
}

peft_error* peft_writer_set_index_metadata_json(peft_writer* writer, const char* json_object) {
  return guarded([&] {
    peft::ShardedWriter& sharded = require_sharded(writer, "peft_writer_set_index_metadata_json");
    require_arg(json_object, "json_object");
    sharded.set_index_metadata_json(json_object);
  });
}

peft_error* peft_writer_start(peft_writer* writer) {
  return guarded([&] {
    require_arg(writer, "writer");
    if (writer->impl->failed()) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "cannot start: the writer failed earlier");
    if (writer->impl->finished()) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "cannot start: the writer has finished");
    writer->impl->start();
  });
}

size_t peft_writer_tensor_count(const peft_writer* writer) {
  return writer == nullptr ? 0 : writer->impl->tensor_count();
}

const char* peft_writer_tensor_name(const peft_writer* writer, size_t position) {
  if (writer == nullptr || !writer->impl->started() || position >= writer->impl->tensor_count()) return nullptr;
  return writer->impl->tensor_at(position).name.c_str();
}

size_t peft_writer_tensor_name_length(const peft_writer* writer, size_t position) {
  if (writer == nullptr || !writer->impl->started() || position >= writer->impl->tensor_count()) return 0;
  return writer->impl->tensor_at(position).name.size();
}

size_t peft_writer_tensor_declaration(const peft_writer* writer, size_t position) {
  if (writer == nullptr || !writer->impl->started() || position >= writer->impl->tensor_count()) {
    return std::numeric_limits<size_t>::max();
  }
  return writer->impl->declaration_at(position);
}

size_t peft_writer_file_count(const peft_writer* writer) {
  if (writer == nullptr || !writer->impl->started()) return 0;
  return writer->impl->output_count();
}

const char* peft_writer_file_path(const peft_writer* writer, size_t file_index) {
  if (writer == nullptr || !writer->impl->started() || file_index >= writer->impl->output_count()) return nullptr;
  return writer->impl->output_path(file_index).c_str();
}

peft_error* peft_writer_begin_tensor(peft_writer* writer, const char* name, int32_t src_dtype) {
  return guarded([&] {
    require_arg(writer, "writer");
    const peft::DType dtype = checked_dtype(src_dtype, "src_dtype");
    writer->impl->begin_tensor(target_name(writer, name), dtype);
  });
}

peft_error* peft_writer_write(peft_writer* writer, const void* data, uint64_t nbytes) {
  return guarded([&] {
    require_arg(writer, "writer");
    writer->impl->write(data, nbytes);
  });
}

peft_error* peft_writer_write_tensor(peft_writer* writer, const char* name, int32_t src_dtype, const void* data,
                                     uint64_t nbytes) {
  return guarded([&] {
    require_arg(writer, "writer");
    if (nbytes > 0) require_arg(data, "data");
    const peft::DType dtype = checked_dtype(src_dtype, "src_dtype");
    writer->impl->write_tensor(target_name(writer, name), dtype, data, nbytes);
  });
}

peft_error* peft_writer_write_from_callback(peft_writer* writer, const char* name, int32_t src_dtype,
                                            peft_tensor_source_fn source, void* user_data) {
  return guarded([&] {
    require_arg(writer, "writer");
    require_arg(reinterpret_cast<const void*>(source), "source");
    const peft::DType dtype = checked_dtype(src_dtype, "src_dtype");
    writer->impl->write_from(target_name(writer, name), dtype, [&](uint64_t offset, void* dst, uint64_t nbytes) {
      return source(user_data, offset, dst, nbytes) == 0;
    });
  });
}

peft_error* peft_writer_write_from_checkpoint(peft_writer* writer, const char* name, const peft_checkpoint* ckpt,
                                              size_t index) {
  return guarded([&] {
    require_arg(writer, "writer");
    require_arg(ckpt, "ckpt");
    writer->impl->write_from_checkpoint(target_name(writer, name), *ckpt->impl, index);
  });
}

peft_error* peft_writer_finish(peft_writer* writer) {
  return guarded([&] {
    require_arg(writer, "writer");
    writer->impl->finish();
  });
}

}  // extern "C"
