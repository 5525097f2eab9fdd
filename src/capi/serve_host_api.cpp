// The host-model part of the serving section of the C API: weight buffers and the adapter swapped
// into them (serve/host_model.hpp).
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/serve_handles.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "serve/host_model.hpp"

using peft::capi::guarded;
using peft::capi::require_arg;

struct peft_host_model {
  peft::serve::HostModel impl;
};

namespace {

peft::DType buffer_dtype(int32_t dtype, const char* what) {
  if (dtype == PEFT_DTYPE_F32 || dtype == PEFT_DTYPE_BF16 || dtype == PEFT_DTYPE_F16)
    return static_cast<peft::DType>(dtype);
  const char* name = peft::is_valid_dtype(dtype) ? peft_dtype_name(dtype) : nullptr;
  peft::fail(PEFT_ERR_UNSUPPORTED, std::string(what) + " dtype " + (name ? name : std::to_string(dtype)) +
                                       " is not supported (F32, BF16 and F16 are)");
}

// Fills the caller's counters up to its `size`: only whole fields (all are 8 bytes) that lie
// within it are written.
void write_stats(const peft::serve::SwapStats& s, peft_swap_stats* out) {
  peft_swap_stats filled;
  filled.size = out->size;
  filled.remove_seconds = s.remove_seconds;
  filled.merge_seconds = s.merge_seconds;
  filled.layers_removed = s.layers_removed;
  filled.layers_merged = s.layers_merged;
  filled.saved_bytes = s.saved_bytes;
  const uint64_t within = out->size < sizeof filled ? out->size : sizeof filled;
  const size_t bytes = static_cast<size_t>(within / 8 * 8);
  if (bytes > sizeof filled.size)
    std::memcpy(reinterpret_cast<char*>(out) + sizeof filled.size, reinterpret_cast<const char*>(&filled) + sizeof filled.size,
                bytes - sizeof filled.size);
}

}  // namespace

extern "C" {

peft_error* peft_host_model_new(peft_host_model** out) {
  return guarded([&] {
    require_arg(out, "out");
    *out = new peft_host_model();
  });
}

void peft_host_model_free(peft_host_model* host) { delete host; }

peft_error* peft_host_model_set_translator(peft_host_model* host, const peft_translator* translator) {
  return guarded([&] {
    require_arg(host, "host");
    if (translator == nullptr)
      host->impl.set_translator(std::nullopt);
    else
      host->impl.set_translator(translator->impl);
  });
}

peft_error* peft_host_model_set_exact(peft_host_model* host, int32_t exact) {
  return guarded([&] {
    require_arg(host, "host");
    host->impl.set_exact(exact != 0);
  });
}

peft_error* peft_host_model_add_weight(peft_host_model* host, const char* name, void* data, int32_t dtype,
                                       const uint64_t* shape, size_t ndim, void* bias, int32_t bias_dtype,
                                       uint64_t bias_elements) {
  return guarded([&] {
    require_arg(host, "host");
    require_arg(name, "name");
    require_arg(data, "data");
    if (ndim > 0) require_arg(shape, "shape");
    const peft::DType weight_dtype = buffer_dtype(dtype, "weight");
    const peft::DType bias_type = bias != nullptr ? buffer_dtype(bias_dtype, "bias") : peft::DType::F32;
    std::vector<int64_t> dims;
    for (size_t i = 0; i < ndim; ++i) {
      if (shape[i] == 0 || shape[i] > static_cast<uint64_t>(INT64_MAX))
        peft::fail(PEFT_ERR_SHAPE_MISMATCH, "weight " + peft::quoted(name) + ": dimension " + std::to_string(i) +
                                                " is " + std::to_string(shape[i]));
      dims.push_back(static_cast<int64_t>(shape[i]));
    }
    if (bias != nullptr && (bias_elements == 0 || bias_elements > static_cast<uint64_t>(INT64_MAX)))
      peft::fail(PEFT_ERR_SHAPE_MISMATCH, "weight " + peft::quoted(name) + ": the bias has " +
                                              std::to_string(bias_elements) + " elements");
    host->impl.add_weight(name, data, weight_dtype, dims, bias, bias_type, static_cast<int64_t>(bias_elements));
  });
}

peft_error* peft_host_model_swap(peft_host_model* host, const peft_lease* lease, double weight,
                                 peft_swap_stats* stats) {
  return guarded([&] {
    require_arg(host, "host");
    const peft::serve::SwapStats done = host->impl.swap(lease != nullptr ? lease->impl.get() : nullptr, weight);
    if (stats != nullptr) write_stats(done, stats);
  });
}

const char* peft_host_model_current(const peft_host_model* host) {
  if (host == nullptr || host->impl.current() == nullptr) return nullptr;
  return host->impl.current()->name().c_str();
}

}  // extern "C"
