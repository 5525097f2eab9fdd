// The multiplicative methods OFT, BOFT and HRA (methods/peft_methods.hpp): their rotations against
// dense reference matrices written from PEFT's formulas, the inverse PEFT's unmerge applies, the
// butterfly permutation, and the application W' = (W @ M) * s with one rounding per element.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "peft/methods/peft_methods.hpp"
#include "test_error_support.hpp"

namespace {

using peft::merge::InputTransform;
using peft::merge::MethodTensor;
using error_test::code_of;

MethodTensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float mean = 0.0f, float sd = 0.3f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, sd);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  MethodTensor t{shape, std::vector<float>(static_cast<size_t>(n))};
  for (float& v : t.values) v = dist(gen);
  return t;
}

using Dense = std::vector<double>;  // n x n row-major

Dense eye(int64_t n) {
  Dense m(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) m[i * n + i] = 1.0;
  return m;
}

Dense mul(const Dense& x, const Dense& y, int64_t n) {
  Dense out(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < n; ++j) out[i * n + j] += x[i * n + k] * y[k * n + j];
  return out;
}

// The skew-symmetric block of one oft_R row (upper triangle, row-major over i < j).
Dense skew(const float* v, int64_t b) {
  Dense q(static_cast<size_t>(b * b), 0.0);
  size_t k = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = i + 1; j < b; ++j, ++k) {
      q[i * b + j] = v[k];
      q[j * b + i] = -double(v[k]);
    }
  return q;
}

// W @ M for W [out, in] (f32 values) and a dense M [in, in], in double.
std::vector<double> times(const std::vector<float>& w, const Dense& m, int64_t out, int64_t in) {
  std::vector<double> r(static_cast<size_t>(out * in), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k)
      for (int64_t j = 0; j < in; ++j) r[o * in + j] += double(w[o * in + k]) * m[k * in + j];
  return r;
}

Dense transpose(const Dense& m, int64_t n) {
  Dense t(m.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) t[j * n + i] = m[i * n + j];
  return t;
}

// Applies `t` to an f32 copy of w [out, in].
std::vector<float> applied(const std::vector<float>& w, const InputTransform& t, int64_t out, int64_t in) {
  std::vector<float> copy = w;
  const auto layout = peft::merge::layout_for(peft::merge::ModuleKind::linear, out, in);
  peft::merge::transform_input({copy.data(), peft::DType::F32, out, in}, layout, t);
  return copy;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tolerance = 1e-6) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= tolerance * scale);
}

}  // namespace

TEST_CASE("rotations: the Cayley transform (I - S)(I + S)^-1 is orthogonal, and inverse_f64 inverts") {
  const int64_t n = 5;
  auto v = random_tensor({1, n * (n - 1) / 2}, 1);
  const Dense s = skew(v.values.data(), n);
  const Dense r = peft::merge::cayley_f64(s, n, "m");
  Dense i_plus = eye(n), i_minus = eye(n);
  for (size_t k = 0; k < s.size(); ++k) {
    i_plus[k] += s[k];
    i_minus[k] -= s[k];
  }
  const Dense lhs = mul(r, i_plus, n), rtr = mul(r, transpose(r, n), n);
  for (size_t k = 0; k < lhs.size(); ++k) {
    CHECK(std::fabs(lhs[k] - i_minus[k]) <= 1e-12);
    CHECK(std::fabs(rtr[k] - (k % (n + 1) == 0 ? 1.0 : 0.0)) <= 1e-12);
  }
  const Dense inv = peft::merge::inverse_f64(i_plus, n, "m"), one = mul(inv, i_plus, n);
  for (size_t k = 0; k < one.size(); ++k) CHECK(std::fabs(one[k] - (k % (n + 1) == 0 ? 1.0 : 0.0)) <= 1e-12);
  CHECK(code_of([&] { peft::merge::inverse_f64(Dense(4, 0.0), 2, "m"); }) == PEFT_ERR_INVALID_CHECKPOINT);
}

