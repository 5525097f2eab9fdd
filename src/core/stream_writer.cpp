#include "core/stream_writer.hpp"

#include <algorithm>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

constexpr size_t kOutputBufferBytes = size_t{1} << 20;  // like the reference's 1 MiB BufWriter
constexpr uint64_t kConvertElements = uint64_t{1} << 18;
constexpr uint8_t kZeros[4096] = {};

uint64_t element_bytes(DType dtype) { return dtype_bits(dtype) / 8; }

}  // namespace

StreamingWriter::~StreamingWriter() { abort(); }

void StreamingWriter::require_declaring(const char* what) const {
  if (failed_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + ": the writer failed earlier");
  if (started_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + " once writing has started");
}

void StreamingWriter::require_streaming(const char* what) const {
  if (failed_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + ": the writer failed earlier");
  if (finished_) fail(PEFT_ERR_INVALID_ARGUMENT, std::string("cannot ") + what + ": the writer has finished");
}

void StreamingWriter::start() {
  if (started_) return;
  require_declaring("start writing");
  StreamPlan plan = plan_stream();
  for (const StreamTensor& t : plan.tensors)
    if (t.file >= plan.files.size()) fail(PEFT_ERR_INTERNAL, "the output plan names a file it does not hold");
  std::vector<OpenFile> files;
  files.reserve(plan.files.size());
  for (StreamFile& f : plan.files) files.push_back({std::move(f), nullptr, false});
  files_ = std::move(files);
  tensors_ = std::move(plan.tensors);
  poison_on_failure([&] {
    for (OpenFile& f : files_)
      if (f.plan.open_at_start) open_file(f);
  });
  started_ = true;
}

void StreamingWriter::require_no_open_tensor() const {
  if (!in_tensor_) return;
  fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(tensors_[next_].name) + " is incomplete: " +
                                      std::to_string(src_done_) + " of " + std::to_string(src_expected_) +
                                      " bytes written");
}

bool StreamingWriter::is_next(std::string_view name) const {
  return next_ < tensors_.size() && !in_tensor_ && tensors_[next_].name == name;
}

void StreamingWriter::begin(std::string_view name, std::optional<DType> src) {
  require_streaming("begin a tensor");
  start();
  require_no_open_tensor();
  if (next_ >= tensors_.size())
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(std::string(name)) + ": every declared tensor is already written");
  const StreamTensor& tensor = tensors_[next_];
  if (tensor.name != name) {
    const bool declared = std::any_of(tensors_.begin(), tensors_.end(), [&](const StreamTensor& t) { return t.name == name; });
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(std::string(name)) +
                                        (declared ? " is not next" : " was never declared") + ": the writer expects " +
                                        quoted(tensor.name) + " next (tensors are written in " + order_ + ")");
  }
  const uint64_t expected = source_bytes(next_, src);
  poison_on_failure([&] {
    OpenFile& f = files_[tensor.file];
    if (!f.file) open_file(f);
  });
  in_tensor_ = true;
  converting_ = src && *src != tensor.dtype;
  src_dtype_ = src.value_or(tensor.dtype);
  src_expected_ = expected;
  src_done_ = 0;
  poison_on_failure([&] { complete_tensor_if_full(); });
}

void StreamingWriter::write(const void* data, uint64_t nbytes) {
  require_streaming("write tensor bytes");
  if (!in_tensor_) fail(PEFT_ERR_INVALID_ARGUMENT, "cannot write tensor bytes: no tensor has been begun");
  const std::string& name = tensors_[next_].name;
  if (nbytes > src_expected_ - src_done_) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(name) + ": " + std::to_string(nbytes) +
                                        " bytes written but only " + std::to_string(src_expected_ - src_done_) +
                                        " of its " + std::to_string(src_expected_) + " bytes are left");
  }
  if (nbytes == 0) return;
  if (data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(name) + ": data must not be NULL");
  if (converting_ && nbytes % element_bytes(src_dtype_) != 0) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(name) + ": a chunk that is converted must hold whole " +
                                        std::string(dtype_name(src_dtype_)) + " elements");
  }
  poison_on_failure([&] { write_unchecked(data, nbytes); });
}

