// The C API of control vectors (steering vectors): open, build, combine, save, and add to a host's
// buffer with an exact removal.
#include <iterator>
#include <memory>
#include <string>

#include "capi/capi_common.hpp"
#include "core/error.hpp"
#include "peft/control/control_apply.hpp"
#include "peft/control/control_vector.hpp"

using peft::capi::guarded;
using peft::capi::require_arg;

struct peft_control_vector {
  peft::ControlVector impl;
};

struct peft_control_record {
  std::unique_ptr<peft::ControlRecord> impl;
};

namespace {

constexpr uint64_t kMaxEmbd = uint64_t{1} << 31;


const peft::DType kDirectionDTypes[] = {peft::DType::F32, peft::DType::BF16, peft::DType::F16, peft::DType::F64};

}  // namespace

extern "C" {

peft_error* peft_control_vector_open(const char* path, peft_control_vector** out) {
  return guarded([&] {
    require_arg(path, "path");
    require_arg(out, "out");
    auto handle = std::make_unique<peft_control_vector>();
    handle->impl = peft::read_control_vector(path);
    *out = handle.release();
  });
}

peft_error* peft_control_vector_new(uint64_t n_embd, const char* model_hint, peft_control_vector** out) {
  return guarded([&] {
    require_arg(out, "out");
    if (n_embd == 0 || n_embd > kMaxEmbd)
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "n_embd " + std::to_string(n_embd) + " is not in [1, 2^31]");
    auto handle = std::make_unique<peft_control_vector>();
    handle->impl.n_embd = n_embd;
    handle->impl.model_hint = model_hint != nullptr ? model_hint : "";
    *out = handle.release();
  });
}

void peft_control_vector_free(peft_control_vector* vector) { delete vector; }

uint64_t peft_control_vector_n_embd(const peft_control_vector* vector) {
  return vector != nullptr ? vector->impl.n_embd : 0;
}

const char* peft_control_vector_model_hint(const peft_control_vector* vector) {
  return vector != nullptr ? vector->impl.model_hint.c_str() : nullptr;
}

size_t peft_control_vector_layer_count(const peft_control_vector* vector) {
  return vector != nullptr ? vector->impl.directions.size() : 0;
}

int64_t peft_control_vector_layer(const peft_control_vector* vector, size_t index) {
  if (vector == nullptr || index >= vector->impl.directions.size()) return -1;
  return std::next(vector->impl.directions.begin(), static_cast<std::ptrdiff_t>(index))->first;
}

const float* peft_control_vector_direction(const peft_control_vector* vector, int64_t layer) {
  if (vector == nullptr) return nullptr;
  const auto found = vector->impl.directions.find(layer);
  return found != vector->impl.directions.end() ? found->second.data() : nullptr;
}

peft_error* peft_control_vector_set_direction(peft_control_vector* vector, int64_t layer, int32_t dtype,
                                              const void* data) {
  return guarded([&] {
    require_arg(vector, "vector");
    require_arg(data, "data");
    peft::set_direction(vector->impl, layer, peft::capi::dtype_arg(dtype, "the direction's dtype", kDirectionDTypes), data);
  });
}

peft_error* peft_control_vector_add(peft_control_vector* dst, const peft_control_vector* src, double strength) {
  return guarded([&] {
    require_arg(dst, "dst");
    require_arg(src, "src");
    peft::add_scaled(dst->impl, src->impl, strength);
  });
}

peft_error* peft_control_vector_save(const peft_control_vector* vector, const char* path, int32_t format) {
  return guarded([&] {
    require_arg(vector, "vector");
    require_arg(path, "path");
    if (format == PEFT_FORMAT_GGUF) {
      peft::write_control_vector_gguf(vector->impl, path);
    } else if (format == PEFT_FORMAT_SAFETENSORS) {
      peft::write_control_vector_safetensors(vector->impl, path);
    } else {
      peft::fail(PEFT_ERR_INVALID_ARGUMENT,
                 "format " + std::to_string(format) + " is not PEFT_FORMAT_SAFETENSORS or PEFT_FORMAT_GGUF");
    }
  });
}

peft_error* peft_control_vector_apply(const peft_control_vector* vector, int64_t layer, double strength, void* data,
                                      int32_t dtype, uint64_t rows, peft_control_record** out) {
  return guarded([&] {
    require_arg(vector, "vector");
    require_arg(data, "data");
    const peft::DType buffer_dtype = peft::capi::dtype_arg(dtype, "the buffer's dtype", peft::capi::kFloatDTypes);
    auto record = peft::apply_control_vector(vector->impl, layer, strength, data, buffer_dtype, rows, out != nullptr);
    if (out != nullptr) *out = new peft_control_record{std::move(record)};
  });
}

peft_error* peft_control_record_remove(peft_control_record* record, void* data) {
  return guarded([&] {
    require_arg(record, "record");
    record->impl->remove(data);
  });
}

void peft_control_record_free(peft_control_record* record) { delete record; }

}  // extern "C"
