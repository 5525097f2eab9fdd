#include "core/tensor_file.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/shape.hpp"
#include "core/text.hpp"

namespace peft {

namespace {

// Non-null address for zero-byte views in pread mode (nothing is read or allocated for them).
const uint8_t kEmpty[1] = {0};

// Conversions read from the file go through a staging buffer of at most this size (small enough to
// stay in the cache between the read and the conversion).
constexpr uint64_t kStagingBytes = uint64_t{256} << 10;

// A buffer of `n` bytes, not initialised (it is overwritten by a read right away).
std::unique_ptr<uint8_t[]> uninitialized_bytes(uint64_t n) {
  if (n > SIZE_MAX) fail(PEFT_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(n) + " bytes");
  return std::unique_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(n == 0 ? 1 : n)]);
}

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) fail(PEFT_ERR_VALIDATION_OVERFLOW, what + ": size overflows 64 bits");
  return out;
}

}  // namespace

uint64_t element_count(const TensorInfo& info) { return shape_elements(info.shape, "tensor " + quoted(info.name)); }

TensorFile::~TensorFile() {
  if (cache_)
    for (size_t i = 0; i < tensors_->size(); ++i) delete[] cache_[i].load(std::memory_order_acquire);
}

ReadOnlyFile TensorFile::open_file(const std::string& path, const std::string& display_path) {
  path_ = display_path.empty() ? path : display_path;
  return ReadOnlyFile::open(path, path_);
}

void TensorFile::attach_file(ReadOnlyFile file, bool use_pread) {
  file_.emplace(std::move(file));
  use_pread_ = use_pread;
}

void TensorFile::attach_copy(const void* data, size_t size) {
  copy_.reset(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(copy_.get(), data, size);
}

void TensorFile::set_tensors(const std::vector<TensorInfo>* tensors, const NameIndex* names, uint64_t data_start,
                             uint64_t source_size) {
  if (data_start > source_size) fail(PEFT_ERR_INTERNAL, path_ + ": header layout disagrees with the file size");
  for (const TensorInfo& t : *tensors)
    if (t.begin > t.end || t.end > source_size - data_start)
      fail(PEFT_ERR_INTERNAL, path_ + ": tensor " + quoted(t.name) + " lies outside the data section");
  if (names->size() != tensors->size()) fail(PEFT_ERR_INTERNAL, path_ + ": the name index disagrees with the tensors");
  tensors_ = tensors;
  names_ = names;
  data_start_ = data_start;
  if (file_ && use_pread_) {
    cache_ = std::make_unique<std::atomic<uint8_t*>[]>(tensors->size());
    for (size_t i = 0; i < tensors->size(); ++i) cache_[i].store(nullptr, std::memory_order_relaxed);
  }
}

const uint8_t* TensorFile::held_bytes(size_t local) const {
  const TensorInfo& info = (*tensors_)[local];
  if (copy_) return copy_.get() + absolute_offset(info);
  if (!cache_) return nullptr;
  if (info.nbytes() == 0) return kEmpty;
  return cache_[local].load(std::memory_order_acquire);
}

const uint8_t* TensorFile::mapping() const {
  if (const uint8_t* base = map_base_.load(std::memory_order_acquire)) return base;
  std::lock_guard<std::mutex> lock(map_mutex_);
  if (!map_) map_.emplace(FileMap::map(*file_));  // PEFT_ERR_IO if the file changed since opening
  map_base_.store(map_->data(), std::memory_order_release);
  return map_->data();
}

void TensorFile::check_unchanged() const {
  if (file_) file_->check_unchanged();
}

std::span<const uint8_t> TensorFile::view(size_t local) const {
  const TensorInfo& info = tensor(local);
  const uint64_t nbytes = info.nbytes();
  if (const uint8_t* bytes = held_bytes(local)) return {bytes, static_cast<size_t>(nbytes)};
  if (!cache_) {
    // mmap mode: the caller's pointer. Checked now; what happens to it later is the caller's.
    const uint8_t* base = mapping();
    file_->check_unchanged();
    return {base + absolute_offset(info), static_cast<size_t>(nbytes)};
  }
  // pread mode, first view: read outside any lock; if another thread won the race, keep its copy.
  std::unique_ptr<uint8_t[]> fresh = uninitialized_bytes(nbytes);
  file_->read_exact(absolute_offset(info), fresh.get(), nbytes);
  uint8_t* expected = nullptr;
  if (cache_[local].compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel))
    return {fresh.release(), static_cast<size_t>(nbytes)};
  return {expected, static_cast<size_t>(nbytes)};
}

