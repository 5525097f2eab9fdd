#include "peft/export/adapter_export.hpp"

#include <cmath>
#include <filesystem>
#include <system_error>

#include "core/atomic_file.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "core/file_identity.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"
#include "peft/arch/key_grammar.hpp"
#include "safetensors/writer.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

void prepare_folder(const std::string& out_dir) {
  if (out_dir.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output folder path is empty");
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the output path " + peft::quoted(out_dir) + " exists and is not a folder");
  fs::create_directories(out_dir, ec);
  if (ec) fail(PEFT_ERR_IO, "cannot create the output folder " + peft::quoted(out_dir) + ": " + ec.message());
  if (!fs::is_directory(out_dir, ec))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the output path " + peft::quoted(out_dir) + " exists and is not a folder");
}

// Only the ordinary float formats are converted (as peftc convert does): F8 tensors hold quantized
// data with scales of their own, and integers are not floats.
DType output_dtype(DType source, const std::optional<DType>& wanted) {
  const bool ordinary_float =
      source == DType::F64 || source == DType::F32 || source == DType::F16 || source == DType::BF16;
  return wanted && ordinary_float ? *wanted : source;
}

}  // namespace

std::string peft_saved_key(const std::string& module, const std::string& suffix) {
  return std::string(kPeftPrefix) + module + "." + suffix;
}

void write_adapter_folder(const std::string& out_dir, const nlohmann::ordered_json& config,
                          const std::vector<OutputTensor>& tensors, const std::optional<DType>& dtype) {
  if (dtype && *dtype != DType::F32 && *dtype != DType::BF16 && *dtype != DType::F16)
    fail(PEFT_ERR_INVALID_ARGUMENT, "adapters are exported as F32, BF16 or F16, not " + std::string(dtype_name(*dtype)));
  // Serialise first: a config that cannot be written must fail before anything touches the disk.
  const std::string config_text = python_json_dumps(config);
  prepare_folder(out_dir);
  const fs::path folder(out_dir);

  FileWriter writer((folder / kAdapterWeightsName).string());
  writer.set_metadata("format", "pt");  // PEFT's safe_save_file(..., metadata={"format": "pt"})
  for (const OutputTensor& t : tensors) writer.add_tensor(t.key, output_dtype(t.dtype, dtype), t.shape);
  writer.start();
  for (size_t position = 0; position < writer.tensor_count(); ++position) {
    const OutputTensor& t = tensors[writer.declaration_at(position)];
    t.write(writer, t.key);
  }
  // Both files complete on disk before either replaces an old one; the config goes last, so a
  // folder never pairs a new config with old weights.
  std::unique_ptr<AtomicFile> config_file = stage_text_file((folder / kAdapterConfigName).string(), config_text);
  writer.finish();
  config_file->commit();
}

void require_finite_output(const std::string& key, const std::vector<float>& values, DType dtype, bool computed) {
  for (const float v : values) {
    const float stored = dtype == DType::F16 ? f16_to_f32(f32_to_f16(v)) : dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
    if (std::isfinite(stored) || (!computed && !std::isfinite(v))) continue;
    fail(PEFT_ERR_NON_FINITE, "tensor " + peft::quoted(key) + " holds " + python_float_repr(v) +
                                  (std::isfinite(v) ? ", which is not finite in " + std::string(dtype_name(dtype)) : std::string()) +
                                  "; nothing was written");
  }
}

namespace {

// Export re-saves LoRA adapters (for a PEFT release, in another dtype); the config it writes is a
// LoraConfig's. Other methods are refused by name, pointing to the conversion where one exists.
void require_lora(const Adapter& adapter, const std::string& what) {
  const MethodRow& row = method_row(adapter.config().method);
  if (row.effect == MethodEffect::lora) return;
  const std::string name = row.peft_type;
  std::string message = what + " is a " + name + " adapter; adapter export writes LoRA adapters only (a PEFT " +
                        "release's LoraConfig, another dtype, GGUF); " +
                        (row.effect == MethodEffect::replacement ? name + " " : std::string()) + row.export_hint;
  fail(PEFT_ERR_UNSUPPORTED, message);
}

}  // namespace

void export_adapter(const Adapter& adapter, const std::string& out_dir, const ExportOptions& options) {
  const std::string what = "adapter " + peft::quoted(adapter.dir());
  require_lora(adapter, what);
  refuse_output_over_inputs(out_dir, {{"the adapter folder", adapter.dir()}, {"the base model folder", adapter.base_dir()}});
  std::vector<ExportedModule> lora_modules;
  std::vector<OutputTensor> tensors;
  const Checkpoint& checkpoint = adapter.checkpoint();
  for (const AdapterModule& m : adapter.modules()) {
    if (m.is_lora())
      lora_modules.push_back({m.expert ? m.expert->module + "." + m.expert->param : m.name, m.rank, m.alpha,
                              m.expert.has_value()});
    for (const AdapterTensor& t : m.tensors) {
      const TensorInfo& info = checkpoint.tensor(t.index);
      OutputTensor out;
      out.key = peft_saved_key(m.name, t.suffix);
      out.dtype = info.dtype;
      out.shape = info.shape;
      const size_t index = t.index;
      if (options.dtype && *options.dtype != info.dtype && is_float(info.dtype))
        require_finite_output(out.key, checkpoint.read_f32(index), *options.dtype, false);
      out.write = [&checkpoint, index](TensorWriter& writer, const std::string& key) {
        writer.write_from_checkpoint(key, checkpoint, index);
      };
      tensors.push_back(std::move(out));
    }
  }
  const nlohmann::ordered_json config =
      export_config(adapter.config().document, lora_modules, options.peft_version, what);
  write_adapter_folder(out_dir, config, tensors, options.dtype);
}

}  // namespace peft
