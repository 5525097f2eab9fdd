#include "safetensors/safetensors_file.hpp"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "core/convert.hpp"
#include "core/error.hpp"

namespace peft {

namespace {

// Non-null address for zero-byte views in pread mode (nothing is read or allocated for them).
const uint8_t kEmpty[1] = {0};

// Conversions of uncached pread tensors go through a bounded staging buffer of this size.
constexpr uint64_t kStagingBytes = uint64_t{8} << 20;

// The parser's messages do not know the file; name it in front, keeping the code.
template <class Body>
auto with_path(const std::string& path, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
}

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) fail(PEFT_ERR_VALIDATION_OVERFLOW, what + ": size overflows 64 bits");
  return out;
}

// Steps 1-8 over bytes that are all present (a mapping or a copy).
Header validate_resident(const std::string& path, const uint8_t* data, uint64_t size, const OpenOptions& options) {
  return with_path(path, [&] {
    const HeaderLimits limits{options.max_header_size};
    const uint64_t header_size =
        read_header_length(data, static_cast<size_t>(std::min<uint64_t>(size, 8)), size, limits);
    return parse_header(std::string_view(reinterpret_cast<const char*>(data) + 8, header_size), size);
  });
}

// The parser promises this; the views below rely on it, so check it once rather than trust it.
void check_layout(const std::string& path, const Header& header, uint64_t file_size) {
  const uint64_t start = header.data_start();
  if (start < 8 || start > file_size || file_size - start != header.data_size)
    fail(PEFT_ERR_INTERNAL, path + ": header layout disagrees with the file size");
  for (const TensorInfo& t : header.tensors)
    if (t.begin > t.end || t.end > header.data_size)
      fail(PEFT_ERR_INTERNAL, path + ": tensor " + quoted(t.name) + " lies outside the data section");
}

}  // namespace

uint64_t element_count(const TensorInfo& info) {
  uint64_t count = 1;
  for (uint64_t dim : info.shape) count = checked_mul(count, dim, "tensor " + quoted(info.name));
  return count;
}

std::unique_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path, const OpenOptions& options,
                                                             const std::string& display_path) {
  std::unique_ptr<SafetensorsFile> out(new SafetensorsFile());
  out->path_ = display_path.empty() ? path : display_path;
  ReadOnlyFile file = ReadOnlyFile::open(path, out->path_);
  const uint64_t size = file.size();
  if (!options.use_pread) {
    FileMap map = FileMap::map(file);
    // The header is read right away, the tensors later and in any order.
    map.advise(0, std::min<uint64_t>(size, 8 + options.max_header_size), FileMap::Advice::will_need);
    out->header_ = validate_resident(out->path_, map.data(), size, options);
    check_layout(out->path_, out->header_, size);
    out->base_ = map.data();
    out->map_.emplace(std::move(map));
    return out;  // the mapping outlives the descriptor, which closes here
  }
  uint8_t prefix[8] = {};
  const size_t prefix_size = static_cast<size_t>(std::min<uint64_t>(size, 8));
  file.read_exact(0, prefix, prefix_size);
  out->header_ = with_path(out->path_, [&] {
    const HeaderLimits limits{options.max_header_size};
    // Bounded by the cap and by the file size before anything is allocated.
    const uint64_t header_size = read_header_length(prefix, prefix_size, size, limits);
    std::string header_bytes(static_cast<size_t>(header_size), '\0');
    file.read_exact(8, header_bytes.data(), header_size);
    return parse_header(header_bytes, size);
  });
  check_layout(out->path_, out->header_, size);
  out->cache_ = std::make_unique<std::atomic<uint8_t*>[]>(out->header_.tensors.size());
  for (size_t i = 0; i < out->header_.tensors.size(); ++i) out->cache_[i].store(nullptr, std::memory_order_relaxed);
  out->file_.emplace(std::move(file));
  return out;
}