void TensorFile::read_bytes(size_t local, uint64_t offset, void* dst, uint64_t count) const {
  const TensorInfo& info = tensor(local);
  if (offset > info.nbytes() || count > info.nbytes() - offset)
    fail(PEFT_ERR_INTERNAL, path_ + ": tensor " + quoted(info.name) + ": byte range outside the tensor");
  if (count == 0) return;
  if (const uint8_t* bytes = held_bytes(local)) {
    std::memcpy(dst, bytes + offset, static_cast<size_t>(count));
    return;
  }
  file_->read_exact(absolute_offset(info) + offset, dst, count);
}

void TensorFile::will_need(size_t local) const {
  const TensorInfo& info = tensor(local);
  if (file_ && !held_bytes(local)) file_->will_need(absolute_offset(info), info.nbytes());
}

void TensorFile::read(size_t local, DType dtype, void* dst, uint64_t dst_nbytes) const {
  const TensorInfo& info = tensor(local);
  const std::string what = path_ + ": tensor " + quoted(info.name);
  if (info.block_quantized)
    fail(PEFT_ERR_UNSUPPORTED, what + " is block-quantized (ggml type " + std::to_string(info.ggml_type) +
                                   "): it converts to no dtype; only its raw bytes can be read");
  if (dtype != info.dtype && !can_convert(info.dtype, dtype))
    fail(PEFT_ERR_UNSUPPORTED, what + ": conversion from " + std::string(dtype_name(info.dtype)) + " to " +
                                   std::string(dtype_name(dtype)) + " is not supported");
  const uint64_t elements = element_count(info);
  const uint64_t bits = checked_mul(elements, dtype_bits(dtype), what);
  if (bits % 8 != 0 || bits / 8 != dst_nbytes)
    fail(PEFT_ERR_INVALID_ARGUMENT, what + ": the buffer has " + std::to_string(dst_nbytes) + " bytes but " +
                                        std::to_string(elements) + " elements of " + std::string(dtype_name(dtype)) +
                                        " need " + (bits % 8 ? std::string("a fractional byte count") :
                                                               std::to_string(bits / 8)));
  if (elements == 0 || dst_nbytes == 0) return;
  if (dst == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, what + ": destination buffer is NULL");

  const uint64_t src_nbytes = info.nbytes();
  if (const uint8_t* src = held_bytes(local)) {
    if (dtype == info.dtype)
      std::memcpy(dst, src, static_cast<size_t>(src_nbytes));
    else
      convert(info.dtype, src, dtype, dst, elements);
    return;
  }
  // From the file, never through the mapping: a truncation then gives PEFT_ERR_IO, not SIGBUS.
  if (dtype == info.dtype) {
    file_->read_exact(absolute_offset(info), dst, src_nbytes);
    return;
  }
  const uint32_t src_bits = dtype_bits(info.dtype);
  const uint32_t dst_bits = dtype_bits(dtype);
  if (src_bits % 8 != 0 || dst_bits % 8 != 0) {
    // Packed dtypes cannot be cut at arbitrary elements: stage the whole tensor.
    const std::unique_ptr<uint8_t[]> staged = uninitialized_bytes(src_nbytes);
    file_->read_exact(absolute_offset(info), staged.get(), src_nbytes);
    convert(info.dtype, staged.get(), dtype, dst, elements);
    return;
  }
  const uint64_t src_size = src_bits / 8, dst_size = dst_bits / 8;
  const uint64_t chunk_elements = std::max<uint64_t>(1, kStagingBytes / src_size);
  const std::unique_ptr<uint8_t[]> staging = uninitialized_bytes(std::min(elements, chunk_elements) * src_size);
  auto* out = static_cast<uint8_t*>(dst);
  for (uint64_t done = 0; done < elements;) {
    const uint64_t n = std::min(chunk_elements, elements - done);
    file_->read_exact(absolute_offset(info) + done * src_size, staging.get(), n * src_size);
    convert(info.dtype, staging.get(), dtype, out + done * dst_size, n);
    done += n;
  }
}

}  // namespace peft
