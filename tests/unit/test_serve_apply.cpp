// Unmerged LoRA on activations (serve/lora_apply.hpp): every dtype combination, mixed batches and
// errors, against a float64 reference written out element by element.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "capi/serve_handles.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "serve/apply_kernels.hpp"
#include "serve/lora_apply.hpp"
#include "serve/registry.hpp"
#include "test_merge_math_support.hpp"
#include "test_error_support.hpp"
#include "peft_test_paths.h"

using error_test::code_of;
using merge_test::Buffer;
using merge_test::random_buffer;
using peft::DType;
using peft::serve::apply_lora;
using peft::serve::LoraBatch;
using peft::serve::LoraFactors;

namespace {

// One adapter's factors for a layer, in their storage dtype.
struct Group {
  int64_t rank = 0;
  double scaling = 0;
  Buffer a, b, bias;
  bool has_bias = false;
  Group(DType dtype, int64_t in, int64_t out, int64_t rank_, double scaling_, bool with_bias, uint32_t seed)
      : rank(rank_), scaling(scaling_),
        // Scales that keep x A^T and (x A^T) B^T near unit size, like trained factors on real activations.
        a(random_buffer(dtype, size_t(rank_ * in), seed, float(1.0 / std::sqrt(double(in))))),
        b(random_buffer(dtype, size_t(out * rank_), seed + 1, float(1.0 / std::sqrt(double(rank_))))),
        bias(random_buffer(dtype, size_t(out), seed + 2)),
        has_bias(with_bias) {}
  Group(int64_t rank_, double scaling_, Buffer a_, Buffer b_, std::optional<Buffer> bias_)
      : rank(rank_), scaling(scaling_), a(std::move(a_)), b(std::move(b_)),
        bias(bias_ ? std::move(*bias_) : Buffer(a.dtype, 0)), has_bias(bias_.has_value()) {}
  LoraFactors factors() const {
    return {a.dtype, a.bytes.data(), b.bytes.data(), has_bias ? bias.bytes.data() : nullptr, rank, scaling};
  }
};

// A batch, its expected result and the check of apply_lora's output against it.
struct Problem {
  int64_t in = 0, out = 0;
  size_t rows = 0;
  std::vector<Group> groups;
  std::vector<bool> present;        // per group: false = the adapter has no such layer
  std::vector<int32_t> row_group;   // empty: every row uses group 0 (row_group NULL)
  Buffer x, y;

  Problem(DType x_dtype, DType y_dtype, int64_t in_, int64_t out_, size_t rows_, uint32_t seed)
      : in(in_), out(out_), rows(rows_), x(random_buffer(x_dtype, rows_ * size_t(in_), seed)),
        y(random_buffer(y_dtype, rows_ * size_t(out_), seed + 1)) {}

  void add_group(DType dtype, int64_t rank, double scaling, bool bias, uint32_t seed) {
    groups.emplace_back(dtype, in, out, rank, scaling, bias, seed);
    present.push_back(true);
  }
  int32_t group_of(size_t row) const { return row_group.empty() ? 0 : row_group[row]; }

  std::vector<std::optional<LoraFactors>> factors() const {
    std::vector<std::optional<LoraFactors>> f;
    for (size_t g = 0; g < groups.size(); ++g) f.push_back(present[g] ? std::optional(groups[g].factors()) : std::nullopt);
    return f;
  }
  LoraBatch batch(Buffer& out_buffer) const {
    return {x.bytes.data(), x.dtype, out_buffer.bytes.data(), out_buffer.dtype, rows, uint64_t(in), uint64_t(out),
            row_group.empty() ? nullptr : row_group.data()};
  }
  Buffer run() const {
    Buffer result = y;
    const auto f = factors();
    apply_lora(f, batch(result));
    return result;
  }

