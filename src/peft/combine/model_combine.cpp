#include "peft/combine/model_combine.hpp"

#include <cmath>
#include <filesystem>
#include <optional>

#include "checkpoint/hub_cache.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/text.hpp"
#include "gguf/gguf_file.hpp"
#include "peft/combine/gguf_model_combine.hpp"
#include "peft/base/base_model.hpp"
#include "peft/merge/folder_files.hpp"
#include "peft/merge/merge_plan.hpp"
#include "peft/merge/merged_folder_writer.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

bool combinable(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16 || d == DType::F64; }

struct Model {
  std::string dir;
  BaseModel model;
};

// The combined values of `p`, in f32, slice by slice to `emit`.
void combine_tensor(const MergePlan& plan, const PlannedTensor& p, const std::vector<Model>& models,
                    std::span<const double> weights, const merge::TaskSettings& task, bool allow_nonfinite,
                    const std::function<void(const float*, size_t)>& emit) {
  const Checkpoint& base = *plan.base.weights;
  std::vector<CombineInput> inputs;
  for (const Model& m : models) inputs.push_back(model_tensor(*m.model.weights, m.dir, base.tensor(p.base_index)));
  combine_tensor_slices({&base, p.base_index}, inputs, weights, task, p.name, allow_nonfinite, emit);
}

}  // namespace

CheckpointMergeResult combine_models(const std::string& base_location, std::span<const std::string> model_dirs,
                                     std::span<const double> weights, CombineMethod method,
                                     const CombineSettings& settings, const std::string& out_dir,
                                     const ModelCombineOptions& options) {
  if (model_dirs.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "combining models: no models given");
  if (weights.size() != model_dirs.size())
    fail(PEFT_ERR_INVALID_ARGUMENT, "combining models: " + std::to_string(model_dirs.size()) + " models but " +
                                        std::to_string(weights.size()) + " weights");
  for (size_t i = 0; i < weights.size(); ++i)
    if (!std::isfinite(weights[i]))
      fail(PEFT_ERR_INVALID_ARGUMENT, "combining models: the weight of model #" + std::to_string(i) + " is not finite");
  if (!is_task_arithmetic(method))
    fail(PEFT_ERR_INVALID_ARGUMENT, "combining models takes linear, ties, dare_linear, dare_ties or magnitude_prune");
  const merge::TaskSettings task = task_settings_of(method, settings, "combining models");
  if (out_dir.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output must not be empty");
  if (is_gguf_path(base_location)) return combine_gguf_models(base_location, model_dirs, weights, task, out_dir, options);
  const std::string base_dir = resolve_model_location(base_location);
  std::vector<Model> models;
  std::vector<JobInput> inputs{{"the base model folder", base_dir}};
  for (const std::string& location : model_dirs) {
    const std::string dir = resolve_model_location(location);
    models.push_back({dir, BaseModel::open(dir, {})});
    inputs.push_back({"an input model folder", dir});
  }
  refuse_output_over_inputs(out_dir, inputs);

  MergePlanOptions plan_options;
  plan_options.dtype = options.dtype;
  plan_options.max_shard_size = options.max_shard_size;
  plan_options.base_only = true;
  MergePlan plan = plan_merge(base_dir, {}, plan_options);
  if (plan.quantization.method != BaseQuantMethod::none || plan.bnb)
    fail(PEFT_ERR_UNSUPPORTED, "combining models: the base " + peft::quoted(base_dir) + " is quantized (" +
                                   plan.quantization.quant_method + "); task arithmetic needs plain float weights");
  std::vector<FolderFile> folder_files =
      plan_folder_files(base_dir, plan.base.config, std::string(), plan.dtype, options.require_config);
  std::error_code ec;
  const bool created = !fs::exists(out_dir, ec);
  MergedFolderWriter writer(out_dir, plan, std::move(folder_files));
  CheckpointMergeResult result;
  try {
    writer.start();
    const uint64_t total = plan.total_bytes();
    uint64_t done = 0;
    for (size_t pos = 0; pos < writer.tensor_count(); ++pos) {
      const PlannedTensor& p = plan.tensors[writer.declaration_at(pos)];
      if (combinable(p.base_dtype)) {
        writer.begin_tensor(p.name, DType::F32);
        combine_tensor(plan, p, models, weights, task, options.allow_nonfinite, [&](const float* values, size_t count) {
          writer.write(values, count * sizeof(float));
        });
        ++result.merged;
      } else {
        writer.write_from_checkpoint(p.name, *plan.base.weights, p.base_index);
        ++result.copied;
      }
      done += p.out_nbytes;
      if (options.progress && !options.progress(done, total))
        fail(PEFT_ERR_CANCELLED, "combining models was cancelled by its progress callback");
    }
    writer.finish();
    result.bytes = total;
  } catch (...) {
    writer.abort();
    if (created) fs::remove(out_dir, ec);  // only removes a folder that is still empty
    throw;
  }
  result.files = writer.written_names();
  return result;
}

}  // namespace peft
