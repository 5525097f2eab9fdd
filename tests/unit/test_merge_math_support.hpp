// Reference loops for the merge-math tests: every module kind written in its own indexing (conv
// as [out][in][kh][kw], embedding as [token][dim], ...), one element at a time, with the
// arithmetic lora_math.hpp promises. The library must match them bit for bit.
#pragma once

#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "core/dtype.hpp"
#include "core/f16.hpp"
#include "peft/methods/lora_math.hpp"

namespace merge_test {

using peft::DType;
using peft::merge::ModuleKind;

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

inline size_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

// A weight buffer in any of the three storage dtypes, with element access through f32.
struct Buffer {
  DType dtype;
  std::vector<unsigned char> bytes;
  Buffer(DType d, size_t n) : dtype(d), bytes(n * dtype_bytes(d)) {}
  size_t size() const { return bytes.size() / dtype_bytes(dtype); }
  float get(size_t i) const {
    if (dtype == DType::F32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return dtype == DType::BF16 ? peft::bf16_to_f32(h) : peft::f16_to_f32(h);
  }
  // Stores round-to-nearest-even of v.
  void set(size_t i, float v) {
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      return;
    }
    const uint16_t h = dtype == DType::BF16 ? peft::f32_to_bf16(v) : peft::f32_to_f16(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  peft::merge::WeightView view(int64_t rows, int64_t cols) { return {bytes.data(), dtype, rows, cols}; }
};

inline Buffer random_buffer(DType d, size_t n, uint32_t seed, float scale = 1.0f) {
  Buffer b(d, n);
  const auto v = random_floats(n, seed, scale);
  for (size_t i = 0; i < n; ++i) b.set(i, v[i]);
  return b;
}

// One LoRA term with its own storage.
struct Term {
  std::vector<float> a, b;
  int64_t rank;
  double coefficient;
  peft::merge::LoraFactors factors() const { return {a.data(), b.data(), rank, coefficient}; }
};

inline Term random_term(int64_t rank, size_t a_size, size_t b_size, double coef, uint32_t seed) {
  return Term{random_floats(a_size, seed, 0.5f), random_floats(b_size, seed + 1, 0.5f), rank, coef};
}

// sum over k of B[o, k] * A[k, x] as the library accumulates it (fma chain from 0), where a_at(k)
// yields A's element for the column in question.
template <class AAt>
float dot_fma(const std::vector<float>& b, int64_t rank, int64_t o, AAt a_at) {
  float acc = 0.0f;
  for (int64_t k = 0; k < rank; ++k) acc = std::fma(b[static_cast<size_t>(o * rank + k)], a_at(k), acc);
  return acc;
}

// The delta in storage order, computed in each kind's natural indexing. weight_shape as PEFT has
// it; for conv, A is [r, in, kernel...] and B [out, r, 1...].
inline std::vector<float> reference_delta(ModuleKind kind, const std::vector<int64_t>& w,
                                          const std::vector<Term>& terms) {
  size_t n = 1;
  for (int64_t d : w) n *= static_cast<size_t>(d);
  std::vector<float> delta(n, 0.0f);
  for (size_t t = 0; t < terms.size(); ++t) {
    const Term& term = terms[t];
    const float c = static_cast<float>(term.coefficient);
    auto accumulate = [&](size_t index, float acc) {
      delta[index] = std::fma(c, acc, t == 0 ? -0.0f : delta[index]);
    };
    const int64_t r = term.rank;
    switch (kind) {
      case ModuleKind::linear:  // W [out][in]
        for (int64_t o = 0; o < w[0]; ++o)
          for (int64_t i = 0; i < w[1]; ++i)
            accumulate(static_cast<size_t>(o * w[1] + i),
                       dot_fma(term.b, r, o, [&](int64_t k) { return term.a[static_cast<size_t>(k * w[1] + i)]; }));
        break;
      case ModuleKind::conv1d_gpt2:  // W [in][out]
        for (int64_t i = 0; i < w[0]; ++i)
          for (int64_t o = 0; o < w[1]; ++o)
            accumulate(static_cast<size_t>(i * w[1] + o),
                       dot_fma(term.b, r, o, [&](int64_t k) { return term.a[static_cast<size_t>(k * w[0] + i)]; }));
        break;
      case ModuleKind::embedding:  // W [token][dim]; A [r][token], B [dim][r]
        for (int64_t tok = 0; tok < w[0]; ++tok)
          for (int64_t d = 0; d < w[1]; ++d)
            accumulate(static_cast<size_t>(tok * w[1] + d),
                       dot_fma(term.b, r, d, [&](int64_t k) { return term.a[static_cast<size_t>(k * w[0] + tok)]; }));
        break;
      case ModuleKind::conv: {  // W [out][in][k...], A [r][in][k...]
        int64_t kernel = 1;
        for (size_t d = 2; d < w.size(); ++d) kernel *= w[d];
        for (int64_t o = 0; o < w[0]; ++o)
          for (int64_t c = 0; c < w[1]; ++c)
            for (int64_t s = 0; s < kernel; ++s)
              accumulate(static_cast<size_t>((o * w[1] + c) * kernel + s), dot_fma(term.b, r, o, [&](int64_t k) {
                           return term.a[static_cast<size_t>((k * w[1] + c) * kernel + s)];
                         }));
        break;
      }
    }
  }
  return delta;
}

// The same delta in f64 with exact products, to check the f32 one is accurate.
inline std::vector<double> exact_delta_linear(int64_t out, int64_t in, const std::vector<Term>& terms) {
  std::vector<double> d(static_cast<size_t>(out * in), 0.0);
  for (const Term& t : terms)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (int64_t k = 0; k < t.rank; ++k)
          acc += double(t.b[static_cast<size_t>(o * t.rank + k)]) * double(t.a[static_cast<size_t>(k * in + i)]);
        d[static_cast<size_t>(o * in + i)] += t.coefficient * acc;
      }
  return d;
}

inline bool same_bytes(const Buffer& x, const Buffer& y) { return x.bytes == y.bytes; }

inline size_t count_different(const Buffer& x, const Buffer& y) {
  size_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) n += x.get(i) != y.get(i) || std::signbit(x.get(i)) != std::signbit(y.get(i));
  return n;
}

}  // namespace merge_test