  // The exact sum in float64 for one row, and the sum of the magnitudes of its terms (the scale
  // of the f32 rounding error).
  void reference_row(size_t i, std::vector<double>& value, std::vector<double>& magnitude) const {
    const Group& g = groups[size_t(group_of(i))];
    std::vector<double> t(size_t(g.rank)), t_magnitude(size_t(g.rank));
    for (int64_t k = 0; k < g.rank; ++k)
      for (int64_t c = 0; c < in; ++c) {
        const double term = double(x.get(i * size_t(in) + size_t(c))) * double(g.a.get(size_t(k * in + c)));
        t[size_t(k)] += term;
        t_magnitude[size_t(k)] += std::fabs(term);
      }
    for (int64_t j = 0; j < out; ++j) {
      const double y0 = y.get(i * size_t(out) + size_t(j));
      double sum = 0, sum_magnitude = 0;
      for (int64_t k = 0; k < g.rank; ++k) {
        const double bk = g.b.get(size_t(j * g.rank + k));
        sum += t[size_t(k)] * bk;
        sum_magnitude += t_magnitude[size_t(k)] * std::fabs(bk);
      }
      const double bias = g.has_bias ? double(g.bias.get(size_t(j))) : 0.0;
      value[size_t(j)] = y0 + g.scaling * sum + g.scaling * bias;
      magnitude[size_t(j)] = std::fabs(y0) + std::fabs(g.scaling) * (sum_magnitude + std::fabs(bias));
    }
  }

  // The bound on |f32 result - exact value| for row i's group, from the arithmetic: x, the factors
  // and y widen to f32 exactly; the result is then in + rank + 6 rounded f32 operations deep (the
  // `in` products and sums of x A^T, the `rank` of T B^T, the multiplication by the scaling, the
  // addition to y, the scaling's own rounding to f32, one spare for a product that folds the
  // scaling into a factor first, and the two operations of the bias term). In any order of
  // summation, with or without fused multiply-adds, such a result is within gamma(n) = n u / (1 - n u)
  // (u = 2^-24) of the exact value, relative to the sum of the magnitudes of the terms (Higham,
  // Accuracy and Stability of Numerical Algorithms, 3.1). This holds for every kernel table's lane
  // width and every split of the rows between threads.
  double f32_error_bound(size_t row, double magnitude) const {
    const double n = double(in + groups[size_t(group_of(row))].rank + 6);
    const double u = std::ldexp(1.0, -24);
    return n * u / (1 - n * u) * magnitude;
  }

  // f32 output: within that bound of the float64 value. BF16/F16 output: the f32 result rounded
  // once, so within half a unit in the last place of the result plus that bound (a second rounding,
  // e.g. of the LoRA term before the addition, can exceed it; "lora apply: one rounding" below
  // catches that case for certain). Rows of no group, or of an absent group, are unchanged bit for bit.
  void check(const Buffer& result) const {
    std::vector<double> value(static_cast<size_t>(out)), magnitude(static_cast<size_t>(out));
    for (size_t i = 0; i < rows; ++i) {
      CAPTURE(i);
      const int32_t g = group_of(i);
      const size_t row_bytes = size_t(out) * merge_test::dtype_bytes(y.dtype);
      if (g < 0 || !present[size_t(g)]) {
        CHECK(std::memcmp(result.bytes.data() + i * row_bytes, y.bytes.data() + i * row_bytes, row_bytes) == 0);
        continue;
      }
      reference_row(i, value, magnitude);
      for (int64_t j = 0; j < out; ++j) {
        const size_t e = i * size_t(out) + size_t(j);
        const double bound = f32_error_bound(i, magnitude[size_t(j)]);
        if (y.dtype == DType::F32) {
          const double error = std::fabs(double(result.get(e)) - value[size_t(j)]);
          if (error > bound)
            FAIL_CHECK("row " << i << " column " << j << ": error " << error << " over the bound " << bound);
          continue;
        }
        uint16_t got;
        std::memcpy(&got, result.bytes.data() + 2 * e, 2);
        const auto decode = [&](uint16_t h) {
          return double(y.dtype == DType::BF16 ? peft::bf16_to_f32(h) : peft::f16_to_f32(h));
        };
        // Half the spacing above |got|: the rounding of an f32 value to `got` moved it at most that far.
        const double half_ulp = std::fabs(decode(uint16_t((got & 0x8000) | ((got & 0x7FFF) + 1))) - decode(got)) / 2;
        const double error = std::fabs(decode(got) - value[size_t(j)]);
        if (error > half_ulp + bound)
          FAIL_CHECK("row " << i << " column " << j << ": " << decode(got) << " is " << error << " from "
                            << value[size_t(j)] << ", over half an ulp plus " << bound);
      }
    }
  }
};

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};

}  // namespace

