#include "core/huge_buffer.hpp"

#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace peft {

HugeBuffer allocate_huge(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  void* p = nullptr;
  if (bytes < kHugePage) {
    p = std::malloc(bytes == 0 ? 1 : bytes);
  } else if (posix_memalign(&p, kHugePage, bytes) != 0) {
    p = nullptr;
  }
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: without THP (or with it "never") the kernel refuses or ignores it, and the buffer
  // is the same memory in 4 KiB pages.
  if (bytes >= kHugePage) (void)madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
  return HugeBuffer(static_cast<unsigned char*>(p));
}

}  // namespace peft
