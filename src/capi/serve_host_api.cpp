// The host-model part of the serving section of the C API: weight buffers and the adapter swapped
// into them (serve/host_model.hpp).
#include <optional>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/serve_handles.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/buffer_merge/named_buffer_merge.hpp"
#include "serve/host_model.hpp"

using peft::capi::guarded;
using peft::capi::require_arg;

struct peft_host_model {
  peft::serve::HostModel impl;
};

extern "C" {

peft_error* peft_host_model_new(peft_host_model** out) { return peft::capi::new_handle(out); }

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
    const auto weight = peft::capi::weight_buffer_arg(data, dtype, shape, ndim, "weight " + peft::quoted(name) + ": ");
    const peft::DType bias_type = bias != nullptr ? static_cast<peft::DType>(bias_dtype) : peft::DType::F32;
    if (bias != nullptr) peft::require_buffer_dtype(bias_type, "bias");
    if (bias != nullptr && (bias_elements == 0 || bias_elements > static_cast<uint64_t>(INT64_MAX)))
      peft::fail(PEFT_ERR_SHAPE_MISMATCH, "weight " + peft::quoted(name) + ": the bias has " +
                                              std::to_string(bias_elements) + " elements");
    host->impl.add_weight(name, data, weight.dtype, weight.dims, bias, bias_type, static_cast<int64_t>(bias_elements));
  });
}

peft_error* peft_host_model_swap(peft_host_model* host, const peft_lease* lease, double weight,
                                 peft_swap_stats* stats) {
  return guarded([&] {
    require_arg(host, "host");
    const peft::serve::SwapStats done = host->impl.swap(lease != nullptr ? lease->impl.get() : nullptr, weight);
    if (stats != nullptr) peft::capi::copy_to_sized(done, stats);
  });
}

const char* peft_host_model_current(const peft_host_model* host) {
  if (host == nullptr || host->impl.current() == nullptr) return nullptr;
  return host->impl.current()->name().c_str();
}

}  // extern "C"