TEST_CASE("lora apply: one adapter for every row, every dtype of x, y and factors") {
  for (DType x_dtype : kDTypes)
    for (DType y_dtype : kDTypes)
      for (DType factor_dtype : kDTypes)
        // 1 row (matrix-vector products), a block and a half, and more than two blocks of rows.
        for (size_t rows : {size_t(1), size_t(100), size_t(150)}) {
          CAPTURE(peft::dtype_name(x_dtype));
          CAPTURE(peft::dtype_name(y_dtype));
          CAPTURE(peft::dtype_name(factor_dtype));
          CAPTURE(rows);
          Problem p(x_dtype, y_dtype, 96, 72, rows, 11);
          p.add_group(factor_dtype, 8, 2.0, false, 20);
          p.check(p.run());
        }
}

TEST_CASE("lora apply: lora_B.bias is added times the scaling") {
  for (DType dtype : kDTypes) {
    CAPTURE(peft::dtype_name(dtype));
    Problem p(dtype, dtype, 64, 48, 20, 3);
    p.add_group(dtype, 4, 0.75, true, 30);
    const Buffer result = p.run();
    p.check(result);
    // Without the bias the result differs: the bias term is really there.
    p.groups[0].has_bias = false;
    CHECK(result.bytes != p.run().bytes);
  }
}

// The LoRA term is added to y in f32 and the sum rounded once. Here y = 1 and the term is half a
// unit in the last place of 1 plus a little, all exact in f32 whatever the kernels: one rounding
// gives the next value above 1, while rounding the term to y's dtype first would drop the little
// and leave a tie that rounds to 1.
TEST_CASE("lora apply: one rounding of y + term to the output dtype, on every kernel") {
  for (DType y_dtype : {DType::BF16, DType::F16})
    for (size_t rows : {size_t(1), size_t(3)}) {  // matrix-vector and matrix-matrix products
      CAPTURE(peft::dtype_name(y_dtype));
      CAPTURE(rows);
      const int mantissa_bits = y_dtype == DType::BF16 ? 7 : 10;
      const float term = std::ldexp(1.0f, -mantissa_bits - 1) + std::ldexp(1.0f, -mantissa_bits - 13);
      Buffer a(DType::F32, 1), b(DType::F32, 1), x(DType::F32, rows), y(y_dtype, rows);
      a.set(0, 1.0f);
      b.set(0, term);
      for (size_t i = 0; i < rows; ++i) {
        x.set(i, 1.0f);
        y.set(i, 1.0f);
      }
      const std::vector<std::optional<LoraFactors>> groups{LoraFactors{DType::F32, a.bytes.data(), b.bytes.data(), nullptr, 1, 1.0}};
      apply_lora(groups, {x.bytes.data(), DType::F32, y.bytes.data(), y_dtype, rows, 1, 1, nullptr});
      for (size_t i = 0; i < rows; ++i) CHECK(y.get(i) == 1.0f + std::ldexp(1.0f, -mantissa_bits));
    }
}

TEST_CASE("lora apply: mixed batches: interleaved groups, rows without adapter, absent layers") {
  for (DType x_dtype : kDTypes)
    for (DType y_dtype : kDTypes)
      for (DType factor_dtype : kDTypes) {
        CAPTURE(peft::dtype_name(x_dtype));
        CAPTURE(peft::dtype_name(y_dtype));
        CAPTURE(peft::dtype_name(factor_dtype));
        Problem p(x_dtype, y_dtype, 80, 56, 90, 5);
        p.add_group(factor_dtype, 8, 2.0, false, 40);
        p.add_group(factor_dtype, 16, 0.5, true, 50);
        p.add_group(factor_dtype, 4, 4.0, false, 60);  // one row only
        p.add_group(factor_dtype, 8, 1.0, false, 70);  // the adapter has no such layer
        p.present[3] = false;
        p.row_group.resize(p.rows);
        for (size_t i = 0; i < p.rows; ++i) p.row_group[i] = i % 5 == 4 ? -1 : int32_t(i % 2);  // interleaved
        p.row_group[17] = 2;
        p.row_group[30] = 3;
        p.row_group[31] = 3;
        // A row nobody touches holds NaN patterns and tiny negative numbers, which come back as they were.
        const size_t row_bytes = size_t(p.out) * merge_test::dtype_bytes(y_dtype);
        std::memset(p.y.bytes.data() + 4 * row_bytes, 0xFF, row_bytes / 2);
        std::memset(p.y.bytes.data() + 4 * row_bytes + row_bytes / 2, 0x80, row_bytes / 2);
        p.check(p.run());
      }
}

