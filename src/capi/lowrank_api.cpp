// The C API of LoRA extraction and conversion to plain LoRA (export section): low-rank options,
// reports, peft_adapter_extract() and peft_adapter_convert_to_lora().
#include <cmath>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/lowrank_handles.hpp"
#include "core/error.hpp"
#include "peft/lowrank/lora_convert.hpp"
#include "peft/lowrank/lora_extract.hpp"

using peft::capi::guarded;
using peft::capi::require_arg;

namespace {

const peft::LowRankModule* module_at(const peft_lowrank_report* report, size_t index) {
  return report != nullptr && index < report->modules.size() ? &report->modules[index] : nullptr;
}

}  // namespace

extern "C" {

peft_error* peft_lowrank_options_new(peft_lowrank_options** out) { return peft::capi::new_handle(out); }

void peft_lowrank_options_free(peft_lowrank_options* opts) { delete opts; }

peft_error* peft_lowrank_options_set_rank(peft_lowrank_options* opts, int64_t rank) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (rank < 1) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the rank must be at least 1, not " + std::to_string(rank));
    o.choice = {rank, 0.0};
  });
}

peft_error* peft_lowrank_options_set_energy(peft_lowrank_options* opts, double fraction) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (!(fraction > 0.0 && fraction <= 1.0))
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the energy fraction must be in (0, 1]");
    o.choice = {0, fraction};
  });
}

peft_error* peft_lowrank_options_set_svd(peft_lowrank_options* opts, int32_t method) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (method != PEFT_SVD_EXACT && method != PEFT_SVD_RANDOMIZED)
      peft::fail(PEFT_ERR_INVALID_ARGUMENT,
                 "SVD method " + std::to_string(method) + " is not PEFT_SVD_EXACT or PEFT_SVD_RANDOMIZED");
    o.method = method == PEFT_SVD_EXACT ? peft::merge::SvdMethod::exact : peft::merge::SvdMethod::randomized;
  });
}

peft_error* peft_lowrank_options_set_threads(peft_lowrank_options* opts, uint32_t threads) {
  return peft::capi::set_option(opts, [&](auto& o) { o.threads = threads; });
}

peft_error* peft_lowrank_options_set_dtype(peft_lowrank_options* opts, int32_t dtype) {
  return peft::capi::set_option(opts, [&](auto& o) {
    o.dtype = peft::capi::output_dtype_option(dtype, "the factors' dtype");
  });
}

peft_error* peft_lowrank_options_set_modules(peft_lowrank_options* opts, const char* const* names, size_t count) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (count > 0) require_arg(names, "names");
    std::vector<std::string> list;
    for (size_t i = 0; i < count; ++i) {
      if (names[i] == nullptr || names[i][0] == '\0')
        peft::fail(PEFT_ERR_INVALID_ARGUMENT, "names[" + std::to_string(i) + "] is NULL or empty");
      list.emplace_back(names[i]);
    }
    o.modules = std::move(list);
  });
}

peft_error* peft_lowrank_options_set_base(peft_lowrank_options* opts, const char* base_dir) {
  return peft::capi::set_option(opts, [&](auto& o) { o.base_dir = base_dir != nullptr ? base_dir : ""; });
}

size_t peft_lowrank_report_module_count(const peft_lowrank_report* report) {
  return report != nullptr ? report->modules.size() : 0;
}

const char* peft_lowrank_report_module_name(const peft_lowrank_report* report, size_t index) {
  const peft::LowRankModule* m = module_at(report, index);
  return m != nullptr ? m->name.c_str() : nullptr;
}

int64_t peft_lowrank_report_module_rank(const peft_lowrank_report* report, size_t index) {
  const peft::LowRankModule* m = module_at(report, index);
  return m != nullptr ? m->rank : 0;
}

double peft_lowrank_report_module_error(const peft_lowrank_report* report, size_t index) {
  const peft::LowRankModule* m = module_at(report, index);
  return m != nullptr ? m->relative_error : -1.0;
}

void peft_lowrank_report_free(peft_lowrank_report* report) { delete report; }

peft_error* peft_adapter_extract(const char* base, const char* tuned, const char* out_dir,
                                 const peft_lowrank_options* opts, peft_lowrank_report** out_report) {
  return guarded([&] {
    require_arg(base, "base");
    require_arg(tuned, "tuned");
    require_arg(out_dir, "out_dir");
    require_arg(opts, "opts");
    peft::capi::hand_out_report(peft::extract_lora(base, tuned, out_dir, opts->impl), out_report);
  });
}

peft_error* peft_adapter_convert_to_lora(const peft_adapter* adapter, const char* out_dir,
                                         const peft_lowrank_options* opts, peft_lowrank_report** out_report) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(out_dir, "out_dir");
    require_arg(opts, "opts");
    peft::capi::hand_out_report(peft::convert_to_lora(*adapter->impl, out_dir, opts->impl), out_report);
  });
}

}  // extern "C"
