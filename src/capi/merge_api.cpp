// The merge section of the C API: checkpoint merges (options, result) and buffer merges (records).
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capi/adapter_handles.hpp"
#include "capi/capi_common.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/checkpoint_merge/checkpoint_merge.hpp"

namespace {

using peft::capi::guarded;
using peft::capi::require_arg;

// An adapter to merge: opened already, or a folder opened against the base at merge time.
struct AdapterEntry {
  std::shared_ptr<const peft::Adapter> adapter;
  std::string dir;
  double weight = 1.0;
};

void require_finite(double weight) {
  if (!std::isfinite(weight)) peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the adapter weight must be a finite number");
}

peft::DType buffer_dtype(int32_t dtype, const char* what) {
  if (dtype == PEFT_DTYPE_F32 || dtype == PEFT_DTYPE_BF16 || dtype == PEFT_DTYPE_F16)
    return static_cast<peft::DType>(dtype);
  const char* name = peft::is_valid_dtype(dtype) ? peft_dtype_name(dtype) : nullptr;
  peft::fail(PEFT_ERR_UNSUPPORTED, std::string(what) + " dtype " + (name ? name : std::to_string(dtype)) +
                                       " is not supported (F32, BF16 and F16 are)");
}

// Opens folder adapters against the base, collecting the problems of all before failing.
std::vector<peft::MergeInput> open_inputs(const std::vector<AdapterEntry>& entries, const std::string& base_dir) {
  std::vector<peft::MergeInput> inputs;
  std::vector<std::string> problems;
  bool unresolved = false;
  for (const AdapterEntry& e : entries) {
    if (e.adapter) {
      inputs.push_back({e.adapter, e.weight});
      continue;
    }
    peft::Adapter::Options options;
    options.base_dir = base_dir;
    try {
      inputs.push_back({peft::Adapter::open(e.dir, options), e.weight});
    } catch (const peft::Error& error) {
      if (error.code() != PEFT_ERR_UNRESOLVED_KEY && error.code() != PEFT_ERR_SHAPE_MISMATCH) throw;
      unresolved = unresolved || error.code() == PEFT_ERR_UNRESOLVED_KEY;
      problems.push_back(error.what());
    }
  }
  if (problems.size() == 1) peft::fail(unresolved ? PEFT_ERR_UNRESOLVED_KEY : PEFT_ERR_SHAPE_MISMATCH, problems[0]);
  if (!problems.empty()) {
    std::string message = std::to_string(problems.size()) + " adapters do not fit the base: ";
    for (size_t i = 0; i < problems.size(); ++i) message += (i ? " | " : "") + problems[i];
    peft::fail(unresolved ? PEFT_ERR_UNRESOLVED_KEY : PEFT_ERR_SHAPE_MISMATCH, message);
  }
  return inputs;
}

}  // namespace

struct peft_merge_options {
  std::vector<AdapterEntry> adapters;
  std::optional<peft::DType> dtype;
  uint64_t max_shard_size = 0;
  uint32_t threads = 0;
  peft_progress_fn progress = nullptr;
  void* progress_user = nullptr;
  bool require_config = true;
  bool allow_nonfinite = false;
};

struct peft_merge_result {
  peft::CheckpointMergeResult impl;
};

struct peft_merge_buffer_options {
  double weight = 1.0;
  bool keep_original_rows = false;
  uint32_t threads = 0;
  std::optional<peft::Translator> translator;
};

struct peft_merge_record {
  peft::BufferMerge record;
  std::string module;
  peft::DType dtype = peft::DType::F32;
  peft::DType bias_dtype = peft::DType::F32;
  int64_t rows = 0, cols = 0, bias_elements = 0;
  bool has_bias = false;
};

extern "C" {

// ---- checkpoint merge ----------------------------------------------------------------------------

peft_error* peft_merge_options_new(peft_merge_options** out) {
  return guarded([&] {
    require_arg(out, "out");
    *out = new peft_merge_options();
  });
}

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
  return guarded([&] {
    require_arg(opts, "opts");
    if (dtype == PEFT_MERGE_DTYPE_KEEP) {
      opts->dtype.reset();
    } else if (dtype == PEFT_DTYPE_F32 || dtype == PEFT_DTYPE_BF16 || dtype == PEFT_DTYPE_F16) {
      opts->dtype = static_cast<peft::DType>(dtype);
    } else {
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the merge output dtype must be PEFT_MERGE_DTYPE_KEEP, F32, BF16 or "
                                            "F16, not " + std::to_string(dtype));
    }
  });
}

peft_error* peft_merge_options_set_max_shard_size(peft_merge_options* opts, uint64_t max_shard_size) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->max_shard_size = max_shard_size;
  });
}

peft_error* peft_merge_options_set_threads(peft_merge_options* opts, uint32_t threads) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->threads = threads;
  });
}

peft_error* peft_merge_options_set_require_config(peft_merge_options* opts, int32_t require) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->require_config = require != 0;
  });
}

peft_error* peft_merge_options_set_allow_nonfinite(peft_merge_options* opts, int32_t allow) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->allow_nonfinite = allow != 0;
  });
}