TEST_CASE("lora apply: groups in consecutive runs, across blocks of rows") {
  for (DType dtype : kDTypes) {
    CAPTURE(peft::dtype_name(dtype));
    Problem p(dtype, dtype, 48, 40, 160, 8);
    p.add_group(DType::BF16, 8, 2.0, false, 80);
    p.add_group(DType::BF16, 8, 2.0, true, 90);
    p.add_group(DType::BF16, 8, 2.0, false, 100);
    p.row_group.assign(p.rows, 0);
    for (size_t i = 70; i < 75; ++i) p.row_group[i] = 1;
    for (size_t i = 75; i < 78; ++i) p.row_group[i] = -1;
    for (size_t i = 78; i < 160; ++i) p.row_group[i] = 2;
    p.check(p.run());
  }
}

TEST_CASE("lora apply: f32 rows at any alignment") {
  Problem p(DType::F32, DType::F32, 40, 24, 9, 21);
  p.add_group(DType::F32, 4, 2.0, true, 22);
  std::vector<unsigned char> x(p.x.bytes.size() + 1), y(p.y.bytes.size() + 1);
  std::memcpy(x.data() + 1, p.x.bytes.data(), p.x.bytes.size());
  std::memcpy(y.data() + 1, p.y.bytes.data(), p.y.bytes.size());
  Buffer result = p.y;
  LoraBatch batch = p.batch(result);
  batch.x = x.data() + 1;
  batch.y = y.data() + 1;
  apply_lora(p.factors(), batch);
  std::memcpy(result.bytes.data(), y.data() + 1, result.bytes.size());
  p.check(result);
}

TEST_CASE("lora apply: no rows, or no adapter with the layer, changes nothing") {
  Problem p(DType::F32, DType::BF16, 16, 8, 6, 1);
  p.add_group(DType::F32, 2, 1.0, false, 2);
  const auto f = p.factors();
  Buffer y = p.y;
  LoraBatch batch = p.batch(y);
  batch.rows = 0;
  batch.x = nullptr;
  batch.y = nullptr;
  apply_lora(f, batch);

  p.present[0] = false;
  CHECK(p.run().bytes == p.y.bytes);
  p.row_group.assign(p.rows, -1);
  p.present[0] = true;
  CHECK(p.run().bytes == p.y.bytes);
}

// Large enough (kParallelWork multiply-adds) that each call splits its rows between the cores; the
// callers then compete for the worker threads, and the ones that find them busy run alone. Every
// result is within the bound, however its rows were split.
TEST_CASE("lora apply: threads writing different outputs with the same factors, each call on the cores") {
  Problem p(DType::BF16, DType::BF16, 256, 192, 600, 4);
  p.add_group(DType::BF16, 16, 2.0, true, 5);
  p.add_group(DType::F16, 8, 1.0, false, 6);
  p.row_group.resize(p.rows);
  for (size_t i = 0; i < p.rows; ++i) p.row_group[i] = int32_t(i % 3) - 1;
  REQUIRE(200 * (16 + 8) * (256 + 192) >= peft::serve::kParallelWork);
  p.check(p.run());
  std::vector<Buffer> results(4, p.y);
  std::vector<std::thread> threads;
  for (Buffer& result : results)
    threads.emplace_back([&p, &result] {
      const auto f = p.factors();
      for (int repeat = 0; repeat < 5; ++repeat) {
        Buffer scratch_result = p.y;
        apply_lora(f, p.batch(scratch_result));
        result = scratch_result;
      }
    });
  for (auto& t : threads) t.join();
  for (const Buffer& result : results) p.check(result);
}

// Too few rows to split (kMinRowsPerThread each), but kSplitWork multiply-adds in a group: that
// group's products are split between the cores instead (ranks of X A^T, with a rank that leaves a
// short last share; output columns of T B^T). Every result is within the bound.
TEST_CASE("lora apply: few rows with large products, each product split between the cores") {
  for (size_t rows : {size_t(1), size_t(3)}) {
    CAPTURE(rows);
    Problem p(DType::BF16, DType::F16, 2500, 1300, rows, 30);
    p.add_group(DType::BF16, 70, 2.0, true, 31);
    p.add_group(DType::F32, 9, 0.5, false, 32);
    if (rows == 3) p.row_group = {0, 1, 0};
    REQUIRE(70 * (2500 + 1300) >= peft::serve::kSplitWork);
    p.check(p.run());
  }
}

