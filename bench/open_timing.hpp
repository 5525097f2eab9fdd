// The timing loop of the open + index benchmarks (bench_open.cpp, and references/llama_gguf_open.cpp,
// which bench/open_vs_native.py builds against llama.cpp alone, so this header needs nothing else):
// `usage: PROGRAM FILE [ITERATIONS]`; opens FILE ITERATIONS times (default 50) with
// open_and_index(path, checksum), which returns false after printing why it failed, and prints
// {"median_us", "best_us", "iterations", "checksum"} as one JSON line.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

template <class OpenAndIndex>
int run_open_benchmark(int argc, char** argv, const char* program, OpenAndIndex&& open_and_index) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [ITERATIONS]\n", program);
    return 2;
  }
  const int iterations = argc > 2 ? std::max(1, std::atoi(argv[2])) : 50;
  std::vector<double> micros;
  size_t checksum = 0;
  for (int it = 0; it < iterations; ++it) {
    const auto start = std::chrono::steady_clock::now();
    if (!open_and_index(argv[1], checksum)) return 1;
    micros.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(micros.begin(), micros.end());
  std::printf("{\"median_us\": %.1f, \"best_us\": %.1f, \"iterations\": %d, \"checksum\": %zu}\n",
              micros[micros.size() / 2], micros.front(), iterations, checksum);
  return 0;
}
