// A minimal fork-join loop for the merge math: tasks 0..count-1 are handed out dynamically to the
// calling thread plus up to threads-1 short-lived std::threads. Results must not depend on which
// thread runs a task (the merge code keeps every task's output separate). Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/worker_pool.hpp"

namespace peft::merge {

// Threads to use for `count` tasks when the caller asked for `requested` (0 = hardware threads).
inline unsigned worker_count(unsigned requested, int64_t count) {
  unsigned n = requested != 0 ? requested : core_count();
  if (count < static_cast<int64_t>(n)) n = static_cast<unsigned>(std::max<int64_t>(count, 1));
  return n;
}

// Runs task(index, worker) for every index in [0, count). `worker` is in [0, threads) and names a
// per-worker scratch slot. The first exception thrown by a task stops the handing out of new tasks
// and is rethrown here after every thread has finished. If a thread cannot be started the work
// is done by fewer threads.
template <class Task>
void parallel_tasks(int64_t count, unsigned threads, Task&& task) {
  if (count <= 0) return;
  if (threads <= 1 || count == 1) {
    for (int64_t i = 0; i < count; ++i) task(i, 0u);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](unsigned worker) {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) return;
      try {
        task(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (unsigned w = 1; w < threads; ++w) {
    try {
      pool.emplace_back(run, w);
    } catch (const std::system_error&) {
      break;  // no more threads available: the started ones and this one finish the work
    }
  }
  run(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace peft::merge
