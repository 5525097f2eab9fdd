#include "safetensors/sharded_writer.hpp"

#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "safetensors/json_writer.hpp"
#include "safetensors/shard_index.hpp"
#include "safetensors/utf8.hpp"

namespace peft {
std::vector<std::vector<size_t>> split_into_shards(const std::vector<uint64_t>& sizes, uint64_t max_size,
                                                   const std::vector<size_t>& breaks) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  size_t next_break = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    while (next_break < breaks.size() && breaks[next_break] < i) ++next_break;
    if (next_break < breaks.size() && breaks[next_break] == i && !current.empty()) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    const uint64_t size = sizes[i];
    if (size > max_size) {  // its own shard, placed before the one being filled
      shards.push_back({i});
      continue;
    }
    if (current_size + size > max_size) {  // both <= max_size, so the sum cannot overflow
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += size;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_file_name(size_t index, size_t count) {
  if (count == 1) return kSingleFileName;
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

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
  std::vector<std::vector<size_t>> shards = split_into_shards(sizes, max_shard_size_, breaks_);
  if (shards.empty()) shards.emplace_back();  // no tensors: one model.safetensors with the metadata
  FolderLayout layout;
  for (size_t k = 0; k < shards.size(); ++k)
    layout.files.push_back({shard_file_name(k, shards.size()), std::move(shards[k]), metadata()});
  layout.write_index = shards.size() > 1;
  layout.index_metadata_json = index_metadata_json_;
  return layout;
}

}  // namespace peft
