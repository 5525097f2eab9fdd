#include "safetensors/shard_index.hpp"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <unordered_set>

#include "core/error.hpp"
#include "core/file_map.hpp"
#include "core/json_parse.hpp"
#include "core/text.hpp"

namespace peft {

namespace {

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

std::string join_path(const std::string& folder, const std::string& name) {
  if (folder.empty()) return name;
  return folder.back() == '/' ? folder + name : folder + "/" + name;
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

std::string resolve_in_folder(const std::string& folder, const std::string& name, const std::string& what) {
  namespace fs = std::filesystem;
  const std::string shown = join_path(folder, name);
  std::error_code error;
  const fs::path real_folder = fs::canonical(fs::path(folder), error);
  if (error) fail(PEFT_ERR_IO, folder + ": " + error.message());
  const fs::path real = fs::canonical(fs::path(shown), error);
  if (error == std::errc::no_such_file_or_directory)
    fail(PEFT_ERR_INVALID_CHECKPOINT, shown + ": " + what + " does not exist");
  if (error) fail(PEFT_ERR_IO, shown + ": " + error.message());
  // A snapshot of the hub cache (<cache>/models--org--name/snapshots/<revision>) links its files to
  // ../../blobs/<hash>: the repository's folder is the limit there.
  fs::path root = real_folder;
  const fs::path snapshots = real_folder.parent_path();
  if (snapshots.filename() == "snapshots" && snapshots.parent_path().filename().native().starts_with("models--"))
    root = snapshots.parent_path();
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
