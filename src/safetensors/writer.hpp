// The streaming, two-pass safetensors writer. Tensors are declared first (name, dtype, shape) with
// the metadata; start() computes every header from the declarations alone; then each tensor's bytes
// are streamed in the writer's order (the reference's order: dtype rank descending, then name) from
// a caller's buffer, in chunks, from a callback, or from an opened checkpoint, converting dtypes
// on the way when asked. Memory holds at most a few fixed-size chunks, never a whole tensor.
//
// Output goes through AtomicFile: nothing appears at a target path until finish() succeeds; any
// failure removes the temporaries and leaves the targets as they were.
//
// A writer belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/dtype.hpp"
#include "safetensors/header_writer.hpp"

namespace peft {

class Checkpoint;

// Fills `dst` with `nbytes` bytes of the tensor (in the source dtype) starting at source byte
// `offset`; returns false to cancel the write (which then fails with PEFT_ERR_CANCELLED).
using ChunkSource = std::function<bool(uint64_t offset, void* dst, uint64_t nbytes)>;

// One output file as a concrete writer plans it.
struct OutputSpec {
  std::string path;
  std::vector<size_t> members;  // declaration indices
  WriterMetadata metadata;
};

class TensorWriter {
 public:
  TensorWriter(const TensorWriter&) = delete;
  TensorWriter& operator=(const TensorWriter&) = delete;
  virtual ~TensorWriter();

  // ---- Declarations (before start) --------------------------------------------------------------
  // INVALID_ARGUMENT for a duplicate or reserved name, non-UTF-8, unknown dtype, or after start();
  // the size errors of make_tensor_decl().
  void add_tensor(std::string name, DType dtype, std::vector<uint64_t> shape);
  // Whether "__metadata__" is written (an empty map writes "__metadata__":{}). false drops entries.
  void set_metadata_present(bool present);
  // Sets one entry (replacing an earlier value of the key) and makes metadata present.
  void set_metadata(std::string key, std::string value);
  const WriterMetadata& metadata() const { return metadata_; }

  // ---- Streaming --------------------------------------------------------------------------------
  // Closes declarations and computes every header (HEADER_TOO_LARGE, duplicate names). Called by the
  // first begin_tensor()/finish() if not called before. A failed start() changes nothing.
  void start();
  bool started() const { return started_; }
  size_t tensor_count() const { return decls_.size(); }
  // The tensor written at `position` (0-based, in writer order). Requires start().
  const TensorDecl& tensor_at(size_t position) const;
  size_t declaration_at(size_t position) const;  // its index in declaration order
  // The files written (after start()): one, or the shards of a checkpoint; an index is not listed.
  size_t output_count() const { return outputs_.size(); }
  const std::string& output_path(size_t k) const { return outputs_.at(k).spec.path; }
  // Position of the tensor expected next; tensor_count() once all are written.
  size_t next_position() const { return next_; }

  // Begins the tensor expected next; `name` must be it (INVALID_ARGUMENT otherwise). The bytes that
  // follow are in `src_dtype`, converted to the declared dtype when they differ (UNSUPPORTED for a
  // pair convert() does not do). A zero-size tensor is complete at once.
  void begin_tensor(std::string_view name, DType src_dtype);
  // Appends bytes of the current tensor. INVALID_ARGUMENT naming the tensor for more bytes than it
  // has left or, when converting, a chunk that is not whole elements; such a call changes nothing.
  void write(const void* data, uint64_t nbytes);
  // A whole tensor at once: TENSOR_INVALID_INFO when `nbytes` differs from its size in `src_dtype`.
  void write_tensor(std::string_view name, DType src_dtype, const void* data, uint64_t nbytes);
  // A whole tensor from a callback, in bounded chunks.
  void write_from(std::string_view name, DType src_dtype, const ChunkSource& source);
  // A whole tensor from tensor `index` of an opened checkpoint (same shape required: SHAPE_MISMATCH),
  // converted to the declared dtype if it differs. Pages of a mapped source are released as they
  // are consumed, so a rewrite does not keep the source resident.
  void write_from_checkpoint(std::string_view name, const Checkpoint& source, size_t index);
  // Checks that every tensor is complete, flushes, and renames every output into place.
  void finish();
  // Discards the output (temporaries removed, targets untouched). Never throws.
  void abort() noexcept;
  bool finished() const { return finished_; }
  bool failed() const { return failed_; }

 protected:
  explicit TensorWriter(WriterMetadata initial_metadata) : metadata_(std::move(initial_metadata)) {}

  // Splits the declarations into output files (at least one).
  virtual std::vector<OutputSpec> plan_outputs(const std::vector<TensorDecl>& decls) = 0;
  // Called by start() once the plan is complete, before anything is written (a folder to create).
  // A throw fails start() with nothing else changed.
  virtual void prepare_outputs() {}
  // Called by finish() once every output is written and flushed: puts them in place. The default
  // renames each output over its target in order; a folder writer orders its files itself.
  virtual void commit_outputs();

  struct Output {
    OutputSpec spec;
    FileLayout layout;
    std::unique_ptr<AtomicFile> file;
    std::string buffer;  // pending small writes
    size_t first_position = 0;
  };
  const std::vector<Output>& outputs() const { return outputs_; }
  std::vector<Output>& outputs() { return outputs_; }
  const std::vector<TensorDecl>& declarations() const { return decls_; }

 private:
  struct Slot {
    size_t output;
    size_t decl;
  };
  void require_declaring(const char* what) const;
  void require_streaming(const char* what) const;
  // INVALID_ARGUMENT naming the current tensor when its bytes are not all written yet.
  void require_no_open_tensor() const;
  void require_current(const char* what) const;
  template <class Body>
  void poison_on_failure(Body&& body);
  uint64_t source_bytes(const TensorDecl& decl, DType src_dtype) const;
  void emit(const void* data, size_t size);
  void open_output(Output& out);
  void close_output(Output& out);
  void flush_buffer(Output& out);
  void complete_tensor_if_full();
  void write_unchecked(const void* data, uint64_t nbytes);

  std::vector<TensorDecl> decls_;
  std::unordered_map<std::string, size_t> by_name_;
  WriterMetadata metadata_;
  std::vector<Output> outputs_;
  std::vector<Slot> slots_;  // by position
  bool started_ = false;
  bool finished_ = false;
  bool failed_ = false;
  size_t next_ = 0;
  // The current tensor (in_tensor_): its source dtype, expected and received source bytes.
  bool in_tensor_ = false;
  DType src_dtype_ = DType::U8;
  uint64_t src_expected_ = 0;
  uint64_t src_done_ = 0;
  std::vector<uint8_t> scratch_;  // conversion output and callback chunks
};

// A writer of one safetensors file. Metadata starts absent, as with the reference's save_file.
class FileWriter final : public TensorWriter {
 public:
  explicit FileWriter(std::string path);

 protected:
  std::vector<OutputSpec> plan_outputs(const std::vector<TensorDecl>& decls) override;

 private:
  std::string path_;
};

// Bytes per chunk when streaming: large enough for full-speed I/O, small enough not to matter.
inline constexpr uint64_t kStreamChunkBytes = uint64_t{4} << 20;

}  // namespace peft