TEST_CASE("lora apply: bad arguments fail before y is written") {
  Problem p(DType::F32, DType::F32, 32, 24, 10, 7);
  p.add_group(DType::F32, 4, 1.0, false, 8);
  p.add_group(DType::BF16, 4, 1.0, false, 9);
  p.row_group.assign(p.rows, 0);
  p.row_group[3] = 1;
  const auto fails = [&](int32_t code, const std::function<void(std::vector<std::optional<LoraFactors>>&, LoraBatch&)>& spoil) {
    Buffer y = p.y;
    auto f = p.factors();
    LoraBatch batch = p.batch(y);
    spoil(f, batch);
    CHECK(code_of([&] { apply_lora(f, batch); }) == code);
    CHECK(y.bytes == p.y.bytes);
  };
  using Groups = std::vector<std::optional<LoraFactors>>;
  // The bad index comes last, after rows that would already have been written.
  std::vector<int32_t> bad_index = p.row_group;
  bad_index.back() = 2;
  fails(PEFT_ERR_INVALID_ARGUMENT, [&](Groups&, LoraBatch& b) { b.row_group = bad_index.data(); });
  bad_index.back() = -2;
  fails(PEFT_ERR_INVALID_ARGUMENT, [&](Groups&, LoraBatch& b) { b.row_group = bad_index.data(); });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups& g, LoraBatch&) { g.clear(); });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups&, LoraBatch& b) { b.x = nullptr; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups& g, LoraBatch&) { g[1]->a = nullptr; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups& g, LoraBatch&) { g[1]->b = nullptr; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups& g, LoraBatch&) { g[1]->rank = 0; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups& g, LoraBatch&) { g[0]->a = static_cast<const char*>(g[0]->a) + 2; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups&, LoraBatch& b) { b.in_features = 0; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups&, LoraBatch& b) { b.out_features = uint64_t(1) << 31; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups&, LoraBatch& b) { b.rows = uint64_t(1) << 62; });
  fails(PEFT_ERR_INVALID_ARGUMENT, [](Groups&, LoraBatch& b) { b.x = static_cast<const char*>(b.y) + 4; });
  fails(PEFT_ERR_UNSUPPORTED, [](Groups&, LoraBatch& b) { b.x_dtype = DType::F64; });
  fails(PEFT_ERR_UNSUPPORTED, [](Groups&, LoraBatch& b) { b.y_dtype = DType::I8; });
  fails(PEFT_ERR_UNSUPPORTED, [](Groups& g, LoraBatch&) { g[1]->dtype = DType::F8_E4M3; });
  // y NULL: nothing to compare, but the call must fail cleanly.
  Buffer y = p.y;
  auto f = p.factors();
  LoraBatch batch = p.batch(y);
  batch.y = nullptr;
  CHECK(code_of([&] { apply_lora(f, batch); }) == PEFT_ERR_INVALID_ARGUMENT);
}

// ---- peft_lora_apply: leases of a registry holding fixture adapters --------------------------------

