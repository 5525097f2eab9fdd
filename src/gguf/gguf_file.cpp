#include "gguf/gguf_file.hpp"

#include <sys/stat.h>

#include <cstring>

#include "core/error.hpp"

namespace peft {

bool has_gguf_magic(const void* data, size_t size) { return size >= 4 && std::memcmp(data, "GGUF", 4) == 0; }

bool is_gguf_path(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  try {
    const ReadOnlyFile file = ReadOnlyFile::open(path);
    uint8_t magic[4] = {};
    if (file.size() < sizeof magic) return false;
    file.read_exact(0, magic, sizeof magic);
    return has_gguf_magic(magic, sizeof magic);
  } catch (const Error&) {
    return false;
  }
}

std::unique_ptr<const GgufFile> GgufFile::open(const std::string& path, const OpenOptions& options,
                                               const std::string& display_path) {
  std::unique_ptr<GgufFile> out(new GgufFile());
  ReadOnlyFile file = out->open_file(path, display_path);
  const uint64_t size = file.size();
  const auto read = [&file](uint64_t offset, void* dst, uint64_t count) { file.read_exact(offset, dst, count); };
  out->header_ = parse_gguf_header(read, size, options.max_header_size, out->path_);
  out->attach_file(std::move(file), options.use_pread);
  out->set_tensors(&out->header_.tensors, &out->header_.tensor_names, out->header_.data_start, size);
  return out;
}

std::unique_ptr<const GgufFile> GgufFile::from_memory(const void* data, size_t size, const OpenOptions& options,
                                                      const std::string& display_name) {
  std::unique_ptr<GgufFile> out(new GgufFile());
  out->path_ = display_name;
  // Validate our own copy, so a caller changing its buffer meanwhile cannot slip past the checks.
  out->attach_copy(data, size);
  const uint8_t* bytes = out->copy();
  const auto read = [bytes, size, &out](uint64_t offset, void* dst, uint64_t count) {
    if (offset > size || count > size - offset)
      fail(PEFT_ERR_INTERNAL, out->path_ + ": the GGUF parser read past the end of the buffer");
    std::memcpy(dst, bytes + offset, static_cast<size_t>(count));
  };
  out->header_ = parse_gguf_header(read, size, options.max_header_size, out->path_);
  out->set_tensors(&out->header_.tensors, &out->header_.tensor_names, out->header_.data_start, size);
  return out;
}

}  // namespace peft
