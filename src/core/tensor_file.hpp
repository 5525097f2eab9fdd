// One validated tensor file of either format (safetensors or GGUF): its tensors and access to their
// bytes. The format's own class parses and validates the file, then hands this class the tensor list
// and where the data section starts; everything after that is the same for both formats.
//
// A file is read with positioned reads (pread) by the library itself; what differs between the two
// modes is only what view() hands out: in mmap mode a pointer into a private mapping of the file
// (made at the first view), in pread mode a private copy of the tensor (read at its first view and
// kept). A buffer given to an in-memory open is copied and served from that copy. Immutable after
// opening; every const method may be called from many threads at once.
//
// A file that changes while it is open (truncated, or rewritten in place) is reported, never served
// and never a crash, wherever the library reads it: read(), read_bytes() and view() fail with
// PEFT_ERR_IO once the file's size or modification time differ from those at opening (see
// ReadOnlyFile::check_unchanged). The exception is memory already handed out: pread-mode views and
// the in-memory copy stay valid (they are copies), while bytes of an mmap-mode view that a truncation
// removed raise SIGBUS in whoever touches them, and bytes rewritten in place show through it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "core/file_map.hpp"
#include "core/name_index.hpp"
#include "core/tensor_info.hpp"

namespace peft {

struct OpenOptions {
  // The largest header accepted: a safetensors header's length (the reference's MAX_HEADER_SIZE,
  // decimal 100 MB), or a GGUF file's bytes before its data section.
  uint64_t max_header_size = 100'000'000;
  bool use_pread = false;  // views are copies read with pread instead of a mapping
};

class TensorFile {
 public:
  virtual ~TensorFile();
  TensorFile(const TensorFile&) = delete;
  TensorFile& operator=(const TensorFile&) = delete;

  const std::string& path() const { return path_; }
  size_t tensor_count() const { return tensors_->size(); }
  const TensorInfo& tensor(size_t local) const { return tensors_->at(local); }
  // The position of the tensor named `name`, from the index the format's parser built.
  std::optional<size_t> find(std::string_view name) const { return names_->find(name, NamesOf(*tensors_)); }

  // The tensor's bytes for a caller. In memory: zero-copy. mmap mode: a pointer into the mapping,
  // after checking that the file is unchanged (PEFT_ERR_IO otherwise); library code never reads
  // through it. pread mode: the first call reads the tensor (PEFT_ERR_IO on failure) and later
  // calls return the same bytes. A zero-size tensor gives a non-null pointer and an empty span.
  std::span<const uint8_t> view(size_t local) const;

  // Copies the tensor into `dst` converted to `dtype` (see convert()). PEFT_ERR_UNSUPPORTED for a
  // conversion that is not done and for a block-quantized GGUF tensor (only its raw bytes can be
  // read); PEFT_ERR_INVALID_ARGUMENT when `dst_nbytes` differs from elements x size of `dtype`;
  // PEFT_ERR_IO when the read fails or the file changed. Reads the file with pread (conversions in
  // bounded chunks), or copies from memory held (the in-memory copy, a pread-mode view).
  void read(size_t local, DType dtype, void* dst, uint64_t dst_nbytes) const;

  // Copies bytes [offset, offset + count) of the tensor's data, unconverted, as read() reads them.
  // PEFT_ERR_INTERNAL for a range outside the tensor.
  void read_bytes(size_t local, uint64_t offset, void* dst, uint64_t count) const;
  // Starts reading tensor `local`'s bytes from the file ahead of a read (ReadOnlyFile::will_need);
  // nothing when they are in memory. Never fails.
  void will_need(size_t local) const;

  // PEFT_ERR_IO if the file changed since it was opened; nothing for bytes held in memory.
  void check_unchanged() const;

 protected:
  TensorFile() = default;
  // The format's opener's first step: names this file `display_path` in messages (`path` when
  // empty) and opens `path`.
  ReadOnlyFile open_file(const std::string& path, const std::string& display_path);
  // Called once by the format's opener after validation: `tensors` (owned by the subclass, never
  // moved afterwards) lie between data_start and the end of the source (`source_size` bytes), which
  // the parser has checked; this checks it again, since every view relies on it.
  void attach_file(ReadOnlyFile file, bool use_pread);
  void attach_copy(const void* data, size_t size);
  // `names` indexes `tensors` by name (also owned by the subclass).
  void set_tensors(const std::vector<TensorInfo>* tensors, const NameIndex* names, uint64_t data_start,
                   uint64_t source_size);
  const uint8_t* copy() const { return copy_.get(); }

  std::string path_;

 private:
  uint64_t absolute_offset(const TensorInfo& info) const { return data_start_ + info.begin; }
  const uint8_t* held_bytes(size_t local) const;  // null unless in memory or a pread-mode view was taken
  const uint8_t* mapping() const;                 // mmap mode: maps the file at the first call

  const std::vector<TensorInfo>* tensors_ = nullptr;
  const NameIndex* names_ = nullptr;
  uint64_t data_start_ = 0;
  // Exactly one source is set: copy_ (from memory) or file_.
  std::unique_ptr<uint8_t[]> copy_;
  std::optional<ReadOnlyFile> file_;
  bool use_pread_ = false;
  // mmap mode: the mapping behind view(), made once under map_mutex_ and published in map_base_.
  mutable std::mutex map_mutex_;
  mutable std::optional<FileMap> map_;
  mutable std::atomic<const uint8_t*> map_base_{nullptr};
  // pread mode: one owned buffer per viewed tensor, installed once with compare-and-swap.
  std::unique_ptr<std::atomic<uint8_t*>[]> cache_;
};

// Number of elements of a validated tensor (product of the shape; 1 for a scalar).
uint64_t element_count(const TensorInfo& info);

}  // namespace peft
