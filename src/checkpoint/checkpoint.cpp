#include "checkpoint/checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"
#include "core/path.hpp"
#include "core/text.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_split.hpp"
#include "checkpoint/hub_cache.hpp"
#include "safetensors/safetensors_file.hpp"

namespace peft {

namespace {

enum class Kind { missing, file, folder, other };

Kind stat_kind(const std::string& path, int* error_number) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *error_number = errno;
    return Kind::missing;
  }
  if (S_ISDIR(st.st_mode)) return Kind::folder;
  return S_ISREG(st.st_mode) ? Kind::file : Kind::other;
}

// A file of either format, told apart by GGUF's magic.
std::unique_ptr<const TensorFile> open_tensor_file(const std::string& path, const OpenOptions& options,
                                                   const std::string& display_path = {}) {
  uint8_t magic[4] = {};
  {
    const ReadOnlyFile file = ReadOnlyFile::open(path, display_path.empty() ? path : display_path);
    file.read_exact(0, magic, std::min<uint64_t>(file.size(), sizeof magic));
  }
  if (has_gguf_magic(magic, sizeof magic)) return GgufFile::open(path, options, display_path);
  return SafetensorsFile::open(path, options, display_path);
}

}  // namespace

std::shared_ptr<const Checkpoint> Checkpoint::open(const std::string& path_or_id, const OpenOptions& options) {
  std::shared_ptr<Checkpoint> checkpoint(new Checkpoint());
  const std::string path = resolve_model_location(path_or_id);
  int error_number = 0;
  switch (stat_kind(path, &error_number)) {
    case Kind::missing:
      fail(PEFT_ERR_IO, path + ": cannot open: " + std::strerror(error_number));
    case Kind::folder:
      checkpoint->open_folder(path, options);
      break;
    case Kind::other:
      fail(PEFT_ERR_IO, path + ": not a regular file or folder");
    case Kind::file:
      if (is_gguf_path(path)) {  // a GGUF model of one file, or every part of a split one
        for (std::unique_ptr<const GgufFile>& part : open_gguf_model(path, options)) checkpoint->add_file(std::move(part));
      } else {
        checkpoint->add_file(open_tensor_file(path, options));
      }
      break;
  }
  return checkpoint;
}

std::shared_ptr<const Checkpoint> Checkpoint::open_memory(const void* data, size_t size, const OpenOptions& options) {
  if (data == nullptr && size != 0) fail(PEFT_ERR_INVALID_ARGUMENT, "data must not be NULL when size is not 0");
  std::shared_ptr<Checkpoint> checkpoint(new Checkpoint());
  if (has_gguf_magic(data, size))
    checkpoint->add_file(GgufFile::from_memory(data, size, options));
  else
    checkpoint->add_file(SafetensorsFile::from_memory(data, size, options));
  return checkpoint;
}

void Checkpoint::open_folder(const std::string& folder, const OpenOptions& options) {
  int error_number = 0;
  check_downloaded(folder, kIndexFileName, "the index");
  check_downloaded(folder, kSingleFileName, "the weight file");
  const std::string index_path = join_path(folder, kIndexFileName);
  const Kind index_kind = stat_kind(index_path, &error_number);
  // Like the shards, the index and the single file must resolve inside the folder (resolve_in_folder).
  if (index_kind != Kind::missing) {
    resolve_in_folder(folder, kIndexFileName, "the index");
    open_index(folder, index_path, options);
    return;
  }
  const std::string single_path = join_path(folder, kSingleFileName);
  if (stat_kind(single_path, &error_number) != Kind::missing) {
    add_file(SafetensorsFile::open(resolve_in_folder(folder, kSingleFileName, "the weight file"), options, single_path));
    return;
  }
  fail(PEFT_ERR_INVALID_CHECKPOINT, folder + ": the folder holds neither " + kIndexFileName + " nor " +
                                        kSingleFileName);
}

void Checkpoint::open_index(const std::string& folder, const std::string& index_path, const OpenOptions& options) {
  ShardIndex index = read_shard_index(index_path);
  // Resolve every name before opening anything, so an escaping name fails fast and touches nothing.
  std::vector<std::string> real_paths;
  real_paths.reserve(index.shards.size());
  for (const std::string& shard : index.shards) real_paths.push_back(resolve_shard(folder, shard));
  for (size_t k = 0; k < index.shards.size(); ++k)
    add_file(SafetensorsFile::open(real_paths[k], options, join_path(folder, index.shards[k])));

  // Shard k of files_ is index.shards[k] (both sorted the same way).
  for (const auto& [tensor, shard] : index.weight_map) {
    const std::optional<size_t> found = find(tensor);
    const auto shard_pos = std::lower_bound(index.shards.begin(), index.shards.end(), shard);
    const size_t shard_file = static_cast<size_t>(shard_pos - index.shards.begin());
    if (!found)
      fail(PEFT_ERR_INVALID_CHECKPOINT, index_path + ": tensor " + quoted(tensor) + " is listed in shard " +
                                            quoted(shard) + " but that shard does not hold it");
    const size_t actual_file = tensors_[*found].file;
    if (actual_file != shard_file)
      fail(PEFT_ERR_INVALID_CHECKPOINT, index_path + ": tensor " + quoted(tensor) + " is listed in shard " +
                                            quoted(shard) + " but that shard does not hold it (shard " +
                                            quoted(index.shards[actual_file]) + " does)");
  }
  index_metadata_json_ = std::move(index.metadata_json);
}

