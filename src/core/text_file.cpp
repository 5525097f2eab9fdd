#include "core/text_file.hpp"

#include "core/error.hpp"
#include "core/file_map.hpp"
#include "core/text.hpp"

namespace peft {

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  const ReadOnlyFile file = ReadOnlyFile::open(path);  // O_NONBLOCK open, then fstat: regular files only
  if (file.size() > max_bytes)
    fail(PEFT_ERR_INVALID_ARGUMENT, peft::quoted(path) + " is " + std::to_string(file.size()) +
                                        " bytes, larger than the " + std::to_string(max_bytes) + " accepted");
  std::string text(static_cast<size_t>(file.size()), '\0');
  file.read_exact(0, text.data(), text.size());
  return text;
}

}  // namespace peft
