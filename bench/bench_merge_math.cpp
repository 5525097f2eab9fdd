// Merge-math throughput: rank-16 LoRA merged into 4096x4096 and 4096x11008 weights (Llama-7B
// attention and MLP shapes). Reports GB/s of weight bytes merged (each byte is read and written
// once) and GFLOP/s of the low-rank product (2 * rank flops per weight element), beside two
// machine limits: a plain read+write pass over the same bytes (memcpy-like, the memory bound)
// and OpenBLAS cblas_sgemm computing the same f32 delta (the BLAS alternative).
//
// Usage: bench_merge_math [repetitions]   (default 5; the best run is reported)
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/f16.hpp"
#include "peft/methods/lora_math.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
namespace pm = peft::merge;

struct Timing {
  double wall = 1e30;  // seconds, best run
  double cpu = 1e30;   // process CPU seconds of that run (all threads): the cost on a busy machine
};

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

Timing best_of(int reps, const std::function<void()>& fn) {
  Timing best;
  for (int i = 0; i < reps; ++i) {
    const double c0 = cpu_seconds();
    const auto t0 = clock_type::now();
    fn();
    const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (wall < best.wall) best = {wall, cpu_seconds() - c0};
  }
  return best;
}

void report(const char* what, size_t weight_bytes, double flops, Timing t) {
  std::printf("  %-40s %8.2f ms %7.2f GB/s %7.1f GFLOP/s   (cpu %7.2f ms)\n", what, t.wall * 1e3,
              static_cast<double>(weight_bytes) / t.wall / 1e9, flops > 0 ? flops / t.wall / 1e9 : 0.0, t.cpu * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const int64_t rank = 16;
  std::printf("merge math: kernels %s, rank %lld, best of %d\n", pm::kernel_name(), static_cast<long long>(rank), reps);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);

  for (auto [out, in] : {std::pair<int64_t, int64_t>{4096, 4096}, {4096, 11008}}) {
    const int64_t n = out * in;
    std::vector<float> a(static_cast<size_t>(rank * in)), b(static_cast<size_t>(out * rank));
    for (auto& x : a) x = normal(rng);
    for (auto& x : b) x = normal(rng);
    std::vector<uint16_t> w16(static_cast<size_t>(n));
    for (auto& x : w16) x = peft::f32_to_bf16(normal(rng));
    std::vector<float> w32(static_cast<size_t>(n));
    for (auto& x : w32) x = normal(rng);
    std::vector<float> magnitude(static_cast<size_t>(out), 1.0f);
    const pm::LoraFactors factors{a.data(), b.data(), rank, 2.0};
    const double flops = 2.0 * static_cast<double>(rank) * static_cast<double>(n);
    const pm::DeltaLayout linear = pm::layout_for(pm::ModuleKind::linear, out, in);
    const pm::DeltaLayout gpt2 = pm::layout_for(pm::ModuleKind::conv1d_gpt2, out, in);
    const pm::WeightView bf16{w16.data(), peft::DType::BF16, out, in};
    const pm::WeightView bf16_t{w16.data(), peft::DType::BF16, in, out};
    const pm::WeightView f32{w32.data(), peft::DType::F32, out, in};
    const size_t bytes16 = static_cast<size_t>(n) * 2, bytes32 = static_cast<size_t>(n) * 4;

    std::printf("weight %lld x %lld (out x in), %.1f MB in bf16\n", static_cast<long long>(out), static_cast<long long>(in),
                static_cast<double>(bytes16) / 1e6);
    std::vector<uint16_t> copy(w16.size());
    report("memory bound: bf16 read+write pass", bytes16, 0, best_of(reps, [&] {
             for (size_t i = 0; i < w16.size(); ++i) copy[i] = static_cast<uint16_t>(w16[i] ^ 1u);
           }));
    for (unsigned threads : {1u, 0u}) {
      pm::ExecOptions exec;
      exec.threads = threads;
      const std::string t = threads == 1 ? " (1 thread)" : " (all threads)";
      report(("merge bf16 Linear" + t).c_str(), bytes16, flops,
             best_of(reps, [&] { pm::add_delta(bf16, linear, {&factors, 1}, exec); }));
    }
    report("merge bf16 Conv1D (transposed)", bytes16, flops,
           best_of(reps, [&] { pm::add_delta(bf16_t, gpt2, {&factors, 1}); }));
    {
      std::vector<uint16_t> w_half(w16.size());
      for (size_t i = 0; i < w_half.size(); ++i) w_half[i] = peft::f32_to_f16(peft::bf16_to_f32(w16[i]));
      const pm::WeightView f16{w_half.data(), peft::DType::F16, out, in};
      report("merge f16 Linear", bytes16, flops, best_of(reps, [&] { pm::add_delta(f16, linear, {&factors, 1}); }));
    }
    report("merge f32 Linear", bytes32, flops,
           best_of(reps, [&] { pm::add_delta(f32, linear, {&factors, 1}); }));
    report("unmerge bf16 Linear", bytes16, flops,
           best_of(reps, [&] { pm::subtract_delta(bf16, linear, {&factors, 1}); }));
    report("DoRA merge bf16 Linear", bytes16, flops,
           best_of(reps, [&] { pm::dora_merge(bf16, linear, {&factors, 1}, magnitude.data()); }));
    report("DoRA merge bf16 Conv1D (two passes)", bytes16, 2 * flops,
           best_of(reps, [&] { pm::dora_merge(bf16_t, gpt2, {&factors, 1}, magnitude.data()); }));
    std::vector<float> delta(static_cast<size_t>(n));
    report("delta only, f32 out (library kernel)", bytes32, flops,
           best_of(reps, [&] { pm::compute_delta(linear, {&factors, 1}, delta.data()); }));
    report("delta only, f32 out (cblas_sgemm)", bytes32, flops, best_of(reps, [&] {
             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(out), static_cast<int>(in),
                         static_cast<int>(rank), 2.0f, b.data(), static_cast<int>(rank), a.data(),
                         static_cast<int>(in), 0.0f, delta.data(), static_cast<int>(in));
           }));
  }
  return 0;
}
