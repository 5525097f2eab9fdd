// The merge arithmetic of VB-LoRA and C3A (methods/peft_methods.hpp) against plain reference loops
// written from PEFT's formulas (peft/tuners/vblora/layer.py, peft/tuners/c3a/{layer,utils}.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "peft/methods/peft_methods.hpp"
#include "test_error_support.hpp"

namespace {

using error_test::code_of;
using peft::merge::MethodTensor;
using peft::merge::VbloraLogits;

MethodTensor random_values(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  MethodTensor t{shape, std::vector<float>(static_cast<size_t>(n))};
  for (float& v : t.values) v = dist(gen);
  return t;
}

// PEFT's _get_low_rank_matrix for one row: topk, softmax, weighted sum of bank rows (f64).
std::vector<double> mix_row(const float* logits, const MethodTensor& bank, int64_t topk) {
  const int64_t nv = bank.shape[0], len = bank.shape[1];
  std::vector<int64_t> order(static_cast<size_t>(nv));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  double sum = 0.0;
  for (int64_t j = 0; j < topk; ++j) sum += std::exp(double(logits[order[j]]));
  std::vector<double> out(static_cast<size_t>(len), 0.0);
  for (int64_t j = 0; j < topk; ++j)
    for (int64_t l = 0; l < len; ++l)
      out[l] += std::exp(double(logits[order[j]])) / sum * bank.values[order[j] * len + l];
  return out;
}

// The top-k form PEFT saves: indices [.., k] and the first k - 1 softmax weights (f32).
void topk_form(const MethodTensor& logits, int64_t topk, MethodTensor& indices, MethodTensor& weights) {
  const int64_t nv = logits.shape[2], rows = logits.shape[0] * logits.shape[1];
  indices = {{logits.shape[0], logits.shape[1], topk}, {}};
  weights = {{logits.shape[0], logits.shape[1], topk - 1}, {}};
  for (int64_t row = 0; row < rows; ++row) {
    const float* x = logits.values.data() + row * nv;
    std::vector<int64_t> order(static_cast<size_t>(nv));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
    double sum = 0.0;
    for (int64_t j = 0; j < topk; ++j) sum += std::exp(double(x[order[j]]));
    for (int64_t j = 0; j < topk; ++j) {
      indices.values.push_back(static_cast<float>(order[j]));
      if (j + 1 < topk) weights.values.push_back(static_cast<float>(std::exp(double(x[order[j]])) / sum));
    }
  }
}

VbloraLogits whole(const MethodTensor* logits) { return VbloraLogits{logits, nullptr, nullptr}; }
VbloraLogits saved_topk(const MethodTensor* indices, const MethodTensor* weights) {
  return VbloraLogits{nullptr, indices, weights};
}

}  // namespace

