// The export section of the C API: export options, adapter export, adapter combination.
#include <cmath>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/export_handles.hpp"
#include "capi/lowrank_handles.hpp"
#include "core/error.hpp"
#include "peft/combine/adapter_combine.hpp"
#include "peft/combine/delta_combine.hpp"
#include "peft/export/adapter_export.hpp"
#include "peft/export/gguf_adapter_export.hpp"
#include "peft/import/gguf_adapter_import.hpp"
#include "peft/export/gguf_split_export.hpp"

using peft::capi::guarded;
using peft::capi::options_of;
using peft::capi::require_arg;

namespace {
// The arguments both combinations take, checked: adapters (none NULL, at least one), their
// weights, the method and the output folder.
struct CombineArgs {
  std::vector<std::shared_ptr<const peft::Adapter>> adapters;
  std::span<const double> weights;
  peft::CombineMethod method;
};
CombineArgs combine_args(const peft_adapter* const* adapters, const double* weights, size_t count, int32_t method,
                         const char* out_dir) {
  require_arg(adapters, "adapters");
  require_arg(weights, "weights");
  require_arg(out_dir, "out_dir");
  CombineArgs args{{}, std::span<const double>(weights, count), peft::capi::combine_method(method)};
  if (count == 0) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "count must be at least 1");
  args.adapters.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (adapters[i] == nullptr) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "adapters[" + std::to_string(i) + "] is NULL");
    args.adapters.push_back(adapters[i]->impl);
  }
  return args;
}

// The options of a GGUF LoRA export: the base (NULL: none) and the tensors' ggml type, checked.
peft::GgufAdapterExportOptions gguf_export_options(const char* base, int32_t ggml_type) {
  if (ggml_type < 0) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "ggml type " + std::to_string(ggml_type) + " is negative");
  peft::GgufAdapterExportOptions options;
  options.base = base != nullptr ? base : "";
  options.ggml_type = static_cast<uint32_t>(ggml_type);
  return options;
}
}  // namespace

extern "C" {

peft_error* peft_export_options_new(peft_export_options** out) { return peft::capi::new_handle(out); }

void peft_export_options_free(peft_export_options* opts) { delete opts; }

peft_error* peft_export_options_set_dtype(peft_export_options* opts, int32_t dtype) {
  return peft::capi::set_option(opts, [&](auto& o) {
    o.dtype = peft::capi::output_dtype_option(dtype, "the export dtype");
  });
}

peft_error* peft_export_options_set_peft_version(peft_export_options* opts, const char* version) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (version == nullptr || version[0] == '\0') {
      o.peft_version.reset();
      return;
    }
    o.peft_version = peft::parse_peft_version(version);
  });
}

peft_error* peft_export_options_set_combine_density(peft_export_options* opts, double density) {
  return guarded([&] {
    require_arg(opts, "opts");
    if (!(density >= 0.0 && density <= 1.0))
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the combination density " + std::to_string(density) +
                                                " is not a number from 0 to 1");
    opts->combine.density = density;
  });
}

peft_error* peft_export_options_set_combine_majority_sign(peft_export_options* opts, int32_t method) {
  return guarded([&] {
    require_arg(opts, "opts");
    if (method != PEFT_MAJORITY_SIGN_TOTAL && method != PEFT_MAJORITY_SIGN_FREQUENCY)
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "majority sign method " + std::to_string(method) +
                                                " is not PEFT_MAJORITY_SIGN_TOTAL or PEFT_MAJORITY_SIGN_FREQUENCY");
    opts->combine.majority_sign =
        method == PEFT_MAJORITY_SIGN_TOTAL ? peft::merge::MajoritySign::total : peft::merge::MajoritySign::frequency;
  });
}

peft_error* peft_export_options_set_combine_seed(peft_export_options* opts, uint64_t seed) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->combine.seed = seed;
  });
}

