#include "core/atomic_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include "core/error.hpp"
#include "core/path.hpp"
#include "core/text.hpp"

namespace peft {

namespace testing {
FaultHook fault_hook = nullptr;
}  // namespace testing

namespace {

constexpr const char* kTempMarker = ".peft-tmp-";
// File names are at most 255 bytes on common file systems; keep room for "." + marker + suffix.
constexpr size_t kMaxBaseInTempName = 200;
// Paced writeback (AtomicFile::write): the kernel is asked to write each span of this many bytes as
// soon as it is complete, and the span before it is waited for and dropped from the page cache.
constexpr uint64_t kWritebackSpan = uint64_t{32} << 20;

int injected(testing::FileOp op, const std::string& target) {
  return testing::fault_hook ? testing::fault_hook(op, target) : 0;
}

[[noreturn]] void fail_io(const std::string& what, const std::string& path, int error) {
  fail(PEFT_ERR_IO, "cannot " + what + " " + quoted(path) + ": " + std::strerror(error));
}

// Random characters that make a name unique with high probability; O_EXCL settles the rest.
std::string random_chars(int count) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t seed = [] {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ device() ^ static_cast<uint64_t>(getpid());
  }();
  const uint64_t now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::mt19937_64 mix(seed ^ now ^ (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull));
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string out;
  for (int i = 0; i < count; ++i) out += kAlphabet[mix() % (sizeof kAlphabet - 1)];
  return out;
}

std::string random_suffix() { return random_chars(6); }

std::string temp_name_for(const std::string& target) {
  const std::string prefix = (target.find('/') == std::string::npos ? std::string() : parent_folder(target) + "/");
  return prefix + "." + file_name(target).substr(0, kMaxBaseInTempName) + kTempMarker + random_suffix();
}

// Removes the temporaries of earlier writes to `target` that a killed process left behind
// (".<name>.peft-tmp-XXXXXX" beside it), as a folder write removes those of its folder. Best effort.
void remove_stale_temporaries(const std::string& target) noexcept {
  const std::string folder = target.find('/') == std::string::npos ? "." : parent_folder(target);
  const std::string prefix = "." + file_name(target).substr(0, kMaxBaseInTempName) + kTempMarker;
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.size() == prefix.size() + 6 && name.starts_with(prefix)) ::unlinkat(::dirfd(dir), name.c_str(), 0);
  }
  ::closedir(dir);
}

}  // namespace

bool is_atomic_temp_name(const std::string& file_name) {
  const size_t at = file_name.rfind(kTempMarker);
  return !file_name.empty() && file_name[0] == '.' && at != std::string::npos &&
         file_name.size() == at + std::strlen(kTempMarker) + 6;
}

std::string atomic_temp_name_for(const std::string& target) { return temp_name_for(target); }

std::string random_token() { return random_chars(8); }

int rename_file(const std::string& from, const std::string& to) {
  const int error = injected(testing::FileOp::rename, to);
  if (error != 0) return error;
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

int remove_file(const std::string& path) {
  const int error = injected(testing::FileOp::remove, path);
  if (error != 0) return error;
  return ::unlink(path.c_str()) == 0 ? 0 : errno;
}

void sync_directory(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename itself succeeded; durability of the entry is best effort here
  (void)::fsync(fd);
  ::close(fd);
}

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  if (target_.empty() || target_.back() == '/') {
    fail(PEFT_ERR_INVALID_ARGUMENT, "output path " + quoted(target_) + " does not name a file");
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string candidate = temp_name_for(target_);
    int fd = -1;
    int error = injected(testing::FileOp::create, target_);
    if (error == 0) {
      // 0666 filtered by the umask: the same mode an ordinary new file gets.
      fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0) error = errno;
    }
    if (fd >= 0) {
      fd_ = fd;
      temp_path_ = std::move(candidate);
      return;
    }
    if (error != EEXIST && error != EINTR) fail_io("create a file in the folder of", target_, error);
  }
  fail(PEFT_ERR_IO, "cannot create a unique temporary file next to " + quoted(target_));
}

AtomicFile::~AtomicFile() { abort(); }

