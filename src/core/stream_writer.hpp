// The streaming core every tensor-file writer shares (the safetensors writers, safetensors/writer.hpp,
// and the GGUF writer, gguf/gguf_writer.hpp): the format plans its files (each one's header bytes and
// size) and its tensors in write order; this writes them. Each tensor is begun by name, in that
// order, and its bytes follow as stored or as elements of another dtype converted on the way
// (core/convert); zero bytes pad a tensor where the format wants them; a file is flushed, checked
// against its planned size and closed after its last tensor; finish() commits every file, abort()
// discards them. Memory holds a few fixed-size chunks, never a tensor.
//
// Output goes through AtomicFile: nothing appears at a target path until finish() succeeds; any
// failure while writing (I/O, cancellation) discards the output, and a discarded or destroyed writer
// leaves the targets as they were.
//
// A writer belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/dtype.hpp"

namespace peft {

// Fills `dst` with `nbytes` bytes of the tensor (in the source dtype) starting at source byte
// `offset`; returns false to cancel the write (which then fails with PEFT_ERR_CANCELLED).
using ChunkSource = std::function<bool(uint64_t offset, void* dst, uint64_t nbytes)>;

// Bytes per chunk when streaming: large enough for full-speed I/O, small enough not to matter.
inline constexpr uint64_t kStreamChunkBytes = uint64_t{4} << 20;

// Appends a declaration (anything with a `name`) to `items` and indexes it by name; when indexing
// fails (out of memory) neither holds it.
template <class Item>
void append_indexed(std::vector<Item>& items, std::unordered_map<std::string, size_t>& by_name, Item item) {
  items.push_back(std::move(item));
  try {
    by_name.emplace(items.back().name, items.size() - 1);
  } catch (...) {
    items.pop_back();
    throw;
  }
}

class StreamingWriter {
 public:
  StreamingWriter(const StreamingWriter&) = delete;
  StreamingWriter& operator=(const StreamingWriter&) = delete;
  virtual ~StreamingWriter();  // abort() unless finished

  // Closes the declarations and plans the files (the format's errors; a failed start() changes
  // nothing). Called by the first begin/write/finish if not called before.
  void start();
  bool started() const { return started_; }
  // Position (in write order) of the tensor expected next; the tensor count once all are written.
  size_t next_position() const { return next_; }

  // Appends bytes of the current tensor. INVALID_ARGUMENT naming the tensor for more bytes than it
  // has left or, when converting, a chunk that is not whole elements; such a call changes nothing.
  void write(const void* data, uint64_t nbytes);
  // Checks that every tensor is complete (INVALID_ARGUMENT naming the first that is not), closes
  // the files and commits them.
  void finish();
  // Discards the output (temporaries removed, targets untouched). Never throws.
  void abort() noexcept;
  bool finished() const { return finished_; }
  bool failed() const { return failed_; }

 protected:
  // One file as the format plans it.
  struct StreamFile {
    std::string path;
    std::string header;          // the bytes before its first tensor
    uint64_t size = 0;           // in all
    bool open_at_start = false;  // created by start() (otherwise when its first tensor begins, or by finish())
  };
  // One tensor, in write order.
  struct StreamTensor {
    std::string name;
    size_t file = 0;            // index into the files
    DType dtype = DType::U8;    // what its stored elements are (for conversions)
    uint64_t pad_after = 0;     // zero bytes after it
  };
  struct StreamPlan {
    std::vector<StreamFile> files;
    std::vector<StreamTensor> tensors;  // in write order, file by file
  };

  // `order` (a string literal) says in messages which order tensors are written in ("the header's order").
  explicit StreamingWriter(const char* order) : order_(order) {}

  // The plan, from the declarations (called once by start(); a throw fails start()).
  virtual StreamPlan plan_stream() = 0;
  // Bytes the tensor at `position` takes from its source: stored bytes (`src` nullopt), or elements of
  // `src` to convert; throws for a source it cannot take.
  virtual uint64_t source_bytes(size_t position, std::optional<DType> src) const = 0;
  // Called by finish() once every file is written and closed: puts them in place. The default
  // commits each file in order.
  virtual void commit_files();

  // INVALID_ARGUMENT "cannot <what>: ..." after a failure, or once writing has started / finished.
  void require_declaring(const char* what) const;
  void require_streaming(const char* what) const;

  // Begins the tensor expected next; `name` must be it (INVALID_ARGUMENT otherwise). A zero-byte
  // tensor is complete at once.
  void begin(std::string_view name, std::optional<DType> src);
  // Whether `name` is the tensor expected next and none is open (a whole-tensor write checks its
  // size against it before beginning it).
  bool is_next(std::string_view name) const;
  bool in_tensor() const { return in_tensor_; }
  // A whole tensor from a callback, in bounded chunks.
  void write_from(std::string_view name, DType src_dtype, const ChunkSource& source);

  // The file `k` of the plan, once it is open (every one is by the time commit_files() runs).
  AtomicFile& output_file(size_t k) { return *files_.at(k).file; }

  // Runs `body`; on any exception discards the output (a half-written temporary is useless) and
  // rethrows.
  template <class Body>
  void poison_on_failure(Body&& body) {
    try {
      body();
    } catch (...) {
      abort();
      throw;
    }
  }

 private:
  struct OpenFile {
    StreamFile plan;
    std::unique_ptr<AtomicFile> file;
    bool closed = false;
  };
  void require_no_open_tensor() const;
  void write_unchecked(const void* data, uint64_t nbytes);
  void complete_tensor_if_full();
  void open_file(OpenFile& f);
  void close_file(OpenFile& f);
  void flush_buffer(OpenFile& f);
  void emit(OpenFile& f, const void* data, size_t size);
  void emit_padding(OpenFile& f, uint64_t count);

  const char* order_;
  std::vector<OpenFile> files_;
  std::vector<StreamTensor> tensors_;
  std::string buffer_;  // pending small writes of the file being written
  bool started_ = false;
  bool finished_ = false;
  bool failed_ = false;
  size_t next_ = 0;
  // The current tensor: whether it is converted, from which dtype, source bytes expected and done.
  bool in_tensor_ = false;
  bool converting_ = false;
  DType src_dtype_ = DType::U8;
  uint64_t src_expected_ = 0;
  uint64_t src_done_ = 0;
  std::vector<uint8_t> scratch_;  // conversion output
};

}  // namespace peft