peft_error* peft_export_options_set_combine_svd_rank(peft_export_options* opts, int64_t rank) {
  return guarded([&] {
    require_arg(opts, "opts");
    if (rank < 0) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the svd rank " + std::to_string(rank) + " is negative");
    opts->combine.svd_rank = rank;
  });
}

peft_error* peft_export_options_set_combine_svd_clamp(peft_export_options* opts, double quantile) {
  return guarded([&] {
    require_arg(opts, "opts");
    if (std::isnan(quantile)) {
      opts->combine.svd_clamp.reset();
      return;
    }
    if (!(quantile >= 0.0 && quantile <= 1.0))
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the svd clamp " + std::to_string(quantile) + " is not a quantile from 0 to 1");
    opts->combine.svd_clamp = quantile;
  });
}

peft_error* peft_adapter_export(const peft_adapter* adapter, const char* out_dir, const peft_export_options* opts) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(out_dir, "out_dir");
    peft::export_adapter(*adapter->impl, out_dir, options_of(opts));
  });
}

peft_error* peft_adapter_export_gguf(const peft_adapter* adapter, const char* out_path, const char* base,
                                     int32_t ggml_type) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(out_path, "out_path");
    const peft::GgufAdapterExportOptions options = gguf_export_options(base, ggml_type);
    peft::export_gguf_adapter(*adapter->impl, out_path, options);
  });
}

peft_error* peft_adapter_export_gguf_split(const peft_adapter* adapter, const char* out_path, const char* base,
                                           int32_t ggml_type, const char* base_out) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(out_path, "out_path");
    require_arg(base_out, "base_out");
    const peft::GgufAdapterExportOptions options = gguf_export_options(base, ggml_type);
    peft::export_gguf_adapter_split(adapter->impl, out_path, options, base_out);
  });
}

peft_error* peft_adapter_import_gguf(const char* gguf_path, const char* out_dir, const char* base) {
  return guarded([&] {
    require_arg(gguf_path, "gguf_path");
    require_arg(out_dir, "out_dir");
    require_arg(base, "base");
    peft::import_gguf_adapter(gguf_path, out_dir, base);
  });
}

peft_error* peft_adapter_combine(const peft_adapter* const* adapters, const double* weights, size_t count,
                                 int32_t method, const char* out_dir, const peft_export_options* opts) {
  return guarded([&] {
    const CombineArgs args = combine_args(adapters, weights, count, method, out_dir);
    peft::combine_adapters(args.adapters, args.weights, args.method, out_dir, options_of(opts),
                           opts != nullptr ? opts->combine : peft::CombineSettings{});
  });
}

peft_error* peft_adapter_combine_deltas(const peft_adapter* const* adapters, const double* weights, size_t count,
                                        int32_t method, const char* out_dir, const peft_export_options* combine_opts,
                                        const peft_lowrank_options* opts, peft_lowrank_report** out_report) {
  return guarded([&] {
    const CombineArgs args = combine_args(adapters, weights, count, method, out_dir);
    peft::capi::hand_out_report(
        peft::combine_deltas(args.adapters, args.weights, args.method,
                             combine_opts != nullptr ? combine_opts->combine : peft::CombineSettings{},
                             opts != nullptr ? opts->impl : peft::LowRankOptions{}, out_dir),
        out_report);
  });
}

}  // extern "C"

// Appended with LoRA extraction (capi/lowrank_api.cpp has the rest): it takes export options.
#include "peft/lowrank/lora_convert.hpp"

extern "C" peft_error* peft_adapter_convert_initial(const char* tuned_dir, const char* initial_dir,
                                                    const char* out_dir, const peft_export_options* opts) {
  return guarded([&] {
    require_arg(tuned_dir, "tuned_dir");
    require_arg(initial_dir, "initial_dir");
    require_arg(out_dir, "out_dir");
    peft::convert_initial_to_lora(tuned_dir, initial_dir, out_dir, options_of(opts).dtype);
  });
}
