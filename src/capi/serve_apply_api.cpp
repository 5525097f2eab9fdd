// peft_lora_apply() of the serving section: finds each lease's layer, checks that PEFT's mixed-batch
// forward would run it and that it fits the call's features, and hands the factors as the registry
// stores them to serve::apply_lora.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "capi/capi_common.hpp"
#include "capi/serve_handles.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "serve/lora_apply.hpp"

namespace {

using peft::capi::guarded;
using peft::capi::require_arg;
using peft::serve::LoadedLayer;
using peft::serve::LoraFactors;

// The factors of the lease's layer `module`, or nullopt when its adapter has no such LoRA layer
// (the rows of that adapter then stay unchanged, as in PEFT).
std::optional<LoraFactors> layer_factors(const peft::serve::Lease& lease, const char* module, uint64_t in_features,
                                         uint64_t out_features) {
  const LoadedLayer* layer = lease.find_layer(module);
  if (layer == nullptr) return std::nullopt;
  const auto where = [&] { return "adapter " + peft::quoted(lease.name()) + " layer " + peft::quoted(layer->module); };
  if (layer->kind != peft::LayerKind::linear && layer->kind != peft::LayerKind::conv1d)
    peft::fail(PEFT_ERR_UNSUPPORTED, where() + " is of kind " + peft::layer_kind_name(layer->kind) +
                                         "; unmerged apply supports Linear and Conv1D layers");
  // PEFT refuses adapter_names with DoRA ("Cannot pass `adapter_names` when DoRA is enabled").
  if (layer->magnitude != LoadedLayer::npos)
    peft::fail(PEFT_ERR_UNSUPPORTED, where() + " is a DoRA layer; unmerged apply does not support DoRA");
  if (static_cast<uint64_t>(layer->a_cols) != in_features || static_cast<uint64_t>(layer->b_rows) != out_features)
    peft::fail(PEFT_ERR_SHAPE_MISMATCH, where() + " has " + std::to_string(layer->a_cols) + " input and " +
                                            std::to_string(layer->b_rows) + " output features; the call gives " +
                                            std::to_string(in_features) + " and " + std::to_string(out_features));
  const peft::serve::LoadedAdapter& loaded = lease.loaded();
  return LoraFactors{loaded.dtype(),
                     loaded.data(layer->a),
                     loaded.data(layer->b),
                     layer->bias != LoadedLayer::npos ? loaded.data(layer->bias) : nullptr,
                     layer->rank,
                     layer->scaling};
}

}  // namespace

extern "C" {

peft_error* peft_lora_apply(const char* module, const peft_lease* const* leases, size_t lease_count,
                            const int32_t* row_lease, const void* x, int32_t x_dtype, uint64_t rows,
                            uint64_t in_features, void* y, int32_t y_dtype, uint64_t out_features) {
  return guarded([&] {
    require_arg(module, "module");
    require_arg(leases, "leases");
    if (lease_count == 0) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "lease_count must be at least 1");
    std::vector<std::optional<LoraFactors>> groups;
    groups.reserve(lease_count);
    for (size_t i = 0; i < lease_count; ++i) {
      if (leases[i] == nullptr)
        peft::fail(PEFT_ERR_INVALID_ARGUMENT, "leases[" + std::to_string(i) + "] must not be NULL");
      groups.push_back(layer_factors(*leases[i]->impl, module, in_features, out_features));
    }
    // apply_lora checks the dtypes (any int32 value is a valid DType object), pointers and indices.
    const peft::serve::LoraBatch batch{.x = x,
                                       .x_dtype = static_cast<peft::DType>(x_dtype),
                                       .y = y,
                                       .y_dtype = static_cast<peft::DType>(y_dtype),
                                       .rows = rows,
                                       .in_features = in_features,
                                       .out_features = out_features,
                                       .row_group = row_lease};
    peft::serve::apply_lora(groups, batch);
  });
}

}  // extern "C"
