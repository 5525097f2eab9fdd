// The files of a merged checkpoint folder besides its weights: config.json, updated as transformers
// would write it after the merge, and the base folder's other small files (tokenizer files,
// generation_config.json, README.md, ...) copied as they are.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "checkpoint/folder_writer.hpp"

namespace peft {

// config.json with the key `untie_key` (tie_word_embeddings; "" for none) set to false (at the top level, and in a
// text_config that holds it) and, when `dtype` is set, every
// "dtype" / "torch_dtype" entry (top level and nested sub-configs) set to its torch name
// ("bfloat16"); a config with neither at the top level gets "dtype", as transformers 5 writes it.
// nullopt when nothing changes, so the file can be copied byte for byte; otherwise the text
// transformers writes: json.dumps(config, indent=2, sort_keys=True) + "\n". With
// `dequantized` (a quantized base written dequantized) the top-level quantization_config is removed.
std::optional<std::string> updated_config_text(const nlohmann::json& config, const std::string& untie_key,
                                               std::optional<DType> dtype,
                                               bool dequantized = false);

// The torch name of a floating-point dtype ("float32", "bfloat16", "float16", "float64").
const char* torch_dtype_name(DType dtype);

// Whether a file of a model folder holds weights (safetensors and their index, PyTorch, TF, Flax,
// GGUF and ONNX files) or marks the folder as an adapter (adapter_config.json): never copied.
bool is_model_weight_file(const std::string& name);

// The files to put next to the merged weights: config.json (copied or rewritten) and every other
// regular file directly in `base_dir` that is not a weight file or one of our temporaries.
// Subfolders, FIFOs and other special files are not copied. A symbolic link is followed only
// where resolve_in_folder() allows (inside the folder, or inside a hub cache repository's folder):
// PEFT_ERR_INVALID_CHECKPOINT naming it otherwise, or when it dangles. With `require_config`,
// PEFT_ERR_NOT_FOUND when there is no config.json and PEFT_ERR_INVALID_CHECKPOINT when it is not a
// regular file (a folder, a FIFO). PEFT_ERR_IO if the folder cannot be listed.
std::vector<FolderFile> plan_folder_files(const std::string& base_dir, const nlohmann::json& config,
                                          const std::string& untie_key,
                                          std::optional<DType> dtype, bool require_config, bool dequantized = false);

}  // namespace peft
