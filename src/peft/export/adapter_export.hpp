// Writes a loaded adapter as PEFT's `PeftModel.save_pretrained` does, so that PEFT (and anything
// that reads PEFT adapters) loads it unchanged:
// * adapter_model.safetensors: every tensor under "base_model.model." + module + "." + role
//   ("lora_A.weight", "lora_magnitude_vector", "weight", ...), no adapter name, metadata
//   {"format": "pt"}, tensors in the order safetensors' writer uses. The bytes are those of the
//   source, so re-exporting a PEFT-written adapter reproduces its file byte for byte;
// * adapter_config.json: the source's config (unknown fields kept) with inference_mode true,
//   init_lora_weights true where that means the same, written as json.dumps(indent=2,
//   sort_keys=True) does (adapter_export_versions.hpp, core/python_json.hpp).
// Options convert F64/F32/F16/BF16 tensors to F32, BF16 or F16 (integer and F8 tensors are kept),
// and restrict the config to what an older PEFT release knows.
//
// Both files go through temporaries in the output folder (created if needed) and are renamed into
// place only when both are complete, the config last; a failure leaves the folder as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/export/adapter_export_versions.hpp"

namespace peft {

class TensorWriter;

struct ExportOptions {
  std::optional<DType> dtype;               // F32, BF16 or F16 (else INVALID_ARGUMENT)
  std::optional<PeftVersion> peft_version;  // write only the config fields this release knows
};

// One tensor of an adapter folder to write.
struct OutputTensor {
  std::string key;  // the full key, "base_model.model. ..."
  DType dtype = DType::F32;  // the source dtype
  std::vector<uint64_t> shape;
  // Streams the tensor's bytes (in `dtype`) into the writer, whose current tensor it is.
  std::function<void(TensorWriter& writer, const std::string& key)> write;
};

// The file names PEFT uses.
inline constexpr const char* kAdapterWeightsName = "adapter_model.safetensors";
inline constexpr const char* kAdapterConfigName = "adapter_config.json";

// Writes `tensors` and `config` as an adapter folder (see the file comment); F64/F32/F16/BF16
// tensors are converted to `dtype` when given. INVALID_ARGUMENT for an empty or unusable folder path or a
// dtype other than F32/BF16/F16, PEFT_ERR_IO for file system failures.
void write_adapter_folder(const std::string& out_dir, const nlohmann::ordered_json& config,
                          const std::vector<OutputTensor>& tensors, const std::optional<DType>& dtype);

// PEFT_ERR_NON_FINITE naming tensor `key` when one of `values` that is finite is not once stored in
// `dtype` (F32, BF16, F16: 1e5 in F16, say), or, with `computed`, when any value is not finite: the
// rule of the merge for the results of conversions (an extraction, an export to a narrower dtype).
void require_finite_output(const std::string& key, const std::vector<float>& values, DType dtype, bool computed);

// Exports `adapter` into `out_dir`. UNSUPPORTED (naming the field) when the target release cannot
// express the adapter; the errors of write_adapter_folder.
void export_adapter(const Adapter& adapter, const std::string& out_dir, const ExportOptions& options);

// The key PEFT saves for a tensor of `module` with canonical role suffix `suffix`.
std::string peft_saved_key(const std::string& module, const std::string& suffix);

}  // namespace peft
