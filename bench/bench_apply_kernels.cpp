// The two products of unmerged LoRA alone (serve/apply_kernels.hpp), on every kernel table this
// CPU has, one thread: T = X A^T ("shrink") and C += s T B^T ("expand") for a layer of 4096 outputs
// and 4096 inputs, then 11008 (down_proj: X's rows outgrow the cache), with bf16 factors, 1, 16 and
// 64 rows, ranks 8, 16 and 64. Median of 7 after a warm-up; GFLOP/s
// counts a multiply-add as two operations.
//
// Usage: bench_apply_kernels [IN] (one layer of IN input features instead)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "serve/apply_kernels.hpp"

namespace {

template <class Fn>
double median_ms(Fn&& fn) {
  fn();
  std::vector<double> times;
  for (int r = 0; r < 7; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[3];
}

void bench_layer(const std::vector<const peft::serve::kernels::Table*>& tables, int64_t in) {
  constexpr int64_t out = 4096;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::printf("apply kernels: %lldx%lld layer, bf16 factors, one thread, median of 7\n", static_cast<long long>(out),
              static_cast<long long>(in));
  std::printf("  %-8s %5s %5s %12s %10s %12s %10s\n", "table", "rows", "rank", "shrink ms", "GFLOP/s", "expand ms",
              "GFLOP/s");
  for (const auto* table : tables)
    for (int64_t n : {1, 16, 64})
      for (int64_t rank : {8, 16, 64}) {
        std::vector<uint16_t> a(static_cast<size_t>(rank * in)), b(static_cast<size_t>(out * rank));
        for (auto& v : a) v = peft::f32_to_bf16(normal(rng));
        for (auto& v : b) v = peft::f32_to_bf16(normal(rng));
        std::vector<float> x(static_cast<size_t>(n * in)), c(static_cast<size_t>(n * out)), t(static_cast<size_t>(n * rank));
        for (auto& v : x) v = normal(rng);
        const double shrink =
            median_ms([&] { table->shrink(peft::DType::BF16, a.data(), rank, in, x.data(), n, t.data(), rank); });
        const double expand = median_ms(
            [&] { table->expand(peft::DType::BF16, b.data(), out, rank, t.data(), n, 2.0f, c.data(), 0, out); });
        const double flops = 2.0 * static_cast<double>(n * rank * in);
        std::printf("  %-8s %5lld %5lld %12.4f %10.1f %12.4f %10.1f\n", table->name, static_cast<long long>(n),
                    static_cast<long long>(rank), shrink, flops / shrink / 1e6, expand, flops / expand / 1e6);
      }
}

}  // namespace

int main(int argc, char** argv) {
  namespace k = peft::serve::kernels;
  std::vector<const k::Table*> tables;
  if (k::x86_avx512()) tables.push_back(k::x86_avx512());
  if (k::x86_avx2()) tables.push_back(k::x86_avx2());
  tables.push_back(&k::portable());
  if (argc > 1) {
    const int64_t in = std::atoll(argv[1]);
    if (in <= 0) {
      std::fprintf(stderr, "usage: bench_apply_kernels [IN]\n");
      return 2;
    }
    bench_layer(tables, in);
    return 0;
  }
  for (int64_t in : {4096, 11008}) bench_layer(tables, in);
  return 0;
}
