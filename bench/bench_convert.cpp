// Throughput of the bulk dtype conversions against memcpy of the same input bytes, on 256 MiB of
// bf16 and f16 data. Before every timed run the input and output are flushed from the CPU caches
// (this machine's L3 is about as large as the data, which would otherwise let one operation reuse
// what the previous one left behind), so every operation starts cold, as a tensor read from a file
// does. Prints GB/s of input bytes and the ratio to memcpy; best of several interleaved runs.
//
//   bench_convert [MiB=256] [runs=7]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/convert.hpp"
#include "core/convert_kernels.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Buffer {
  std::unique_ptr<unsigned char[], decltype(&std::free)> data{nullptr, &std::free};
  size_t size = 0;
};

// Page-aligned and touched, so that page faults are not part of any measurement.
Buffer make_buffer(size_t size) {
  Buffer b;
  b.data.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, (size + 4095) / 4096 * 4096)));
  if (!b.data) {
    std::fprintf(stderr, "out of memory\n");
    std::exit(1);
  }
  b.size = size;
  std::memset(b.data.get(), 0, size);
  return b;
}

// Writes back and evicts every cache line of [p, p + size).
void flush_from_caches(const unsigned char* p, size_t size) {
#if defined(__x86_64__)
  for (size_t i = 0; i < size; i += 64) _mm_clflush(p + i);
  _mm_mfence();
#else
  // Elsewhere: read a buffer twice the size of any last-level cache we expect.
  static std::vector<unsigned char> scratch(size_t(1) << 30, 1);
  volatile unsigned sum = 0;
  for (size_t i = 0; i < scratch.size(); i += 64) sum = sum + scratch[i];
  (void)p;
  (void)size;
#endif
}

// The 1-minute load average, to judge how busy the machine was (Linux; "?" elsewhere).
std::string load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  char text[64] = {0};
  const bool ok = std::fscanf(f, "%63s", text) == 1;
  std::fclose(f);
  return ok ? text : "?";
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct Timing {
  double wall;
  double cpu;  // this thread's CPU time: excludes time other processes had the core
};

Timing time_of(const std::function<void()>& body) {
  const auto start = Clock::now();
  const double cpu_start = thread_cpu_seconds();
  body();
  const double cpu = thread_cpu_seconds() - cpu_start;
  return {std::chrono::duration<double>(Clock::now() - start).count(), cpu};
}

void fill_normal_16(Buffer& b, bool bf16, uint32_t seed) {
  // Realistic weights: normally distributed values, stored as bf16 or f16 bit patterns.
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> block(1 << 16);
  std::vector<unsigned char> out(block.size() * 2);
  for (size_t done = 0; done < b.size / 2; done += block.size()) {
    const size_t n = std::min(block.size(), b.size / 2 - done);
    for (size_t i = 0; i < n; ++i) block[i] = normal(rng);
    peft::convert(peft::DType::F32, block.data(), bf16 ? peft::DType::BF16 : peft::DType::F16, b.data.get() + 2 * done, n);
  }
}

