// What a transformers checkpoint folder looks like, the one statement of it for reading, writing
// and merging: the entry points (model.safetensors, or model.safetensors.index.json and the shards
// it names), save_pretrained's shard split and shard names, the index file read and written
// (`model.safetensors.index.json` as transformers v4 writes it), the names an older layout may have
// left behind, and the rule for which files a folder may lead to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace peft {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr std::string_view kWeightFileSuffix = ".safetensors";

// ---- shards as save_pretrained lays them out --------------------------------------------------

// huggingface_hub's split_state_dict_into_shards_factory on sizes alone: a tensor larger than
// `max_size` gets a shard of its own (appended at once, before the shard being filled); otherwise a
// new shard starts when the current one would exceed `max_size`. `breaks` (sorted) force a new
// shard before those indices. Returns the shards' members in order; no shard is empty.
std::vector<std::vector<size_t>> split_into_shards(const std::vector<uint64_t>& sizes, uint64_t max_size,
                                                   const std::vector<size_t>& breaks = {});

// "model-00001-of-00003.safetensors", or "model.safetensors" when there is one shard.
std::string shard_file_name(size_t index, size_t count);

// One weight file of save_pretrained's layout: its name and the tensors it holds (indices).
struct ShardFile {
  std::string name;
  std::vector<size_t> members;
};

// The weight files save_pretrained writes for tensors of these sizes: split_into_shards, named by
// shard_file_name; one model.safetensors (perhaps empty) when everything fits in one. The folder
// has an index exactly when there is more than one file.
std::vector<ShardFile> save_pretrained_shards(const std::vector<uint64_t>& sizes, uint64_t max_size,
                                              const std::vector<size_t>& breaks = {});

// ---- weight file names of this library's writes -----------------------------------------------

// `name` with a per-write token before ".safetensors" (or at the end for another suffix):
// "model-00001-of-00002.peft-Ab3dE9xZ.safetensors", the name of a shard whose planned name is taken.
std::string weight_name_with_token(const std::string& name, const std::string& token);

// model-DDDDD-of-DDDDD.safetensors.
bool is_numbered_shard_name(const std::string& name);
// Any name with a per-write token (".peft-XXXXXXXX.safetensors").
bool is_tokenized_weight_name(const std::string& name);
// A file of a checkpoint's weight layout that a write replacing the folder removes when it does not
// write it again: either entry point, numbered and tokenized shard names.
bool is_layout_file_name(const std::string& name);

// ---- the index ---------------------------------------------------------------------------------

struct ShardIndex {
  // tensor name -> shard name, as listed (a name repeated in the JSON keeps its last value, as
  // Python's json does).
  std::vector<std::pair<std::string, std::string>> weight_map;
  // Distinct shard names sorted by bytes: the order transformers opens them in.
  std::vector<std::string> shards;
  // The "metadata" object as compact JSON, keys in file order; nullopt when absent.
  std::optional<std::string> metadata_json;
};

// Reads and checks an index file. PEFT_ERR_INVALID_CHECKPOINT for bad JSON, a missing or non-object
// `weight_map`, a non-object `metadata`, an empty map, or a shard name that is not a relative path
// of plain components (absolute, empty, "." or ".." components, NUL bytes); PEFT_ERR_IO if unreadable.
ShardIndex read_shard_index(const std::string& index_path);
// The same checks on the text of an index; `index_path` names it in messages.
ShardIndex parse_shard_index(std::string_view text, const std::string& index_path);

// The text of an index as transformers writes it: {"metadata": ..., "weight_map": ...} through
// json.dumps(indent=2, sort_keys=True) plus a newline. `metadata_json` is a JSON object (anything
// else counts as {}); its "total_size" is set to `total_size`. `weight_map` maps tensor to shard.
std::string index_file_text(const std::string& metadata_json, uint64_t total_size,
                            const std::vector<std::pair<std::string, std::string>>& weight_map);

// ---- which files a folder may lead to ---------------------------------------------------------

// The real path of file `name` in `folder` after resolving symbolic links: the one rule for every
// file read from a model folder (shards, config.json, tokenizer files). It must exist and lie inside
// the real path of `folder` or, when `folder` is a snapshot of the Hugging Face hub cache
// (<cache>/models--org--name/snapshots/<revision>, whose files link to ../../blobs/<hash>), inside
// that repository's folder <cache>/models--org--name. PEFT_ERR_INVALID_CHECKPOINT naming the file
// (described as `what`) and where it leads otherwise; PEFT_ERR_IO when it cannot be resolved. In a
// hub snapshot, a file that is missing or links to a missing blob is an incomplete download:
// PEFT_ERR_NOT_FOUND (hub_cache.hpp's fail_missing_from_snapshot).
std::string resolve_in_folder(const std::string& folder, const std::string& name, const std::string& what);

// resolve_in_folder() for a shard named by the index.
std::string resolve_shard(const std::string& folder, const std::string& name);

}  // namespace peft
