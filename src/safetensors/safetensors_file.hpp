// One validated safetensors file: its header and access to its tensors' bytes, backed by a private
// memory mapping (zero-copy views), by positioned reads (pread; each viewed tensor is read once and
// kept), or by a private copy of a caller's buffer. Immutable after opening; every const method may
// be called from many threads at once. As with any mapping (and the reference reader), a file that is
// truncated by someone else while mapped is out of scope: touching the lost pages raises SIGBUS; pread
// mode reports PEFT_ERR_IO instead.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/dtype.hpp"
#include "core/file_map.hpp"
#include "safetensors/header_parser.hpp"

namespace peft {

struct OpenOptions {
  uint64_t max_header_size = 100'000'000;  // the reference's MAX_HEADER_SIZE (decimal 100 MB)
  bool use_pread = false;                   // read with pread instead of mapping the file
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

  // The tensor's bytes. Zero-copy when mapped or in memory; with pread the first call reads the
  // tensor (PEFT_ERR_IO on failure) and later calls return the same bytes. A zero-size tensor gives
  // a non-null pointer and an empty span.
  std::span<const uint8_t> view(size_t local) const;

  // Copies the tensor into `dst` converted to `dtype` (see convert()). PEFT_ERR_UNSUPPORTED for a
  // conversion that is not done; PEFT_ERR_INVALID_ARGUMENT when `dst_nbytes` differs from elements
  // x size of `dtype`. With pread, uncached tensors are read in chunks, not cached.
  void read(size_t local, DType dtype, void* dst, uint64_t dst_nbytes) const;

 private:
  SafetensorsFile() = default;
  uint64_t absolute_offset(const TensorInfo& info) const;
  const uint8_t* resident_bytes(size_t local) const;  // null unless mapped, in memory or cached

  std::string path_;
  Header header_;
  // Exactly one backend is set: base_ (mapped file or owned copy) or file_ (pread).
  const uint8_t* base_ = nullptr;
  std::optional<FileMap> map_;
  std::unique_ptr<uint8_t[]> copy_;
  std::optional<ReadOnlyFile> file_;
  // pread cache: one owned buffer per tensor, installed once with compare-and-swap.
  std::unique_ptr<std::atomic<uint8_t*>[]> cache_;
};

// Number of elements of a validated tensor (product of the shape; 1 for a scalar).
uint64_t element_count(const TensorInfo& info);

}  // namespace peft
