// The merge section of the C API: checkpoint merges (options, result) and buffer merges (records).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "capi/export_handles.hpp"
#include "core/error.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/quant/ggml_types.hpp"
#include "core/text.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/buffer_merge/named_buffer_merge.hpp"
#include "peft/combine/adapter_combine.hpp"
#include "peft/combine/model_combine.hpp"
#include "peft/merge/merge_entry.hpp"
#include "peft/methods/lora_math.hpp"

namespace {

using peft::capi::guarded;
using peft::capi::require_arg;

void require_finite(double weight) { peft::merge::require_merge_weight(weight); }

}  // namespace

struct peft_merge_options {
  std::vector<peft::MergeAdapter> adapters;
  peft::CheckpointMergeOptions impl;  // all but the adapters, which are opened when the merge starts
};

struct peft_merge_result {
  peft::CheckpointMergeResult impl;
  std::string report_json = "[]";  // impl.store_report as peft_merge_result_report_json() gives it
};

struct peft_merge_buffer_options {
  peft::NamedBufferMergeOptions impl;
};

struct peft_merge_record {
  peft::NamedBufferMerge impl;
};

extern "C" {

// ---- checkpoint merge ----------------------------------------------------------------------------

peft_error* peft_merge_options_new(peft_merge_options** out) { return peft::capi::new_handle(out); }

void peft_merge_options_free(peft_merge_options* opts) { delete opts; }

peft_error* peft_merge_options_add_adapter(peft_merge_options* opts, const peft_adapter* adapter, double weight) {
  return guarded([&] {
    require_arg(opts, "opts");
    require_arg(adapter, "adapter");
    require_finite(weight);
    opts->adapters.push_back({adapter->impl, adapter->impl->dir(), weight});
  });
}

peft_error* peft_merge_options_add_adapter_dir(peft_merge_options* opts, const char* dir, double weight) {
  return guarded([&] {
    require_arg(opts, "opts");
    require_arg(dir, "dir");
    if (*dir == '\0') peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the adapter folder must not be empty");
    require_finite(weight);
    opts->adapters.push_back({nullptr, dir, weight});
  });
}

peft_error* peft_merge_options_set_dtype(peft_merge_options* opts, int32_t dtype) {
  return peft::capi::set_option(opts, [&](auto& o) {
    o.dtype = peft::capi::output_dtype_option(dtype, "the merge output dtype");
  });
}

peft_error* peft_merge_options_set_max_shard_size(peft_merge_options* opts, uint64_t max_shard_size) {
  return peft::capi::set_option(opts, [&](auto& o) { o.max_shard_size = max_shard_size; });
}

peft_error* peft_merge_options_set_threads(peft_merge_options* opts, uint32_t threads) {
  return peft::capi::set_option(opts, [&](auto& o) { o.threads = threads; });
}

peft_error* peft_merge_options_set_require_config(peft_merge_options* opts, int32_t require) {
  return peft::capi::set_option(opts, [&](auto& o) { o.require_config = require != 0; });
}

peft_error* peft_merge_options_set_allow_nonfinite(peft_merge_options* opts, int32_t allow) {
  return peft::capi::set_option(opts, [&](auto& o) { o.allow_nonfinite = allow != 0; });
}

peft_error* peft_merge_options_set_progress(peft_merge_options* opts, peft_progress_fn fn, void* user_data) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (fn == nullptr)
      o.progress = nullptr;
    else
      o.progress = [fn, user_data](uint64_t done, uint64_t total) { return fn(user_data, done, total) == 0; };
  });
}

peft_error* peft_merge_checkpoint(const char* base_dir, const char* out_dir, const peft_merge_options* opts,
                                  peft_merge_result** out_result) {
  return guarded([&] {
    require_arg(base_dir, "base_dir");
    require_arg(out_dir, "out_dir");
    require_arg(opts, "opts");
    if (opts->adapters.empty()) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the merge options hold no adapter");
    auto result = out_result ? std::make_unique<peft_merge_result>() : nullptr;
    peft::CheckpointMergeResult r = peft::merge_adapters(base_dir, out_dir, opts->adapters, opts->impl);
    if (result) {
      result->report_json = peft::store_report_json(r.store_report);
      result->impl = std::move(r);
      *out_result = result.release();
    }
  });
}

