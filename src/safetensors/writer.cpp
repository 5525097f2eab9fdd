#include "safetensors/writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

constexpr size_t kOutputBufferBytes = size_t{1} << 20;  // like the reference's 1 MiB BufWriter
constexpr uint64_t kConvertElements = uint64_t{1} << 18;

uint64_t element_bytes(DType dtype) { return dtype_bits(dtype) / 8; }

}  // namespace

TensorWriter::~TensorWriter() { abort(); }

// ---- declarations ------------------------------------------------------------------------------

void TensorWriter::require_declaring(const char* what) const {
  if (failed_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + ": the writer failed earlier");
  if (started_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + " once writing has started");
}

void TensorWriter::add_tensor(std::string name, DType dtype, std::vector<uint64_t> shape) {
  require_declaring("declare a tensor");
  if (by_name_.count(name) != 0) fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(name) + " is declared twice");
  TensorDecl decl = make_tensor_decl(std::move(name), dtype, std::move(shape));
  decls_.push_back(std::move(decl));
  try {
    by_name_.emplace(decls_.back().name, decls_.size() - 1);
  } catch (...) {
    decls_.pop_back();
    throw;
  }
}

void TensorWriter::set_metadata_present(bool present) {
  require_declaring("change the metadata");
  if (!present) {
    metadata_.reset();
  } else if (!metadata_) {
    metadata_.emplace();
  }
}

void TensorWriter::set_metadata(std::string key, std::string value) {
  require_declaring("change the metadata");
  check_metadata_entry(key, value);
  WriterMetadata updated = metadata_ ? metadata_ : WriterMetadata(std::in_place);
  (*updated)[std::move(key)] = std::move(value);
  metadata_ = std::move(updated);
}

// ---- planning ----------------------------------------------------------------------------------

void TensorWriter::start() {
  if (started_) return;
  require_declaring("start writing");
  std::vector<OutputSpec> specs = plan_outputs(decls_);
  std::vector<Output> outputs;
  std::vector<Slot> slots;
  slots.reserve(decls_.size());
  for (OutputSpec& spec : specs) {
    Output out;
    out.layout = plan_file(decls_, spec.members, spec.metadata, spec.path);
    out.spec = std::move(spec);
    out.first_position = slots.size();
    for (size_t d : out.layout.order) slots.push_back({outputs.size(), d});
    outputs.push_back(std::move(out));
  }
  if (slots.size() != decls_.size()) fail(PEFT_ERR_INTERNAL, "the output plan does not cover every tensor once");
  prepare_outputs();
  outputs_ = std::move(outputs);
  slots_ = std::move(slots);
  started_ = true;
}

const TensorDecl& TensorWriter::tensor_at(size_t position) const {
  return decls_.at(declaration_at(position));
}

size_t TensorWriter::declaration_at(size_t position) const {
  if (!started_) fail(PEFT_ERR_INVALID_ARGUMENT, "the writer's order is known once writing has started");
  if (position >= slots_.size()) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "position " + std::to_string(position) + " is out of range (the writer has " +
                                        std::to_string(slots_.size()) + " tensors)");
  }
  return slots_[position].decl;
}

// ---- streaming ---------------------------------------------------------------------------------

void TensorWriter::require_streaming(const char* what) const {
  if (failed_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + ": the writer failed earlier");
  if (finished_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + ": the writer has finished");
}

void TensorWriter::require_current(const char* what) const {
  require_streaming(what);
  if (!in_tensor_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + ": no tensor has been begun");
}

// I/O failures, cancellations and anything unexpected leave a half-written temporary behind; the
// only safe state after that is a discarded output.
template <class Body>
void TensorWriter::poison_on_failure(Body&& body) {
  try {
    body();
  } catch (...) {
    abort();
    throw;
  }
}

uint64_t TensorWriter::source_bytes(const TensorDecl& decl, DType src_dtype) const {
  if (src_dtype == decl.dtype) return decl.nbytes;
  if (!is_valid_dtype(static_cast<int32_t>(src_dtype))) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(decl.name) + ": unknown source dtype " +
                                        std::to_string(static_cast<int32_t>(src_dtype)));
  }
  if (!can_convert(src_dtype, decl.dtype)) {
    fail(PEFT_ERR_UNSUPPORTED, "tensor " + quoted(decl.name) + ": cannot convert " +
                                   std::string(dtype_name(src_dtype)) + " to " + std::string(dtype_name(decl.dtype)));
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(decl.elements, element_bytes(src_dtype), &bytes)) {
    fail(PEFT_ERR_VALIDATION_OVERFLOW, "tensor " + quoted(decl.name) + ": its source size overflows");
  }
  return bytes;
}

