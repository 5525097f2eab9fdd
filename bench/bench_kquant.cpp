// K-quant quantizer throughput, one thread: Q4_K and Q6_K rows of weight-like values (Gaussian, sigma
// 0.02) through every lane table this machine runs (and the scalar reference), as CPU time per
// million values (clock_gettime(CLOCK_THREAD_CPUTIME_ID), so other processes on the machine do not
// count), best of the repetitions; plus a check that every table gives the scalar reference's bytes.
//
// Usage: bench_kquant [repetitions] [values] [table]   (defaults 3, 4 Mi values, every table; the scalar
// reference always runs once, for the check)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "core/kernel_level.hpp"
#include "core/quant/ggml_quant_k_lanes.hpp"

namespace {

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using Quantize = void (*)(const peft::quant::KLanes&, const float*, uint8_t*, uint64_t);

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  const uint64_t values = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (uint64_t{4} << 20)) / 256 * 256;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(values);
  for (float& v : x) v = normal(rng);
  const uint64_t blocks = values / 256;
  const char* only = argc > 3 ? argv[3] : nullptr;
  std::vector<const peft::quant::KLanes*> tables{&peft::quant::k_lanes_scalar()};
  for (auto level : {peft::kernels::Level::portable, peft::kernels::Level::avx2, peft::kernels::Level::avx512})
    if (const auto* t = peft::quant::k_lanes(level); t != nullptr && (only == nullptr || std::strcmp(only, t->name) == 0))
      tables.push_back(t);
  struct Type {
    const char* name;
    Quantize quantize;
    uint64_t block_bytes;
  };
  const Type types[] = {{"Q4_K", peft::quant::quantize_q4_k_with, 144}, {"Q6_K", peft::quant::quantize_q6_k_with, 210}};
  int status = 0;
  for (const Type& type : types) {
    std::vector<uint8_t> reference(blocks * type.block_bytes), out(reference.size());
    for (const auto* t : tables) {
      double best = 1e30;
      for (int r = 0; r < (t == tables.front() && only != nullptr ? 1 : reps); ++r) {
        const double t0 = thread_seconds();
        type.quantize(*t, x.data(), out.data(), blocks);
        best = std::min(best, thread_seconds() - t0);
      }
      if (t == tables.front()) reference = out;
      const bool same = reference == out;
      if (!same) status = 1;
      std::printf("%s %-8s %8.1f ms CPU per Mi values%s\n", type.name, t->name,
                  1e3 * best / (static_cast<double>(values) / (1 << 20)), same ? "" : "  DIFFERENT BYTES");
    }
  }
  return status;
}
