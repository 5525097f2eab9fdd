// Read-only access to a file: an owned descriptor with positioned reads (pread), and a read-only
// private memory mapping of the whole file. Both report failures as PEFT_ERR_IO naming the path.
//
// A file that changes while it is open: every positioned read checks afterwards (fstat) that the
// file still has the size and modification time it had when it was opened, and fails with
// PEFT_ERR_IO when it does not, so a truncated or rewritten file is reported rather than served.
// A mapping cannot be protected that way: touching mapped pages that a truncation removed raises
// SIGBUS in whoever touches them. The library therefore never reads file data through a mapping
// itself; mappings exist only for the zero-copy views it hands to callers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace peft {

// An open, read-only, regular file. Positioned reads do not move a shared offset, so one
// ReadOnlyFile may serve many threads at once.
class ReadOnlyFile {
 public:
  // Opens `path` read-only; fails with PEFT_ERR_IO (path and strerror) if it cannot be opened or is
  // not a regular file. `display_path` names the file in messages (defaults to `path`).
  static ReadOnlyFile open(const std::string& path, const std::string& display_path = {});

  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  // Size in bytes at the time of opening.
  uint64_t size() const { return size_; }
  const std::string& path() const { return display_path_; }
  int descriptor() const { return fd_; }

  // Reads exactly `count` bytes at `offset` into `dst`, retrying on EINTR and short reads, then
  // checks the file as check_unchanged() does. PEFT_ERR_IO if the file ends early, the read fails or
  // the file changed; `dst` may then hold part of the bytes.
  void read_exact(uint64_t offset, void* dst, uint64_t count) const;

  // Asks the kernel to start reading bytes [offset, offset + count) into the page cache now, so that
  // a read_exact of them later finds them there (posix_fadvise WILLNEED). Best effort: never fails.
  void will_need(uint64_t offset, uint64_t count) const;

  // PEFT_ERR_IO naming the file unless its size and modification time (fstat of the open
  // descriptor) are those it had when it was opened. A change that keeps both (the same size,
  // within the file system's timestamp granularity of the last write before opening) goes unseen.
  void check_unchanged() const;

 private:
  ReadOnlyFile(int fd, std::string display_path) : fd_(fd), display_path_(std::move(display_path)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_sec_ = 0;
  int64_t mtime_nsec_ = 0;
  std::string display_path_;
};

// A read-only, private (copy-on-write, never written) mapping of a whole file, as it was opened. An
// empty file is not mapped at all: data() is then a valid non-null pointer to zero bytes. Only for
// memory handed to callers (see above): library code reads files with ReadOnlyFile::read_exact.
class FileMap {
 public:
  // Maps `file` (its size at opening); PEFT_ERR_IO if it changed since (check_unchanged()).
  static FileMap map(const ReadOnlyFile& file);

  FileMap(FileMap&& other) noexcept;
  FileMap& operator=(FileMap&& other) noexcept;
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
  ~FileMap();

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  FileMap(const uint8_t* data, uint64_t size, bool mapped) : data_(data), size_(size), mapped_(mapped) {}
  void release() noexcept;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace peft
