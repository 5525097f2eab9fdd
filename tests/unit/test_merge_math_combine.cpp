// add_weighted_adapter's combinations ("cat", "linear", the pruning types, the SVD types) against
// reference loops, and the kernel tables (AVX-512, AVX2, portable) against each other.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "core/error.hpp"
#include "peft/kernels/merge_kernels.hpp"
#include "peft/kernels/truncated_svd.hpp"
#include "test_merge_math_support.hpp"

using namespace merge_test;
namespace pm = peft::merge;

TEST_CASE("merge math: combine cat concatenates w*s*A rows and B columns") {
  const int64_t out = 13, in = 21;
  std::vector<Term> t{random_term(3, 3 * in, out * 3, 0, 601), random_term(5, 5 * in, out * 5, 0, 602)};
  const double w[2] = {0.7, -1.3}, s[2] = {2.0, 16.0 / 5.0};
  std::vector<pm::WeightedFactors> in_f{{t[0].a.data(), t[0].b.data(), 3, s[0], w[0]},
                                        {t[1].a.data(), t[1].b.data(), 5, s[1], w[1]}};
  const pm::CombinedFactors c = pm::combine_cat(in_f, out, in);
  REQUIRE(c.rank == 8);
  REQUIRE(c.a.size() == static_cast<size_t>(8 * in));
  REQUIRE(c.b.size() == static_cast<size_t>(out * 8));
  int64_t offset = 0;
  for (int i = 0; i < 2; ++i) {
    const int64_t r = t[static_cast<size_t>(i)].rank;
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < in; ++j) {
        const float weighted = t[static_cast<size_t>(i)].a[static_cast<size_t>(k * in + j)] * static_cast<float>(w[i]);
        CHECK(c.a[static_cast<size_t>((offset + k) * in + j)] == weighted * static_cast<float>(s[i]));
      }
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k)
        CHECK(c.b[static_cast<size_t>(o * 8 + offset + k)] == t[static_cast<size_t>(i)].b[static_cast<size_t>(o * r + k)]);
    offset += r;
  }
  // The combined adapter (scaling 1) reproduces sum_i w_i s_i B_i A_i.
  std::vector<Term> weighted{t[0], t[1]};
  weighted[0].coefficient = w[0] * s[0];
  weighted[1].coefficient = w[1] * s[1];
  const auto exact = exact_delta_linear(out, in, weighted);
  const pm::LoraFactors cf{c.a.data(), c.b.data(), c.rank, 1.0};
  const auto got = pm::compute_delta(pm::layout_for(pm::ModuleKind::linear, out, in), {&cf, 1});
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - exact[i]) <= 1e-5 * (1 + std::fabs(exact[i])));
}

TEST_CASE("merge math: combine linear sums sqrt-weighted factors, sign on A") {
  const int64_t out = 9, in = 14, r = 4;
  std::vector<Term> t{random_term(r, r * in, out * r, 0, 701), random_term(r, r * in, out * r, 0, 702),
                      random_term(r, r * in, out * r, 0, 703)};
  const double w[3] = {0.5, -2.0, 1.0}, s[3] = {2.0, 0.75, 8.0 / std::sqrt(4.0)};
  std::vector<pm::WeightedFactors> in_f;
  for (int i = 0; i < 3; ++i) in_f.push_back({t[static_cast<size_t>(i)].a.data(), t[static_cast<size_t>(i)].b.data(), r, s[i], w[i]});
  const pm::CombinedFactors c = pm::combine_linear(in_f, out, in);
  REQUIRE(c.rank == r);
  for (size_t e = 0; e < c.a.size(); ++e) {
    float acc_a = 0.0f;
    for (int i = 0; i < 3; ++i) {
      const double cw = w[i] * s[i];
      const float wa = static_cast<float>(cw >= 0 ? std::sqrt(std::fabs(cw)) : -std::sqrt(std::fabs(cw)));
      const float term = t[static_cast<size_t>(i)].a[e] * wa;
      acc_a = acc_a + term;
    }
    CHECK(c.a[e] == acc_a);
  }
  for (size_t e = 0; e < c.b.size(); ++e) {
    float acc_b = 0.0f;
    for (int i = 0; i < 3; ++i) {
      const float wb = static_cast<float>(std::sqrt(std::fabs(w[i] * s[i])));
      const float term = t[static_cast<size_t>(i)].b[e] * wb;
      acc_b = acc_b + term;
    }
    CHECK(c.b[e] == acc_b);
  }
  // A single adapter is exact: B'A' = w s B A (up to f32 rounding of the square roots).
  const pm::CombinedFactors one = pm::combine_linear({in_f.data() + 1, 1}, out, in);
  std::vector<Term> weighted{t[1]};
  weighted[0].coefficient = w[1] * s[1];
  const auto exact = exact_delta_linear(out, in, weighted);
  const pm::LoraFactors cf{one.a.data(), one.b.data(), r, 1.0};
  const auto got = pm::compute_delta(pm::layout_for(pm::ModuleKind::linear, out, in), {&cf, 1});
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - exact[i]) <= 1e-5 * (1 + std::fabs(exact[i])));

  // Unequal ranks are refused, as PEFT does.
  Term other = random_term(2, 2 * in, out * 2, 0, 704);
  std::vector<pm::WeightedFactors> mixed{in_f[0], {other.a.data(), other.b.data(), 2, 1.0, 1.0}};
  try {
    pm::combine_linear(mixed, out, in);
    FAIL("expected an error");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_INVALID_ARGUMENT);
  }
  try {
    pm::combine_cat({}, out, in);
    FAIL("expected an error");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_INVALID_ARGUMENT);
  }
}

