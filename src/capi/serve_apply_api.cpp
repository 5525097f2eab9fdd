// peft_lora_apply() of the serving section: the factors of each lease's layer, as far as PEFT's
// mixed-batch forward allows them (serve/mixed_batch.hpp), handed to serve::apply_lora.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capi/capi_common.hpp"
#include "capi/serve_handles.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "serve/lora_apply.hpp"
#include "serve/mixed_batch.hpp"

using peft::capi::guarded;
using peft::capi::require_arg;

extern "C" {

peft_error* peft_lora_apply(const char* module, const peft_lease* const* leases, size_t lease_count,
                            const int32_t* row_lease, const void* x, int32_t x_dtype, uint64_t rows,
                            uint64_t in_features, void* y, int32_t y_dtype, uint64_t out_features) {
  return guarded([&] {
    require_arg(module, "module");
    require_arg(leases, "leases");
    if (lease_count == 0) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "lease_count must be at least 1");
    std::vector<std::optional<peft::serve::LoraFactors>> groups;
    std::vector<std::shared_ptr<const peft::serve::DoraScale>> dora;  // kept while groups point into them
    groups.reserve(lease_count);
    dora.reserve(lease_count);
    for (size_t i = 0; i < lease_count; ++i) {
      if (leases[i] == nullptr)
        peft::fail(PEFT_ERR_INVALID_ARGUMENT, "leases[" + std::to_string(i) + "] must not be NULL");
      peft::serve::BatchFactors factors =
          peft::serve::mixed_batch_factors(*leases[i]->impl, module, in_features, out_features);
      groups.push_back(factors.factors);
      dora.push_back(std::move(factors.dora));
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
