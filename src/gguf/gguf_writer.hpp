// The streaming GGUF v3 writer: the GGUF header encoder on the streaming core
// (core/stream_writer.hpp). Metadata and tensors are declared first, in the order they are to
// appear; start() writes the header; then each tensor's bytes are streamed in declaration order (the
// tensor-info order is the data order, as gguf-py's GGUFWriter and ggml's gguf.cpp write it), raw
// or converted from another dtype on the way. Memory holds a few fixed-size chunks, never a tensor.
//
// The bytes are exactly gguf-py's for the same metadata and tensors (tests/interop/
// test_gguf_writer.py): "GGUF", version 3 (u32), tensor count and KV count (u64); each KV as key
// (u64 length + bytes), value type (u32), value (integers and floats little-endian at their width,
// BOOL one byte 0/1, STRING u64 length + bytes, ARRAY element type u32 + count u64 + elements
// without a type of their own, also those of a nested array); each tensor info as name, n_dims (u32),
// the dimensions innermost first (u64 each), ggml type (u32) and its data offset (u64); zero bytes
// up to the alignment (also when there are no tensors); then each tensor's bytes followed by zero
// bytes up to the alignment. Offsets are relative to the data section and aligned. Unlike
// gguf.cpp, which drops outer dimensions of size 1 from n_dims, the shape is written as declared
// (as gguf-py does), so a copied file keeps its tensor infos.
//
// Output goes through AtomicFile: nothing appears at the target until finish() succeeds; a failure
// at any step, or destruction without finish(), leaves the target as it was.
//
// A writer belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/dtype.hpp"
#include "core/stream_writer.hpp"
#include "core/tensor_info.hpp"
#include "gguf/gguf_header.hpp"

namespace peft {

inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint64_t kGgufDefaultAlignment = 32;
// Longest tensor name ggml reads: GGML_MAX_NAME (64) bytes including the terminating NUL.
inline constexpr size_t kGgufMaxTensorName = 63;
inline constexpr size_t kGgufMaxDims = 4;  // GGML_MAX_DIMS

// Appends `item` to `array` in its compact form (GgufArray). INVALID_ARGUMENT, as add_metadata,
// for an item that add_metadata would refuse or whose type is not the array's element type.
void gguf_array_append(GgufArray& array, const GgufValue& item);

class GgufWriter final : public StreamingWriter {
 public:
  // Nothing is created until start(). INVALID_ARGUMENT for an empty path. Destroyed unfinished, it
  // leaves the target as it was (StreamingWriter).
  explicit GgufWriter(std::string path);

  // ---- Declarations (before start) --------------------------------------------------------------
  // Appends one metadata key/value. INVALID_ARGUMENT naming the key for: a duplicate key, a key that
  // is not UTF-8, a value whose `data` does not hold the alternative its type needs (gguf_header.hpp),
  // an integer out of its type's range, an F32 that is finite but rounds to infinity (F32 values are
  // rounded to nearest as gguf-py's struct.pack does), an array whose storage is inconsistent
  // (GgufArray::well_formed()), a value type out of range; `general.alignment` that is not a U32 holding a
  // nonzero power of two (it sets the alignment of the file; 32 without it). STRING values are
  // written as given (any bytes, as gguf-py writes `bytes` values).
  void add_metadata(GgufKeyValue entry);
  void add_metadata(std::string key, GgufValue value);
  // Appends one tensor: its name, ggml type number (gguf/ggml_type.hpp) and shape outermost first
  // (written as ne, innermost first; at most 4 dimensions, none for a one-element scalar).
  // INVALID_ARGUMENT naming the tensor for: a name that is not UTF-8, is longer than 63 bytes (ggml
  // refuses to read it) or is declared twice; an unknown ggml type; more than 4 dimensions; an
  // innermost dimension that is not a multiple of the type's block size. VALIDATION_OVERFLOW when
  // the element count exceeds INT64_MAX or a size or offset does not fit 64 bits.
  void add_tensor(std::string name, uint32_t ggml_type, std::vector<uint64_t> shape);
  // Declares everything a parsed header holds (its metadata, then its tensors, in its order), so
  // that a file can be copied, with changes made to the GgufHeader before. The header's version,
  // offsets and data_start are not used: the writer writes version 3 and computes its own layout.
  void declare(const GgufHeader& header);

  // ---- The layout -------------------------------------------------------------------------------
  uint64_t alignment() const { return alignment_; }
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  // The tensors as declared, with the begin/end the writer gives them (relative to the data
  // section), dtype and block_quantized filled in as a parser reports them.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Bytes of everything before the data section (a multiple of the alignment).
  uint64_t data_start() const;
  // Bytes of the data section: the last tensor's end padded to the alignment (0 without tensors).
  uint64_t data_size() const { return data_size_; }
  uint64_t file_size() const;  // VALIDATION_OVERFLOW when it does not fit 64 bits
  // The header a GGUF parser should report for the file: version 3, the metadata and tensors, the
  // alignment, data_start and data_size.
  GgufHeader layout() const;

  // ---- Streaming --------------------------------------------------------------------------------
  // start() (StreamingWriter) closes the declarations, creates the temporary next to the target,
  // reserves the file's size and writes the header. Called by the first
  // begin_tensor()/write_tensor()/finish() if not before. write(): StreamingWriter.
  // Index of the tensor expected next; tensors().size() once all are written.
  size_t next_tensor() const { return next_position(); }

  // Begins the tensor expected next (`name` must be it: INVALID_ARGUMENT naming both otherwise).
  // Without a dtype, the bytes that follow are the tensor's stored bytes (any ggml type). With
  // one, they are elements of `src_dtype`, converted to the declared type (F32, F16, BF16, F64;
  // or copied when it is the declared type's own dtype); UNSUPPORTED for a pair convert() does not
  // do and for block-quantized types, which take raw bytes only. A zero-byte tensor is complete at
  // once.
  void begin_tensor(std::string_view name) { begin(name, std::nullopt); }
  void begin_tensor(std::string_view name, DType src_dtype) { begin(name, src_dtype); }
  // A whole tensor at once: TENSOR_INVALID_INFO naming it when `nbytes` is not its size (in
  // `src_dtype` when given).
  void write_tensor(std::string_view name, const void* data, uint64_t nbytes);
  void write_tensor(std::string_view name, DType src_dtype, const void* data, uint64_t nbytes);
  // finish() checks that every tensor was written completely (INVALID_ARGUMENT naming the first that
  // was not), flushes and renames the file over the target; abort() discards it (StreamingWriter).

  // Files that appear together or not at all (the parts of a split model): finish_staged() is
  // finish() without the rename, the complete file left in its temporary (removed if the writer is
  // destroyed before commit_together). commit_together() then renames every writer's file over its
  // target in order; if one rename fails, the targets already renamed are removed, every other
  // temporary is removed with its writer, and the error is thrown (PEFT_ERR_IO). Each writer must have
  // finished staged (INVALID_ARGUMENT otherwise).
  void finish_staged();
  static void commit_together(const std::vector<std::unique_ptr<GgufWriter>>& writers);
  const std::string& path() const { return path_; }

 private:
  void commit_files() override;
  bool staged_ = false;  // finish() leaves the file in its temporary
  class Sink;
  StreamPlan plan_stream() override;
  uint64_t source_bytes(size_t position, std::optional<DType> src) const override;
  void place_tensors();
  void write_header(Sink& sink) const;

  std::string path_;
  std::vector<GgufKeyValue> metadata_;
  std::unordered_set<std::string> keys_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_size_ = 0;
};

}  // namespace peft