TEST_CASE("merge math: ties, magnitude_prune and dare on factors, by hand") {
  // Two rank-1 adapters on a 1x4 layer; scaling 1, weights 4 and 1: A weights sqrt 2 and 1, B 2 and 1.
  const float a0[4] = {1.0f, -3.0f, 0.5f, 2.0f}, a1[4] = {-2.0f, 1.0f, 0.25f, -4.0f};
  const float b0[1] = {1.0f}, b1[1] = {-1.0f};
  const std::vector<pm::WeightedFactors> f{{a0, b0, 1, 1.0, 4.0}, {a1, b1, 1, 1.0, 1.0}};
  pm::TaskSettings s;
  s.how = pm::TaskArithmetic::magnitude_prune;
  s.density = 0.5;  // keeps 2 of 4 values of each A; of each 1-value B keeps int(0.5) = 0
  pm::CombinedFactors c = pm::combine_task_arithmetic(f, 1, 4, s);
  const float w0 = static_cast<float>(std::sqrt(4.0));
  // pruned A0 = {0, -3, 0, 2}, A1 = {-2, 0, 0, -4}
  CHECK(c.a == std::vector<float>{-2.0f, -3.0f * w0, 0.0f, 2.0f * w0 + -4.0f});
  CHECK(c.b == std::vector<float>{0.0f});
  // ties, total: pruned A0 = {0,-3,0,2}, A1 = {-2,0,0,-4}; sums {-2,-3,0,-2} elect {-,-,+,-}.
  s.how = pm::TaskArithmetic::ties;
  c = pm::combine_task_arithmetic(f, 1, 4, s);
  CHECK(c.a == std::vector<float>{-2.0f, -3.0f * w0, 0.0f, -4.0f});
  // frequency: signs {-1,-1,0,0} elect {-,-,+,+}; the last has only A0's +2 (weighted) agreeing.
  s.sign = pm::MajoritySign::frequency;
  c = pm::combine_task_arithmetic(f, 1, 4, s);
  CHECK(c.a == std::vector<float>{-2.0f, -3.0f * w0, 0.0f, 2.0f * w0});
  // density 1 prunes nothing: ties elects over the whole factors; the mean of the agreeing values.
  s.density = 1.0;
  s.sign = pm::MajoritySign::total;
  c = pm::combine_task_arithmetic(f, 1, 4, s);
  CHECK(c.a[2] == (0.5f * w0 + 0.25f) / 2.0f);
  CHECK(c.b == std::vector<float>{2.0f});  // B: 1 + -1 = 0 elects +, so B0's weighted 1*2 alone
  // dare_linear: a value is kept iff dare_keep says so, and divided by float(density).
  s.how = pm::TaskArithmetic::dare_linear;
  s.density = 0.5;
  s.seed = 42;
  s.stream = "m";
  c = pm::combine_task_arithmetic(f, 1, 4, s);
  for (size_t e = 0; e < 4; ++e) {
    const float p0 = pm::dare_keep(42, "m", 0, 0, e, 0.5) ? a0[e] / 0.5f : 0.0f;
    const float p1 = pm::dare_keep(42, "m", 1, 0, e, 0.5) ? a1[e] / 0.5f : 0.0f;
    CHECK(c.a[e] == (0.0f + p0 * w0) + p1 * 1.0f);
  }
  // The draw: the first 32 decisions of the formula the header documents, computed by a separate Python
  // implementation of it (fixed here: a change of the generator changes every published combination).
  const char* expected = "10011011001100110010011100000000";
  for (uint64_t e = 0; e < 32; ++e)
    CHECK(pm::dare_keep(7, "model.layers.0.q_proj", 1, 1, e, 0.5) == (expected[e] == '1'));
  int kept = 0;
  for (uint64_t e = 0; e < 100000; ++e) kept += pm::dare_keep(7, "model.layers.0.q_proj", 1, 1, e, 0.3) ? 1 : 0;
  CHECK(std::abs(kept - 30000) < 4 * 145);  // sd = sqrt(1e5 * 0.3 * 0.7) = 145
  for (const double bad : {-0.5, std::nan("")}) {
    s.density = bad;
    CHECK_THROWS_AS(pm::combine_task_arithmetic(f, 1, 4, s), peft::Error);
  }
}

