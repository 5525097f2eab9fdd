#include "core/file_map.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "core/error.hpp"

namespace peft {

namespace {

[[noreturn]] void fail_io(const std::string& path, const std::string& what, int error_number) {
  fail(PEFT_ERR_IO, path + ": " + what + std::strerror(error_number));
}

// A valid address for views of zero bytes (an empty file is never mapped: mmap rejects length 0).
const uint8_t kNoBytes[1] = {0};

}  // namespace

ReadOnlyFile ReadOnlyFile::open(const std::string& path, const std::string& display_path) {
  const std::string& shown = display_path.empty() ? path : display_path;
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // O_NONBLOCK: never hang on a FIFO
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail_io(shown, "cannot open: ", errno);
  ReadOnlyFile file(fd, shown);  // owns fd from here on, so every failure below closes it
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_io(shown, "cannot stat: ", errno);
  if (!S_ISREG(st.st_mode)) fail(PEFT_ERR_IO, shown + ": not a regular file");
  file.size_ = static_cast<uint64_t>(st.st_size);
  file.mtime_sec_ = static_cast<int64_t>(st.st_mtim.tv_sec);
  file.mtime_nsec_ = static_cast<int64_t>(st.st_mtim.tv_nsec);
  return file;
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), mtime_sec_(other.mtime_sec_),
      mtime_nsec_(other.mtime_nsec_), display_path_(std::move(other.display_path_)) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    mtime_sec_ = other.mtime_sec_;
    mtime_nsec_ = other.mtime_nsec_;
    display_path_ = std::move(other.display_path_);
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::will_need(uint64_t offset, uint64_t count) const {
  // Linux reads at most the device's read-ahead size (a few MiB) per call, whatever the range asked:
  // the range goes in pieces of 2 MiB, the smallest step the kernel reads in anyway.
  constexpr uint64_t kStep = uint64_t{2} << 20;
  if (fd_ < 0 || offset >= size_) return;
  const uint64_t end = offset + std::min(count, size_ - offset);
  for (uint64_t at = offset; at < end; at += kStep) {
    (void)::posix_fadvise(fd_, static_cast<off_t>(at), static_cast<off_t>(std::min(kStep, end - at)),
                          POSIX_FADV_WILLNEED);
  }
}

void ReadOnlyFile::read_exact(uint64_t offset, void* dst, uint64_t count) const {
  auto* out = static_cast<uint8_t*>(dst);
  // Linux transfers at most ~2 GiB per call; keep each request well below that.
  constexpr uint64_t kMaxChunk = uint64_t{1} << 30;
  while (count > 0) {
    if (offset > static_cast<uint64_t>(std::numeric_limits<off_t>::max()))
      fail(PEFT_ERR_IO, display_path_ + ": read offset out of range");
    const size_t want = static_cast<size_t>(count < kMaxChunk ? count : kMaxChunk);
    const ssize_t got = ::pread(fd_, out, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_io(display_path_, "read failed: ", errno);
    }
    if (got == 0) {
      check_unchanged();  // names the truncation when that is what happened
      fail(PEFT_ERR_IO, display_path_ + ": unexpected end of file");
    }
    out += got;
    offset += static_cast<uint64_t>(got);
    count -= static_cast<uint64_t>(got);
  }
  // After the read, so a change made before or during it is seen.
  check_unchanged();
}

void ReadOnlyFile::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_io(display_path_, "cannot stat: ", errno);
  const auto now = static_cast<uint64_t>(st.st_size);
  if (now < size_)
    fail(PEFT_ERR_IO, display_path_ + ": the file changed since it was opened: it was truncated from " +
                          std::to_string(size_) + " to " + std::to_string(now) + " bytes");
  if (now != size_ || st.st_mtim.tv_sec != mtime_sec_ || st.st_mtim.tv_nsec != mtime_nsec_)
    fail(PEFT_ERR_IO, display_path_ + ": the file changed since it was opened (its size or modification time "
                                      "differs); open it again to read the new contents");
}

FileMap FileMap::map(const ReadOnlyFile& file) {
  const uint64_t size = file.size();
  if (size == 0) return FileMap(kNoBytes, 0, false);
  file.check_unchanged();
  if (size > std::numeric_limits<size_t>::max())
    fail(PEFT_ERR_IO, file.path() + ": file too large to map on this system");
  void* address = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, file.descriptor(), 0);
  if (address == MAP_FAILED) fail_io(file.path(), "cannot map: ", errno);
  return FileMap(static_cast<const uint8_t*>(address), size, true);
}

FileMap::FileMap(FileMap&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, false)) {}

FileMap& FileMap::operator=(FileMap&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

FileMap::~FileMap() { release(); }

void FileMap::release() noexcept {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
  mapped_ = false;
}

}  // namespace peft