void Checkpoint::add_file(std::unique_ptr<const TensorFile> file) {
  const size_t file_index = files_.size();
  const TensorFile& added = *file;
  files_.push_back(std::move(file));
  const size_t first_new = tensors_.size();
  tensors_.reserve(first_new + added.tensor_count());
  for (size_t local = 0; local < added.tensor_count(); ++local)
    tensors_.push_back({file_index, local, added.tensor(local).name});
  // One file answers find() with the index its parser built (which rejects a name given twice within
  // the file). Several files are indexed here, all of them once a second one comes.
  if (files_.size() == 1) return;
  by_name_.reserve(tensors_.size());
  for (size_t i = files_.size() == 2 ? 0 : first_new; i < tensors_.size(); ++i) {
    if (const std::optional<size_t> first = by_name_.insert(tensors_[i].name, i, NamesOf(tensors_)))
      fail(PEFT_ERR_INVALID_CHECKPOINT, "tensor " + quoted(std::string(tensors_[i].name)) + " is in two shards: " +
                                            files_[tensors_[*first].file]->path() + " and " + added.path());
  }
}

const Checkpoint::Location& Checkpoint::locate(size_t i) const {
  if (i >= tensors_.size())
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor index " + std::to_string(i) + " is out of range (the checkpoint has " +
                                        std::to_string(tensors_.size()) + " tensors)");
  return tensors_[i];
}

const TensorInfo& Checkpoint::tensor(size_t i) const {
  const Location& at = locate(i);
  return files_[at.file]->tensor(at.local);
}

std::optional<size_t> Checkpoint::find(std::string_view name) const {
  if (files_.size() == 1) return files_[0]->find(name);  // its positions are the checkpoint's
  return by_name_.find(name, NamesOf(tensors_));
}

size_t Checkpoint::tensor_file(size_t i) const { return locate(i).file; }

const std::string& Checkpoint::file_path(size_t k) const {
  if (k >= files_.size())
    fail(PEFT_ERR_INVALID_ARGUMENT, "file index " + std::to_string(k) + " is out of range (the checkpoint has " +
                                        std::to_string(files_.size()) + " files)");
  return files_[k]->path();
}

const std::optional<Metadata>& Checkpoint::file_metadata(size_t k) const {
  static const std::optional<Metadata> kNone;
  file_path(k);  // range check
  const auto* file = dynamic_cast<const SafetensorsFile*>(files_[k].get());
  return file != nullptr ? file->header().metadata : kNone;
}

const GgufHeader* Checkpoint::gguf_header(size_t k) const {
  file_path(k);  // range check
  const auto* file = dynamic_cast<const GgufFile*>(files_[k].get());
  return file != nullptr ? &file->header() : nullptr;
}

std::span<const uint8_t> Checkpoint::view(size_t i) const {
  const Location& at = locate(i);
  return files_[at.file]->view(at.local);
}

void Checkpoint::read(size_t i, DType dtype, void* dst, uint64_t dst_nbytes) const {
  const Location& at = locate(i);
  files_[at.file]->read(at.local, dtype, dst, dst_nbytes);
}

void Checkpoint::read_bytes(size_t i, uint64_t offset, void* dst, uint64_t count) const {
  const Location& at = locate(i);
  files_[at.file]->read_bytes(at.local, offset, dst, count);
}

void Checkpoint::will_need(size_t i) const {
  const Location& at = locate(i);
  files_[at.file]->will_need(at.local);
}

void Checkpoint::check_unchanged(size_t i) const {
  const Location& at = locate(i);
  files_[at.file]->check_unchanged();
}

std::vector<float> Checkpoint::read_f32(size_t i) const {
  const Location& at = locate(i);
  const TensorFile& file = *files_[at.file];
  const uint64_t elements = element_count(file.tensor(at.local));
  if (elements > std::vector<float>().max_size())
    fail(PEFT_ERR_OUT_OF_MEMORY, "tensor " + quoted(file.tensor(at.local).name) + " is too large to read");
  std::vector<float> out(static_cast<size_t>(elements));
  file.read(at.local, DType::F32, out.data(), elements * sizeof(float));
  return out;
}

}  // namespace peft