namespace {

// The merge kernels' tables this machine can run: portable, then avx2 and avx512 where present.
std::vector<const pm::kernels::Table*> kernel_tables() {
  namespace k = pm::kernels;
  std::vector<const k::Table*> tables{&k::portable()};
  if (k::x86_avx2()) tables.push_back(k::x86_avx2());
  if (k::x86_avx512()) tables.push_back(k::x86_avx512());
  return tables;
}

}  // namespace

TEST_CASE("merge math: every kernel table gives the same bits") {
  namespace k = pm::kernels;
  const std::vector<const k::Table*> tables = kernel_tables();
  MESSAGE("kernel tables available: " << tables.size() << ", active: " << std::string(k::active().name));
  const int64_t rows = 11, cols = 203, rank = 7;
  const auto L = random_floats(static_cast<size_t>(rows * rank), 801);
  const auto R = random_floats(static_cast<size_t>(rank * cols), 802);
  auto d = random_floats(static_cast<size_t>(cols), 803, 0.1f);
  // Specials: NaN, infinities, values that overflow f16/bf16, results in the f16 subnormal range.
  const float specials[] = {std::nanf(""), -std::nanf(""), INFINITY, -INFINITY, 70000.0f, 3.4e38f,
                            1e-6f, -3e-8f, 6.1e-5f, 0.0f, -0.0f};
  for (size_t i = 0; i < std::size(specials); ++i) d[i * 13] = specials[i];
  const auto f = random_floats(static_cast<size_t>(cols), 804);
  auto run = [&](const k::Table& t) {
    std::vector<float> c(static_cast<size_t>(rows * cols));
    t.lowrank(L.data(), R.data(), rows, cols, rank, 0.37f, false, c.data());
    t.lowrank(L.data(), R.data(), rows, cols, rank, -1.5f, true, c.data());
    std::vector<std::vector<unsigned char>> out;
    out.emplace_back(reinterpret_cast<unsigned char*>(c.data()), reinterpret_cast<unsigned char*>(c.data() + c.size()));
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      const k::Storage s = dt == DType::F32 ? k::Storage::f32 : dt == DType::BF16 ? k::Storage::bf16 : k::Storage::f16;
      Buffer w = random_buffer(dt, static_cast<size_t>(cols), 805);
      for (size_t i = 0; i < 16; ++i) w.set(i * 11 + 5, i % 2 ? 1e-7f * static_cast<float>(i) : 60000.0f);
      const double sq = t.sum_squares(s, w.bytes.data(), d.data(), cols);
      std::vector<double> acc(static_cast<size_t>(cols), 1.0);
      t.accumulate_squares(s, w.bytes.data(), d.data(), acc.data(), cols);
      t.add_rounded(s, w.bytes.data(), w.bytes.data(), d.data(), cols);
      t.dora_apply(s, w.bytes.data(), d.data(), f.data(), 1, cols);
      t.dora_apply(s, w.bytes.data(), d.data(), f.data() + 3, 0, cols);
      t.dora_remove(s, w.bytes.data(), d.data(), f.data(), 1, cols);
      t.dora_remove(s, w.bytes.data(), d.data(), f.data() + 5, 0, cols);
      // Bits must agree except inside NaNs, whose payload and sign depend on operand order.
      std::vector<unsigned char> bytes = w.bytes;
      for (size_t i = 0; i < w.size(); ++i)
        if (std::isnan(w.get(i))) std::memset(bytes.data() + i * dtype_bytes(dt), 0xAA, dtype_bytes(dt));
      out.push_back(bytes);
      acc.push_back(sq);
      for (double& x : acc)
        if (std::isnan(x)) x = 12345.0;
      out.emplace_back(reinterpret_cast<unsigned char*>(acc.data()), reinterpret_cast<unsigned char*>(acc.data() + acc.size()));
    }
    return out;
  };
  const auto want = run(*tables[0]);
  for (size_t i = 1; i < tables.size(); ++i) {
    CAPTURE(std::string(tables[i]->name));
    const auto got = run(*tables[i]);
    REQUIRE(got.size() == want.size());
    for (size_t part = 0; part < got.size(); ++part) {
      CAPTURE(part);  // 0: lowrank; then per dtype F32, BF16, F16: weight bytes, squares
      CHECK(got[part] == want[part]);
    }
  }
  // And the portable table agrees with the reference loop of the library's contract.
  std::vector<float> c(static_cast<size_t>(rows * cols));
  k::portable().lowrank(L.data(), R.data(), rows, cols, rank, 0.37f, false, c.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int64_t q = 0; q < rank; ++q) acc = std::fma(L[static_cast<size_t>(i * rank + q)], R[static_cast<size_t>(q * cols + j)], acc);
      CHECK(c[static_cast<size_t>(i * cols + j)] == 0.37f * acc);
    }
}