namespace {

std::string fixture_dir(const std::string& adapter) { return std::string(PEFT_TEST_DATA) + "/adapters/" + adapter; }

// The layer `module` of a fixture adapter, read with the adapter API (not the registry's loader)
// and rounded to the registry's storage dtype; the scaling comes from the test, worked out from
// the adapter's config (lora_alpha / r).
Group fixture_group(const std::string& adapter_name, const std::string& module, DType storage, double scaling) {
  peft_adapter* adapter = nullptr;
  REQUIRE(peft_adapter_open(fixture_dir(adapter_name).c_str(), nullptr, &adapter) == nullptr);
  size_t m = 0;
  REQUIRE(peft_adapter_find_module(adapter, module.c_str(), &m) == nullptr);
  std::optional<Buffer> a, b, bias;
  int64_t rank = 0;
  for (size_t t = 0; t < peft_adapter_module_tensor_count(adapter, m); ++t) {
    const std::string role = peft_adapter_module_tensor_role(adapter, m, t);
    const uint64_t* shape = peft_adapter_module_tensor_shape(adapter, m, t);
    size_t count = 1;
    for (size_t d = 0; d < peft_adapter_module_tensor_ndim(adapter, m, t); ++d) count *= size_t(shape[d]);
    std::vector<float> values(count);
    REQUIRE(peft_adapter_module_tensor_read(adapter, m, t, PEFT_DTYPE_F32, values.data(), count * 4) == nullptr);
    Buffer stored(storage, count);
    for (size_t i = 0; i < count; ++i) stored.set(i, values[i]);
    if (role == "lora_A.weight") {
      rank = int64_t(shape[0]);
      a = std::move(stored);
    } else if (role == "lora_B.weight") {
      b = std::move(stored);
    } else if (role == "lora_B.bias") {
      bias = std::move(stored);
    }
  }
  peft_adapter_free(adapter);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  return Group(rank, scaling, std::move(*a), std::move(*b), std::move(bias));
}

struct Served {
  peft::serve::Registry registry;
  std::vector<std::unique_ptr<peft_lease>> leases;
  explicit Served(DType storage) : registry(storage, uint64_t(1) << 24, std::nullopt) {}
  const peft_lease* acquire(const std::string& adapter) {
    registry.add(adapter, peft::Adapter::open(fixture_dir(adapter), {}));
    leases.push_back(std::make_unique<peft_lease>(peft_lease{registry.acquire(adapter)}));
    return leases.back().get();
  }
};

// Runs peft_lora_apply on a copy of p.y; returns the error code (0 for success) and the message.
std::pair<int32_t, std::string> c_apply(const Problem& p, const char* module, const std::vector<const peft_lease*>& leases,
                                        Buffer& y, const int32_t* row_lease) {
  peft_error* error = peft_lora_apply(module, leases.empty() ? nullptr : leases.data(), leases.size(), row_lease,
                                      p.x.bytes.data(), int32_t(p.x.dtype), p.rows, uint64_t(p.in), y.bytes.data(),
                                      int32_t(y.dtype), uint64_t(p.out));
  if (error == nullptr) return {0, ""};
  std::pair<int32_t, std::string> result{peft_error_code(error), peft_error_message(error)};
  peft_error_free(error);
  return result;
}

}  // namespace

TEST_CASE("peft_lora_apply: a mixed batch of fixture adapters, layers named as modules or weights") {
  // F32 storage with f32 activations; BF16 storage (factors rounded on load) with bf16 x and f16 y.
  for (auto dtypes : {std::tuple{DType::F32, DType::F32, DType::F32}, std::tuple{DType::BF16, DType::BF16, DType::F16}}) {
    // Named copies, not a structured binding: clang 14 cannot capture one (CAPTURE is a lambda).
    const DType storage = std::get<0>(dtypes), x_dtype = std::get<1>(dtypes), y_dtype = std::get<2>(dtypes);
    CAPTURE(peft::dtype_name(storage));
    Served served(storage);
    const std::vector<const peft_lease*> leases = {served.acquire("llama_lora"), served.acquire("llama_lora_second"),
                                                   served.acquire("llama_embedding")};
    const std::string module = "model.layers.0.mlp.down_proj";  // 32 -> 16; llama_embedding has no such layer
    Problem p(x_dtype, y_dtype, 32, 16, 7, 12);
    p.groups.push_back(fixture_group("llama_lora", module, storage, 8.0 / 4));
    p.groups.push_back(fixture_group("llama_lora_second", module, storage, 16.0 / 4));
    p.groups.push_back(p.groups[0]);  // stands in for llama_embedding's absent layer
    p.present = {true, true, false};
    p.row_group = {0, 1, -1, 0, 2, 1, 0};
    for (const char* name : {"model.layers.0.mlp.down_proj", "base_model.model.model.layers.0.mlp.down_proj.weight"}) {
      CAPTURE(name);
      Buffer y = p.y;
      CHECK(c_apply(p, name, leases, y, p.row_group.data()).first == 0);
      p.check(y);
    }
  }
}

TEST_CASE("peft_lora_apply: lora_B.bias, GPT-2 Conv1D, every row on leases[0]") {
  Served served(DType::F32);
  {
    const std::vector<const peft_lease*> leases = {served.acquire("qwen2_lora_bias")};
    Problem p(DType::F32, DType::F32, 16, 16, 5, 13);
    p.groups.push_back(fixture_group("qwen2_lora_bias", "model.layers.0.self_attn.q_proj", DType::F32, 8.0 / 4));
    p.present = {true};
    REQUIRE(p.groups[0].has_bias);
    Buffer y = p.y;
    CHECK(c_apply(p, "model.layers.0.self_attn.q_proj", leases, y, nullptr).first == 0);
    p.check(y);
  }
  {
    const std::vector<const peft_lease*> leases = {served.acquire("gpt2_lora")};
    Problem p(DType::F32, DType::F32, 16, 48, 1, 14);  // c_attn: 16 -> 48 (base weight [16, 48])
    p.groups.push_back(fixture_group("gpt2_lora", "transformer.h.0.attn.c_attn", DType::F32, 8.0 / 4));
    p.present = {true};
    Buffer y = p.y;
    CHECK(c_apply(p, "transformer.h.0.attn.c_attn", leases, y, nullptr).first == 0);
    p.check(y);
  }
}

