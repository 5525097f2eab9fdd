// Opening adapters for the commands, with --lenient and its warnings (adapter_open.hpp).
#include "adapter_open.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

namespace peftc {

peft_error* open_adapter(const std::string& dir, const std::string& base, bool lenient, peft_adapter** out) {
  peft_adapter_options* opts = nullptr;
  if (peft_error* err = peft_adapter_options_new(&opts)) return err;
  peft_error* err = base.empty() ? nullptr : peft_adapter_options_set_base_dir(opts, base.c_str());
  if (!err) err = peft_adapter_options_set_lenient(opts, lenient ? 1 : 0);
  if (!err) err = peft_adapter_open(dir.c_str(), opts, out);
  peft_adapter_options_free(opts);
  if (!err) print_warnings(*out);
  return err;
}

bool is_gguf_file(const std::string& path) {
  // Non-blocking and regular files only: a FIFO or device named *.gguf is not sniffed (which would
  // block or consume it) but left to the library, which refuses it with PEFT_ERR_IO at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  char magic[4] = {};
  const bool gguf = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::pread(fd, magic, 4, 0) == 4 &&
                    magic[0] == 'G' && magic[1] == 'G' && magic[2] == 'U' && magic[3] == 'F';
  ::close(fd);
  return gguf;
}

void print_warnings(const peft_adapter* adapter) {
  for (size_t i = 0; i < peft_adapter_warning_count(adapter); ++i)
    std::fprintf(stderr, "warning: %s\n", peft_adapter_warning(adapter, i));
}

}  // namespace peftc