namespace {

// `bytes` bytes at `offset` bytes past a 64-byte boundary, with guard bytes on both sides.
struct GuardedBytes {
  static constexpr unsigned char kGuard = 0x5C;
  GuardedBytes(size_t bytes, size_t offset) : arena(bytes + 256, kGuard), size(bytes) {
    const uintptr_t aligned = (reinterpret_cast<uintptr_t>(arena.data()) + 63) / 64 * 64;
    data = reinterpret_cast<unsigned char*>(aligned) + 64 + offset;
  }
  // Whether every byte outside [data, data + size) still holds the guard.
  bool guards_intact() const {
    for (const unsigned char* p = arena.data(); p < data; ++p)
      if (*p != kGuard) return false;
    for (const unsigned char* p = data + size; p < arena.data() + arena.size(); ++p)
      if (*p != kGuard) return false;
    return true;
  }
  std::vector<unsigned char> arena;
  size_t size;
  unsigned char* data;
};

}  // namespace

TEST_CASE("merge math: add_rounded from another buffer writes the bits of the add in place") {
  // The x86 tables stream whole cache lines when `from` is another buffer: the destination's offset
  // decides where the lines start (first chunk short), the length where the plain tail begins.
  namespace k = pm::kernels;
  const std::vector<const k::Table*> tables = kernel_tables();
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (int64_t n : {1, 15, 31, 256, 257, 700, 1029})
      for (size_t offset : {0, 1, 2, 6, 30, 33}) {  // elements from a 64-byte boundary
        CAPTURE(dtype_name(dt));
        CAPTURE(n);
        CAPTURE(offset);
        const k::Storage s = dt == DType::F32 ? k::Storage::f32 : dt == DType::BF16 ? k::Storage::bf16 : k::Storage::f16;
        const size_t esize = dtype_bytes(dt), bytes = static_cast<size_t>(n) * esize;
        const Buffer original = random_buffer(dt, static_cast<size_t>(n), 811 + static_cast<uint32_t>(n));
        auto d = random_floats(static_cast<size_t>(n), 812, 0.1f);
        d[0] = 70000.0f;  // infinite in f16
        for (const k::Table* t : tables) {
          CAPTURE(t->name);
          std::vector<unsigned char> in_place = original.bytes;
          const bool in_place_bad = t->add_rounded(s, in_place.data(), in_place.data(), d.data(), n);
          GuardedBytes out(bytes, offset * esize);
          unsigned char* w = out.data;
          const std::vector<unsigned char> from = original.bytes;
          const bool bad = t->add_rounded(s, w, from.data(), d.data(), n);
          CHECK(bad == in_place_bad);
          CHECK(bad == (dt == DType::F16));
          CHECK(std::memcmp(w, in_place.data(), bytes) == 0);
          CHECK(from == original.bytes);
          CHECK(out.guards_intact());
        }
      }
}

