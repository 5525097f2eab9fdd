// add_weighted_adapter "cat" and "linear" against reference loops, and the kernel tables (AVX-512,
// AVX2, portable) against each other.
#include <doctest/doctest.h>

#include "core/error.hpp"
#include "peft/kernels/merge_kernels.hpp"
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

TEST_CASE("merge math: every kernel table gives the same bits") {
  namespace k = pm::kernels;
  std::vector<const k::Table*> tables{&k::portable()};
  if (k::x86_avx2()) tables.push_back(k::x86_avx2());
  if (k::x86_avx512()) tables.push_back(k::x86_avx512());
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
      t.add_rounded(s, w.bytes.data(), d.data(), cols);
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

TEST_CASE("merge math: every kernel table reports a non-finite write in the add that makes it") {
  namespace k = pm::kernels;
  std::vector<const k::Table*> tables{&k::portable()};
  if (k::x86_avx2()) tables.push_back(k::x86_avx2());
  if (k::x86_avx512()) tables.push_back(k::x86_avx512());
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
                                         : t->add_rounded(s, w.bytes.data(), d.data(), 301);
              bool written = false;
              for (size_t i = 0; i < w.size(); ++i) written |= !std::isfinite(w.get(i));
              CHECK(reported == written);
            }
          }
}
