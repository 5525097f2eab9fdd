// The streaming, two-pass safetensors writer: the safetensors header encoder on the streaming core
// (core/stream_writer.hpp). Tensors are declared first (name, dtype, shape) with the metadata;
// start() computes every header from the declarations alone; then each tensor's bytes are streamed
// in the writer's order (the reference's order: dtype rank descending, then name) from a caller's
// buffer, in chunks, from a callback, or from an opened checkpoint, converting dtypes on the way
// when asked. Memory holds at most a few fixed-size chunks, never a whole tensor.
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

#include "core/dtype.hpp"
#include "core/stream_writer.hpp"
#include "safetensors/header_writer.hpp"

namespace peft {

class Checkpoint;

// One output file as a concrete writer plans it.
struct OutputSpec {
  std::string path;
  std::vector<size_t> members;  // declaration indices
  WriterMetadata metadata;
};

class TensorWriter : public StreamingWriter {
 public:
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
  // start() (StreamingWriter) closes declarations and computes every header (HEADER_TOO_LARGE,
  // duplicate names); it is called by the first begin_tensor()/finish() if not called before. A
  // failed start() changes nothing. write(), finish(), abort(): StreamingWriter.
  size_t tensor_count() const { return decls_.size(); }
  // The tensor written at `position` (0-based, in writer order). Requires start().
  const TensorDecl& tensor_at(size_t position) const;
  size_t declaration_at(size_t position) const;  // its index in declaration order
  // The files written (after start()): one, or the shards of a checkpoint; an index is not listed.
  size_t output_count() const { return outputs_.size(); }
  const std::string& output_path(size_t k) const { return outputs_.at(k).spec.path; }

  // Begins the tensor expected next; `name` must be it (INVALID_ARGUMENT otherwise). The bytes that
  // follow are in `src_dtype`, converted to the declared dtype when they differ (UNSUPPORTED for a
  // pair convert() does not do). A zero-size tensor is complete at once.
  void begin_tensor(std::string_view name, DType src_dtype) { begin(name, src_dtype); }
  // A whole tensor at once: TENSOR_INVALID_INFO when `nbytes` differs from its size in `src_dtype`.
  void write_tensor(std::string_view name, DType src_dtype, const void* data, uint64_t nbytes);
  // A whole tensor from a callback, in bounded chunks.
  using StreamingWriter::write_from;
  // A whole tensor from tensor `index` of an opened checkpoint (same shape required: SHAPE_MISMATCH),
  // converted to the declared dtype if it differs. Pages of a mapped source are released as they
  // are consumed, so a rewrite does not keep the source resident.
  void write_from_checkpoint(std::string_view name, const Checkpoint& source, size_t index);

 protected:
  explicit TensorWriter(WriterMetadata initial_metadata)
      : StreamingWriter("the header's order"), metadata_(std::move(initial_metadata)) {}

  // Splits the declarations into output files (at least one).
  virtual std::vector<OutputSpec> plan_outputs(const std::vector<TensorDecl>& decls) = 0;
  // Called by start() once the plan is complete, before anything is written (a folder to create).
  // A throw fails start() with nothing else changed.
  virtual void prepare_outputs() {}
  // Called by finish() once every output is written and flushed: puts them in place. The default
  // renames each output over its target in order; a folder writer orders its files itself.
  virtual void commit_outputs() { StreamingWriter::commit_files(); }

  struct Output {
    OutputSpec spec;
    FileLayout layout;  // without its prefix, which the streaming core holds until it is written
    size_t first_position = 0;
  };
  const std::vector<Output>& outputs() const { return outputs_; }
  std::vector<Output>& outputs() { return outputs_; }
  const std::vector<TensorDecl>& declarations() const { return decls_; }

 private:
  StreamPlan plan_stream() final;
  uint64_t source_bytes(size_t position, std::optional<DType> src) const final;
  void commit_files() final { commit_outputs(); }
  // Bytes of the tensor in `src_dtype` (UNSUPPORTED for a conversion convert() does not do).
  uint64_t bytes_from(const TensorDecl& decl, DType src_dtype) const;

  std::vector<TensorDecl> decls_;
  std::unordered_map<std::string, size_t> by_name_;
  WriterMetadata metadata_;
  std::vector<Output> outputs_;
  std::vector<size_t> order_;  // declaration index by position
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

}  // namespace peft