void TensorWriter::require_no_open_tensor() const {
  if (!in_tensor_) return;
  const TensorDecl& cur = tensor_at(next_);
  fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(cur.name) + " is incomplete: " + std::to_string(src_done_) +
                                      " of " + std::to_string(src_expected_) + " bytes written");
}

void TensorWriter::begin_tensor(std::string_view name, DType src_dtype) {
  require_streaming("begin a tensor");
  start();
  require_no_open_tensor();
  if (next_ >= slots_.size()) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(std::string(name)) + ": every declared tensor is already written");
  }
  const TensorDecl& decl = tensor_at(next_);
  if (decl.name != name) {
    const std::string what = by_name_.count(std::string(name)) ? " is not next" : " was never declared";
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(std::string(name)) + what + ": the writer expects " +
                                        quoted(decl.name) + " next (tensors are written in the header's order)");
  }
  const uint64_t expected = source_bytes(decl, src_dtype);
  poison_on_failure([&] {
    Output& out = outputs_[slots_[next_].output];
    if (!out.file) open_output(out);
  });
  in_tensor_ = true;
  src_dtype_ = src_dtype;
  src_expected_ = expected;
  src_done_ = 0;
  poison_on_failure([&] { complete_tensor_if_full(); });
}

void TensorWriter::write(const void* data, uint64_t nbytes) {
  require_current("write tensor bytes");
  const TensorDecl& decl = tensor_at(next_);
  if (nbytes > src_expected_ - src_done_) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(decl.name) + ": " + std::to_string(nbytes) +
                                        " bytes written but only " + std::to_string(src_expected_ - src_done_) +
                                        " of its " + std::to_string(src_expected_) + " bytes are left");
  }
  if (nbytes == 0) return;
  if (data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(decl.name) + ": data must not be NULL");
  if (src_dtype_ != decl.dtype && nbytes % element_bytes(src_dtype_) != 0) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(decl.name) + ": a chunk that is converted must hold whole " +
                                        std::string(dtype_name(src_dtype_)) + " elements");
  }
  poison_on_failure([&] { write_unchecked(data, nbytes); });
}

void TensorWriter::write_unchecked(const void* data, uint64_t nbytes) {
  const TensorDecl& decl = tensor_at(next_);
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (src_dtype_ == decl.dtype) {
    emit(bytes, nbytes);
  } else {
    const uint64_t in_size = element_bytes(src_dtype_);
    const uint64_t out_size = element_bytes(decl.dtype);
    if (scratch_.size() < kConvertElements * out_size) scratch_.resize(kConvertElements * out_size);
    for (uint64_t done = 0; done < nbytes;) {
      const uint64_t count = std::min(kConvertElements, (nbytes - done) / in_size);
      convert(src_dtype_, bytes + done, decl.dtype, scratch_.data(), count);
      emit(scratch_.data(), count * out_size);
      done += count * in_size;
    }
  }
  src_done_ += nbytes;
  complete_tensor_if_full();
}

void TensorWriter::complete_tensor_if_full() {
  if (!in_tensor_ || src_done_ != src_expected_) return;
  in_tensor_ = false;
  Output& out = outputs_[slots_[next_].output];
  ++next_;
  const bool last_of_output = next_ == slots_.size() || slots_[next_].output != slots_[next_ - 1].output;
  if (last_of_output) close_output(out);
}

void TensorWriter::write_tensor(std::string_view name, DType src_dtype, const void* data, uint64_t nbytes) {
  require_streaming("write a tensor");
  start();
  if (next_ < slots_.size() && !in_tensor_ && tensor_at(next_).name == name) {
    const TensorDecl& decl = tensor_at(next_);
    const uint64_t expected = source_bytes(decl, src_dtype);
    if (nbytes != expected) {
      fail(PEFT_ERR_TENSOR_INVALID_INFO, "tensor " + quoted(decl.name) + ": " + std::to_string(nbytes) +
                                             " bytes given but its shape and dtype " +
                                             std::string(dtype_name(src_dtype)) + " make " + std::to_string(expected));
    }
  }
  begin_tensor(name, src_dtype);  // reports the order errors
  if (in_tensor_) write(data, nbytes);
}

