// The worker threads kept for short parallel loops (core/worker_pool.hpp). Also run under
// ThreadSanitizer (scripts/test.sh).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/worker_pool.hpp"

using peft::run_parallel;

namespace {

// Runs a loop of `count` tasks on `threads` threads and checks that each ran exactly once, on a
// worker slot below the number of threads.
void check_loop(int64_t count, unsigned threads) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
  std::atomic<bool> bad_worker{false};
  const unsigned limit = threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : threads;
  run_parallel(count, threads, [&](int64_t i, unsigned worker) {
    if (worker >= limit) bad_worker = true;
    runs[size_t(i)].fetch_add(1);
  });
  CHECK_FALSE(bad_worker.load());
  for (int64_t i = 0; i < count; ++i) REQUIRE(runs[size_t(i)].load() == 1);
}

}  // namespace

TEST_CASE("worker pool: every task runs once, on a worker slot below the thread count") {
  for (unsigned threads : {0u, 1u, 2u, 3u, 8u})
    for (int64_t count : {int64_t(0), int64_t(1), int64_t(2), int64_t(7), int64_t(1000)}) {
      CAPTURE(threads);
      CAPTURE(count);
      check_loop(count, threads);
    }
}

TEST_CASE("worker pool: a task's exception reaches the caller, and the pool keeps working") {
  std::atomic<int> ran{0};
  CHECK_THROWS_AS(run_parallel(1000, 4,
                               [&](int64_t i, unsigned) {
                                 ran.fetch_add(1);
                                 if (i == 10) throw std::runtime_error("task 10 failed");
                                 // Long enough that the loop would take 10 ms without the stop.
                                 std::this_thread::sleep_for(std::chrono::microseconds(20));
                               }),
                  std::runtime_error);
  CHECK(ran.load() < 1000);  // the handing out stopped
  check_loop(100, 4);
}

TEST_CASE("worker pool: callers on many threads at once, and a loop inside a task") {
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int repeat = 0; repeat < 200; ++repeat) {
        std::vector<std::atomic<int>> runs(64);
        run_parallel(64, 0, [&](int64_t i, unsigned) { runs[size_t(i)].fetch_add(1); });
        for (auto& r : runs)
          if (r.load() != 1) failures.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  CHECK(failures.load() == 0);

  // A task that starts a loop finds the pool busy and runs that loop on its own thread.
  std::atomic<int> inner{0};
  run_parallel(4, 2, [&](int64_t, unsigned) { run_parallel(8, 2, [&](int64_t, unsigned) { inner.fetch_add(1); }); });
  CHECK(inner.load() == 32);
}
