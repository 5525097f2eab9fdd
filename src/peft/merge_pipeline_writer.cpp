#include "peft/merge_pipeline_writer.hpp"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_map.hpp"
#include "safetensors/json_writer.hpp"
#include "safetensors/shard_index.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

// model-DDDDD-of-DDDDD.safetensors, the shard names transformers writes.
bool is_numbered_shard(const std::string& name) {
  if (name.size() != 32 || !name.starts_with("model-") || !name.ends_with(".safetensors")) return false;
  for (size_t i : {6u, 7u, 8u, 9u, 10u, 15u, 16u, 17u, 18u, 19u})
    if (name[i] < '0' || name[i] > '9') return false;
  return name.compare(11, 4, "-of-") == 0;
}

// The model files an earlier checkpoint left in `folder` (names relative to it).
std::set<std::string> existing_model_files(const std::string& folder) {
  std::set<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == kSingleFileName || name == kIndexFileName || is_numbered_shard(name)) found.insert(name);
  }
  if (found.count(kIndexFileName)) {
    try {
      for (const std::string& shard : read_shard_index(join_path(folder, kIndexFileName)).shards)
        if (shard.ends_with(".safetensors")) found.insert(shard);  // never a file of another kind
    } catch (const Error&) {
      // An unreadable old index only means its shards cannot be found; it is replaced either way.
    }
  }
  return found;
}

}  // namespace

void copy_into(const std::string& source_path, AtomicFile& target) {
  const ReadOnlyFile source = ReadOnlyFile::open(source_path);  // regular files only: a FIFO never blocks
  std::vector<char> buffer(1 << 20);
  for (uint64_t offset = 0; offset < source.size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), source.size() - offset));
    source.read_exact(offset, buffer.data(), n);
    target.write(buffer.data(), n);
    offset += n;
  }
}

MergedFolderWriter::MergedFolderWriter(std::string folder, std::vector<OutputFilePlan> files, bool write_index,
                                       std::string index_metadata_json, std::vector<FolderFile> extra_files)
    : TensorWriter(std::nullopt),
      folder_(std::move(folder)),
      files_(std::move(files)),
      write_index_(write_index),
      index_metadata_json_(std::move(index_metadata_json)),
      extra_files_(std::move(extra_files)) {
  if (folder_.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output folder must not be empty");
  if (files_.empty()) fail(PEFT_ERR_INTERNAL, "a merged checkpoint needs at least one file");
}

std::vector<OutputSpec> MergedFolderWriter::plan_outputs(const std::vector<TensorDecl>&) {
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec) fail(PEFT_ERR_IO, "cannot create the folder " + peft::quoted(folder_) + ": " + ec.message());
  stale_candidates_ = existing_model_files(folder_);
  std::vector<OutputSpec> specs;
  for (const OutputFilePlan& f : files_) {
    OutputSpec spec;
    spec.path = join_path(folder_, f.name);
    const fs::path parent = fs::path(spec.path).parent_path();
    if (!parent.empty()) {
      fs::create_directories(parent, ec);
      if (ec) fail(PEFT_ERR_IO, "cannot create the folder " + peft::quoted(parent.string()) + ": " + ec.message());
    }
    spec.members = f.members;
    spec.metadata = f.metadata;
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::vector<std::unique_ptr<AtomicFile>> MergedFolderWriter::make_extra_files() {
  std::vector<std::unique_ptr<AtomicFile>> extras;
  if (write_index_) {
    nlohmann::json metadata = nlohmann::json::parse(index_metadata_json_, nullptr, false);
    if (!metadata.is_object()) metadata = nlohmann::json::object();
    uint64_t total = 0;
    for (const TensorDecl& d : declarations()) total += d.nbytes;  // fits: every file's data size did
    metadata["total_size"] = total;
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t k = 0; k < outputs().size(); ++k)
      for (size_t d : outputs()[k].layout.order) weight_map[declarations()[d].name] = files_[k].name;
    nlohmann::json index = {{"metadata", std::move(metadata)}, {"weight_map", std::move(weight_map)}};
    const std::string text = json::python_dumps_indent2_sorted(index) + "\n";
    auto file = std::make_unique<AtomicFile>(join_path(folder_, kIndexFileName));
    file->write(text.data(), text.size());
    file->flush_and_close();
    extras.push_back(std::move(file));
  }
  for (const FolderFile& f : extra_files_) {
    auto file = std::make_unique<AtomicFile>(join_path(folder_, f.name));
    if (f.content)
      file->write(f.content->data(), f.content->size());
    else
      copy_into(f.source_path, *file);
    file->flush_and_close();
    extras.push_back(std::move(file));
  }
  return extras;
}

std::vector<std::string> MergedFolderWriter::written_names() const {
  std::vector<std::string> names;
  for (const OutputFilePlan& f : files_) names.push_back(f.name);
  if (write_index_) names.push_back(kIndexFileName);
  for (const FolderFile& f : extra_files_) names.push_back(f.name);
  return names;
}

void MergedFolderWriter::after_commit() noexcept {
  try {
    std::set<std::string> keep;
    for (const std::string& name : written_names()) keep.insert(name);
    bool removed = false;
    for (const std::string& name : stale_candidates_) {
      if (keep.count(name)) continue;
      removed = ::unlink(join_path(folder_, name).c_str()) == 0 || removed;
    }
    if (removed) sync_directory(folder_);
  } catch (...) {
    // Removing an older layout is best effort: the new checkpoint is complete either way.
  }
}

}  // namespace peft
