// A file that appears at its target path only when complete. Bytes go to a temporary file in the
// target's folder (".<name>.peft-tmp-XXXXXX", created with O_EXCL and mode 0666 & ~umask like any
// new file); commit() flushes it to disk, renames it over the target and flushes the folder. If the
// object is destroyed (or abort()ed) without a commit, the temporary is removed and the target
// keeps whatever it held before. A process killed mid-write leaves the target untouched; only a
// stray temporary, recognisable by its name, may remain, and the next commit() to the same target
// removes it (with any other ".<name>.peft-tmp-XXXXXX" of that name).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace peft {

class AtomicFile {
 public:
  // Creates the temporary next to `target`. PEFT_ERR_IO naming the target on failure (a missing
  // folder, no permission, ...).
  explicit AtomicFile(std::string target);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Reserves disk space for `size` bytes in total (without changing the file's length), so that a
  // full disk is reported before anything is written. Ignored where the file system cannot do it.
  // PEFT_ERR_IO naming the target when there is no room.
  void reserve(uint64_t size);

  // Appends bytes (retrying short writes and EINTR). PEFT_ERR_IO naming the target on failure
  // (e.g. "no space left on device"); the object is then unusable except for abort(). Writeback is
  // paced: each 32 MiB written are handed to the device at once, and the writer waits for the 32 MiB
  // before them, so that about 64 MiB at most are in flight (the reasons in pace_writeback).
  void write(const void* data, size_t size);

  // Flushes the file to disk and closes it, without renaming yet: a group of files (the shards of
  // a checkpoint) can all be made durable before any of them replaces an old file.
  void flush_and_close();

  // flush_and_close() if not done yet, then renames over the target and flushes the folder.
  void commit();

  // Closes and removes the temporary; never throws. Does nothing after commit().
  void abort() noexcept;

  const std::string& target() const { return target_; }
  const std::string& temp_path() const { return temp_path_; }
  uint64_t bytes_written() const { return written_; }
  bool committed() const { return committed_; }

 private:
  void pace_writeback();

  std::string target_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  uint64_t writeback_started_ = 0;  // bytes [0, writeback_started_) were handed to the kernel to write
  uint64_t writeback_done_ = 0;     // bytes [0, writeback_done_) were written and dropped from the cache
  bool closed_ = false;
  bool committed_ = false;
};

// Flushes a folder's entries (after a rename into it). Best effort on file systems that refuse.
void sync_directory(const std::string& folder);

// True when a file name is one of our temporaries (".<name>.peft-tmp-XXXXXX").
bool is_atomic_temp_name(const std::string& file_name);

// A free temporary name next to `target` (".<name>.peft-tmp-XXXXXX"), not created.
std::string atomic_temp_name_for(const std::string& target);

// rename(2) and unlink(2) through the fault hook below (FileOp::rename naming `to`, FileOp::remove):
// the steps of a folder commit. Return 0 or the errno.
int rename_file(const std::string& from, const std::string& to);
int remove_file(const std::string& path);

// Writes `text` to a temporary next to `path`, flushed and closed but not yet renamed: the caller
// commits it (AtomicFile::commit) once everything else that belongs with it is written too.
// PEFT_ERR_IO naming the path on failure.
std::unique_ptr<AtomicFile> stage_text_file(const std::string& path, const std::string& text);

// Eight random characters from [A-Za-z0-9]: a per-write token for file names.
std::string random_token();

namespace testing {

// Fault injection for tests only (not exported from the shared library, which hides every
// non-peft_ symbol). When set, the hook runs before each system call of AtomicFile; returning a
// nonzero errno makes that call fail with it. NULL (the default) injects nothing. A hook may also
// stop the process there (the kill tests).
enum class FileOp { create, reserve, write, fsync, rename, remove };
using FaultHook = int (*)(FileOp op, const std::string& target);
extern FaultHook fault_hook;

}  // namespace testing

}  // namespace peft
