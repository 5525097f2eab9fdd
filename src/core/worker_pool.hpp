// Worker threads kept for short parallel loops on the hot path of a call (unmerged LoRA apply):
// starting threads for each call costs tens of microseconds, more than such a loop's share.
// (Long loops, such as a merge's, start their own threads: peft/kernels/merge_parallel.hpp.)
//
// One loop runs on the pool at a time: a caller that finds it busy with another thread's loop, or
// in a child process after fork(), runs its loop alone. Workers start on the first loop that
// asks for them, spin for a short while after each loop (so that back-to-back calls find them
// awake) and then sleep; they are joined when the library is unloaded or the process exits.
#pragma once

#include <cstdint>
#include <type_traits>

namespace peft {

// The cores of the machine, std::thread::hardware_concurrency() (at least 1), asked once per
// process: glibc reads /sys/devices/system/cpu/online on every call (an open, a read and a close),
// which took about a third of a batch-1 apply of rank 8 (peft_lora_apply, 9.6 us a call).
unsigned core_count();

// Runs task(i, worker) for every i in [0, count): on the calling thread (worker 0) and on up to
// threads - 1 pool workers (worker 1, 2...), tasks handed out one at a time. The first exception
// a task throws stops the handing out and is rethrown here after every worker has left the loop.
// `threads` 0 means one per core.
void run_parallel(int64_t count, unsigned threads, void (*task)(void* context, int64_t i, unsigned worker),
                  void* context);

template <class Task>
void run_parallel(int64_t count, unsigned threads, Task&& task) {
  run_parallel(
      count, threads,
      [](void* context, int64_t i, unsigned worker) { (*static_cast<std::remove_reference_t<Task>*>(context))(i, worker); },
      const_cast<void*>(static_cast<const void*>(&task)));
}

}  // namespace peft
