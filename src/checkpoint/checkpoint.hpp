// A checkpoint: one safetensors or GGUF file, a folder holding `model.safetensors`, or a folder
// holding `model.safetensors.index.json` and the shards it names. A GGUF file that is a part of a
// split model (`NAME-00002-of-00003.gguf`, gguf/gguf_split.hpp) opens as the whole model: every part,
// one file each, in part order, whichever part was named. Callers see tensors the same way
// whichever format holds them (core/tensor_file.hpp); GGUF shapes are outermost first. Every header is validated when the
// checkpoint opens; afterwards it is immutable and every const method may be called from many
// threads at once.
//
// Shards follow transformers' loader: they are opened in sorted shard-name order, and every tensor
// of every shard is part of the checkpoint, including tensors the weight_map does not list (which
// transformers also loads). Two deliberate strictnesses: a tensor in two shards is rejected
// (transformers silently lets the later shard win), and a weight_map entry whose tensor is not in
// the shard it names is rejected (transformers reports it as a missing key only later).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "core/name_index.hpp"
#include "core/tensor_file.hpp"
#include "gguf/gguf_header.hpp"
#include "safetensors/header_parser.hpp"

namespace peft {

class Checkpoint {
 public:
  // A file or a folder, or a model id in the hub cache ("org/name[@revision]", resolved by
  // resolve_model_location when no such path exists). PEFT_ERR_IO (path and reason) if it cannot be
  // read, format errors naming the file, PEFT_ERR_INVALID_CHECKPOINT for a wrong folder or index,
  // PEFT_ERR_NOT_FOUND for an id not in the cache or an incomplete download in a hub snapshot.
  static std::shared_ptr<const Checkpoint> open(const std::string& path, const OpenOptions& options = {});
  // A safetensors or GGUF file held in memory; the bytes are copied.
  static std::shared_ptr<const Checkpoint> open_memory(const void* data, size_t size,
                                                       const OpenOptions& options = {});

  size_t tensor_count() const { return tensors_.size(); }
  // i in [0, count): file by file, each file in data order. Throws INVALID_ARGUMENT out of range.
  const TensorInfo& tensor(size_t i) const;
  std::optional<size_t> find(std::string_view name) const;  // O(1)
  size_t tensor_file(size_t i) const;

  size_t file_count() const { return files_.size(); }
  const std::string& file_path(size_t k) const;
  // File k's safetensors "__metadata__"; nullopt when absent, and for a GGUF file.
  const std::optional<Metadata>& file_metadata(size_t k) const;
  // File k's parsed GGUF header; nullptr for a safetensors file.
  const GgufHeader* gguf_header(size_t k) const;
  // Compact JSON of the index's "metadata" object; nullopt without an index or without "metadata".
  const std::optional<std::string>& index_metadata_json() const { return index_metadata_json_; }

  // For callers (the C API's views): zero-copy in mmap mode; read once and cached in pread mode
  // (PEFT_ERR_IO if that read fails or the file changed). Library code reads with read() or
  // read_bytes() instead, which never touch a mapping (see TensorFile).
  std::span<const uint8_t> view(size_t i) const;
  // Converted copy into dst (see TensorFile::read for the errors).
  void read(size_t i, DType dtype, void* dst, uint64_t dst_nbytes) const;
  // Bytes [offset, offset + count) of tensor i's data, unconverted (see TensorFile::read_bytes).
  void read_bytes(size_t i, uint64_t offset, void* dst, uint64_t count) const;
  // Starts reading tensor i's bytes ahead of a read (TensorFile::will_need). Never fails.
  void will_need(size_t i) const;
  // PEFT_ERR_IO if the file holding tensor i changed since it was opened.
  void check_unchanged(size_t i) const;
  // The whole tensor as f32 (for merge code); UNSUPPORTED if its dtype does not convert to F32.
  std::vector<float> read_f32(size_t i) const;

 private:
  struct Location {
    size_t file;
    size_t local;
    std::string_view name;  // held by files_' headers, which never move once a file is added
  };
  Checkpoint() = default;
  void add_file(std::unique_ptr<const TensorFile> file);  // numbers its tensors, rejects duplicates
  void open_folder(const std::string& folder, const OpenOptions& options);
  void open_index(const std::string& folder, const std::string& index_path, const OpenOptions& options);
  const Location& locate(size_t i) const;

  std::vector<std::unique_ptr<const TensorFile>> files_;
  std::vector<Location> tensors_;
  NameIndex by_name_;  // positions in tensors_ by name, when there are several files (one file's own serves alone)
  std::optional<std::string> index_metadata_json_;
};

}  // namespace peft
