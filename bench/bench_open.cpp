// Opens a safetensors file repeatedly through the public C API, indexes every tensor (name, dtype,
// shape, find by name) and prints the median and best time per open in microseconds.
// usage: bench_open FILE [ITERATIONS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "peft_c.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_open FILE [ITERATIONS]\n");
    return 2;
  }
  int iterations = argc > 2 ? std::atoi(argv[2]) : 50;
  std::vector<double> micros;
  size_t checksum = 0;
  for (int it = 0; it < iterations; ++it) {
    auto start = std::chrono::steady_clock::now();
    peft_checkpoint* ckpt = nullptr;
    if (peft_error* err = peft_checkpoint_open(argv[1], nullptr, &ckpt)) {
      std::fprintf(stderr, "bench_open: %s\n", peft_error_message(err));
      peft_error_free(err);
      return 1;
    }
    size_t count = peft_checkpoint_tensor_count(ckpt);
    for (size_t i = 0; i < count; ++i) {
      const char* name = peft_checkpoint_tensor_name(ckpt, i);
      size_t found = 0;
      peft_error_free(peft_checkpoint_find(ckpt, name, &found));
      checksum += found + peft_checkpoint_tensor_ndim(ckpt, i) +
                  static_cast<size_t>(peft_checkpoint_tensor_dtype(ckpt, i));
    }
    peft_checkpoint_free(ckpt);
    micros.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(micros.begin(), micros.end());
  std::printf("{\"median_us\": %.1f, \"best_us\": %.1f, \"iterations\": %d, \"checksum\": %zu}\n",
              micros[micros.size() / 2], micros.front(), iterations, checksum);
  return 0;
}
