#include "peft/combine/gguf_model_combine.hpp"

#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/quant/ggml_types.hpp"
#include "core/shape.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"
#include "gguf/gguf_writer.hpp"
#include "peft/base/gguf_base.hpp"

namespace peft {
namespace {

struct Input {
  std::string path;
  std::shared_ptr<const Checkpoint> file;
};

Input open_model(const std::string& path, const char* what) {
  Input in{path, Checkpoint::open(path)};
  if (in.file->file_count() != 1 || in.file->gguf_header(0) == nullptr)
    fail(PEFT_ERR_UNSUPPORTED, std::string(what) + " " + peft::quoted(path) + " is " +
                                   (in.file->gguf_header(0) ? "a GGUF model split into parts; join it first "
                                                              "(llama-gguf-split --merge)"
                                                            : "not a GGUF file, as the base is"));
  require_gguf_model(*in.file->gguf_header(0), path);
  return in;
}

// A float tensor: a plain float type or a block type with both kernels. Integer tensors are copied.
bool is_float_type(uint32_t type) {
  if (const std::optional<DType> plain = dtype_of_ggml(type)) return is_float(*plain);
  return true;
}

}  // namespace

CheckpointMergeResult combine_gguf_models(const std::string& base_path, std::span<const std::string> model_paths,
                                          std::span<const double> weights, const merge::TaskSettings& task,
                                          const std::string& out_path, const ModelCombineOptions& options) {
  if (options.dtype || options.max_shard_size != 0)
    fail(PEFT_ERR_INVALID_ARGUMENT, "combining GGUF models: the output keeps each tensor's type and is one file, so a "
                                    "dtype or a shard size does not apply");
  const Input base = open_model(base_path, "the base");
  std::vector<Input> models;
  std::vector<JobInput> inputs{{"the base model", base_path}};
  for (const std::string& path : model_paths) {
    models.push_back(open_model(path, "the model"));
    inputs.push_back({"an input model", path});
  }
  refuse_output_over_inputs(out_path, inputs);

  GgufWriter writer(out_path);
  writer.declare(*base.file->gguf_header(0));
  CheckpointMergeResult result;
  const uint64_t total = writer.data_size();
  uint64_t done = 0;
  writer.start();
  for (size_t i = 0; i < base.file->tensor_count(); ++i) {
    const TensorInfo& info = base.file->tensor(i);
    const auto type = static_cast<uint32_t>(info.ggml_type);
    if (!is_float_type(type)) {
      std::vector<uint8_t> bytes(info.nbytes());
      base.file->read_bytes(i, 0, bytes.data(), bytes.size());
      writer.write_tensor(info.name, bytes.data(), bytes.size());
      ++result.copied;
    } else {
      const std::optional<GgmlType> row = ggml_type(type);
      if (!row || !row->to_float || !row->from_float)
        fail(PEFT_ERR_UNSUPPORTED, "tensor " + quoted_name(info.name) + " of the base is " +
                                       (row ? std::string(row->name) : std::to_string(type)) +
                                       ", which cannot be stored again here (" + ggml_quantizable_names() + ")");
      std::vector<CombineInput> inputs;
      for (const Input& m : models) inputs.push_back(model_tensor(*m.file, m.path, info));
      const uint64_t cols = info.shape.empty() ? 1 : info.shape.back();
      std::vector<uint8_t> stored;
      writer.begin_tensor(info.name);
      combine_tensor_slices({base.file.get(), i}, inputs, weights, task, info.name, options.allow_nonfinite,
                            [&](const float* values, size_t count) {
                              stored.resize(ggml_rows_bytes(type, count / cols, cols));
                              quantize_rows(type, values, count / cols, cols, stored.data());
                              writer.write(stored.data(), stored.size());
                            });
      ++result.merged;
    }
    done += info.nbytes();
    if (options.progress && !options.progress(done, total))
      fail(PEFT_ERR_CANCELLED, "combining models was cancelled by its progress callback");
  }
  writer.finish();
  result.bytes = total;
  result.files = {std::filesystem::path(out_path).filename().string()};
  return result;
}

}  // namespace peft
