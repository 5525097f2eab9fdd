// One validated safetensors file: its header and access to its tensors' bytes. A file is read with
// positioned reads (pread) by the library itself; what differs between the two modes is only what
// view() hands out: in mmap mode a pointer into a private mapping of the file (made at the first
// view), in pread mode a private copy of the tensor (read at its first view and kept). A buffer
// given to from_memory() is copied and served from that copy. Immutable after opening; every const
// method may be called from many threads at once.
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

#include "core/dtype.hpp"
#include "core/file_map.hpp"
#include "safetensors/header_parser.hpp"

namespace peft {

struct OpenOptions {
  uint64_t max_header_size = 100'000'000;  // the reference's MAX_HEADER_SIZE (decimal 100 MB)
  bool use_pread = false;                   // views are copies read with pread instead of a mapping
};

class SafetensorsFile {
 public:
  // Opens and validates `path` completely (reference steps 1-8 against the real file size) before
  // any tensor byte is touched. `display_path` names the file in messages (defaults to `path`).
  static std::unique_ptr<const SafetensorsFile> open(const std::string& path, const OpenOptions& options = {},
                                                     const std::string& display_path = {});
  // Copies `size` bytes and validates them; the copy is owned by the result. `use_pread` is ignored.
  static std::unique_ptr<const SafetensorsFile> from_memory(const void* data, size_t size,
                                                            const OpenOptions& options = {},
                                                            const std::string& display_name = "<memory>");
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  size_t tensor_count() const { return header_.tensors.size(); }
  const TensorInfo& tensor(size_t local) const { return header_.tensors.at(local); }

  // The tensor's bytes for a caller. In memory: zero-copy. mmap mode: a pointer into the mapping,
  // after checking that the file is unchanged (PEFT_ERR_IO otherwise); library code never reads
  // through it. pread mode: the first call reads the tensor (PEFT_ERR_IO on failure) and later
  // calls return the same bytes. A zero-size tensor gives a non-null pointer and an empty span.
  std::span<const uint8_t> view(size_t local) const;

  // Copies the tensor into `dst` converted to `dtype` (see convert()). PEFT_ERR_UNSUPPORTED for a
  // conversion that is not done; PEFT_ERR_INVALID_ARGUMENT when `dst_nbytes` differs from elements
  // x size of `dtype`; PEFT_ERR_IO when the read fails or the file changed. Reads the file with
  // pread (conversions in bounded chunks), or copies from memory held (the in-memory copy, a
  // pread-mode view).
  void read(size_t local, DType dtype, void* dst, uint64_t dst_nbytes) const;

  // Copies bytes [offset, offset + count) of the tensor's data, unconverted, as read() reads them.
  // PEFT_ERR_INTERNAL for a range outside the tensor.
  void read_bytes(size_t local, uint64_t offset, void* dst, uint64_t count) const;

  // PEFT_ERR_IO if the file changed since it was opened; nothing for bytes held in memory.
  void check_unchanged() const;

 private:
  SafetensorsFile() = default;
  uint64_t absolute_offset(const TensorInfo& info) const;
  const uint8_t* held_bytes(size_t local) const;  // null unless in memory or a pread-mode view was taken
  const uint8_t* mapping() const;                 // mmap mode: maps the file at the first call

  std::string path_;
  Header header_;
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
