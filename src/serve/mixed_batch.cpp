// The layers a mixed batch may use and their factors (mixed_batch.hpp).
#include "serve/mixed_batch.hpp"

#include <string>

#include "core/error.hpp"
#include "core/text.hpp"
#include "serve/loaded_adapter.hpp"

namespace peft::serve {

BatchFactors mixed_batch_factors(const Lease& lease, std::string_view module, uint64_t in_features,
                                 uint64_t out_features) {
  const LoadedLayer* layer = lease.find_layer(module);
  if (layer == nullptr) return {};
  const auto where = [&] { return "adapter " + peft::quoted(lease.name()) + " layer " + peft::quoted(layer->module); };
  if (layer->kind != LayerKind::linear && layer->kind != LayerKind::conv1d)
    fail(PEFT_ERR_UNSUPPORTED, where() + " is of kind " + layer_kind_name(layer->kind) +
                                   "; unmerged apply supports Linear and Conv1D layers");
  if (static_cast<uint64_t>(layer->a_cols) != in_features || static_cast<uint64_t>(layer->b_rows) != out_features)
    fail(PEFT_ERR_SHAPE_MISMATCH, where() + " has " + std::to_string(layer->a_cols) + " input and " +
                                      std::to_string(layer->b_rows) + " output features; the call gives " +
                                      std::to_string(in_features) + " and " + std::to_string(out_features));
  const LoadedAdapter& loaded = lease.loaded();
  BatchFactors result;
  result.factors = LoraFactors{loaded.dtype(),
                               loaded.data(layer->a),
                               loaded.data(layer->b),
                               layer->bias != LoadedLayer::npos ? loaded.data(layer->bias) : nullptr,
                               layer->rank,
                               layer->scaling};
  if (layer->magnitude != LoadedLayer::npos) {
    result.dora = lease.dora_scale(*layer);
    result.factors->dora_scale = result.dora->scale.data();
    result.factors->base_bias = result.dora->bias.empty() ? nullptr : result.dora->bias.data();
  }
  return result;
}

}  // namespace peft::serve
