// Unmerged LoRA (serve/lora_apply.hpp, what peft_lora_apply() runs) against the base product it
// rides on, for LLaMA-7B layer shapes (4096 -> 4096 attention projections, 4096 -> 11008 MLP),
// batches of 1, 16 and 256 rows and ranks 8, 16 and 64:
//   base   Y = X W^T in f32 (cblas_sgemm; cblas_sgemv for one row), the host's own work
//   apply  apply_lora on that Y, one adapter for every row (row_group NULL), or four adapters
//          interleaved row by row ("mixed": every group gathered)
// Factors are stored in f32 or bf16 (bf16 is widened per call); x and y are f32 or bf16.
// "cold" runs flush the factors, x and y from the caches first, as in a model whose other layers
// ran in between; "warm" runs repeat on cached data. Best of the repetitions, wall clock.
//
// Usage: bench_lora_apply [repetitions=15]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/convert.hpp"
#include "serve/lora_apply.hpp"

namespace {

using peft::DType;
using peft::serve::LoraBatch;
using peft::serve::LoraFactors;
using Clock = std::chrono::steady_clock;

std::vector<unsigned char> random_tensor(DType dtype, size_t count, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  std::vector<unsigned char> bytes(count * (dtype == DType::F32 ? 4 : 2));
  peft::convert(DType::F32, values.data(), dtype, bytes.data(), count);
  return bytes;
}

void flush_from_caches(const std::vector<unsigned char>& bytes) {
#if defined(__x86_64__)
  for (size_t i = 0; i < bytes.size(); i += 64) _mm_clflush(bytes.data() + i);
  _mm_mfence();
#else
  (void)bytes;
#endif
}

double best_seconds(int repetitions, const std::function<void()>& prepare, const std::function<void()>& body) {
  double best = 1e30;
  for (int r = 0; r < repetitions; ++r) {
    prepare();
    const auto start = Clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

struct Adapter {
  std::vector<unsigned char> a, b;
  LoraFactors factors(DType dtype, int64_t rank) const { return {dtype, a.data(), b.data(), nullptr, rank, 2.0}; }
};

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 15;
  struct Shape {
    const char* name;
    size_t in, out;
  };
  const Shape shapes[] = {{"4096->4096", 4096, 4096}, {"4096->11008", 4096, 11008}};
  const size_t batches[] = {1, 16, 256};
  const int64_t ranks[] = {8, 16, 64};
  struct Variant {
    const char* name;
    DType io, factors;
    bool mixed;
  };
  const Variant variants[] = {{"f32 x/y, f32 factors", DType::F32, DType::F32, false},
                              {"f32 x/y, bf16 factors", DType::F32, DType::BF16, false},
                              {"bf16 x/y, bf16 factors", DType::BF16, DType::BF16, false},
                              {"bf16 x/y, bf16 factors, mixed", DType::BF16, DType::BF16, true}};

  std::printf("bench_lora_apply: best of %d, milliseconds; overhead = apply / base\n\n", repetitions);
  std::printf("| %-11s | %5s | %4s | %-30s | %9s | %9s | %9s | %8s | %8s |\n", "shape", "batch", "rank", "variant",
              "base ms", "apply ms", "cold ms", "overhead", "cold ovh");
  std::printf("|-------------|-------|------|--------------------------------|-----------|-----------|-----------|----------|----------|\n");
  for (const Shape& shape : shapes) {
    const std::vector<unsigned char> weight = random_tensor(DType::F32, shape.out * shape.in, 0.02f, 1);
    for (size_t batch : batches) {
      std::vector<unsigned char> x32 = random_tensor(DType::F32, batch * shape.in, 1.0f, 2);
      std::vector<unsigned char> y32(batch * shape.out * 4);
      const auto* w = reinterpret_cast<const float*>(weight.data());
      const auto* x = reinterpret_cast<const float*>(x32.data());
      auto* y = reinterpret_cast<float*>(y32.data());
      const auto base = [&] {
        if (batch == 1)
          cblas_sgemv(CblasRowMajor, CblasNoTrans, int(shape.out), int(shape.in), 1.0f, w, int(shape.in), x, 1, 0.0f,
                      y, 1);
        else
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(batch), int(shape.out), int(shape.in), 1.0f, x,
                      int(shape.in), w, int(shape.in), 0.0f, y, int(shape.out));
      };
      const double base_seconds = best_seconds(repetitions, [] {}, base);

      for (int64_t rank : ranks) {
        for (const Variant& v : variants) {
          if (v.mixed && batch == 1) continue;
          std::vector<Adapter> adapters;
          for (uint32_t k = 0; k < (v.mixed ? 4u : 1u); ++k)
            adapters.push_back({random_tensor(v.factors, size_t(rank) * shape.in, 0.02f, 10 + k),
                                random_tensor(v.factors, shape.out * size_t(rank), 0.02f, 20 + k)});
          std::vector<std::optional<LoraFactors>> groups;
          for (const Adapter& a : adapters) groups.emplace_back(a.factors(v.factors, rank));
          std::vector<int32_t> row_group(batch);
          for (size_t i = 0; i < batch; ++i) row_group[i] = int32_t(i % adapters.size());

          const std::vector<unsigned char> x_io = v.io == DType::F32 ? x32 : random_tensor(v.io, batch * shape.in, 1.0f, 2);
          std::vector<unsigned char> y_io = random_tensor(v.io, batch * shape.out, 1.0f, 3);
          const LoraBatch lora{x_io.data(), v.io, y_io.data(), v.io, batch, shape.in, shape.out,
                               v.mixed ? row_group.data() : nullptr};
          const auto apply = [&] { peft::serve::apply_lora(groups, lora); };
          const double warm = best_seconds(repetitions, [] {}, apply);
          const double cold = best_seconds(repetitions, [&] {
            for (const Adapter& a : adapters) {
              flush_from_caches(a.a);
              flush_from_caches(a.b);
            }
            flush_from_caches(x_io);
            flush_from_caches(y_io);
          }, apply);
          std::printf("| %-11s | %5zu | %4lld | %-30s | %9.3f | %9.3f | %9.3f | %7.1f%% | %7.1f%% |\n", shape.name,
                      batch, static_cast<long long>(rank), v.name, base_seconds * 1e3, warm * 1e3, cold * 1e3,
                      100 * warm / base_seconds, 100 * cold / base_seconds);
        }
      }
    }
  }
  return 0;
}
