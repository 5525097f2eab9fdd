#include "peft/merge/folder_files.hpp"

#include <algorithm>
#include <filesystem>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/path.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"
#include "checkpoint/checkpoint_layout.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

// Sets every "dtype"/"torch_dtype" string entry in `value` and its nested objects; true if any changed.
bool set_dtype_entries(nlohmann::json& value, const std::string& name) {
  if (!value.is_object()) return false;
  bool changed = false;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if ((it.key() == "dtype" || it.key() == "torch_dtype") && it->is_string()) {
      if (it->get<std::string>() != name) {
        *it = name;
        changed = true;
      }
    } else if (it->is_object()) {
      changed = set_dtype_entries(*it, name) || changed;
    }
  }
  return changed;
}

bool ends_with_any(const std::string& name, std::initializer_list<const char*> suffixes) {
  return std::any_of(suffixes.begin(), suffixes.end(), [&](const char* s) { return name.ends_with(s); });
}

}  // namespace

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    default: return "";
  }
}

std::optional<std::string> updated_config_text(const nlohmann::json& config, const std::string& untie_key,
                                               std::optional<DType> dtype,
                                               bool dequantized) {
  if (!config.is_object()) return std::nullopt;
  nlohmann::json updated = config;
  bool changed = dequantized && updated.erase("quantization_config") > 0;
  if (!untie_key.empty()) {
    auto it = updated.find(untie_key);
    if (it == updated.end() || !it->is_boolean() || it->get<bool>()) {
      updated[untie_key] = false;
      changed = true;
    }
    // A composite config's text_config holding the key true (the one transformers 4 reads) too.
    if (auto text = updated.find("text_config"); text != updated.end() && text->is_object())
      if (auto nested = text->find(untie_key); nested != text->end() && (!nested->is_boolean() || nested->get<bool>())) {
        *nested = false;
        changed = true;
      }
  }
  if (dtype) {
    const std::string name = torch_dtype_name(*dtype);
    changed = set_dtype_entries(updated, name) || changed;
    if (!updated.contains("dtype") && !updated.contains("torch_dtype")) {
      updated["dtype"] = name;
      changed = true;
    }
  }
  if (!changed) return std::nullopt;
  return python_json_dumps(updated) + "\n";
}

bool is_model_weight_file(const std::string& name) {
  if (name.find(".safetensors") != std::string::npos) return true;  // shards, indexes, adapter weights
  if (name == "adapter_config.json") return true;  // transformers would load the folder as an adapter
  return ends_with_any(name, {".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".bin.index.json",
                              ".h5.index.json", ".msgpack.index.json"});
}

std::vector<FolderFile> plan_folder_files(const std::string& base_dir, const nlohmann::json& config,
                                          const std::string& untie_key,
                                          std::optional<DType> dtype, bool require_config, bool dequantized) {
  std::vector<FolderFile> files;
  std::error_code ec;
  fs::directory_iterator it(base_dir, ec), end;
  if (ec) fail(PEFT_ERR_IO, "cannot list the base model folder " + peft::quoted(base_dir) + ": " + ec.message());
  bool have_config = false;
  for (; it != end; it.increment(ec)) {
    if (ec) fail(PEFT_ERR_IO, "cannot list the base model folder " + peft::quoted(base_dir) + ": " + ec.message());
    const std::string name = it->path().filename().string();
    if (is_model_weight_file(name) || is_atomic_temp_name(name)) continue;
    std::error_code type_error;
    // Links are followed only where the weight files' links may lead (hub caches link to blobs).
    const std::string source = it->is_symlink(type_error) ? resolve_in_folder(base_dir, name, "the file")
                                                          : it->path().string();
    if (!fs::is_regular_file(source, type_error)) {
      if (name == "config.json" && require_config)
        fail(PEFT_ERR_INVALID_CHECKPOINT, join_path(base_dir, name) + " is not a regular file (a folder, a FIFO or "
                                          "a device); the merged model needs its config.json");
      continue;
    }
    FolderFile f;
    f.name = name;
    f.source_path = source;
    if (name == "config.json") {
      f.content = updated_config_text(config, untie_key, dtype, dequantized);
      have_config = true;
    }
    files.push_back(std::move(f));
  }
  if (require_config && !have_config)
    fail(PEFT_ERR_NOT_FOUND, "the base model folder " + peft::quoted(base_dir) +
                                 " has no config.json, so transformers could not load the merged model; "
                                 "merge without it only if the output needs no config (--no-config)");
  std::sort(files.begin(), files.end(), [](const FolderFile& a, const FolderFile& b) { return a.name < b.name; });
  return files;
}

}  // namespace peft
