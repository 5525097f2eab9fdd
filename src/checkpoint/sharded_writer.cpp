#include "checkpoint/sharded_writer.hpp"

#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/utf8.hpp"
#include "checkpoint/checkpoint_layout.hpp"

namespace peft {
ShardedWriter::ShardedWriter(std::string folder, uint64_t max_shard_size)
    : CheckpointFolderWriter(std::move(folder), WriterMetadata(std::map<std::string, std::string>{{"format", "pt"}}), {}),
      max_shard_size_(max_shard_size == 0 ? std::numeric_limits<uint64_t>::max() : max_shard_size) {}

void ShardedWriter::break_shard() {
  if (started()) fail(PEFT_ERR_INVALID_ARGUMENT, "cannot break a shard once writing has started");
  const size_t at = tensor_count();
  if (breaks_.empty() || breaks_.back() != at) breaks_.push_back(at);
}

void ShardedWriter::set_index_metadata_json(const std::string& json_object) {
  if (started()) fail(PEFT_ERR_INVALID_ARGUMENT, "cannot change the index metadata once writing has started");
  if (!is_valid_utf8(json_object)) fail(PEFT_ERR_INVALID_ARGUMENT, "the index metadata is not valid UTF-8");
  const nlohmann::json parsed = parse_json(json_object, PEFT_ERR_INVALID_ARGUMENT, "the index metadata");
  if (!parsed.is_object()) fail(PEFT_ERR_INVALID_ARGUMENT, "the index metadata must be a JSON object");
  index_metadata_json_ = json_object;
}

FolderLayout ShardedWriter::plan_layout(const std::vector<TensorDecl>& decls) {
  std::vector<uint64_t> sizes;
  sizes.reserve(decls.size());
  for (const TensorDecl& d : decls) sizes.push_back(d.nbytes);
  FolderLayout layout;
  for (ShardFile& shard : save_pretrained_shards(sizes, max_shard_size_, breaks_))
    layout.files.push_back({std::move(shard.name), std::move(shard.members), metadata()});
  layout.write_index = layout.files.size() > 1;
  layout.index_metadata_json = index_metadata_json_;
  return layout;
}

}  // namespace peft