TEST_CASE("rotations: OFT is W @ R^T with R block diagonal of Neumann series or Cayley transforms") {
  const int64_t out = 3, b = 4, blocks = 2, in = b * blocks, n = b * (b - 1) / 2;
  auto oft_r = random_tensor({blocks, n}, 2);
  auto w = random_tensor({out, in}, 3, 0.0f, 1.0f);
  for (bool neumann : {true, false}) {
    CAPTURE(neumann);
    peft::merge::OftSettings settings;
    settings.use_cayley_neumann = neumann;
    settings.num_cayley_neumann_terms = 5;
    Dense r(static_cast<size_t>(in * in), 0.0);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const Dense q = skew(oft_r.values.data() + blk * n, b);
      Dense block;
      if (neumann) {  // _cayley_batch with 5 terms: I + 2Q + 2Q^2 + 2Q^3 + Q^4
        const Dense q2 = mul(q, q, b), q3 = mul(q2, q, b), q4 = mul(q3, q, b);
        block = eye(b);
        for (size_t k = 0; k < block.size(); ++k) block[k] += 2 * q[k] + 2 * q2[k] + 2 * q3[k] + q4[k];
      } else {
        block = peft::merge::cayley_f64(q, b, "m");
      }
      for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < b; ++j) r[(blk * b + i) * in + blk * b + j] = block[i * b + j];
    }
    const InputTransform t = peft::merge::oft_transform(oft_r, settings, in, false, "m");
    const std::vector<float> merged = applied(w.values, t, out, in);
    check_close(merged, times(w.values, transpose(r, in), out, in));
    // PEFT's unmerge inverts R: back to W within f32 rounding.
    const std::vector<float> back = applied(merged, peft::merge::oft_transform(oft_r, settings, in, true, "m"), out, in);
    check_close(back, std::vector<double>(w.values.begin(), w.values.end()));
  }
}

