// DoRA merge/unmerge against reference loops: the norm axis of each module kind (rows for
// Linear and Conv, columns for Conv1D and Embedding), f32/bf16/f16, the cached norm.
#include <doctest/doctest.h>

#include "core/error.hpp"
#include "test_merge_math_support.hpp"

using namespace merge_test;
namespace pm = peft::merge;

namespace {

struct DoraCase {
  const char* name;
  ModuleKind kind;
  std::vector<int64_t> weight, a, b;
};

size_t product(const std::vector<int64_t>& s) {
  size_t n = 1;
  for (auto d : s) n *= static_cast<size_t>(d);
  return n;
}

struct Reference {
  std::vector<float> norm;
  Buffer merged;
  Buffer unmerged;
};

// PEFT's DoRA: x = W + dW (f32), n = ||x|| per output channel, f = m / n, W' = f * x rounded;
// unmerge W'' = W' / f - dW rounded.
Reference reference_dora(const DoraCase& c, const Buffer& w, const std::vector<float>& d, const std::vector<float>& m,
                         const std::vector<float>* given_norm = nullptr) {
  const pm::DeltaLayout l = pm::layout_for(c.kind, c.weight, c.a, c.b);
  const int64_t rows = l.rows(), cols = l.cols();
  auto channel = [&](int64_t i, int64_t j) { return l.transposed ? j : i; };
  std::vector<double> sums(static_cast<size_t>(l.out), 0.0);
  std::vector<float> x(w.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t e = static_cast<size_t>(i * cols + j);
      x[e] = w.get(e) + d[e];
      sums[static_cast<size_t>(channel(i, j))] += double(x[e]) * double(x[e]);
    }
  Reference ref{{}, w, w};
  for (double s : sums) ref.norm.push_back(static_cast<float>(std::sqrt(s)));
  const std::vector<float>& n = given_norm ? *given_norm : ref.norm;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t e = static_cast<size_t>(i * cols + j);
      const size_t ch = static_cast<size_t>(channel(i, j));
      const float f = m[ch] / n[ch];
      ref.merged.set(e, f * x[e]);
      ref.unmerged.set(e, ref.merged.get(e) / f - d[e]);
    }
  return ref;
}

std::vector<float> positive_magnitude(int64_t n, uint32_t seed) {
  auto v = random_floats(static_cast<size_t>(n), seed);
  for (auto& x : v) x = 0.5f + std::fabs(x);
  return v;
}

}  // namespace

TEST_CASE("merge math: DoRA merge and unmerge match the reference for every kind and dtype") {
  const int64_t r = 6;
  const std::vector<DoraCase> cases{
      {"linear", ModuleKind::linear, {41, 77}, {r, 77}, {41, r}},
      {"conv1d_gpt2", ModuleKind::conv1d_gpt2, {77, 41}, {r, 77}, {41, r}},
      {"embedding", ModuleKind::embedding, {150, 23}, {r, 150}, {23, r}},
      {"conv2d 3x3", ModuleKind::conv, {12, 5, 3, 3}, {r, 5, 3, 3}, {12, r, 1, 1}},
      {"conv2d 1x1", ModuleKind::conv, {12, 9, 1, 1}, {r, 9, 1, 1}, {12, r, 1, 1}},
      {"conv1d", ModuleKind::conv, {7, 4, 5}, {r, 4, 5}, {7, r, 1}},
  };
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (const auto& c : cases) {
      CAPTURE(c.name);
      CAPTURE(peft::dtype_name(dtype));
      const pm::DeltaLayout l = pm::layout_for(c.kind, c.weight, c.a, c.b);
      std::vector<Term> terms{random_term(r, product(c.a), product(c.b), 0.9, 201)};
      const pm::LoraFactors f = terms[0].factors();
      const auto m = positive_magnitude(l.out, 202);
      const Buffer w0 = random_buffer(dtype, product(c.weight), 203);
      const auto d = reference_delta(c.kind, c.weight, terms);
      const Reference ref = reference_dora(c, w0, d, m);

      CHECK(pm::dora_weight_norm(pm::ConstWeightView{w0.bytes.data(), dtype, l.rows(), l.cols()}, l, {&f, 1}) == ref.norm);
      Buffer w = w0;
      const std::vector<float> norm = pm::dora_merge(w.view(l.rows(), l.cols()), l, {&f, 1}, m.data());
      CHECK(norm == ref.norm);
      CHECK(same_bytes(w, ref.merged));
      pm::dora_unmerge(w.view(l.rows(), l.cols()), l, {&f, 1}, m.data(), norm.data());
      CHECK(same_bytes(w, ref.unmerged));
      // Unmerge is approximate in 16 bits, essentially exact in f32.
      size_t off = count_different(w, w0);
      if (dtype == DType::F32) {
        for (size_t i = 0; i < w.size(); ++i) CHECK(std::fabs(w.get(i) - w0.get(i)) <= 1e-5f * (1 + std::fabs(w0.get(i))));
      } else {
        CHECK(off < w.size() / 2);
      }
      // With threads the result is the same.
      Buffer w2 = w0;
      pm::ExecOptions exec;
      exec.threads = 3;
      pm::dora_merge(w2.view(l.rows(), l.cols()), l, {&f, 1}, m.data(), nullptr, exec);
      CHECK(same_bytes(w2, ref.merged));
    }
  }
}

