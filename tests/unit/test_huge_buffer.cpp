// Buffers in huge pages (core/huge_buffer.hpp): every size usable to its last byte, the large ones
// aligned to 2 MiB. Whether the kernel backs them with huge pages is the system's choice (THP
// "madvise", "always" or "never"), so the test reads /proc/self/smaps only to report it.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/huge_buffer.hpp"

namespace {

// AnonHugePages of the mapping holding `p`, in kB; -1 when /proc/self/smaps cannot tell.
long anon_huge_kb(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto address = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= address && address < end;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) return std::stol(line.substr(14));
  }
  return -1;
}

}  // namespace

TEST_CASE("huge buffer: every size is usable to its last byte; from 2 MiB on, aligned to 2 MiB") {
  constexpr size_t kHuge = size_t{2} << 20;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4095}, kHuge - 1, kHuge, 3 * kHuge + 17}) {
    CAPTURE(bytes);
    peft::HugeBuffer buffer = peft::allocate_huge(bytes);
    REQUIRE(buffer != nullptr);
    if (bytes >= kHuge) CHECK(reinterpret_cast<uintptr_t>(buffer.get()) % kHuge == 0);
    std::memset(buffer.get(), 0xA5, bytes);
    size_t same = 0;
    for (size_t i = 0; i < bytes; ++i) same += buffer[i] == 0xA5;
    CHECK(same == bytes);
    if (bytes == 3 * kHuge + 17) MESSAGE("AnonHugePages of a 6 MiB buffer's mapping: " << anon_huge_kb(buffer.get()) << " kB");
  }
}
