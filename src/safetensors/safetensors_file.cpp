#include "safetensors/safetensors_file.hpp"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "core/error.hpp"
#include "core/error_context.hpp"

namespace peft {

std::unique_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path, const OpenOptions& options,
                                                             const std::string& display_path) {
  std::unique_ptr<SafetensorsFile> out(new SafetensorsFile());
  ReadOnlyFile file = out->open_file(path, display_path);
  const uint64_t size = file.size();
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
  out->attach_file(std::move(file), options.use_pread);
  out->set_tensors(&out->header_.tensors, &out->header_.names, out->header_.data_start(), size);
  return out;
}

std::unique_ptr<const SafetensorsFile> SafetensorsFile::from_memory(const void* data, size_t size,
                                                                    const OpenOptions& options,
                                                                    const std::string& display_name) {
  std::unique_ptr<SafetensorsFile> out(new SafetensorsFile());
  out->path_ = display_name;
  // Validate our own copy, so a caller changing its buffer meanwhile cannot slip past the checks.
  out->attach_copy(data, size);
  const uint8_t* bytes = out->copy();
  out->header_ = with_path(out->path_, [&] {
    const HeaderLimits limits{options.max_header_size};
    const uint64_t header_size =
        read_header_length(bytes, static_cast<size_t>(std::min<uint64_t>(size, 8)), size, limits);
    return parse_header(std::string_view(reinterpret_cast<const char*>(bytes) + 8, header_size), size);
  });
  out->set_tensors(&out->header_.tensors, &out->header_.names, out->header_.data_start(), size);
  return out;
}

}  // namespace peft
