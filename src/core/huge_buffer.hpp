// Large buffers that hot calls read in small pieces at random places (a registry's adapter storage:
// one layer's factors per call), backed by transparent huge pages where the system offers them.
// A call whose factors come from memory otherwise takes a TLB miss per 4 KiB page it reads, and
// the page walks come from memory too: on the benchmark machine (THP in "madvise" mode), a batch-1
// apply of rank 8 after 64 MiB of other reads took 1.2x to 2.3x its bytes' time at the read
// bandwidth with 4 KiB pages, 0.9x to 1.1x with 2 MiB pages (bench_serve apply, "cold").
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace peft {

struct FreeBytes {
  void operator()(unsigned char* p) const { std::free(p); }
};
using HugeBuffer = std::unique_ptr<unsigned char[], FreeBytes>;

// `bytes` bytes, not zeroed. From 2 MiB on, aligned to 2 MiB and advised as huge pages
// (madvise MADV_HUGEPAGE on Linux) over its whole 2 MiB pieces only, so that the tail never takes
// a page beyond the buffer; smaller buffers come from malloc. Throws std::bad_alloc.
HugeBuffer allocate_huge(size_t bytes);

}  // namespace peft