peft_error* peft_merge_options_set_progress(peft_merge_options* opts, peft_progress_fn fn, void* user_data) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->progress = fn;
    opts->progress_user = user_data;
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
    peft::CheckpointMergeOptions options;
    options.adapters = open_inputs(opts->adapters, base_dir);
    options.dtype = opts->dtype;
    options.max_shard_size = opts->max_shard_size;
    options.threads = opts->threads;
    options.require_config = opts->require_config;
    options.allow_nonfinite = opts->allow_nonfinite;
    if (opts->progress) {
      const peft_progress_fn fn = opts->progress;
      void* user = opts->progress_user;
      options.progress = [fn, user](uint64_t done, uint64_t total) { return fn(user, done, total) == 0; };
    }
    peft::CheckpointMergeResult r = peft::merge_checkpoint(base_dir, out_dir, options);
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

// ---- buffer merge --------------------------------------------------------------------------------

peft_error* peft_merge_buffer_options_new(peft_merge_buffer_options** out) {
  return guarded([&] {
    require_arg(out, "out");
    *out = new peft_merge_buffer_options();
  });
}

void peft_merge_buffer_options_free(peft_merge_buffer_options* opts) { delete opts; }

peft_error* peft_merge_buffer_options_set_weight(peft_merge_buffer_options* opts, double weight) {
  return guarded([&] {
    require_arg(opts, "opts");
    require_finite(weight);
    opts->weight = weight;
  });
}

peft_error* peft_merge_buffer_options_set_keep_original_rows(peft_merge_buffer_options* opts, int32_t keep) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->keep_original_rows = keep != 0;
  });
}

peft_error* peft_merge_buffer_options_set_threads(peft_merge_buffer_options* opts, uint32_t threads) {
  return guarded([&] {
    require_arg(opts, "opts");
    opts->threads = threads;
  });
}

peft_error* peft_merge_buffer_options_set_translator(peft_merge_buffer_options* opts,
                                                     const peft_translator* translator) {
  return guarded([&] {
    require_arg(opts, "opts");
    if (translator == nullptr)
      opts->translator.reset();
    else
      opts->translator.emplace(translator->impl);
  });
}

peft_error* peft_merge_buffer_apply(const peft_adapter* adapter, const char* name, void* data, int32_t dtype,
                                    const uint64_t* shape, size_t ndim, void* bias, int32_t bias_dtype,
                                    const peft_merge_buffer_options* opts, peft_merge_record** out) {
  return guarded([&] {
    require_arg(adapter, "adapter");
    require_arg(name, "name");
    require_arg(data, "data");
    require_arg(out, "out");
    if (ndim > 0) require_arg(shape, "shape");
    const peft_merge_buffer_options defaults;
    const peft_merge_buffer_options& o = opts ? *opts : defaults;
    const peft::DType weight_dtype = buffer_dtype(dtype, "weight");
    std::vector<int64_t> dims;
    for (size_t i = 0; i < ndim; ++i) {
      if (shape[i] == 0 || shape[i] > static_cast<uint64_t>(INT64_MAX))
        peft::fail(PEFT_ERR_SHAPE_MISMATCH, "weight dimension " + std::to_string(i) + " is " + std::to_string(shape[i]));
      dims.push_back(static_cast<int64_t>(shape[i]));
    }
    const peft::AdapterModule& module =
        peft::find_lora_module(*adapter->impl, name, o.translator ? &*o.translator : nullptr);
    peft::BufferMergeModule im = peft::buffer_merge_module(adapter->impl, module, dims);

    auto record = std::make_unique<peft_merge_record>();
    record->module = module.name;
    record->dtype = weight_dtype;
    record->rows = im.layout.rows();
    record->cols = im.layout.cols();
    peft::merge::WeightView weight{data, weight_dtype, record->rows, record->cols};
    std::optional<peft::merge::WeightView> bias_view;
    if (im.lora_bias != nullptr) {
      if (bias == nullptr)
        peft::fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(module.name) +
                                                  " has a lora_B.bias: pass the layer's bias buffer");
      record->has_bias = true;
      record->bias_dtype = buffer_dtype(bias_dtype, "bias");
      record->bias_elements = im.layout.out;
      bias_view = peft::merge::WeightView{bias, record->bias_dtype, 1, record->bias_elements};
    }
    peft::BufferMergeOptions options;
    options.weight = o.weight;
    options.keep_original_rows = o.keep_original_rows;
    options.threads = o.threads;
    record->record = peft::BufferMerge::apply(weight, bias_view ? &*bias_view : nullptr, im, options);
    *out = record.release();
  });
}

peft_error* peft_merge_buffer_remove(peft_merge_record* record, void* data, void* bias) {
  return guarded([&] {
    require_arg(record, "record");
    require_arg(data, "data");
    if (!record->record.active())
      peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the merge of " + peft::quoted(record->module) + " was already removed");
    peft::merge::WeightView weight{data, record->dtype, record->rows, record->cols};
    std::optional<peft::merge::WeightView> bias_view;
    if (record->has_bias) {
      if (bias == nullptr)
        peft::fail(PEFT_ERR_INVALID_ARGUMENT, "the merge of " + peft::quoted(record->module) +
                                                  " changed a bias: pass the bias buffer");
      bias_view = peft::merge::WeightView{bias, record->bias_dtype, 1, record->bias_elements};
    }
    record->record.remove(weight, bias_view ? &*bias_view : nullptr);
  });
}

void peft_merge_record_free(peft_merge_record* record) { delete record; }

const char* peft_merge_record_module(const peft_merge_record* record) {
  return record ? record->module.c_str() : nullptr;
}

int32_t peft_merge_record_active(const peft_merge_record* record) {
  return record && record->record.active() ? 1 : 0;
}

uint64_t peft_merge_record_saved_bytes(const peft_merge_record* record) {
  return record ? record->record.saved_bytes() : 0;
}

}  // extern "C"
