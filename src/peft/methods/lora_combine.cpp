// add_weighted_adapter's "cat" and "linear" combinations (peft/tuners/lora/model.py), on f32
// factors, in torch's order of f32 operations. No contraction: the weighted sums round each
// product before adding it, as torch's `(task_tensors * weights).sum(dim=0)` does.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>
#include <string>

#include "core/error.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft::merge {

namespace {

void check_adapters(std::span<const WeightedFactors> adapters, int64_t out, int64_t in, const char* how) {
  const std::string what = std::string("combining adapters (") + how + ")";
  if (adapters.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, what + ": no adapters given");
  if (out < 1 || in < 1) fail(PEFT_ERR_INVALID_ARGUMENT, what + ": empty factor dimension");
  int64_t total = 0;
  for (size_t i = 0; i < adapters.size(); ++i) {
    const WeightedFactors& f = adapters[i];
    if (f.a == nullptr || f.b == nullptr)
      fail(PEFT_ERR_INVALID_ARGUMENT, what + ": adapter #" + std::to_string(i) + " has a null factor");
    if (f.rank < 1)
      fail(PEFT_ERR_INVALID_ARGUMENT, what + ": adapter #" + std::to_string(i) + " has rank " + std::to_string(f.rank));
    lora_coefficient(f.weight, f.scaling, what + ": adapter #" + std::to_string(i));
    int64_t a_size = 0, b_size = 0;
    if (__builtin_add_overflow(total, f.rank, &total) || __builtin_mul_overflow(total, in, &a_size) ||
        __builtin_mul_overflow(total, out, &b_size) || a_size > (int64_t(1) << 60) || b_size > (int64_t(1) << 60))
      fail(PEFT_ERR_VALIDATION_OVERFLOW, what + ": combined factors are too large");
  }
}

}  // namespace

CombinedFactors combine_cat(std::span<const WeightedFactors> adapters, int64_t out, int64_t in) {
  check_adapters(adapters, out, in, "cat");
  CombinedFactors c;
  c.in = in;
  c.out = out;
  for (const auto& f : adapters) c.rank += f.rank;
  c.a.resize(static_cast<size_t>(c.rank * in));
  c.b.resize(static_cast<size_t>(out * c.rank));
  int64_t offset = 0;
  for (const auto& f : adapters) {
    // lora_A * weight * scaling: two f32 products, left to right.
    const float w = static_cast<float>(f.weight), s = static_cast<float>(f.scaling);
    float* a = c.a.data() + offset * in;
    for (int64_t i = 0; i < f.rank * in; ++i) {
      const float weighted = f.a[i] * w;
      a[i] = weighted * s;
    }
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < f.rank; ++k) c.b[static_cast<size_t>(o * c.rank + offset + k)] = f.b[o * f.rank + k];
    offset += f.rank;
  }
  return c;
}

CombinedFactors combine_linear(std::span<const WeightedFactors> adapters, int64_t out, int64_t in) {
  check_adapters(adapters, out, in, "linear");
  const int64_t rank = adapters[0].rank;
  for (const auto& f : adapters)
    if (f.rank != rank)
      fail(PEFT_ERR_INVALID_ARGUMENT, "combining adapters (linear): all ranks must be equal, got " +
                                          std::to_string(rank) + " and " + std::to_string(f.rank));
  CombinedFactors c;
  c.in = in;
  c.out = out;
  c.rank = rank;
  c.a.assign(static_cast<size_t>(rank * in), 0.0f);
  c.b.assign(static_cast<size_t>(out * rank), 0.0f);
  for (const auto& f : adapters) {
    // Python floats, then torch.tensor(list) makes them f32; the sign goes on A only.
    const double weighted = f.weight * f.scaling;
    const double root = std::sqrt(std::fabs(weighted));
    const float wa = static_cast<float>(weighted >= 0 ? root : -root);
    const float wb = static_cast<float>(root);
    for (size_t i = 0; i < c.a.size(); ++i) {
      const float term = f.a[i] * wa;
      c.a[i] = c.a[i] + term;
    }
    for (size_t i = 0; i < c.b.size(); ++i) {
      const float term = f.b[i] * wb;
      c.b[i] = c.b[i] + term;
    }
  }
  return c;
}

}  // namespace peft::merge