TEST_CASE("methods: VB-LoRA delta is B @ A of the top-k softmax mixtures of the vector bank") {
  const int64_t out = 8, in = 12, r = 2, len = 4, nv = 7, topk = 3;
  const auto bank = random_values({nv, len}, 1);
  auto la = random_values({r, in / len, nv}, 2), lb = random_values({out / len, r, nv}, 3);
  for (float& v : la.values) v *= 4.0f;  // spread the logits: the top k carry distinct weights
  for (float& v : lb.values) v *= 4.0f;
  const auto d = peft::merge::vblora_delta(bank, whole(&la), whole(&lb), topk, 1.0, out, in, "m");
  // A [r, in]: row k, column t * len + l = mix(logits_A[k, t])[l]; B [out, r]: row t * len + l,
  // column k = mix(logits_B[t, k])[l].
  std::vector<double> a(static_cast<size_t>(r * in)), b(static_cast<size_t>(out * r));
  for (int64_t k = 0; k < r; ++k)
    for (int64_t t = 0; t < in / len; ++t) {
      const auto m = mix_row(la.values.data() + (k * (in / len) + t) * nv, bank, topk);
      for (int64_t l = 0; l < len; ++l) a[k * in + t * len + l] = m[l];
    }
  for (int64_t t = 0; t < out / len; ++t)
    for (int64_t k = 0; k < r; ++k) {
      const auto m = mix_row(lb.values.data() + (t * r + k) * nv, bank, topk);
      for (int64_t l = 0; l < len; ++l) b[(t * len + l) * r + k] = m[l];
    }
  double scale = 0.0;
  std::vector<double> want(static_cast<size_t>(out * in), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t k = 0; k < r; ++k) want[o * in + i] += b[o * r + k] * a[k * in + i];
      scale = std::max(scale, std::fabs(want[o * in + i]));
    }
  REQUIRE(scale > 0);
  REQUIRE(d.size() == want.size());
  for (size_t i = 0; i < d.size(); ++i) CHECK(std::fabs(d[i] - want[i]) <= 1e-6 * scale);

  // The save_only_topk_weights form gives the same delta (its weights are the f32 softmax).
  MethodTensor ia, wa, ib, wb;
  topk_form(la, topk, ia, wa);
  topk_form(lb, topk, ib, wb);
  const auto t = peft::merge::vblora_delta(bank, saved_topk(&ia, &wa), saved_topk(&ib, &wb),
                                           topk, 1.0, out, in, "m");
  for (size_t i = 0; i < d.size(); ++i) CHECK(std::fabs(t[i] - want[i]) <= 1e-6 * scale);

  // A merge weight multiplies once in f32.
  const auto half = peft::merge::vblora_delta(bank, whole(&la), whole(&lb), topk, 0.5, out, in, "m");
  for (size_t i = 0; i < d.size(); ++i) CHECK(half[i] == d[i] * 0.5f);

  // Refusals: topk above the bank, features not a multiple of L, a completed weight below 0, an
  // index outside the bank.
  CHECK(code_of([&] { peft::merge::vblora_delta(bank, whole(&la), whole(&lb), nv + 1, 1.0, out, in, "m"); }) ==
        PEFT_ERR_INVALID_CONFIG);
  CHECK(code_of([&] { peft::merge::vblora_delta(bank, whole(&la), whole(&lb), topk, 1.0, out, in + 2, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
  MethodTensor bad = wa;
  bad.values[0] = 0.75f;
  bad.values[1] = 0.5f;  // 1 - 1.25 < 0: PEFT's log would make the merge NaN
  CHECK(code_of([&] {
          peft::merge::vblora_delta(bank, saved_topk(&ia, &bad), saved_topk(&ib, &wb), topk, 1.0,
                                    out, in, "m");
        }) == PEFT_ERR_INVALID_ARGUMENT);
  MethodTensor far = ia;
  far.values[0] = static_cast<float>(nv);
  CHECK(code_of([&] {
          peft::merge::vblora_delta(bank, saved_topk(&far, &wa), saved_topk(&ib, &wb), topk, 1.0,
                                    out, in, "m");
        }) == PEFT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("methods: C3A delta is the exact block-circulant kernel[M, N, (j - i) mod b] / in") {
  const int64_t b = 4, mb = 2, nb = 3, out = mb * b, in = nb * b;
  const auto kernel = random_values({mb, nb, b}, 7);
  const auto d = peft::merge::c3a_delta(kernel, 1.0, out, in, "m");
  REQUIRE(d.size() == static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < in; ++c) {
      const float v = kernel.values[((o / b) * nb + c / b) * b + ((c % b) - (o % b) + b) % b];
      CHECK(d[o * in + c] == v / static_cast<float>(in));
    }
  const auto half = peft::merge::c3a_delta(kernel, 0.5, out, in, "m");
  for (size_t i = 0; i < d.size(); ++i) CHECK(half[i] == d[i] * 0.5f);
  CHECK(code_of([&] { peft::merge::c3a_delta(kernel, 1.0, out, in + b, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { peft::merge::c3a_delta(kernel, 1.0, in, out, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
}
