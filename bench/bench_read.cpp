// Read throughput of peft_checkpoint_tensor_read, the path every internal read takes (merges,
// registry loads, adapter reads): a 1 GiB F32 file of 64 tensors of 16 MiB in the page cache, each
// tensor read into one reused buffer as F32 (a copy) and as BF16 (a conversion), with the checkpoint
// opened afresh for every pass as a merge or a load does. Prints the best and median of the passes,
// by wall clock and by the thread's CPU time (which other processes disturb less), in GB/s of file
// bytes read.
// usage: bench_read [FILE] [PASSES]   (FILE defaults to /dev/shm/peft_bench_read.safetensors)
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "peft_c.h"

namespace {

constexpr int kTensors = 64;
constexpr uint64_t kElements = uint64_t{4} << 20;  // 16 MiB of F32 each

bool write_file(const std::string& path) {
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i) {
    const uint64_t begin = uint64_t(i) * kElements * 4;
    if (i > 0) header += ',';
    header += "\"t" + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(kElements) +
              "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(begin + kElements * 4) + "]}";
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const uint64_t length = header.size();
  std::fwrite(&length, 8, 1, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::vector<float> values(kElements);
  for (int i = 0; i < kTensors; ++i) {
    for (uint64_t j = 0; j < kElements; ++j) values[j] = float(j % 1000) * 0.001f + float(i);
    std::fwrite(values.data(), 4, kElements, f);
  }
  return std::fclose(f) == 0;
}

double now(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct Pass {
  double wall, cpu;
};

bool read_all(const std::string& path, int32_t dtype, std::vector<uint8_t>& buffer, Pass& pass) {
  const double wall = now(CLOCK_MONOTONIC), cpu = now(CLOCK_THREAD_CPUTIME_ID);
  peft_checkpoint* ckpt = nullptr;
  peft_error* err = peft_checkpoint_open(path.c_str(), nullptr, &ckpt);
  for (size_t i = 0; err == nullptr && i < peft_checkpoint_tensor_count(ckpt); ++i)
    err = peft_checkpoint_tensor_read(ckpt, i, dtype, buffer.data(), kElements * (dtype == PEFT_DTYPE_F32 ? 4 : 2));
  peft_checkpoint_free(ckpt);
  if (err != nullptr) {
    std::fprintf(stderr, "bench_read: %s\n", peft_error_message(err));
    peft_error_free(err);
    return false;
  }
  pass = {now(CLOCK_MONOTONIC) - wall, now(CLOCK_THREAD_CPUTIME_ID) - cpu};
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "/dev/shm/peft_bench_read.safetensors";
  const int passes = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
  if (!write_file(path)) {
    std::perror(path.c_str());
    return 1;
  }
  std::vector<uint8_t> buffer(kElements * 4);
  const double gb = double(kTensors) * double(kElements) * 4 / 1e9;
  std::printf("bench_read: %.2f GB of F32 in %d tensors, peft_c %s, %d passes\n", gb, kTensors, peft_version(), passes);
  for (int32_t dtype : {PEFT_DTYPE_F32, PEFT_DTYPE_BF16}) {
    std::vector<double> wall, cpu;
    for (int p = 0; p < passes; ++p) {
      Pass pass{};
      if (!read_all(path, dtype, buffer, pass)) return 1;
      wall.push_back(pass.wall);
      cpu.push_back(pass.cpu);
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    std::printf("  read as %-4s  wall: best %5.2f GB/s, median %5.2f GB/s   cpu: best %5.2f GB/s, median %5.2f GB/s\n",
                dtype == PEFT_DTYPE_F32 ? "F32" : "BF16", gb / wall.front(), gb / wall[wall.size() / 2],
                gb / cpu.front(), gb / cpu[cpu.size() / 2]);
  }
  std::remove(path.c_str());
  return 0;
}
