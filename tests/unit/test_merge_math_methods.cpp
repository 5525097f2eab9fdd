// The merge arithmetic of LoHa, LoKr, AdaLoRA and IA3 (methods/peft_methods.hpp) against plain
// reference loops written from PEFT's formulas, and the dense-delta / scale application.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "peft/methods/peft_methods.hpp"
#include "test_error_support.hpp"

namespace {

using peft::merge::MethodTensor;
using error_test::code_of;

MethodTensor random_tensor(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  MethodTensor t{{rows, cols}, std::vector<float>(static_cast<size_t>(rows * cols))};
  for (float& v : t.values) v = dist(gen);
  return t;
}

// x @ y in double.
std::vector<double> product(const MethodTensor& x, const MethodTensor& y) {
  const int64_t m = x.shape[0], k = x.shape[1], n = y.shape[1];
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) out[i * n + j] += double(x.values[i * k + p]) * y.values[p * n + j];
  return out;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= 1e-6 * scale);
}

}  // namespace

TEST_CASE("methods: LoHa delta is ((w1a @ w1b) * (w2a @ w2b)) * scale") {
  const int64_t out = 6, in = 5, r = 3;
  auto w1a = random_tensor(out, r, 1), w1b = random_tensor(r, in, 2), w2a = random_tensor(out, r, 3),
       w2b = random_tensor(r, in, 4);
  const auto d = peft::merge::loha_delta(w1a, w1b, w2a, w2b, 0.75, out, in, "m");
  const auto p1 = product(w1a, w1b), p2 = product(w2a, w2b);
  std::vector<double> want(p1.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = p1[i] * p2[i] * 0.75;
  check_close(d, want);
  auto bad = random_tensor(r, in + 1, 5);
  CHECK(code_of([&] { peft::merge::loha_delta(w1a, bad, w2a, w2b, 1.0, out, in, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
}

TEST_CASE("methods: LoKr delta is kron(w1, w2) * scale, from whole or decomposed factors") {
  auto w1 = random_tensor(2, 3, 6), w2 = random_tensor(4, 2, 7);
  peft::merge::LokrFactors whole;
  whole.w1 = &w1;
  whole.w2 = &w2;
  const auto d = peft::merge::lokr_delta(whole, 0.5, 8, 6, "m");
  std::vector<double> want(48);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 2; ++l) want[(i * 4 + k) * 6 + j * 2 + l] = double(w1.values[i * 3 + j]) * w2.values[k * 2 + l] * 0.5;
  check_close(d, want);

  auto w2a = random_tensor(4, 1, 8), w2b = random_tensor(1, 2, 9);
  peft::merge::LokrFactors split;
  split.w1 = &w1;
  split.w2_a = &w2a;
  split.w2_b = &w2b;
  const auto p2 = product(w2a, w2b);
  const auto d2 = peft::merge::lokr_delta(split, 1.0, 8, 6, "m");
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 2; ++l) want[(i * 4 + k) * 6 + j * 2 + l] = double(w1.values[i * 3 + j]) * p2[k * 2 + l];
  check_close(d2, want);
  CHECK(code_of([&] { peft::merge::lokr_delta(whole, 1.0, 8, 8, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
  peft::merge::LokrFactors missing;
  missing.w1 = &w1;
  CHECK(code_of([&] { peft::merge::lokr_delta(missing, 1.0, 8, 6, "m"); }) == PEFT_ERR_INVALID_CHECKPOINT);
}

namespace {

MethodTensor random_4d(int64_t a, int64_t b, int64_t c, int64_t d, uint32_t seed) {
  MethodTensor t = random_tensor(a * b, c * d, seed);
  t.shape = {a, b, c, d};
  return t;
}

// einsum("i j k l, i p, j r -> p r k l", t, wa, wb) in double, one element at a time.
double cp_element(const MethodTensor& t, const MethodTensor& wa, const MethodTensor& wb, int64_t p, int64_t q,
                  int64_t s) {
  const int64_t r1 = t.shape[0], r2 = t.shape[1], kernel = t.shape[2] * t.shape[3];
  const int64_t pn = wa.shape[1], qn = wb.shape[1];
  double sum = 0;
  for (int64_t i = 0; i < r1; ++i)
    for (int64_t j = 0; j < r2; ++j)
      sum += double(t.values[(i * r2 + j) * kernel + s]) * wa.values[i * pn + p] * wb.values[j * qn + q];
  return sum;
}

}  // namespace

TEST_CASE("methods: LoHa CP form is cp(t1, w1a, w1b) * cp(t2, w2a, w2b) * scale on a Conv2d") {
  const int64_t out = 5, c = 3, kh = 3, kw = 2, r = 2, kernel = kh * kw;
  auto t1 = random_4d(r, r, kh, kw, 11), t2 = random_4d(r, r, kh, kw, 12);
  auto w1a = random_tensor(r, out, 13), w1b = random_tensor(r, c, 14), w2a = random_tensor(r, out, 15),
       w2b = random_tensor(r, c, 16);
  const auto d = peft::merge::loha_cp_delta(t1, w1a, w1b, t2, w2a, w2b, 1.5, out, c * kernel, "m");
  std::vector<double> want(static_cast<size_t>(out * c * kernel));
  for (int64_t p = 0; p < out; ++p)
    for (int64_t q = 0; q < c; ++q)
      for (int64_t s = 0; s < kernel; ++s)
        want[(p * c + q) * kernel + s] = cp_element(t1, w1a, w1b, p, q, s) * cp_element(t2, w2a, w2b, p, q, s) * 1.5;
  check_close(d, want);
  CHECK(code_of([&] { peft::merge::loha_cp_delta(t1, w1a, w1b, t2, w2a, w2b, 1.0, out, c * kernel + 1, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
  auto flat = random_tensor(r, r * kernel, 17);  // a core that is not 4-D
  CHECK(code_of([&] { peft::merge::loha_cp_delta(flat, w1a, w1b, t2, w2a, w2b, 1.0, out, c * kernel, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
}

TEST_CASE("methods: LoKr on a Conv2d: kron(w1, w2 [b, d, kh, kw]) and the CP form of w2") {
  const int64_t a = 2, c = 3, b = 2, dd = 2, kh = 3, kw = 3, r = 2, kernel = kh * kw;
  const int64_t out = a * b, in = c * dd * kernel;
  auto w1 = random_tensor(a, c, 21);
  auto t2 = random_4d(r, r, kh, kw, 22);
  auto w2a = random_tensor(r, b, 23), w2b = random_tensor(r, dd, 24);
  // The reference: torch.kron(w1[:, :, None, None], w2) reshaped [out, in * kh * kw].
  auto kron_ref = [&](auto w2_at) {
    std::vector<double> want(static_cast<size_t>(out * in));
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < c; ++j)
        for (int64_t k = 0; k < b; ++k)
          for (int64_t l = 0; l < dd; ++l)
            for (int64_t s = 0; s < kernel; ++s)
              want[((i * b + k) * (c * dd) + (j * dd + l)) * kernel + s] =
                  double(w1.values[i * c + j]) * w2_at(k, l, s) * 0.5;
    return want;
  };
  peft::merge::LokrFactors cp;
  cp.w1 = &w1;
  cp.t2 = &t2;
  cp.w2_a = &w2a;
  cp.w2_b = &w2b;
  check_close(peft::merge::lokr_delta(cp, 0.5, out, in, "m"),
              kron_ref([&](int64_t k, int64_t l, int64_t s) { return cp_element(t2, w2a, w2b, k, l, s); }));

  auto w2 = random_4d(b, dd, kh, kw, 25);
  peft::merge::LokrFactors whole;
  whole.w1 = &w1;
  whole.w2 = &w2;
  check_close(peft::merge::lokr_delta(whole, 0.5, out, in, "m"), kron_ref([&](int64_t k, int64_t l, int64_t s) {
                return double(w2.values[(k * dd + l) * kernel + s]);
              }));
  cp.w2 = &w2;  // lokr_w2 and lokr_t2 together
  CHECK(code_of([&] { peft::merge::lokr_delta(cp, 1.0, out, in, "m"); }) == PEFT_ERR_INVALID_CHECKPOINT);
}

TEST_CASE("methods: AdaLoRA delta is B @ (A * E) * scaling / (ranknum + 1e-5)") {
  const int64_t out = 4, in = 7, r = 2;
  auto a = random_tensor(r, in, 10), e = random_tensor(r, 1, 11), b = random_tensor(out, r, 12);
  const auto d = peft::merge::adalora_delta(a, e, b, 8.0, 4.0, out, in, "m");
  std::vector<double> want(static_cast<size_t>(out * in), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t k = 0; k < r; ++k) want[o * in + i] += double(b.values[o * r + k]) * a.values[k * in + i] * e.values[k];
      want[o * in + i] *= 8.0 / (4.0 + 1e-5);
    }
  check_close(d, want);
}

TEST_CASE("methods: a dense delta goes into storage order, transposed for Conv1D, and comes out again") {
  const int64_t out = 3, in = 5;
  auto delta = random_tensor(out, in, 13);
  auto w = random_tensor(in, out, 14);  // Conv1D storage [in, out]
  const std::vector<float> original = w.values;
  const auto layout = peft::merge::layout_for(peft::merge::ModuleKind::conv1d_gpt2, out, in);
  const peft::merge::WeightView view{w.values.data(), peft::DType::F32, in, out};
  peft::merge::add_dense_delta(view, layout, delta.values.data(), false);
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) CHECK(w.values[i * out + o] == original[i * out + o] + delta.values[o * in + i]);
  peft::merge::add_dense_delta(view, layout, delta.values.data(), true);
  for (size_t k = 0; k < w.values.size(); ++k) CHECK(std::fabs(w.values[k] - original[k]) <= 1e-6f);
}

TEST_CASE("methods: IA3 scales output features, or input features of a feed-forward layer, in one rounding") {
  const int64_t out = 3, in = 4;
  std::vector<uint16_t> weight(static_cast<size_t>(out * in));
  for (size_t k = 0; k < weight.size(); ++k) weight[k] = peft::f32_to_bf16(0.1f * float(k) - 0.5f);
  const std::vector<uint16_t> original = weight;
  const std::vector<float> l_out = {1.5f, 0.25f, -2.0f}, l_in = {0.5f, 1.0f, 3.0f, 1.25f};
  const auto layout = peft::merge::layout_for(peft::merge::ModuleKind::linear, out, in);
  const peft::merge::WeightView view{weight.data(), peft::DType::BF16, out, in};
  peft::merge::ia3_scale(view, layout, l_out.data(), false, false);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      CHECK(weight[o * in + i] == peft::f32_to_bf16(peft::bf16_to_f32(original[o * in + i]) * l_out[o]));
  weight = original;
  peft::merge::ia3_scale(view, layout, l_in.data(), true, false);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      CHECK(weight[o * in + i] == peft::f32_to_bf16(peft::bf16_to_f32(original[o * in + i]) * l_in[i]));
}

TEST_CASE("methods: MiSS adds miss_block[j % r, o] (standard, with a remainder) and the mini block repeated") {
  const int64_t out = 6, in = 7;
  const MethodTensor block = random_tensor(3, out, 41);  // r = 3: 7 = 2 * 3 + 1 leaves a remainder
  const auto d = peft::merge::miss_delta(block, 0, false, nullptr, out, in, "m");
  REQUIRE(d.size() == static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) CHECK(d[o * in + j] == block.values[(j % 3) * out + o]);
  const MethodTensor mini = random_tensor(3, 2, 42);  // mini_r = 2 repeated over 6 outputs
  const auto dm = peft::merge::miss_delta(mini, 2, false, nullptr, out, in, "m");
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) CHECK(dm[o * in + j] == mini.values[(j % 3) * 2 + o % 2]);
  CHECK(code_of([&] { peft::merge::miss_delta(random_tensor(3, 5, 1), 0, false, nullptr, out, in, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { peft::merge::miss_delta(random_tensor(8, out, 1), 0, false, nullptr, out, in, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);  // r > in
  CHECK(code_of([&] { peft::merge::miss_delta(random_tensor(3, 4, 1), 4, false, nullptr, out, in, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);  // mini_r does not divide out
}

TEST_CASE("methods: MiSS bat delta is W_block @ miss_block[a] + miss_block[a] per r x r block") {
  const int64_t out = 4, in = 6, r = 2;
  const MethodTensor w = random_tensor(out, in, 43);
  MethodTensor block = random_tensor(out / r, r * r, 44);
  block.shape = {out / r, r, r};
  const auto d = peft::merge::miss_delta(block, 0, true, w.values.data(), out, in, "m");
  std::vector<double> want(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) {
      const int64_t a = o / r, i = o % r, c = j / r, jj = j % r;
      double s = block.values[a * r * r + i * r + jj];
      for (int64_t k = 0; k < r; ++k) s += double(w.values[o * in + c * r + k]) * block.values[a * r * r + k * r + jj];
      want[o * in + j] = s;
    }
  check_close(d, want);
  CHECK(peft::merge::miss_delta(block, 0, true, nullptr, out, in, "m").empty());  // shapes only
  CHECK(code_of([&] { peft::merge::miss_delta(block, 0, true, nullptr, out, 5, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
}

TEST_CASE("methods: SHiRA puts shira_weight * scale at the saved indices and -0.0 elsewhere") {
  const int64_t out = 3, in = 4;
  const MethodTensor values{{3}, {0.5f, -1.25f, 2.0f}};
  const MethodTensor indices{{2, 3}, {0, 2, 1, /* columns */ 3, 0, 1}};
  const auto d = peft::merge::shira_delta(values, indices, 0.5, out, in, "m");
  REQUIRE(d.size() == 12u);
  CHECK(d[0 * in + 3] == 0.25f);
  CHECK(d[2 * in + 0] == -0.625f);
  CHECK(d[1 * in + 1] == 1.0f);
  int untouched = 0;
  for (float v : d) untouched += (v == 0.0f && std::signbit(v)) ? 1 : 0;
  CHECK(untouched == 9);  // -0.0 leaves every weight's bits as they are, -0.0 included
  const MethodTensor outside{{2, 3}, {0, 3, 1, 3, 0, 1}};  // row 3 of a 3-row layer
  CHECK(code_of([&] { peft::merge::shira_delta(values, outside, 1.0, out, in, "m"); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { peft::merge::shira_delta(values, MethodTensor{{2, 2}, {0, 1, 0, 1}}, 1.0, out, in, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
}
