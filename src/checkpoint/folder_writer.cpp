#include "checkpoint/folder_writer.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>


#include "core/error.hpp"
#include "core/file_map.hpp"
#include "core/path.hpp"
#include "core/text.hpp"
#include "checkpoint/checkpoint_layout.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

bool exists_no_follow(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// The top-level names in `folder` (empty when it cannot be listed).
std::vector<std::string> list_folder(const std::string& folder) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  return names;
}

// Moves the file at `path` (if any) to a temporary name; returns that name ("" when there was none).
std::string move_aside(const std::string& path) {
  if (!exists_no_follow(path)) return "";
  const std::string aside = atomic_temp_name_for(path);
  const int error = rename_file(path, aside);
  if (error != 0) fail(PEFT_ERR_IO, "cannot move " + peft::quoted(path) + " aside: " + std::strerror(error));
  return aside;
}

}  // namespace

void copy_into(const std::string& source_path, AtomicFile& target) {
  const ReadOnlyFile source = ReadOnlyFile::open(source_path);  // regular files only: a FIFO never blocks
  std::vector<char> buffer(static_cast<size_t>(std::min<uint64_t>(source.size(), 1 << 20)));
  for (uint64_t offset = 0; offset < source.size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), source.size() - offset));
    source.read_exact(offset, buffer.data(), n);
    target.write(buffer.data(), n);
    offset += n;
  }
}

CheckpointFolderWriter::CheckpointFolderWriter(std::string folder, WriterMetadata initial_metadata,
                                               std::vector<FolderFile> other_files)
    : TensorWriter(std::move(initial_metadata)), folder_(std::move(folder)), other_files_(std::move(other_files)) {
  if (folder_.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output folder must not be empty");
}

std::vector<std::string> CheckpointFolderWriter::written_names() const {
  std::vector<std::string> names = names_;
  if (write_index_) names.push_back(kIndexFileName);
  for (const FolderFile& f : other_files_) names.push_back(f.name);
  return names;
}

std::vector<OutputSpec> CheckpointFolderWriter::plan_outputs(const std::vector<TensorDecl>& decls) {
  FolderLayout layout = plan_layout(decls);
  if (layout.files.empty()) fail(PEFT_ERR_INTERNAL, "a checkpoint folder needs at least one weight file");
  old_index_shards_.clear();
  const std::string index_path = join_path(folder_, kIndexFileName);
  if (exists_no_follow(index_path)) {
    try {
      for (const std::string& shard : read_shard_index(index_path).shards)
        if (shard.ends_with(kWeightFileSuffix)) old_index_shards_.insert(shard);  // never a file of another kind
    } catch (const Error&) {
      // An unreadable old index only means its shards cannot be found; it is replaced either way.
    }
  }

  // Sharded: a name is used as planned only when no reader can reach it before the commit.
  const std::string token = random_token();
  names_.clear();
  std::vector<OutputSpec> specs;
  for (PlannedWeightFile& f : layout.files) {
    std::string name = f.name;
    if (layout.write_index) {
      const auto taken = [&](const std::string& n) {
        return n == kSingleFileName || n == kIndexFileName || old_index_shards_.count(n) != 0 ||
               exists_no_follow(join_path(folder_, n));
      };
      if (taken(name)) {
        const size_t slash = name.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "" : name.substr(0, slash + 1);
        name = dir + weight_name_with_token(name.substr(dir.size()), token);
        if (taken(name)) fail(PEFT_ERR_IO, "cannot find a free name for " + peft::quoted(join_path(folder_, f.name)));
      }
    }
    OutputSpec spec;
    spec.path = join_path(folder_, name);
    spec.members = std::move(f.members);
    spec.metadata = std::move(f.metadata);
    specs.push_back(std::move(spec));
    names_.push_back(std::move(name));
  }
  write_index_ = layout.write_index;
  index_metadata_json_ = std::move(layout.index_metadata_json);
  return specs;
}

void CheckpointFolderWriter::prepare_outputs() {
  std::error_code ec;
  for (const std::string& name : names_) {  // the folder, and the folders of nested shard names
    const fs::path parent = fs::path(join_path(folder_, name)).parent_path();
    fs::create_directories(parent.empty() ? fs::path(folder_) : parent, ec);
    if (ec) fail(PEFT_ERR_IO, "cannot create the folder " + peft::quoted(parent.string()) + ": " + ec.message());
  }
  // Temporaries of killed runs: nothing refers to them.
  for (const std::string& name : list_folder(folder_))
    if (is_atomic_temp_name(name)) (void)remove_file(join_path(folder_, name));
}

std::unique_ptr<AtomicFile> CheckpointFolderWriter::make_index_file() {
  uint64_t total = 0;
  for (const TensorDecl& d : declarations()) total += d.nbytes;  // fits: every file's data size did
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t k = 0; k < outputs().size(); ++k)
    for (size_t d : outputs()[k].layout.order) weight_map.emplace_back(declarations()[d].name, names_[k]);
  return stage_text_file(join_path(folder_, kIndexFileName), index_file_text(index_metadata_json_, total, weight_map));
}

void CheckpointFolderWriter::commit_outputs() {
  // Everything is written and flushed before the first rename.
  if (!write_index_ && outputs().size() != 1) fail(PEFT_ERR_INTERNAL, "several weight files need an index");
  std::unique_ptr<AtomicFile> index = write_index_ ? make_index_file() : nullptr;
  std::vector<std::unique_ptr<AtomicFile>> others;
  for (const FolderFile& f : other_files_) {
    auto file = std::make_unique<AtomicFile>(join_path(folder_, f.name));
    if (f.content)
      file->write(f.content->data(), f.content->size());
    else
      copy_into(f.source_path, *file);
    file->flush_and_close();
    others.push_back(std::move(file));
  }

  // Up to the commit point, a failure undoes every step.
  std::string aside;
  const std::string other_entry = join_path(folder_, write_index_ ? kSingleFileName : kIndexFileName);
  try {
    if (write_index_) {
      for (size_t k = 0; k < outputs().size(); ++k) output_file(k).commit();  // free names: no reader sees them yet
      aside = move_aside(other_entry);
      index->commit();  // the commit point
    } else {
      aside = move_aside(other_entry);
      output_file(0).commit();  // the commit point
    }
  } catch (...) {
    if (!aside.empty()) (void)::rename(aside.c_str(), other_entry.c_str());
    if (write_index_ && !index->committed())
      for (size_t k = 0; k < outputs().size(); ++k)
        if (output_file(k).committed()) (void)::unlink(output_file(k).target().c_str());
    throw;
  }
  for (auto& file : others) file->commit();
  if (!aside.empty()) (void)remove_file(aside);
  remove_old_layout();
}

void CheckpointFolderWriter::remove_old_layout() noexcept {
  try {
    const std::vector<std::string> written = written_names();
    const std::set<std::string> keep(written.begin(), written.end());
    std::set<std::string> stale = old_index_shards_;
    for (const std::string& name : list_folder(folder_))
      if (is_layout_file_name(name)) stale.insert(name);
    bool removed = false;
    for (const std::string& name : stale)
      if (keep.count(name) == 0) removed = remove_file(join_path(folder_, name)) == 0 || removed;
    if (removed) sync_directory(folder_);
  } catch (...) {
    // Removing an older layout is best effort: the new checkpoint is complete either way.
  }
}

}  // namespace peft
