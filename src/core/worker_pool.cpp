#include "core/worker_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace peft {
namespace {

// How long a worker keeps polling for the next loop before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(200);

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void run(int64_t count, unsigned threads, void (*task)(void*, int64_t, unsigned), void* context) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || getpid() != pid_) return run_alone(count, task, context);
    start_workers(threads - 1);
    const unsigned helpers = std::min<unsigned>(threads - 1, static_cast<unsigned>(workers_.size()));
    if (helpers == 0) return run_alone(count, task, context);

    task_ = task;
    context_ = context;
    count_ = count;
    helpers_ = helpers;
    next_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    unfinished_.store(static_cast<unsigned>(workers_.size()), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();

    take_tasks(0);
    // Every worker, taking part or not, acknowledges the loop; then none of them reads its state.
    const auto spin_end = std::chrono::steady_clock::now() + kSpin;
    while (unfinished_.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < spin_end)
      std::this_thread::yield();
    if (unfinished_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, [this] { return unfinished_.load(std::memory_order_acquire) == 0; });
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static void run_alone(int64_t count, void (*task)(void*, int64_t, unsigned), void* context) {
    for (int64_t i = 0; i < count; ++i) task(context, i, 0);
  }

  // Called with busy_ held. If a thread cannot be started, the loops use fewer.
  void start_workers(unsigned wanted) {
    while (workers_.size() < wanted && !start_failed_) {
      try {
        // The worker waits for the generation after this one, whenever the thread gets to run.
        const uint64_t seen = generation_.load(std::memory_order_relaxed);
        workers_.emplace_back([this, id = static_cast<unsigned>(workers_.size()) + 1, seen] { work(id, seen); });
      } catch (const std::system_error&) {
        start_failed_ = true;
      }
    }
  }

  void take_tasks(unsigned worker) {
    for (;;) {
      if (failed_.load(std::memory_order_relaxed)) return;
      const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= count_) return;
      try {
        task_(context_, i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);
        return;
      }
    }
  }

  void work(unsigned id, uint64_t seen) {
    for (;;) {
      // Poll for a while, then sleep until the next loop.
      const auto spin_end = std::chrono::steady_clock::now() + kSpin;
      while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < spin_end)
        std::this_thread::yield();
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
        if (stop_) return;
      }
      seen = generation_.load(std::memory_order_acquire);
      if (id <= helpers_) take_tasks(id);
      if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        finished_.notify_one();
      }
    }
  }

  const pid_t pid_ = getpid();
  std::mutex busy_;  // held by the thread whose loop runs
  std::vector<std::thread> workers_;
  bool start_failed_ = false;

  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  bool stop_ = false;
  std::atomic<uint64_t> generation_{0};
  std::atomic<unsigned> unfinished_{0};

  // The loop that runs: written by its caller before generation_ changes.
  void (*task_)(void*, int64_t, unsigned) = nullptr;
  void* context_ = nullptr;
  int64_t count_ = 0;
  unsigned helpers_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace

unsigned core_count() {
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return cores;
}

void run_parallel(int64_t count, unsigned threads, void (*task)(void* context, int64_t i, unsigned worker),
                  void* context) {
  if (threads == 0) threads = core_count();
  if (count <= 0) return;
  if (threads == 1 || count == 1) {
    for (int64_t i = 0; i < count; ++i) task(context, i, 0);
    return;
  }
  static Pool pool;
  pool.run(count, std::min<unsigned>(threads, static_cast<unsigned>(std::min<int64_t>(count, 1024))), task, context);
}

}  // namespace peft