struct Op {
  std::string name;
  const unsigned char* in;
  size_t in_bytes;
  const unsigned char* out;
  size_t out_bytes;
  std::function<void()> body;
  double best = 1e30;
  double best_cpu = 1e30;
};

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 7;
  const size_t half_bytes = mib << 20;  // the 16-bit input
  const size_t n = half_bytes / 2;

  Buffer bf16 = make_buffer(half_bytes), f16 = make_buffer(half_bytes);
  Buffer wide = make_buffer(n * 4), narrow = make_buffer(half_bytes), copy = make_buffer(n * 4);
  fill_normal_16(bf16, true, 1);
  fill_normal_16(f16, false, 2);
  peft::convert(peft::DType::BF16, bf16.data.get(), peft::DType::F32, wide.data.get(), n);

  const auto& active = peft::convert_kernels::active();
  const auto& portable = peft::convert_kernels::portable();
  using peft::DType;
  auto convert_op = [&](const char* name, DType from, const Buffer& in, DType to, Buffer& out) {
    return Op{name, in.data.get(), n * peft::dtype_bits(from) / 8, out.data.get(), n * peft::dtype_bits(to) / 8,
              [&in, &out, from, to, n] { peft::convert(from, in.data.get(), to, out.data.get(), n); }};
  };
  auto kernel_op = [&](const char* name, peft::convert_kernels::Kernel k, const Buffer& in, size_t in_size,
                       size_t out_size, Buffer& out) {
    return Op{name, in.data.get(), n * in_size, out.data.get(), n * out_size, [k, &in, &out, n] { k(in.data.get(), out.data.get(), n); }};
  };
  // f32 -> 16-bit reads `wide` (valid f32 from the bf16 data) and writes `narrow`, so that the
  // wider outputs never overwrite an input.
  std::vector<Op> ops;
  ops.push_back({"memcpy (16-bit input bytes)", bf16.data.get(), half_bytes, copy.data.get(), half_bytes,
                 [&] { std::memcpy(copy.data.get(), bf16.data.get(), half_bytes); }});
  ops.push_back({"memcpy (32-bit input bytes)", wide.data.get(), n * 4, copy.data.get(), n * 4,
                 [&] { std::memcpy(copy.data.get(), wide.data.get(), n * 4); }});
  ops.push_back(convert_op("bf16 -> f32", DType::BF16, bf16, DType::F32, copy));
  ops.push_back(convert_op("f16 -> f32", DType::F16, f16, DType::F32, copy));
  ops.push_back(convert_op("f32 -> bf16", DType::F32, wide, DType::BF16, narrow));
  ops.push_back(convert_op("f32 -> f16", DType::F32, wide, DType::F16, narrow));
  // The portable kernels, for comparison: what a CPU without AVX2/F16C runs.
  ops.push_back(kernel_op("bf16 -> f32 (portable)", portable.bf16_to_f32, bf16, 2, 4, copy));
  ops.push_back(kernel_op("f16 -> f32 (portable)", portable.f16_to_f32, f16, 2, 4, copy));
  ops.push_back(kernel_op("f32 -> bf16 (portable)", portable.f32_to_bf16, wide, 4, 2, narrow));
  ops.push_back(kernel_op("f32 -> f16 (portable)", portable.f32_to_f16, wide, 4, 2, narrow));

  // Runs are interleaved (every operation once per round) so that a busy machine slows all of them
  // alike; the best round of each counts.
  for (int r = 0; r < runs; ++r) {
    for (Op& op : ops) {
      flush_from_caches(op.in, op.in_bytes);
      flush_from_caches(op.out, op.out_bytes);
      const Timing t = time_of(op.body);
      op.best = std::min(op.best, t.wall);
      op.best_cpu = std::min(op.best_cpu, t.cpu);
    }
  }

  std::printf("bench_convert: %zu elements (%zu MiB of 16-bit input), best of %d runs, kernels: %s\n\n", n, mib,
              runs, active.name);
  std::printf("| %-28s | %9s | %10s | %11s | %15s | %11s |\n", "operation", "time ms", "input GB/s", "in+out GB/s",
              "ratio to memcpy", "ratio (cpu)");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(11, '-').c_str(),
              std::string(12, '-').c_str(), std::string(13, '-').c_str(), std::string(17, '-').c_str(),
              std::string(13, '-').c_str());
  for (const Op& op : ops) {
    const Op& same_input = op.in_bytes == half_bytes ? ops[0] : ops[1];
    std::printf("| %-28s | %9.1f | %10.2f | %11.2f | %15.2f | %11.2f |\n", op.name.c_str(), op.best * 1e3,
                op.in_bytes / op.best / 1e9, (op.in_bytes + op.out_bytes) / op.best / 1e9, same_input.best / op.best,
                same_input.best_cpu / op.best_cpu);
  }
  std::printf("\nratio = best memcpy time of the same input bytes / best conversion time (1.0 = as fast as\n"
              "memcpy), by wall clock and by this thread's CPU time (robust when other processes share the\n"
              "cores). Load average at the end: %s\n", load_average().c_str());
  return 0;
}