std::unique_ptr<const SafetensorsFile> SafetensorsFile::from_memory(const void* data, size_t size,
                                                                    const OpenOptions& options,
                                                                    const std::string& display_name) {
  std::unique_ptr<SafetensorsFile> out(new SafetensorsFile());
  out->path_ = display_name;
  // Validate our own copy, so a caller changing its buffer meanwhile cannot slip past the checks.
  out->copy_.reset(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(out->copy_.get(), data, size);
  out->header_ = validate_resident(out->path_, out->copy_.get(), size, options);
  check_layout(out->path_, out->header_, size);
  out->base_ = out->copy_.get();
  return out;
}

SafetensorsFile::~SafetensorsFile() {
  if (cache_)
    for (size_t i = 0; i < header_.tensors.size(); ++i) delete[] cache_[i].load(std::memory_order_acquire);
}

uint64_t SafetensorsFile::absolute_offset(const TensorInfo& info) const { return header_.data_start() + info.begin; }

const uint8_t* SafetensorsFile::resident_bytes(size_t local) const {
  const TensorInfo& info = header_.tensors[local];
  if (base_ != nullptr) return base_ + absolute_offset(info);
  if (info.nbytes() == 0) return kEmpty;
  return cache_[local].load(std::memory_order_acquire);
}

std::span<const uint8_t> SafetensorsFile::view(size_t local) const {
  const TensorInfo& info = tensor(local);
  const uint64_t nbytes = info.nbytes();
  if (const uint8_t* bytes = resident_bytes(local)) return {bytes, static_cast<size_t>(nbytes)};
  // pread mode, first view: read outside any lock; if another thread won the race, keep its copy.
  std::unique_ptr<uint8_t[]> fresh(new uint8_t[static_cast<size_t>(nbytes)]);
  file_->read_exact(absolute_offset(info), fresh.get(), nbytes);
  uint8_t* expected = nullptr;
  if (cache_[local].compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel))
    return {fresh.release(), static_cast<size_t>(nbytes)};
  return {expected, static_cast<size_t>(nbytes)};
}

void SafetensorsFile::read(size_t local, DType dtype, void* dst, uint64_t dst_nbytes) const {
  const TensorInfo& info = tensor(local);
  const std::string what = path_ + ": tensor " + quoted(info.name);
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
  if (const uint8_t* src = resident_bytes(local)) {
    if (map_) map_->advise(absolute_offset(info), src_nbytes, FileMap::Advice::will_need);
    if (dtype == info.dtype)
      std::memcpy(dst, src, static_cast<size_t>(src_nbytes));
    else
      convert(info.dtype, src, dtype, dst, elements);
    return;
  }
  // pread mode, tensor not cached.
  if (dtype == info.dtype) {
    file_->read_exact(absolute_offset(info), dst, src_nbytes);
    return;
  }
  const uint32_t src_bits = dtype_bits(info.dtype);
  const uint32_t dst_bits = dtype_bits(dtype);
  if (src_bits % 8 != 0 || dst_bits % 8 != 0) {
    // Packed dtypes cannot be cut at arbitrary elements: stage the whole tensor.
    std::vector<uint8_t> staged(static_cast<size_t>(src_nbytes));
    file_->read_exact(absolute_offset(info), staged.data(), src_nbytes);
    convert(info.dtype, staged.data(), dtype, dst, elements);
    return;
  }
  const uint64_t src_size = src_bits / 8, dst_size = dst_bits / 8;
  const uint64_t chunk_elements = std::max<uint64_t>(1, kStagingBytes / src_size);
  std::vector<uint8_t> staging(static_cast<size_t>(std::min(elements, chunk_elements) * src_size));
  auto* out = static_cast<uint8_t*>(dst);
  for (uint64_t done = 0; done < elements;) {
    const uint64_t n = std::min(chunk_elements, elements - done);
    file_->read_exact(absolute_offset(info) + done * src_size, staging.data(), n * src_size);
    convert(info.dtype, staging.data(), dtype, out + done * dst_size, n);
    done += n;
  }
}

}  // namespace peft
