// The index of a sharded checkpoint, `model.safetensors.index.json`: which shard holds which tensor,
// plus free-form metadata. Shard names are confined to the checkpoint's folder.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace peft {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kSingleFileName = "model.safetensors";

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

// `folder` joined with `name` the way paths are shown to users ("dir/name", one separator).
std::string join_path(const std::string& folder, const std::string& name);

// The real path of file `name` in `folder` after resolving symbolic links: the one rule for every
// file read from a model folder (shards, config.json, tokenizer files). It must exist and lie inside
// the real path of `folder` or, when `folder` is a snapshot of the Hugging Face hub cache
// (<cache>/models--org--name/snapshots/<revision>, whose files link to ../../blobs/<hash>), inside
// that repository's folder <cache>/models--org--name. PEFT_ERR_INVALID_CHECKPOINT naming the file
// (described as `what`) and where it leads otherwise; PEFT_ERR_IO when it cannot be resolved.
std::string resolve_in_folder(const std::string& folder, const std::string& name, const std::string& what);

// resolve_in_folder() for a shard named by the index.
std::string resolve_shard(const std::string& folder, const std::string& name);

}  // namespace peft
