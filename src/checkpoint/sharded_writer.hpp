// A writer of a checkpoint folder as transformers' save_pretrained lays it out
// (checkpoint_layout.hpp: huggingface_hub's shard split, `model-00001-of-0000N.safetensors` or one
// `model.safetensors` and no index, the index as transformers v4 writes it), with `{"format":"pt"}`
// metadata on every shard.
//
// The folder is replaced as CheckpointFolderWriter describes (folder_writer.hpp): a shard whose
// name is taken gets a per-write token in its name, and the index is the commit point.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/folder_writer.hpp"

namespace peft {

class ShardedWriter final : public CheckpointFolderWriter {
 public:
  // `max_shard_size` in bytes of tensor data; 0 means no limit (one shard unless break_shard()).
  // The folder is created (with its parents) when writing starts.
  ShardedWriter(std::string folder, uint64_t max_shard_size);

  // Ends the current shard: the next declared tensor starts a new one (to keep a given layout).
  void break_shard();
  // Extra entries of the index's "metadata" object, as a JSON object text (e.g. the source index's
  // metadata); "total_size" is always recomputed. INVALID_ARGUMENT if it is not a JSON object.
  void set_index_metadata_json(const std::string& json_object);

  // The file names chosen for the shards (valid after start()).
  std::vector<std::string> shard_names() const { return weight_names(); }

 protected:
  FolderLayout plan_layout(const std::vector<TensorDecl>& decls) override;

 private:
  uint64_t max_shard_size_;
  std::vector<size_t> breaks_;  // declaration indices that start a new shard
  std::string index_metadata_json_ = "{}";
};

}  // namespace peft
