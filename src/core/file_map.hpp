// Read-only access to a file: an owned descriptor with positioned reads (pread), and a read-only
// private memory mapping of the whole file. Both report failures as PEFT_ERR_IO naming the path.
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

  // Reads exactly `count` bytes at `offset` into `dst`, retrying on EINTR and short reads.
  // PEFT_ERR_IO if the file ends early or the read fails.
  void read_exact(uint64_t offset, void* dst, uint64_t count) const;

 private:
  ReadOnlyFile(int fd, uint64_t size, std::string display_path)
      : fd_(fd), size_(size), display_path_(std::move(display_path)) {}
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string display_path_;
};

// A read-only, private (copy-on-write, never written) mapping of a whole file. An empty file is
// not mapped at all: data() is then a valid non-null pointer to zero bytes.
class FileMap {
 public:
  enum class Advice { normal, sequential, random, will_need, dont_need };

  static FileMap map(const ReadOnlyFile& file);

  FileMap(FileMap&& other) noexcept;
  FileMap& operator=(FileMap&& other) noexcept;
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
  ~FileMap();

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

  // A paging hint for [offset, offset + length) of the file; widened to whole pages, clipped to the
  // mapping, and ignored where the system does not support it (a hint never fails).
  void advise(uint64_t offset, uint64_t length, Advice advice) const noexcept;

 private:
  FileMap(const uint8_t* data, uint64_t size, bool mapped) : data_(data), size_(size), mapped_(mapped) {}
  void release() noexcept;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace peft
