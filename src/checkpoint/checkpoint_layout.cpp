#include "checkpoint/checkpoint_layout.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <unordered_set>

#include "core/error.hpp"
#include "core/file_map.hpp"
#include "core/json_parse.hpp"
#include "core/path.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"
#include "checkpoint/hub_cache.hpp"

namespace peft {

namespace {

constexpr std::string_view kTokenMarker = ".peft-";
constexpr size_t kTokenSize = 8;

// Real indexes are a few MB even for the largest models; refuse anything absurd before reading it.
constexpr uint64_t kMaxIndexBytes = uint64_t{256} << 20;

[[noreturn]] void invalid(const std::string& path, const std::string& message) {
  fail(PEFT_ERR_INVALID_CHECKPOINT, path + ": " + message);
}

// A shard name must be a relative path made of plain components; symbolic links are checked later
// against the real folder (resolve_shard).
void check_shard_name(const std::string& index_path, const std::string& tensor, const std::string& name) {
  const std::string where = "weight_map entry " + quoted(tensor) + " names shard " + quoted(name);
  if (name.empty()) invalid(index_path, where + ", an empty name");
  if (name.find('\0') != std::string::npos) invalid(index_path, where + ", which contains a NUL byte");
  if (name.front() == '/') invalid(index_path, where + ", an absolute path outside the folder");
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    const std::string_view part(name.data() + start, end - start);
    if (part == "..") invalid(index_path, where + ", which leaves the folder through \"..\"");
    if (part.empty() || part == ".") invalid(index_path, where + ", which is not a plain relative path");
    start = end + 1;
  }
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
  if (count == 1) return kSingleFileName;
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

std::vector<ShardFile> save_pretrained_shards(const std::vector<uint64_t>& sizes, uint64_t max_size,
                                              const std::vector<size_t>& breaks) {
  std::vector<std::vector<size_t>> shards = split_into_shards(sizes, max_size, breaks);
  if (shards.empty()) shards.emplace_back();  // no tensors: one model.safetensors
  std::vector<ShardFile> files;
  for (size_t k = 0; k < shards.size(); ++k) files.push_back({shard_file_name(k, shards.size()), std::move(shards[k])});
  return files;
}

std::string weight_name_with_token(const std::string& name, const std::string& token) {
  const bool suffixed = name.ends_with(kWeightFileSuffix);
  const std::string stem = suffixed ? name.substr(0, name.size() - kWeightFileSuffix.size()) : name;
  return stem + std::string(kTokenMarker) + token + (suffixed ? std::string(kWeightFileSuffix) : std::string());
}

bool is_numbered_shard_name(const std::string& name) {
  if (name.size() != 32 || !name.starts_with("model-") || !name.ends_with(kWeightFileSuffix)) return false;
  for (size_t i : {6u, 7u, 8u, 9u, 10u, 15u, 16u, 17u, 18u, 19u})
    if (name[i] < '0' || name[i] > '9') return false;
  return name.compare(11, 4, "-of-") == 0;
}

bool is_tokenized_weight_name(const std::string& name) {
  if (!name.ends_with(kWeightFileSuffix) || name.size() < kWeightFileSuffix.size() + kTokenMarker.size() + kTokenSize + 1) return false;
  const size_t token_at = name.size() - kWeightFileSuffix.size() - kTokenSize;
  if (name.compare(token_at - kTokenMarker.size(), kTokenMarker.size(), kTokenMarker) != 0) return false;
  return std::all_of(name.begin() + static_cast<ptrdiff_t>(token_at),
                     name.begin() + static_cast<ptrdiff_t>(token_at + kTokenSize),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; });
}

bool is_layout_file_name(const std::string& name) {
  return name == kSingleFileName || name == kIndexFileName || is_numbered_shard_name(name) || is_tokenized_weight_name(name);
}

ShardIndex read_shard_index(const std::string& index_path) {
  ReadOnlyFile file = ReadOnlyFile::open(index_path);
  if (file.size() > kMaxIndexBytes)
    invalid(index_path, "index is " + std::to_string(file.size()) + " bytes, larger than the " +
                            std::to_string(kMaxIndexBytes) + " accepted");
  std::string text(static_cast<size_t>(file.size()), '\0');
  file.read_exact(0, text.data(), text.size());
  return parse_shard_index(text, index_path);
}

ShardIndex parse_shard_index(std::string_view text, const std::string& index_path) {
  // Nesting bounded: it also bounds the recursion of the serializer used for "metadata" below.
  const nlohmann::ordered_json doc = parse_json_ordered(text, PEFT_ERR_INVALID_CHECKPOINT, index_path);
  if (!doc.is_object()) invalid(index_path, "the index is not a JSON object");

  ShardIndex index;
  std::unordered_set<std::string_view> distinct;  // views into `doc`
  const auto weight_map = doc.find("weight_map");
  if (weight_map == doc.end()) invalid(index_path, "no \"weight_map\"");
  if (!weight_map->is_object()) invalid(index_path, "\"weight_map\" is not an object");
  if (weight_map->empty()) invalid(index_path, "\"weight_map\" names no tensor");
  for (const auto& [tensor, shard] : weight_map->items()) {
    if (!shard.is_string()) invalid(index_path, "weight_map entry " + quoted(tensor) + " is not a file name");
    const std::string& name = shard.get_ref<const std::string&>();
    check_shard_name(index_path, tensor, name);
    index.weight_map.emplace_back(tensor, name);
    if (distinct.insert(name).second) index.shards.push_back(name);
  }
  std::sort(index.shards.begin(), index.shards.end());

  // transformers requires a "metadata" object; we accept its absence but not another type.
  const auto metadata = doc.find("metadata");
  if (metadata != doc.end()) {
    if (!metadata->is_object()) invalid(index_path, "\"metadata\" is not an object");
    index.metadata_json = metadata->dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  }
  return index;
}

std::string index_file_text(const std::string& metadata_json, uint64_t total_size,
                            const std::vector<std::pair<std::string, std::string>>& weight_map) {
  nlohmann::json metadata = nlohmann::json::parse(metadata_json, nullptr, false);
  if (!metadata.is_object()) metadata = nlohmann::json::object();
  metadata["total_size"] = total_size;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [tensor, shard] : weight_map) map[tensor] = shard;
  const nlohmann::json index = {{"metadata", std::move(metadata)}, {"weight_map", std::move(map)}};
  return python_json_dumps(index) + "\n";
}

