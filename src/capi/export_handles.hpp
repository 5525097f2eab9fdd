// The C handle of export options, shared by the export section (export_api.cpp) and the whole-model
// combination of the merge section (merge_api.cpp), which reads its combination settings. Only
// src/capi includes this.
#pragma once

#include <iterator>
#include <string>

#include "core/error.hpp"
#include "peft/combine/adapter_combine.hpp"
#include "peft/export/adapter_export.hpp"
#include "peft_c.h"

struct peft_export_options {
  peft::ExportOptions impl;
  peft::CombineSettings combine;  // read by the combinations only
};

namespace peft::capi {

// PEFT_COMBINE_* as a CombineMethod; INVALID_ARGUMENT for another value.
inline CombineMethod combine_method(int32_t method) {
  using M = CombineMethod;
  static constexpr M kMethods[] = {M::cat,         M::linear,          M::ties,         M::dare_linear,
                                   M::dare_ties,   M::magnitude_prune, M::svd,          M::ties_svd,
                                   M::dare_linear_svd, M::dare_ties_svd, M::magnitude_prune_svd};
  static_assert(PEFT_COMBINE_CAT == 0 && PEFT_COMBINE_LINEAR == 1 && PEFT_COMBINE_TIES == 2 &&
                PEFT_COMBINE_DARE_LINEAR == 3 && PEFT_COMBINE_DARE_TIES == 4 && PEFT_COMBINE_MAGNITUDE_PRUNE == 5 &&
                PEFT_COMBINE_SVD == 6 && PEFT_COMBINE_TIES_SVD == 7 && PEFT_COMBINE_DARE_LINEAR_SVD == 8 &&
                PEFT_COMBINE_DARE_TIES_SVD == 9 && PEFT_COMBINE_MAGNITUDE_PRUNE_SVD == 10);
  if (method < 0 || method >= static_cast<int32_t>(std::size(kMethods)))
    fail(PEFT_ERR_INVALID_ARGUMENT, "combination method " + std::to_string(method) +
                                        " is not one of the PEFT_COMBINE_* values");
  return kMethods[method];
}

}  // namespace peft::capi