TEST_CASE("peft_lora_apply: errors name what is wrong and leave y unchanged") {
  Served served(DType::F32);
  const peft_lease* lora = served.acquire("llama_lora");
  const peft_lease* dora = served.acquire("llama_dora");
  const peft_lease* embedding = served.acquire("llama_embedding");
  Problem p(DType::F32, DType::F32, 16, 16, 4, 15);  // q_proj: 16 -> 16
  std::vector<int32_t> row_lease = {0, 0, 0, 0};
  const auto fails = [&](int32_t code, const char* module, const std::vector<const peft_lease*>& leases,
                         const std::string& message_part) {
    Buffer y = p.y;
    const auto [got, message] = c_apply(p, module, leases, y, row_lease.data());
    CHECK(got == code);
    CHECK(message.find(message_part) != std::string::npos);
    CHECK(y.bytes == p.y.bytes);
  };
  const char* q_proj = "model.layers.0.self_attn.q_proj";
  fails(PEFT_ERR_SHAPE_MISMATCH, "model.layers.0.mlp.down_proj", {lora}, "\"llama_lora\"");
  // DoRA is served from the host's base weight; without one: NOT_FOUND naming how to give it.
  fails(PEFT_ERR_NOT_FOUND, q_proj, {lora, dora}, "peft_registry_set_base_weight");
  fails(PEFT_ERR_UNSUPPORTED, "model.embed_tokens", {embedding}, "embedding");
  fails(PEFT_ERR_INVALID_ARGUMENT, nullptr, {lora}, "module");
  fails(PEFT_ERR_INVALID_ARGUMENT, q_proj, {}, "lease");
  fails(PEFT_ERR_INVALID_ARGUMENT, q_proj, {lora, nullptr}, "leases[1]");
  row_lease.back() = 1;
  fails(PEFT_ERR_INVALID_ARGUMENT, q_proj, {lora}, "row 3");
  row_lease.back() = 0;

  Buffer y = p.y;
  const std::vector<const peft_lease*> leases = {lora};
  for (int32_t dtype : {int32_t(PEFT_DTYPE_I32), int32_t(PEFT_DTYPE_F64), int32_t(9999)}) {
    peft_error* error = peft_lora_apply(q_proj, leases.data(), 1, nullptr, p.x.bytes.data(), dtype, p.rows, 16,
                                        y.bytes.data(), PEFT_DTYPE_F32, 16);
    CHECK(peft_error_code(error) == PEFT_ERR_UNSUPPORTED);
    peft_error_free(error);
  }
  CHECK(y.bytes == p.y.bytes);
  // No rows: nothing to do, and x and y may be NULL.
  CHECK(peft_lora_apply(q_proj, leases.data(), 1, nullptr, nullptr, PEFT_DTYPE_F32, 0, 16, nullptr, PEFT_DTYPE_F32, 16) ==
        nullptr);
}