peft_error* peft_model_combine(const char* base_dir, const char* const* models, const double* weights, size_t count,
                               int32_t method, const char* out_dir, const peft_export_options* combine_opts,
                               const peft_merge_options* opts, peft_merge_result** out_result) {
  return guarded([&] {
    require_arg(base_dir, "base_dir");
    require_arg(models, "models");
    require_arg(weights, "weights");
    require_arg(out_dir, "out_dir");
    if (count == 0) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "count must be at least 1");
    std::vector<std::string> dirs;
    for (size_t i = 0; i < count; ++i) {
      if (models[i] == nullptr) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "models[" + std::to_string(i) + "] is NULL");
      dirs.emplace_back(models[i]);
    }
    if (opts != nullptr && !opts->adapters.empty())
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the merge options hold adapters, which a model combination does not take");
    const peft::CombineMethod how = peft::capi::combine_method(method);
    peft::ModelCombineOptions options;
    if (opts != nullptr) {
      options.dtype = opts->impl.dtype;
      options.max_shard_size = opts->impl.max_shard_size;
      options.progress = opts->impl.progress;
      options.require_config = opts->impl.require_config;
      options.allow_nonfinite = opts->impl.allow_nonfinite;
    }
    auto result = out_result ? std::make_unique<peft_merge_result>() : nullptr;
    peft::CheckpointMergeResult r =
        peft::combine_models(base_dir, dirs, std::span<const double>(weights, count), how,
                             combine_opts != nullptr ? combine_opts->combine : peft::CombineSettings{}, out_dir, options);
    if (result) {
      result->impl = std::move(r);
      *out_result = result.release();
    }
  });
}

void peft_merge_result_free(peft_merge_result* result) { delete result; }

uint64_t peft_merge_result_tensor_count(const peft_merge_result* result, int32_t which) {
  if (result == nullptr) return 0;
  switch (which) {
    case PEFT_MERGE_TENSORS_MERGED: return result->impl.merged;
    case PEFT_MERGE_TENSORS_REPLACED: return result->impl.replaced;
    case PEFT_MERGE_TENSORS_COPIED: return result->impl.copied;
    case PEFT_MERGE_TENSORS_ADDED: return result->impl.added;
    default: return 0;
  }
}

uint64_t peft_merge_result_bytes(const peft_merge_result* result) { return result ? result->impl.bytes : 0; }

size_t peft_merge_result_file_count(const peft_merge_result* result) { return result ? result->impl.files.size() : 0; }

const char* peft_merge_result_file_name(const peft_merge_result* result, size_t index) {
  if (result == nullptr || index >= result->impl.files.size()) return nullptr;
  return result->impl.files[index].c_str();
}

int32_t peft_merge_result_untied_embeddings(const peft_merge_result* result) {
  return result && result->impl.untied_embeddings ? 1 : 0;
}

size_t peft_merge_result_note_count(const peft_merge_result* result) { return result ? result->impl.notes.size() : 0; }

const char* peft_merge_result_note(const peft_merge_result* result, size_t index) {
  if (result == nullptr || index >= result->impl.notes.size()) return nullptr;
  return result->impl.notes[index].c_str();
}

peft_error* peft_merge_options_set_quant(peft_merge_options* opts, int32_t ggml_type) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (ggml_type == PEFT_DTYPE_KEEP) {
      o.quant.reset();
      return;
    }
    const auto type = ggml_type < 0 ? std::nullopt : peft::ggml_type(static_cast<uint32_t>(ggml_type));
    if (!type) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the merge's quantization type " + std::to_string(ggml_type) +
                                                         " is not a ggml type");
    if (!peft::ggml_can_quantize(type->id))
      peft::fail(PEFT_ERR_UNSUPPORTED, "merged tensors cannot be quantized to " + std::string(type->name) +
                                           " (ggml's quantizer for it needs an importance matrix)");
    o.quant = type->id;
  });
}

peft_error* peft_merge_options_set_report(peft_merge_options* opts, int32_t report) {
  return peft::capi::set_option(opts, [&](auto& o) { o.report = report != 0; });
}

const char* peft_merge_result_report_json(const peft_merge_result* result) {
  return result ? result->report_json.c_str() : nullptr;
}

peft_error* peft_merge_options_set_arithmetic(peft_merge_options* opts, int32_t arithmetic) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (arithmetic == PEFT_MERGE_ARITHMETIC_PEFT)
      o.arithmetic = peft::merge::Arithmetic::peft;
    else if (arithmetic == PEFT_MERGE_ARITHMETIC_GGML)
      o.arithmetic = peft::merge::Arithmetic::ggml;
    else
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the merge arithmetic " + std::to_string(arithmetic) +
                                                " is not PEFT_MERGE_ARITHMETIC_PEFT (0) or PEFT_MERGE_ARITHMETIC_GGML (1)");
  });
}