void StreamingWriter::write_unchecked(const void* data, uint64_t nbytes) {
  OpenFile& f = files_[tensors_[next_].file];
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (!converting_) {
    emit(f, bytes, nbytes);
  } else {
    const DType dst = tensors_[next_].dtype;
    const uint64_t in_size = element_bytes(src_dtype_);
    const uint64_t out_size = element_bytes(dst);
    if (scratch_.size() < kConvertElements * out_size) scratch_.resize(kConvertElements * out_size);
    for (uint64_t done = 0; done < nbytes;) {
      const uint64_t count = std::min(kConvertElements, (nbytes - done) / in_size);
      convert(src_dtype_, bytes + done, dst, scratch_.data(), count);
      emit(f, scratch_.data(), count * out_size);
      done += count * in_size;
    }
  }
  src_done_ += nbytes;
  complete_tensor_if_full();
}

// Ends the current tensor once all its bytes are in, with its padding, and its file after its last.
void StreamingWriter::complete_tensor_if_full() {
  if (!in_tensor_ || src_done_ != src_expected_) return;
  const StreamTensor& tensor = tensors_[next_];
  OpenFile& f = files_[tensor.file];
  emit_padding(f, tensor.pad_after);
  in_tensor_ = false;
  ++next_;
  if (next_ == tensors_.size() || tensors_[next_].file != tensor.file) close_file(f);
}

void StreamingWriter::write_from(std::string_view name, DType src_dtype, const ChunkSource& source) {
  if (!source) fail(PEFT_ERR_INVALID_ARGUMENT, "the tensor source callback must not be NULL");
  begin(name, src_dtype);
  if (!in_tensor_) return;
  const std::string tensor_name(name);
  const uint64_t unit = converting_ ? element_bytes(src_dtype) : 1;
  const uint64_t chunk = std::max<uint64_t>(unit, kStreamChunkBytes / unit * unit);
  std::vector<uint8_t> buffer;
  poison_on_failure([&] {
    buffer.resize(static_cast<size_t>(std::min(chunk, src_expected_)));
    while (in_tensor_) {
      const uint64_t offset = src_done_;
      const uint64_t n = std::min<uint64_t>(buffer.size(), src_expected_ - offset);
      if (!source(offset, buffer.data(), n))
        fail(PEFT_ERR_CANCELLED, "writing tensor " + quoted(tensor_name) + " was cancelled by its source callback");
      write_unchecked(buffer.data(), n);
    }
  });
}

// ---- files -------------------------------------------------------------------------------------

void StreamingWriter::open_file(OpenFile& f) {
  f.file = std::make_unique<AtomicFile>(f.plan.path);
  f.file->reserve(f.plan.size);
  buffer_.reserve(kOutputBufferBytes);
  emit(f, f.plan.header.data(), f.plan.header.size());
  std::string().swap(f.plan.header);
}

void StreamingWriter::flush_buffer(OpenFile& f) {
  if (buffer_.empty()) return;
  f.file->write(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void StreamingWriter::close_file(OpenFile& f) {
  flush_buffer(f);
  if (f.file->bytes_written() != f.plan.size) {
    fail(PEFT_ERR_INTERNAL, "output " + quoted(f.plan.path) + " has " + std::to_string(f.file->bytes_written()) +
                                " bytes instead of " + std::to_string(f.plan.size));
  }
  f.file->flush_and_close();
  f.closed = true;
}

void StreamingWriter::emit(OpenFile& f, const void* data, size_t size) {
  if (buffer_.size() + size > kOutputBufferBytes) flush_buffer(f);
  if (size >= kOutputBufferBytes) {
    f.file->write(data, size);
  } else {
    buffer_.append(static_cast<const char*>(data), size);
  }
}

void StreamingWriter::emit_padding(OpenFile& f, uint64_t count) {
  while (count > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(count, sizeof kZeros));
    emit(f, kZeros, n);
    count -= n;
  }
}

void StreamingWriter::finish() {
  require_streaming("finish");
  start();
  require_no_open_tensor();
  if (next_ < tensors_.size()) {
    fail(PEFT_ERR_INVALID_ARGUMENT, "tensor " + quoted(tensors_[next_].name) + " was never written (" +
                                        std::to_string(tensors_.size() - next_) + " of " +
                                        std::to_string(tensors_.size()) + " tensors are missing)");
  }
  poison_on_failure([&] {
    for (OpenFile& f : files_) {  // files without tensors are written only now
      if (!f.file) open_file(f);
      if (!f.closed) close_file(f);
    }
    commit_files();
  });
  finished_ = true;
  std::string().swap(buffer_);
  std::vector<uint8_t>().swap(scratch_);
}

void StreamingWriter::commit_files() {
  for (OpenFile& f : files_) f.file->commit();
}

void StreamingWriter::abort() noexcept {
  if (finished_) return;
  failed_ = true;
  for (OpenFile& f : files_)
    if (f.file) f.file->abort();
  in_tensor_ = false;
}

}  // namespace peft