// The two products of each kernel table the CPU has, against float64, at every edge of their tiles
// and lanes: one row and rows that fill no tile, ranks below, at and above the lane widths and above
// the transposed panel's limit (and, for F16, above the widening buffer), widths that leave tails,
// shrink's panels and its column chunks, and a range of output columns with the rest untouched. Bound: gamma(depth) relative to the sum
// of the magnitudes of the terms, depth = in for X A^T, rank + 2 for C + scale * T B^T.
TEST_CASE("lora apply kernels: every table against float64, at the edges of the tiles") {
  namespace k = peft::serve::kernels;
  std::vector<const k::Table*> tables{&k::portable()};
  if (k::x86_avx2()) tables.push_back(k::x86_avx2());
  if (k::x86_avx512()) tables.push_back(k::x86_avx512());
  const auto gamma = [](double depth) {
    const double u = std::ldexp(1.0, -24);
    return depth * u / (1 - depth * u);
  };
  struct Shape {
    int64_t in, rank, out, n;
  };
  std::vector<Shape> shapes;
  for (int64_t in : {1, 37, 300})
    for (int64_t rank : {1, 3, 4, 9, 16, 20, 129})
      for (int64_t out : {1, 7, 70})
        for (int64_t n : {1, 3, 4, 9}) shapes.push_back({in, rank, out, n});
  shapes.push_back({3, 2100, 5, 5});  // F16: a rank above every table's widening buffer
  // shrink's panels (from 32 rows, ranks of a panel's width: 16 or 64 columns): rows that leave a
  // partial tile, a partial last panel of ranks, depths past one panel (128) with a tail.
  for (int64_t rank : {16, 64, 70, 129}) shapes.push_back({300, rank, 9, 37});
  // shrink's dot products over column chunks (X's rows above 512 KiB), for F16 at most 1024 wide.
  shapes.push_back({3500, 9, 5, 40});
  shapes.push_back({3500, 64, 5, 40});
  uint32_t seed = 1000;
  for (const k::Table* table : tables)
    for (DType dtype : kDTypes)
      for (const Shape& s : shapes) {
        CAPTURE(table->name);
        CAPTURE(peft::dtype_name(dtype));
        CAPTURE(s.in);
        CAPTURE(s.rank);
        CAPTURE(s.out);
        CAPTURE(s.n);
        const Buffer a = random_buffer(dtype, size_t(s.rank * s.in), ++seed);
        const Buffer b = random_buffer(dtype, size_t(s.out * s.rank), ++seed);
        const std::vector<float> x = merge_test::random_floats(size_t(s.n * s.in), ++seed);
        const std::vector<float> c0 = merge_test::random_floats(size_t(s.n * s.out), ++seed);
        const float scale = 0.75f;

        const auto check_t = [&](const std::vector<float>& t) {
          for (int64_t i = 0; i < s.n; ++i)
            for (int64_t r = 0; r < s.rank; ++r) {
              double exact = 0, magnitude = 0;
              for (int64_t c = 0; c < s.in; ++c) {
                const double term = double(x[size_t(i * s.in + c)]) * double(a.get(size_t(r * s.in + c)));
                exact += term;
                magnitude += std::fabs(term);
              }
              const double error = std::fabs(double(t[size_t(i * s.rank + r)]) - exact);
              if (error > gamma(double(s.in)) * magnitude) FAIL_CHECK("T[" << i << ", " << r << "]: error " << error);
            }
        };
        std::vector<float> t(size_t(s.n * s.rank));
        table->shrink(dtype, a.bytes.data(), s.rank, s.in, x.data(), s.n, t.data(), s.rank);
        check_t(t);
        if (s.rank > 1) {  // the ranks split in two calls, as threads take them: T's columns [0, h) and [h, rank)
          CAPTURE("ranks split");
          const int64_t h = s.rank / 2;
          const size_t element = merge_test::dtype_bytes(dtype);
          std::vector<float> halves(t.size(), -1.0f);
          table->shrink(dtype, a.bytes.data(), h, s.in, x.data(), s.n, halves.data(), s.rank);
          table->shrink(dtype, a.bytes.data() + size_t(h * s.in) * element, s.rank - h, s.in, x.data(), s.n,
                        halves.data() + h, s.rank);
          check_t(halves);
        }

        // Columns [j0, j1) only: a third of the way in to the end.
        const int64_t j0 = s.out / 3, j1 = s.out;
        std::vector<float> c = c0;
        table->expand(dtype, b.bytes.data(), s.out, s.rank, t.data(), s.n, scale, c.data(), j0, j1);
        for (int64_t i = 0; i < s.n; ++i)
          for (int64_t j = 0; j < s.out; ++j) {
            const size_t e = size_t(i * s.out + j);
            if (j < j0) {
              if (c[e] != c0[e]) FAIL_CHECK("C[" << i << ", " << j << "] outside the columns changed");
              continue;
            }
            double sum = 0, magnitude = 0;
            for (int64_t r = 0; r < s.rank; ++r) {
              const double term = double(t[size_t(i * s.rank + r)]) * double(b.get(size_t(j * s.rank + r)));
              sum += term;
              magnitude += std::fabs(term);
            }
            const double exact = double(c0[e]) + double(scale) * sum;
            const double bound = gamma(double(s.rank + 2)) * (std::fabs(double(c0[e])) + double(scale) * magnitude);
            const double error = std::fabs(double(c[e]) - exact);
            if (error > bound) FAIL_CHECK("C[" << i << ", " << j << "]: error " << error << " over " << bound);
          }
      }
}