TEST_CASE("rotations: OFT block_share repeats one block; coft projects onto the eps ball; sizes are checked") {
  const int64_t out = 2, b = 3, in = 9, n = 3;
  auto shared = random_tensor({1, n}, 4);
  auto w = random_tensor({out, in}, 5, 0.0f, 1.0f);
  peft::merge::OftSettings settings;
  settings.block_share = true;
  settings.num_cayley_neumann_terms = 2;  // I + 2Q
  const Dense q = skew(shared.values.data(), b);
  Dense r(static_cast<size_t>(in * in), 0.0);
  for (int64_t blk = 0; blk < 3; ++blk)
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < b; ++j)
        r[(blk * b + i) * in + blk * b + j] = (i == j ? 1.0 : 0.0) + 2 * q[i * b + j];
  check_close(applied(w.values, peft::merge::oft_transform(shared, settings, in, false, "m"), out, in),
              times(w.values, transpose(r, in), out, in));

  // coft: ||Q||_F > eps / sqrt(1) is scaled to eps; a Neumann series of 1 term is I (no change).
  settings.coft = true;
  settings.eps = 1e-3;
  const InputTransform t = peft::merge::oft_transform(shared, settings, in, false, "m");
  double norm = 0;
  for (double v : q) norm += v * v;
  norm = std::sqrt(norm);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < b; ++j)
      CHECK(std::fabs(t.steps[0].values[i * b + j] - ((i == j ? 1.0 : 0.0) + 2 * 1e-3 * q[i * b + j] / norm)) <= 1e-15);
  settings.num_cayley_neumann_terms = 1;
  const std::vector<float> same = applied(w.values, peft::merge::oft_transform(shared, settings, in, false, "m"), out, in);
  CHECK(same == w.values);

  auto not_triangular = random_tensor({3, 4}, 6);
  CHECK(code_of([&] { peft::merge::oft_transform(not_triangular, {}, 12, false, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
  auto too_few = random_tensor({2, 3}, 7);  // 2 blocks of 3 for 9 features
  CHECK(code_of([&] { peft::merge::oft_transform(too_few, {}, 9, false, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
  std::vector<float> conv1d(static_cast<size_t>(in * out));
  const auto transposed = peft::merge::layout_for(peft::merge::ModuleKind::conv1d_gpt2, out, in);
  CHECK(code_of([&] {
          peft::merge::transform_input({conv1d.data(), peft::DType::F32, in, out}, transposed,
                                       peft::merge::oft_transform(shared, settings, in, false, "m"));
        }) == PEFT_ERR_UNSUPPORTED);
}

TEST_CASE("rotations: HRA is W @ (I - 2 u1 u1^T)...(I - 2 ur ur^T), or I - 2 U U^T after Gram-Schmidt") {
  const int64_t out = 3, in = 6, r = 3;
  auto u = random_tensor({in, r}, 8);
  auto w = random_tensor({out, in}, 9, 0.0f, 1.0f);
  std::vector<Dense> cols(r, Dense(in));
  for (int64_t k = 0; k < r; ++k) {
    double norm = 0;
    for (int64_t i = 0; i < in; ++i) norm += double(u.values[i * r + k]) * u.values[i * r + k];
    for (int64_t i = 0; i < in; ++i) cols[k][i] = u.values[i * r + k] / std::sqrt(norm);
  }
  Dense h = eye(in);
  for (int64_t k = 0; k < r; ++k) {
    Dense reflection = eye(in);
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < in; ++j) reflection[i * in + j] -= 2 * cols[k][i] * cols[k][j];
    h = mul(h, reflection, in);
  }
  const std::vector<float> merged = applied(w.values, peft::merge::hra_transform(u, false, in, false, "m"), out, in);
  check_close(merged, times(w.values, h, out, in));
  check_close(applied(merged, peft::merge::hra_transform(u, false, in, true, "m"), out, in),
              std::vector<double>(w.values.begin(), w.values.end()));

  // Gram-Schmidt: H = I - 2 U U^T, U orthonormal, is symmetric and orthogonal.
  const InputTransform gs = peft::merge::hra_transform(u, true, in, false, "m");
  const Dense& q = gs.steps[0].values;
  for (int64_t a = 0; a < r; ++a)
    for (int64_t c = 0; c < r; ++c) {
      double dot = 0;
      for (int64_t i = 0; i < in; ++i) dot += q[a * in + i] * q[c * in + i];
      CHECK(std::fabs(dot - (a == c ? 1.0 : 0.0)) <= 1e-12);
    }
  Dense hg = eye(in);
  for (int64_t k = 0; k < r; ++k)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < in; ++j) hg[i * in + j] -= 2 * q[k * in + i] * q[k * in + j];
  const std::vector<float> merged_gs = applied(w.values, gs, out, in);
  check_close(merged_gs, times(w.values, hg, out, in));
  check_close(applied(merged_gs, peft::merge::hra_transform(u, true, in, true, "m"), out, in),
              std::vector<double>(w.values.begin(), w.values.end()));
  auto wrong = random_tensor({in + 1, r}, 10);
  CHECK(code_of([&] { peft::merge::hra_transform(wrong, false, in, false, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
}

TEST_CASE("rotations: BOFT butterfly permutations, Cayley blocks, and boft_s applied after one f32 rounding") {
  const int64_t out = 2, n = 2, d = 4, h = 2, in = d * h;
  auto boft_r = random_tensor({n, d, h, h}, 11);
  auto boft_s = random_tensor({out, 1}, 12, 1.0f, 0.1f);
  const InputTransform t = peft::merge::boft_transform(boft_r, boft_s, out, in, false, "m");
  REQUIRE(t.steps.size() == 6);
  // block_butterfly_perm(8, 4, 1, 1) is the identity (one pair per block); (8, 2, 1, 1) swaps the
  // middle of each four: PEFT's values.
  CHECK(t.steps[2].index == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(t.steps[5].index == std::vector<int64_t>{0, 2, 1, 3, 4, 6, 5, 7});

  // Dense reference: M = B_1 B_0, B_i = P_i D_i P_i^T, P[k, perm[k]] = 1; W' = (W @ M^T) * s.
  auto w = random_tensor({out, in}, 13, 0.0f, 1.0f);
  Dense m = eye(in);
  for (int64_t i = 0; i < n; ++i) {
    Dense blocks(static_cast<size_t>(in * in), 0.0), p(static_cast<size_t>(in * in), 0.0);
    for (int64_t k = 0; k < d; ++k) {
      const float* raw = boft_r.values.data() + (i * d + k) * h * h;
      Dense s(static_cast<size_t>(h * h));
      for (int64_t a = 0; a < h; ++a)
        for (int64_t c = 0; c < h; ++c) s[a * h + c] = 0.5 * (double(raw[a * h + c]) - raw[c * h + a]);
      const Dense q = peft::merge::cayley_f64(s, h, "m");
      for (int64_t a = 0; a < h; ++a)
        for (int64_t c = 0; c < h; ++c) blocks[(k * h + a) * in + k * h + c] = q[a * h + c];
    }
    for (int64_t k = 0; k < in; ++k) p[k * in + t.steps[3 * i + 2].index[k]] = 1.0;
    m = mul(mul(mul(p, blocks, in), transpose(p, in), in), m, in);
  }
  const std::vector<double> rotated = times(w.values, transpose(m, in), out, in);
  const std::vector<float> merged = applied(w.values, t, out, in);
  std::vector<double> want(rotated.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) want[o * in + j] = rotated[o * in + j] * boft_s.values[o];
  check_close(merged, want);
  // One f32 rounding, then the f32 product with boft_s (PEFT's `orig_weight * boft_s`).
  std::vector<float> unscaled = w.values;
  InputTransform no_scale = t;
  no_scale.out_scale.clear();
  unscaled = applied(unscaled, no_scale, out, in);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) CHECK(merged[o * in + j] == unscaled[o * in + j] * boft_s.values[o]);
  // PEFT's unmerge: W' @ M, then * (1 / boft_s).
  check_close(applied(merged, peft::merge::boft_transform(boft_r, boft_s, out, in, true, "m"), out, in),
              std::vector<double>(w.values.begin(), w.values.end()));
  auto bad_s = random_tensor({out + 1, 1}, 14);
  CHECK(code_of([&] { peft::merge::boft_transform(boft_r, bad_s, out, in, false, "m"); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { peft::merge::boft_transform(boft_r, boft_s, out, in + 2, false, "m"); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
}

TEST_CASE("rotations: a bf16 weight is the f32 result rounded once, and unchanged rows are not reported") {
  const int64_t out = 2, in = 4;
  auto u = random_tensor({in, 1}, 15);
  std::vector<float> wide = random_tensor({out, in}, 16, 0.0f, 1.0f).values;
  std::vector<uint16_t> half(wide.size());
  for (size_t k = 0; k < wide.size(); ++k) {
    half[k] = peft::f32_to_bf16(wide[k]);
    wide[k] = peft::bf16_to_f32(half[k]);
  }
  const InputTransform t = peft::merge::hra_transform(u, false, in, false, "m");
  const std::vector<float> merged = applied(wide, t, out, in);
  int64_t reported = 0;
  peft::merge::RowSink sink = [&](int64_t, const void*, size_t) { ++reported; };
  peft::merge::ExecOptions exec;
  exec.row_sink = &sink;
  peft::merge::transform_input({half.data(), peft::DType::BF16, out, in},
                               peft::merge::layout_for(peft::merge::ModuleKind::linear, out, in), t, exec);
  for (size_t k = 0; k < half.size(); ++k) CHECK(half[k] == peft::f32_to_bf16(merged[k]));
  CHECK(reported == out);
}