TEST_CASE("merge math: DoRA takes the norm from the unmerged base when one is given") {
  // PEFT computes the norm from the weight with earlier merges taken out; a pipeline that merged
  // something before passes that norm explicitly.
  const int64_t out = 19, in = 300, r = 4;
  const DoraCase c{"linear", ModuleKind::linear, {out, in}, {r, in}, {out, r}};
  const pm::DeltaLayout l = pm::layout_for(c.kind, c.weight, c.a, c.b);
  std::vector<Term> terms{random_term(r, r * in, out * r, 0.5, 301)};
  const pm::LoraFactors f = terms[0].factors();
  const auto m = positive_magnitude(out, 302);
  const Buffer base = random_buffer(DType::BF16, out * in, 303);
  const Buffer current = random_buffer(DType::BF16, out * in, 304);
  const auto norm = pm::dora_weight_norm(pm::ConstWeightView{base.bytes.data(), DType::BF16, out, in}, l, {&f, 1});
  const auto d = reference_delta(c.kind, c.weight, terms);
  const Reference ref = reference_dora(c, current, d, m, &norm);
  Buffer w = current;
  const auto used = pm::dora_merge(w.view(out, in), l, {&f, 1}, m.data(), norm.data());
  CHECK(used == norm);
  CHECK(same_bytes(w, ref.merged));
}

TEST_CASE("merge math: DoRA for large transposed weights is independent of threads") {
  const int64_t out = 700, in = 900, r = 8;  // Conv1D storage [in, out]: column norms over 900 rows
  const pm::DeltaLayout l = pm::layout_for(ModuleKind::conv1d_gpt2, out, in);
  Term t = random_term(r, r * in, out * r, 0.25, 401);
  const pm::LoraFactors f = t.factors();
  const auto m = positive_magnitude(out, 402);
  const Buffer w0 = random_buffer(DType::BF16, out * in, 403);
  Buffer one = w0;
  pm::ExecOptions single;
  single.threads = 1;
  const auto n1 = pm::dora_merge(one.view(in, out), l, {&f, 1}, m.data(), nullptr, single);
  for (unsigned threads : {2u, 5u}) {
    Buffer w = w0;
    pm::ExecOptions exec;
    exec.threads = threads;
    CHECK(pm::dora_merge(w.view(in, out), l, {&f, 1}, m.data(), nullptr, exec) == n1);
    CHECK(same_bytes(w, one));
  }
}

TEST_CASE("merge math: DoRA argument errors") {
  const int64_t out = 4, in = 4, r = 1;
  const pm::DeltaLayout l = pm::layout_for(ModuleKind::linear, out, in);
  Term t = random_term(r, r * in, out * r, 1.0, 501);
  const pm::LoraFactors f = t.factors();
  Buffer w = random_buffer(DType::F32, out * in, 502);
  const auto m = positive_magnitude(out, 503);
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const peft::Error& e) {
      return e.code();
    }
    return 0;
  };
  CHECK(code_of([&] { pm::dora_merge(w.view(out, in), l, {&f, 1}, nullptr); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { pm::dora_unmerge(w.view(out, in), l, {&f, 1}, m.data(), nullptr); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { pm::dora_merge(w.view(2, 8), l, {&f, 1}, m.data()); }) == PEFT_ERR_SHAPE_MISMATCH);
}