void AtomicFile::reserve(uint64_t size) {
  if (fd_ < 0 || size == 0) return;
  int error = injected(testing::FileOp::reserve, target_);
  if (error == 0 && ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)) != 0) error = errno;
  if (error == ENOSPC || error == EDQUOT || error == EFBIG) fail_io("write", target_, error);
  // Anything else (EOPNOTSUPP, EINVAL on some file systems) only means no early check.
}

void AtomicFile::write(const void* data, size_t size) {
  if (fd_ < 0 || closed_) fail(PEFT_ERR_INTERNAL, "write to a closed output file " + quoted(target_));
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (size > 0) {
    int error = injected(testing::FileOp::write, target_);
    ssize_t n = -1;
    if (error == 0) {
      n = ::write(fd_, bytes, size);
      if (n < 0) error = errno;
    }
    if (n < 0) {
      if (error == EINTR) continue;
      fail_io("write", target_, error);
    }
    if (n == 0) fail_io("write", target_, EIO);
    bytes += n;
    size -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
  pace_writeback();
}

// Without pacing, a large output piles up in the page cache as dirty pages, written by the kernel
// when it decides (then stalling every writer at once) and by the final fsync, after the reading is
// done: a merge then costs its read time plus its write time. Starting each span's writeback as soon
// as it is complete overlaps the device's writing with the reading and merging; waiting for the span
// before it keeps at most two spans in flight, and dropping the written span from the cache keeps a
// merge larger than memory from evicting everything else. Best effort: an error of a write that
// sync_file_range started is reported by the fsync of flush_and_close, and a file system without
// it (EINVAL, ENOSYS, ESPIPE) just has no pacing.
void AtomicFile::pace_writeback() {
  if (written_ - writeback_started_ < kWritebackSpan) return;
  (void)::sync_file_range(fd_, static_cast<off_t>(writeback_started_),
                          static_cast<off_t>(written_ - writeback_started_), SYNC_FILE_RANGE_WRITE);
  const auto done = static_cast<off_t>(writeback_done_);
  const auto pending = static_cast<off_t>(writeback_started_ - writeback_done_);
  if (pending > 0 && ::sync_file_range(fd_, done, pending, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                                               SYNC_FILE_RANGE_WAIT_AFTER) == 0)
    (void)::posix_fadvise(fd_, done, pending, POSIX_FADV_DONTNEED);
  writeback_done_ = writeback_started_;
  writeback_started_ = written_;
}

void AtomicFile::flush_and_close() {
  if (closed_) return;
  if (fd_ < 0) fail(PEFT_ERR_INTERNAL, "flush of an aborted output file " + quoted(target_));
  int error = injected(testing::FileOp::fsync, target_);
  if (error == 0 && ::fsync(fd_) != 0) error = errno;
  if (error != 0 && error != EINVAL) fail_io("flush", target_, error);  // EINVAL: no fsync there
  const int fd = fd_;
  fd_ = -1;
  closed_ = true;
  if (::close(fd) != 0 && errno != EINTR) {
    const int close_error = errno;
    ::unlink(temp_path_.c_str());
    temp_path_.clear();
    fail_io("write", target_, close_error);
  }
}

void AtomicFile::commit() {
  if (committed_) return;
  flush_and_close();
  if (temp_path_.empty()) fail(PEFT_ERR_INTERNAL, "commit of an aborted output file " + quoted(target_));
  int error = injected(testing::FileOp::rename, target_);
  if (error == 0 && ::rename(temp_path_.c_str(), target_.c_str()) != 0) error = errno;
  if (error != 0) fail_io("replace", target_, error);
  committed_ = true;
  temp_path_.clear();
  remove_stale_temporaries(target_);
  sync_directory(parent_folder(target_));
}

void AtomicFile::abort() noexcept {
  if (committed_) return;
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  closed_ = true;
  if (!temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_path_.clear();
  }
}

std::unique_ptr<AtomicFile> stage_text_file(const std::string& path, const std::string& text) {
  auto file = std::make_unique<AtomicFile>(path);
  file->write(text.data(), text.size());
  file->flush_and_close();
  return file;
}

}  // namespace peft