TEST_CASE("merge math: every kernel table's copy writes exactly the bytes of memcpy") {
  namespace k = pm::kernels;
  const std::vector<const k::Table*> tables = kernel_tables();
  std::vector<unsigned char> from(5000);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<unsigned char>(i * 131 + 7);
  for (const k::Table* t : tables)
    for (size_t bytes : {0, 1, 31, 63, 64, 65, 200, 4097})
      for (size_t to_offset : {0, 1, 17, 32, 63})
        for (size_t from_offset : {0, 3}) {
          CAPTURE(t->name);
          CAPTURE(bytes);
          CAPTURE(to_offset);
          CAPTURE(from_offset);
          GuardedBytes to(bytes, to_offset);
          t->copy(to.data, from.data() + from_offset, bytes);
          CHECK(std::memcmp(to.data, from.data() + from_offset, bytes) == 0);
          CHECK(to.guards_intact());
        }
}

TEST_CASE("merge math: every kernel table reports a non-finite write in the add that makes it") {
  namespace k = pm::kernels;
  const std::vector<const k::Table*> tables = kernel_tables();
  // Sums just below and at the point where each dtype rounds to an infinity, and NaN.
  const float sums[] = {1.0f, 65519.0f, 65520.0f, 0x1.FEFFFEp127f, 0x1.FFp127f, 3.4028234e38f, INFINITY, std::nanf("")};
  for (const k::Table* t : tables)
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (float sum : sums)
        for (float sign : {1.0f, -1.0f})
          for (int64_t at : {0, 7, 300}) {
            CAPTURE(t->name);
            CAPTURE(dtype_name(dt));
            CAPTURE(sum);
            const k::Storage s = dt == DType::F32 ? k::Storage::f32 : dt == DType::BF16 ? k::Storage::bf16 : k::Storage::f16;
            for (bool dora : {false, true}) {
              Buffer w(dt, 301);  // zeros
              std::vector<float> d(301, 0.25f);
              d[static_cast<size_t>(at)] = sign * sum;
              const float one = 1.0f;
              const bool reported = dora ? t->dora_apply(s, w.bytes.data(), d.data(), &one, 0, 301)
                                         : t->add_rounded(s, w.bytes.data(), w.bytes.data(), d.data(), 301);
              bool written = false;
              for (size_t i = 0; i < w.size(); ++i) written |= !std::isfinite(w.get(i));
              CHECK(reported == written);
            }
          }
}