peft_error* peft_merge_options_set_join_split(peft_merge_options* opts, int32_t join) {
  return peft::capi::set_option(opts, [&](auto& o) { o.join_split = join != 0; });
}

peft_error* peft_merge_options_set_combine(peft_merge_options* opts, int32_t method,
                                          const peft_export_options* combine_opts) {
  return peft::capi::set_option(opts, [&](auto& o) {
    const peft::CombineMethod how = peft::capi::combine_method(method);
    if (!peft::is_task_arithmetic(how))
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "a merge combines adapters with PEFT_COMBINE_LINEAR, _TIES, _DARE_LINEAR, "
                                            "_DARE_TIES or _MAGNITUDE_PRUNE, not method " + std::to_string(method));
    if (how == peft::CombineMethod::linear) {
      o.combine.reset();
      return;
    }
    o.combine = peft::task_settings_of(how, combine_opts != nullptr ? combine_opts->combine : peft::CombineSettings{},
                                       "a merge's combination");
  });
}

peft_error* peft_merge_options_set_tied_embeddings(peft_merge_options* opts, int32_t policy) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (policy == PEFT_MERGE_TIED_UNTIE)
      o.tied_embeddings = peft::TiedEmbeddingsPolicy::untie;
    else if (policy == PEFT_MERGE_TIED_SHARED)
      o.tied_embeddings = peft::TiedEmbeddingsPolicy::shared;
    else
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the tied embeddings policy " + std::to_string(policy) +
                                                " is not PEFT_MERGE_TIED_UNTIE (0) or PEFT_MERGE_TIED_SHARED (1)");
  });
}

// ---- buffer merge --------------------------------------------------------------------------------

peft_error* peft_merge_buffer_options_new(peft_merge_buffer_options** out) { return peft::capi::new_handle(out); }

void peft_merge_buffer_options_free(peft_merge_buffer_options* opts) { delete opts; }

peft_error* peft_merge_buffer_options_set_weight(peft_merge_buffer_options* opts, double weight) {
  return peft::capi::set_option(opts, [&](auto& o) {
    require_finite(weight);
    o.weight = weight;
  });
}

peft_error* peft_merge_buffer_options_set_keep_original_rows(peft_merge_buffer_options* opts, int32_t keep) {
  return peft::capi::set_option(opts, [&](auto& o) { o.keep_original_rows = keep != 0; });
}

peft_error* peft_merge_buffer_options_set_threads(peft_merge_buffer_options* opts, uint32_t threads) {
  return peft::capi::set_option(opts, [&](auto& o) { o.threads = threads; });
}

peft_error* peft_merge_buffer_options_set_translator(peft_merge_buffer_options* opts,
                                                     const peft_translator* translator) {
  return peft::capi::set_option(opts, [&](auto& o) {
    if (translator == nullptr)
      o.translator.reset();
    else
      o.translator.emplace(translator->impl);
  });
}

peft_error* peft_merge_buffer_apply(const peft_adapter* adapter, const char* name, void* data, int32_t dtype,
                                    const uint64_t* shape, size_t ndim, void* bias, int32_t bias_dtype,
                                    const peft_merge_buffer_options* opts, peft_merge_record** out) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(name, "name");
    require_arg(out, "out");
    const auto weight = peft::capi::weight_buffer_arg(data, dtype, shape, ndim, "weight ");
    auto record = std::make_unique<peft_merge_record>();
    record->impl = peft::NamedBufferMerge::apply(adapter->impl, name, data, weight.dtype, weight.dims, bias,
                                                 static_cast<peft::DType>(bias_dtype), peft::capi::options_of(opts));
    *out = record.release();
  });
}

peft_error* peft_merge_record_unmerge(peft_merge_record* record, void* data, void* bias) {
  return guarded([&] {
    require_arg(record, "record");
    require_arg(data, "data");
    record->impl.remove(data, bias);
  });
}

peft_error* peft_merge_buffer_remove(peft_merge_record* record, void* data, void* bias) {
  return peft_merge_record_unmerge(record, data, bias);
}

void peft_merge_record_free(peft_merge_record* record) { delete record; }

const char* peft_merge_record_module(const peft_merge_record* record) {
  return record ? record->impl.module().c_str() : nullptr;
}

int32_t peft_merge_record_active(const peft_merge_record* record) {
  return record && record->impl.active() ? 1 : 0;
}

uint64_t peft_merge_record_saved_bytes(const peft_merge_record* record) {
  return record ? record->impl.saved_bytes() : 0;
}

}  // extern "C"
