// Which adapters a mixed batch may use for one layer, as PEFT's unmerged forward with
// `adapter_names` allows (peft/tuners/lora/layer.py, Linear._mixed_batch_forward), and the factors
// that apply_lora (lora_apply.hpp) then uses for each adapter's rows, as the registry stores them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "serve/lora_apply.hpp"
#include "serve/registry.hpp"

namespace peft::serve {

// One adapter's factors for one layer of a batch; `dora` owns what factors->dora_scale and
// factors->base_bias point to (keep it while the factors are used).
struct BatchFactors {
  std::optional<LoraFactors> factors;
  std::shared_ptr<const DoraScale> dora;
};

// The factors of the leased adapter's layer `module` (Lease::find_layer) for a batch with
// `in_features` inputs and `out_features` outputs; no factors when the adapter has no such LoRA
// layer (its rows then stay unchanged, as in PEFT). A DoRA layer gets its scale and the base
// layer's bias from the registry's base weights (Lease::dora_scale; PEFT refuses `adapter_names`
// with DoRA, we serve it). PEFT_ERR_UNSUPPORTED for a layer that is not Linear or Conv1D;
// PEFT_ERR_SHAPE_MISMATCH when the layer's features are not the batch's;
// PEFT_ERR_UNRESOLVED_KEY from Lease::find_layer; Lease::dora_scale's errors (NOT_FOUND without a
// base weight).
BatchFactors mixed_batch_factors(const Lease& lease, std::string_view module, uint64_t in_features,
                                 uint64_t out_features);

}  // namespace peft::serve