namespace {

// B @ A of combined factors, in f64, as [out, in].
std::vector<double> product_of(const pm::CombinedFactors& c) {
  std::vector<double> p(static_cast<size_t>(c.out * c.in), 0.0);
  for (int64_t o = 0; o < c.out; ++o)
    for (int64_t k = 0; k < c.rank; ++k)
      for (int64_t i = 0; i < c.in; ++i)
        p[static_cast<size_t>(o * c.in + i)] +=
            double(c.b[static_cast<size_t>(o * c.rank + k)]) * double(c.a[static_cast<size_t>(k * c.in + i)]);
  return p;
}

double frobenius(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

double distance(const std::vector<double>& x, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += (x[i] - y[i]) * (x[i] - y[i]);
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("merge math: the SVD combinations factor the weighted sum of the deltas") {
  const int64_t out = 13, in = 21;
  std::vector<Term> t{random_term(2, 2 * in, out * 2, 0, 701), random_term(3, 3 * in, out * 3, 0, 702)};
  const double w[2] = {0.7, -1.3}, s[2] = {2.0, 0.5};
  const std::vector<pm::WeightedFactors> f{{t[0].a.data(), t[0].b.data(), 2, s[0], w[0]},
                                           {t[1].a.data(), t[1].b.data(), 3, s[1], w[1]}};
  std::vector<Term> weighted{t[0], t[1]};
  weighted[0].coefficient = w[0] * s[0];
  weighted[1].coefficient = w[1] * s[1];
  const std::vector<double> exact = exact_delta_linear(out, in, weighted);
  pm::TaskSettings settings;
  settings.stream = "m";
  const pm::DeltaLayout linear = pm::layout_for(pm::ModuleKind::linear, out, in);

  // Rank 5 holds the sum of a rank-2 and a rank-3 delta: exact up to f32 rounding.
  const pm::CombinedFactors full = pm::combine_svd(f, linear, settings, 5, std::nullopt);
  REQUIRE(full.rank == 5);
  CHECK(distance(product_of(full), exact) <= 1e-5 * frobenius(exact));
  // One sign per component: the largest magnitude of each column of B is positive.
  for (int64_t k = 0; k < full.rank; ++k) {
    float largest = 0.0f;
    for (int64_t o = 0; o < out; ++o) {
      const float v = full.b[static_cast<size_t>(o * full.rank + k)];
      if (std::fabs(v) > std::fabs(largest)) largest = v;
    }
    CHECK(largest > 0.0f);
  }
  // The storage order of the deltas (Conv1D, embeddings) does not change the factors.
  const pm::CombinedFactors from_transposed =
      pm::combine_svd(f, pm::layout_for(pm::ModuleKind::conv1d_gpt2, out, in), settings, 5, std::nullopt);
  CHECK(from_transposed.a == full.a);
  CHECK(from_transposed.b == full.b);

  // Rank 2: the best rank-2 approximation, an orthogonal projection: ||D||^2 = ||BA||^2 + ||D - BA||^2.
  const pm::CombinedFactors two = pm::combine_svd(f, linear, settings, 2, std::nullopt);
  const std::vector<double> p2 = product_of(two);
  const double lhs = frobenius(exact) * frobenius(exact);
  const double rhs = frobenius(p2) * frobenius(p2) + distance(p2, exact) * distance(p2, exact);
  CHECK(std::fabs(lhs - rhs) <= 1e-5 * lhs);
  CHECK(distance(p2, exact) > 1e-3 * frobenius(exact));  // rank 2 does lose something here

  // A rank above min(out, in): the full-rank factors, zero-padded.
  const pm::CombinedFactors padded = pm::combine_svd(f, pm::layout_for(pm::ModuleKind::linear, 3, in), settings, 5,
                                                     std::nullopt);
  REQUIRE(padded.rank == 5);
  for (int64_t k = 3; k < 5; ++k) {
    for (int64_t i = 0; i < in; ++i) CHECK(padded.a[static_cast<size_t>(k * in + i)] == 0.0f);
    for (int64_t o = 0; o < 3; ++o) CHECK(padded.b[static_cast<size_t>(o * 5 + k)] == 0.0f);
  }

  // The clamp: hi = the 0.9-quantile (linear interpolation) of B's and A's values; all within [-hi, hi],
  // the others unchanged.
  const pm::CombinedFactors clamped = pm::combine_svd(f, linear, settings, 5, 0.9);
  std::vector<float> values(full.b);
  values.insert(values.end(), full.a.begin(), full.a.end());
  std::sort(values.begin(), values.end());
  const double position = double(0.9f) * static_cast<double>(values.size() - 1);  // torch: q in f32
  const auto below = static_cast<size_t>(position);
  const double hi = values[below] + (position - static_cast<double>(below)) * (values[below + 1] - values[below]);
  size_t changed = 0;
  for (const auto& [got, was] : {std::pair{&clamped.a, &full.a}, std::pair{&clamped.b, &full.b}})
    for (size_t i = 0; i < got->size(); ++i) {
      const float x = (*was)[i];
      if (std::fabs(x) <= hi * (1 - 1e-6)) {
        CHECK((*got)[i] == x);
      } else {
        CHECK(std::fabs(std::fabs((*got)[i]) - hi) <= 1e-6 * hi);
        ++changed;
      }
    }
  CHECK(changed > 0);
  CHECK_THROWS_AS(pm::combine_svd(f, linear, settings, 5, 1.5), peft::Error);
  CHECK_THROWS_AS(pm::combine_svd(f, linear, settings, 0, std::nullopt), peft::Error);
}

TEST_CASE("merge math: the pruning SVD types prune the deltas, not the factors") {
  const int64_t out = 6, in = 9;
  std::vector<Term> t{random_term(2, 2 * in, out * 2, 0, 711), random_term(2, 2 * in, out * 2, 0, 712)};
  const double w[2] = {1.5, -0.5}, s[2] = {1.0, 2.0};
  const std::vector<pm::WeightedFactors> f{{t[0].a.data(), t[0].b.data(), 2, s[0], w[0]},
                                           {t[1].a.data(), t[1].b.data(), 2, s[1], w[1]}};
  const pm::DeltaLayout layout = pm::layout_for(pm::ModuleKind::linear, out, in);
  const size_t n = static_cast<size_t>(out * in);
  std::vector<std::vector<float>> deltas;
  for (int i = 0; i < 2; ++i) {
    const pm::LoraFactors term{t[static_cast<size_t>(i)].a.data(), t[static_cast<size_t>(i)].b.data(), 2, s[i]};
    deltas.push_back(pm::compute_delta(layout, std::span<const pm::LoraFactors>(&term, 1)));
  }
  pm::TaskSettings settings;
  settings.stream = "model.layers.0.q_proj";
  settings.seed = 99;
  settings.density = 0.4;
  for (const pm::TaskArithmetic how : {pm::TaskArithmetic::magnitude_prune, pm::TaskArithmetic::dare_linear}) {
    settings.how = how;
    // The expected sum, pruned by hand: the int(0.4 n) largest magnitudes, or DARE's masks (factor 2).
    std::vector<double> expected(n, 0.0);
    for (size_t i = 0; i < 2; ++i) {
      const std::vector<float>& d = deltas[i];
      std::vector<float> magnitudes;
      for (float v : d) magnitudes.push_back(std::fabs(v));
      std::sort(magnitudes.begin(), magnitudes.end(), std::greater<>());
      const float threshold = magnitudes[static_cast<size_t>(0.4 * static_cast<double>(n)) - 1];
      for (size_t e = 0; e < n; ++e) {
        const bool kept = how == pm::TaskArithmetic::magnitude_prune ? std::fabs(d[e]) >= threshold
                                                                     : pm::dare_keep(99, settings.stream, i, 2, e, 0.4);
        const double value = how == pm::TaskArithmetic::magnitude_prune ? d[e] : d[e] / 0.4f;
        if (kept) expected[e] += static_cast<double>(static_cast<float>(w[i])) * value;
      }
    }
    const pm::CombinedFactors c = pm::combine_svd(f, layout, settings, std::min(out, in), std::nullopt);
    CHECK(distance(product_of(c), expected) <= 1e-5 * frobenius(expected));
  }
}

TEST_CASE("merge math: combining in slices gives combine_task_tensors' values bit for bit") {
  // Three tensors of 1000 values with many equal magnitudes (the top-k cut falls inside a run of
  // equal keys that crosses slice boundaries), -0 and a value of every sign.
  const size_t n = 1000;
  std::vector<std::vector<float>> t(3, std::vector<float>(n));
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = 0; j < n; ++j) {
      const int v = static_cast<int>((j * (7 + 2 * i) + 3 * i) % 11) - 5;
      t[i][j] = v == 0 && j % 2 ? -0.0f : 0.125f * static_cast<float>(v);
    }
  const std::vector<const float*> ptrs = {t[0].data(), t[1].data(), t[2].data()};
  const std::vector<float> w = {0.7f, -1.3f, 0.4f};
  using peft::merge::TaskArithmetic;
  for (TaskArithmetic how : {TaskArithmetic::linear, TaskArithmetic::ties, TaskArithmetic::dare_linear,
                             TaskArithmetic::dare_ties, TaskArithmetic::magnitude_prune}) {
    for (double density : {0.0, 0.33, 0.5, 0.9, 1.0}) {
      peft::merge::TaskSettings s;
      s.how = how;
      s.density = density;
      s.seed = 9;
      s.stream = "layer";
      const std::vector<float> whole = peft::merge::combine_task_tensors(ptrs, w, n, s, 2);
      for (size_t slice : {size_t{1}, size_t{7}, size_t{64}, size_t{999}, size_t{4096}}) {
        CAPTURE(static_cast<int>(how));
        CAPTURE(density);
        CAPTURE(slice);
        std::vector<float> sliced;
        size_t reads = 0;
        peft::merge::combine_task_slices(
            3, w, n, s, 2, slice,
            [&](size_t i, uint64_t offset, size_t count, float* out) {
              ++reads;
              std::copy_n(t[i].data() + offset, count, out);
            },
            [&](uint64_t offset, const float* values, size_t count) {
              CHECK(offset == sliced.size());
              sliced.insert(sliced.end(), values, values + count);
            });
        REQUIRE(sliced.size() == n);
        CHECK(std::memcmp(sliced.data(), whole.data(), n * sizeof(float)) == 0);
        // Magnitude pruning reads every tensor twice more for its cut (density 0 keeps nothing: no cut to find).
        const bool cut = (how == TaskArithmetic::ties || how == TaskArithmetic::magnitude_prune) && density > 0.0 &&
                         density < 1.0;
        const size_t passes = cut ? 3 : 1;
        CHECK(reads == passes * 3 * ((n + slice - 1) / slice));
      }
    }
  }
}

TEST_CASE("merge math: the magnitude cut keeps int(density * n) values, the lower index first among equals") {
  const std::vector<float> t = {1.0f, -3.0f, 3.0f, 2.0f, -3.0f, 0.0f, 3.0f, -0.0f};
  auto cut_of = [&](double density) {
    return peft::merge::magnitude_cut(t.size(), density, [&](const peft::merge::SliceVisitor& visit) {
      visit(t.data(), 3);
      visit(t.data() + 3, t.size() - 3);
    });
  };
  const float three = 3.0f;
  uint32_t key = 0;
  std::memcpy(&key, &three, 4);
  // 3 of 8: three of the four 3s (indices 1, 2, 4), not index 6.
  peft::merge::MagnitudeCut c = cut_of(0.4);
  CHECK(c.threshold == key);
  CHECK(c.equal_kept == 3);
  c = cut_of(0.0);
  CHECK(c.equal_kept == 0);
  CHECK(c.threshold == 0xFFFFFFFFu);
  c = cut_of(0.99);  // 7 of 8: everything but one of the two zeros
  CHECK(c.threshold == 0);
  CHECK(c.equal_kept == 1);
}

#if defined(__ELF__)
extern "C" {
int openblas_get_num_threads(void) __attribute__((weak));
void openblas_set_num_threads(int threads) __attribute__((weak));
}

TEST_CASE("merge math: SVDs on several workers hold OpenBLAS to the calling thread, and its thread count comes back") {
  if (openblas_get_num_threads == nullptr || openblas_set_num_threads == nullptr) {
    MESSAGE("skipped: the BLAS this build runs on is not OpenBLAS");
    return;
  }
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(3);  // above 1 whatever the machine's cores, so that the guard shows
  {
    const pm::BlasOnCallingThread inactive(false);
    CHECK(openblas_get_num_threads() == 3);
    {
      const pm::BlasOnCallingThread outer(true);
      CHECK(openblas_get_num_threads() == 1);
      {
        const pm::BlasOnCallingThread inner(true);
        CHECK(openblas_get_num_threads() == 1);
      }
      CHECK(openblas_get_num_threads() == 1);  // the outer one still holds it
    }
    CHECK(openblas_get_num_threads() == 3);
  }
  // Holders taken and released on several threads at once: single-threaded while any is held, the
  // count back once the last is released.
  bool held_single = true;
  std::vector<std::thread> threads;
  std::vector<char> single(4, 1);
  for (size_t w = 0; w < single.size(); ++w)
    threads.emplace_back([&single, w] {
      for (int i = 0; i < 200; ++i) {
        const pm::BlasOnCallingThread hold(true);
        if (openblas_get_num_threads() != 1) single[w] = 0;
      }
    });
  for (std::thread& t : threads) t.join();
  for (const char s : single) held_single = held_single && s != 0;
  CHECK(held_single);
  CHECK(openblas_get_num_threads() == 3);
  openblas_set_num_threads(before);
}
#endif