std::string resolve_in_folder(const std::string& folder, const std::string& name, const std::string& what) {
  namespace fs = std::filesystem;
  const std::string shown = join_path(folder, name);
  std::error_code error;
  const fs::path real_folder = fs::canonical(fs::path(folder), error);
  if (error) fail(PEFT_ERR_IO, folder + ": " + error.message());
  // A snapshot of the hub cache (<cache>/models--org--name/snapshots/<revision>) links its files to
  // ../../blobs/<hash>: the repository's folder is the limit there, and a missing file is a download
  // that did not finish.
  const std::optional<std::string> repository = hub_repository_of_snapshot(real_folder.native());
  const fs::path real = fs::canonical(fs::path(shown), error);
  if (error == std::errc::no_such_file_or_directory) {
    if (repository) fail_missing_from_snapshot(folder, *repository, name, what);
    fail(PEFT_ERR_INVALID_CHECKPOINT, shown + ": " + what + " does not exist");
  }
  if (error) fail(PEFT_ERR_IO, shown + ": " + error.message());
  const fs::path root = repository ? fs::path(*repository) : real_folder;
  // Compare whole components: "/a/bc" is not inside "/a/b".
  std::string prefix = root.native();
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  if (real.native().compare(0, prefix.size(), prefix) != 0)
    fail(PEFT_ERR_INVALID_CHECKPOINT, shown + ": " + what + " resolves to " + real.native() + ", outside the " +
                                          (root == real_folder ? "folder " : "hub cache repository folder ") +
                                          root.native());
  return real.native();
}

std::string resolve_shard(const std::string& folder, const std::string& name) {
  return resolve_in_folder(folder, name, "the shard named by the index");
}

}  // namespace peft