void TensorWriter::write_from(std::string_view name, DType src_dtype, const ChunkSource& source) {
  if (!source) fail(PEFT_ERR_INVALID_ARGUMENT, "the tensor source callback must not be NULL");
  begin_tensor(name, src_dtype);
  if (!in_tensor_) return;
  const std::string tensor_name(name);
  const uint64_t unit = src_dtype == tensor_at(next_).dtype ? 1 : element_bytes(src_dtype);
  const uint64_t chunk = std::max<uint64_t>(unit, kStreamChunkBytes / unit * unit);
  std::vector<uint8_t> buffer;
  poison_on_failure([&] {
    buffer.resize(static_cast<size_t>(std::min(chunk, src_expected_)));
    while (in_tensor_) {
      const uint64_t offset = src_done_;
      const uint64_t n = std::min<uint64_t>(buffer.size(), src_expected_ - offset);
      if (!source(offset, buffer.data(), n)) {
        fail(PEFT_ERR_CANCELLED, "writing tensor " + quoted(tensor_name) + " was cancelled by its source callback");
      }
      write_unchecked(buffer.data(), n);
    }
  });
}

// ---- output files ------------------------------------------------------------------------------

void TensorWriter::open_output(Output& out) {
  out.file = std::make_unique<AtomicFile>(out.spec.path);
  out.file->reserve(out.layout.file_size);
  out.buffer.reserve(kOutputBufferBytes);
  out.file->write(out.layout.prefix.data(), out.layout.prefix.size());
}

void TensorWriter::flush_buffer(Output& out) {
  if (out.buffer.empty()) return;
  out.file->write(out.buffer.data(), out.buffer.size());
  out.buffer.clear();
}

void TensorWriter::close_output(Output& out) {
  flush_buffer(out);
  if (out.file->bytes_written() != out.layout.file_size) {
    fail(PEFT_ERR_INTERNAL, "output " + quoted(out.spec.path) + " has " + std::to_string(out.file->bytes_written()) +
                                " bytes instead of " + std::to_string(out.layout.file_size));
  }
  out.file->flush_and_close();
  std::string().swap(out.buffer);
}

void TensorWriter::emit(const void* data, size_t size) {
  Output& out = outputs_[slots_[next_].output];
  if (out.buffer.size() + size > kOutputBufferBytes) flush_buffer(out);
  if (size >= kOutputBufferBytes) {
    out.file->write(data, size);
  } else {
    out.buffer.append(static_cast<const char*>(data), size);
  }
}

void TensorWriter::finish() {
  require_streaming("finish");
  start();
  require_no_open_tensor();
  if (next_ < slots_.size()) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(tensor_at(next_).name) + " was never written (" +
                                        std::to_string(slots_.size() - next_) + " of " +
                                        std::to_string(slots_.size()) + " tensors are missing)");
  }
  poison_on_failure([&] {
    for (Output& out : outputs_) {  // outputs without tensors exist only now
      if (!out.file) {
        open_output(out);
        close_output(out);
      }
    }
    commit_outputs();
  });
  finished_ = true;
}

void TensorWriter::commit_outputs() {
  for (Output& out : outputs_) out.file->commit();
}

void TensorWriter::abort() noexcept {
  if (finished_) return;
  failed_ = true;
  for (Output& out : outputs_) {
    if (out.file) out.file->abort();
  }
  in_tensor_ = false;
}

// ---- one file ----------------------------------------------------------------------------------

FileWriter::FileWriter(std::string path) : TensorWriter(std::nullopt), path_(std::move(path)) {
  if (path_.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "the output path must not be empty");
}

std::vector<OutputSpec> FileWriter::plan_outputs(const std::vector<TensorDecl>& decls) {
  OutputSpec spec;
  spec.path = path_;
  spec.metadata = metadata();
  spec.members.resize(decls.size());
  for (size_t i = 0; i < decls.size(); ++i) spec.members[i] = i;
  return {std::move(spec)};
}

}  // namespace peft
