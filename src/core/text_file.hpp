// Reading a small whole file (a config, an index, a translation table). The one place such files are
// opened: without blocking and only when they are regular files, so a FIFO, a device or a folder
// given as a config is an error, never a hang or an endless read.
#pragma once

#include <cstdint>
#include <string>

namespace peft {

// The contents of `path`. PEFT_ERR_IO naming the path when it cannot be opened or read or is not a
// regular file; PEFT_ERR_INVALID_ARGUMENT when it is larger than `max_bytes`.
std::string read_text_file(const std::string& path, uint64_t max_bytes);

}  // namespace peft
