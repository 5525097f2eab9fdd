// The merge arithmetic of VeRA, RandLoRA and FourierFT (methods/peft_methods.hpp) against plain
// reference loops written from PEFT's formulas (peft/tuners/{vera,randlora,fourierft}/layer.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "peft/methods/peft_methods.hpp"
#include "test_error_support.hpp"

namespace {

using peft::merge::MethodTensor;
using error_test::code_of;

MethodTensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  MethodTensor t{shape, std::vector<float>(static_cast<size_t>(n))};
  for (float& v : t.values) v = dist(gen);
  return t;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  REQUIRE(scale > 0);
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= 1e-6 * scale);
}

}  // namespace

TEST_CASE("methods: VeRA delta slices the shared projections: (lambda_b * B[:out]) @ (lambda_d * A[:, :in])") {
  const int64_t out = 5, in = 4, r = 3;
  auto a = random_tensor({r, in + 3}, 1), b = random_tensor({out + 2, r}, 2);
  auto ld = random_tensor({r}, 3), lb = random_tensor({out}, 4);
  const auto d = peft::merge::vera_delta(a, b, ld, lb, 1.0, out, in, "m");
  std::vector<double> want(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j)
      for (int64_t k = 0; k < r; ++k)
        want[i * in + j] += double(lb.values[i]) * b.values[i * r + k] * ld.values[k] * a.values[k * (in + 3) + j];
  check_close(d, want);
  const auto half = peft::merge::vera_delta(a, b, ld, lb, 0.5, out, in, "m");
  for (size_t i = 0; i < d.size(); ++i) CHECK(half[i] == d[i] * 0.5f);
  auto small = random_tensor({r, in - 1}, 5);
  CHECK(code_of([&] { peft::merge::vera_delta(small, b, ld, lb, 1.0, out, in, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
  auto wrong_rank = random_tensor({r + 1, in}, 6);
  CHECK(code_of([&] { peft::merge::vera_delta(wrong_rank, b, ld, lb, 1.0, out, in, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
}

namespace {

// RandLoRA from PEFT's formula with explicit flat indices: S[(k, b), j] and L[i, (b, k)].
std::vector<double> randlora_reference(const MethodTensor& a, const MethodTensor& b, const MethodTensor& lambda,
                                       const MethodTensor& gamma, double scale, int64_t out, int64_t in) {
  const int64_t lo = std::min(out, in), hi = std::max(out, in), r = lambda.shape[0], nb = lambda.shape[1];
  std::vector<double> p(static_cast<size_t>(hi * lo), 0.0);
  for (int64_t i = 0; i < hi; ++i)
    for (int64_t j = 0; j < lo; ++j)
      for (int64_t flat = 0; flat < r * nb; ++flat) {
        const int64_t k = flat / nb, base = flat % nb;        // S's row: (rank, base)
        const int64_t lb = flat / r, lk = flat % r;            // L's column: (base, rank)
        const int64_t abase = a.shape[1] == 1 ? 0 : base;
        const double s = double(lambda.values[k * nb + base]) * a.values[(k * a.shape[1] + abase) * a.shape[2] + j] *
                         gamma.values[base * lo + j];
        p[i * lo + j] += double(b.values[(i * b.shape[1] + lb) * r + lk]) * s;
      }
  std::vector<double> d(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < hi; ++i)
    for (int64_t j = 0; j < lo; ++j) d[lo == in ? i * in + j : j * in + i] = p[i * lo + j] * scale;
  return d;
}

}  // namespace

TEST_CASE("methods: RandLoRA delta pairs the flattened bases as PEFT does, in both orientations") {
  for (const std::pair<int64_t, int64_t>& shape : {std::pair<int64_t, int64_t>{7, 5}, {4, 9}, {6, 6}}) {
    const int64_t out = shape.first, in = shape.second;
    const int64_t r = 2, lo = std::min(out, in), hi = std::max(out, in), nb = (lo + r - 1) / r;
    auto a = random_tensor({r, 1, lo + 1}, 11), b = random_tensor({hi + 2, nb + 1, r}, 12);
    auto lambda = random_tensor({r, nb}, 13), gamma = random_tensor({nb, lo}, 14);
    CAPTURE(out);
    CAPTURE(in);
    check_close(peft::merge::randlora_delta(a, b, lambda, gamma, 1.5, out, in, "m"),
                randlora_reference(a, b, lambda, gamma, 1.5, out, in));
    auto a_all = random_tensor({r, nb, lo}, 15);  // one A per base
    check_close(peft::merge::randlora_delta(a_all, b, lambda, gamma, 0.5, out, in, "m"),
                randlora_reference(a_all, b, lambda, gamma, 0.5, out, in));
    auto bad_lambda = random_tensor({r, nb + 1}, 16);
    CHECK(code_of([&] { peft::merge::randlora_delta(a, b, bad_lambda, gamma, 1.0, out, in, "m"); }) ==
          PEFT_ERR_SHAPE_MISMATCH);
  }
}

TEST_CASE("methods: torch_randperm is torch.randperm's CPU shuffle") {
  // torch.randperm(10, generator=torch.Generator().manual_seed(5)) and manual_seed(-1) (torch 2.15);
  // seeds keep their low 32 bits. tests/interop/test_method_merge_vera_randlora_fourierft.py checks many more sizes.
  const std::vector<int64_t> seed5 = {1, 4, 9, 6, 3, 5, 0, 2, 8, 7};
  const std::vector<int64_t> minus1 = {1, 4, 6, 2, 0, 5, 8, 7, 9, 3};
  CHECK(peft::merge::torch_randperm(10, 5, 10) == seed5);
  CHECK(peft::merge::torch_randperm(10, (int64_t{1} << 32) + 5, 10) == seed5);
  CHECK(peft::merge::torch_randperm(10, -1, 10) == minus1);
  CHECK(peft::merge::torch_randperm(10, 5, 4) == std::vector<int64_t>(seed5.begin(), seed5.begin() + 4));
  CHECK(peft::merge::torch_randperm(1, 5, 1) == std::vector<int64_t>{0});
  CHECK(code_of([] { peft::merge::torch_randperm(int64_t{1} << 28, 5, 1); }) == PEFT_ERR_UNSUPPORTED);
}

TEST_CASE("methods: FourierFT delta is the real part of the inverse 2-D DFT of the placed spectrum, scaled") {
  const int64_t out = 6, in = 10, n = 12, seed = 777;
  auto spectrum = random_tensor({n}, 21);
  const auto d = peft::merge::fourierft_delta(spectrum, seed, 150.0, out, in, "m");
  const auto pos = peft::merge::torch_randperm(out * in, seed, n);
  std::vector<double> want(static_cast<size_t>(out * in), 0.0);
  for (int64_t p = 0; p < out; ++p)
    for (int64_t q = 0; q < in; ++q)
      for (int64_t e = 0; e < n; ++e) {
        const double j = double(pos[e] / in), k = double(pos[e] % in);
        want[p * in + q] += spectrum.values[e] * std::cos(2 * std::numbers::pi * (j * p / out + k * q / in)) /
                            double(out * in) * 150.0;
      }
  check_close(d, want);
  auto too_long = random_tensor({out * in + 1}, 22);
  CHECK(code_of([&] { peft::merge::fourierft_delta(too_long, seed, 1.0, out, in, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
}
