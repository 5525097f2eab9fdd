#include "safetensors/sharded_writer.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "safetensors/json_writer.hpp"
#include "safetensors/utf8.hpp"

namespace peft {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string join(const std::string& folder, const std::string& name) {
  if (folder.empty()) return name;
  return folder.back() == '/' ? folder + name : folder + "/" + name;
}

// model-DDDDD-of-DDDDD.safetensors: the names huggingface_hub and transformers clean up.
bool is_shard_name(const std::string& name) {
  static constexpr std::string_view kPrefix = "model-", kMiddle = "-of-", kSuffix = ".safetensors";
  if (name.size() != kPrefix.size() + 5 + kMiddle.size() + 5 + kSuffix.size()) return false;
  const auto digits = [&](size_t at) {
    return std::all_of(name.begin() + at, name.begin() + at + 5, [](char c) { return c >= '0' && c <= '9'; });
  };
  size_t at = 0;
  if (name.compare(at, kPrefix.size(), kPrefix) != 0) return false;
  at += kPrefix.size();
  if (!digits(at)) return false;
  at += 5;
  if (name.compare(at, kMiddle.size(), kMiddle) != 0) return false;
  at += kMiddle.size();
  if (!digits(at)) return false;
  at += 5;
  return name.compare(at, kSuffix.size(), kSuffix) == 0;
}

}  // namespace

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
  if (count == 1) return kSingleFile;
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

ShardedWriter::ShardedWriter(std::string folder, uint64_t max_shard_size)
    : TensorWriter(WriterMetadata(std::map<std::string, std::string>{{"format", "pt"}})),
      folder_(std::move(folder)),
      max_shard_size_(max_shard_size == 0 ? std::numeric_limits<uint64_t>::max() : max_shard_size) {
  if (folder_.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output folder must not be empty");
}

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

std::vector<std::string> ShardedWriter::shard_names() const { return names_; }

std::vector<OutputSpec> ShardedWriter::plan_outputs(const std::vector<TensorDecl>& decls) {
  std::vector<uint64_t> sizes;
  sizes.reserve(decls.size());
  for (const TensorDecl& d : decls) sizes.push_back(d.nbytes);
  std::vector<std::vector<size_t>> shards = split_into_shards(sizes, max_shard_size_, breaks_);
  if (shards.empty()) shards.emplace_back();  // no tensors: one model.safetensors with the metadata
  std::vector<OutputSpec> specs;
  std::vector<std::string> names;
  for (size_t k = 0; k < shards.size(); ++k) {
    names.push_back(shard_file_name(k, shards.size()));
    OutputSpec spec;
    spec.path = join(folder_, names.back());
    spec.members = std::move(shards[k]);
    spec.metadata = metadata();
    specs.push_back(std::move(spec));
  }
  names_ = std::move(names);
  return specs;
}

void ShardedWriter::prepare_outputs() {
  std::error_code error;
  std::filesystem::create_directories(folder_, error);
  if (error) fail(PEFT_ERR_IO, "cannot create the folder " + peft::quoted(folder_) + ": " + error.message());
}

std::vector<std::unique_ptr<AtomicFile>> ShardedWriter::make_extra_files() {
  std::vector<std::unique_ptr<AtomicFile>> extras;
  if (names_.size() < 2) return extras;
  nlohmann::json index_metadata = nlohmann::json::parse(index_metadata_json_);
  uint64_t total = 0;
  for (const TensorDecl& d : declarations()) total += d.nbytes;  // fits: every file's data size did
  index_metadata["total_size"] = total;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < outputs().size(); ++k) {
    for (size_t d : outputs()[k].layout.order) weight_map[declarations()[d].name] = names_[k];
  }
  nlohmann::json index = {{"metadata", std::move(index_metadata)}, {"weight_map", std::move(weight_map)}};
  const std::string text = json::python_dumps_indent2_sorted(index) + "\n";
  auto file = std::make_unique<AtomicFile>(join(folder_, kIndexFile));
  file->write(text.data(), text.size());
  file->flush_and_close();
  extras.push_back(std::move(file));
  return extras;
}

void ShardedWriter::after_commit() noexcept {
  try {
    std::set<std::string> keep(names_.begin(), names_.end());
    if (names_.size() > 1) keep.insert(kIndexFile);
    std::vector<std::string> stale;
    if (DIR* dir = ::opendir(folder_.c_str())) {
      while (const dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        const bool ours = is_shard_name(name) || name == kSingleFile || name == kIndexFile;
        if (ours && keep.count(name) == 0) stale.push_back(name);
      }
      ::closedir(dir);
    }
    for (const std::string& name : stale) ::unlink(join(folder_, name).c_str());
    if (!stale.empty()) sync_directory(folder_);
  } catch (...) {
    // Cleaning an older layout is best effort: the new checkpoint is complete either way.
  }
}

}  // namespace peft
