// BufferMerge: merging into a host's buffers and taking the merge out again, exactly (saved rows)
// or arithmetically (PEFT's unmerge), with weights, DoRA, lora_bias, misuse and concurrency.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "core/error.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "test_merge_math_support.hpp"
#include "test_error_support.hpp"

using error_test::code_of;
using namespace merge_test;
namespace pm = peft::merge;
using peft::BufferMergeOptions;
using peft::BufferMergeModule;
using peft::BufferMerge;

namespace {

struct Fixture {
  pm::ModuleKind kind;
  int64_t out, in, rank;
  Term term;
  std::vector<float> magnitude, lora_bias;
  BufferMergeModule module(bool dora, bool bias) const {
    BufferMergeModule m;
    m.layout = pm::layout_for(kind, out, in);
    m.lora_a = term.a.data();
    m.lora_b = term.b.data();
    m.rank = rank;
    m.scaling = term.coefficient;
    m.magnitude = dora ? magnitude.data() : nullptr;
    m.lora_bias = bias ? lora_bias.data() : nullptr;
    return m;
  }
};

Fixture make_fixture(pm::ModuleKind kind, int64_t out, int64_t in, int64_t rank, uint32_t seed) {
  Fixture f{kind, out, in, rank, random_term(rank, static_cast<size_t>(rank * in), static_cast<size_t>(out * rank), 2.0, seed),
            random_floats(static_cast<size_t>(out), seed + 2), random_floats(static_cast<size_t>(out), seed + 3)};
  for (auto& m : f.magnitude) m = 1.0f + std::fabs(m);
  return f;
}

// The weight dtypes a buffer merge takes, and the largest finite value of each.
const DType kWeightDtypes[] = {DType::F32, DType::BF16, DType::F16};
const double kLargestFinite[] = {3.4028234e38, 0x1.FEp127, 65504.0};

}  // namespace

TEST_CASE("buffer merge: keeping original rows restores the buffer bit for bit") {
  for (pm::ModuleKind kind : {pm::ModuleKind::linear, pm::ModuleKind::conv1d_gpt2, pm::ModuleKind::embedding}) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      for (bool dora : {false, true}) {
        CAPTURE(static_cast<int>(kind));
        CAPTURE(peft::dtype_name(dtype));
        CAPTURE(dora);
        const Fixture fx = make_fixture(kind, 70, 90, 8, 1000);
        const bool with_bias = kind != pm::ModuleKind::embedding;
        const BufferMergeModule m = fx.module(dora, with_bias);
        Buffer w = random_buffer(dtype, 70 * 90, 1001);
        Buffer b = random_buffer(dtype, 70, 1002);
        const Buffer w0 = w, b0 = b;
        auto wv = w.view(m.layout.rows(), m.layout.cols());
        auto bv = b.view(1, 70);
        BufferMerge r = BufferMerge::apply(wv, &bv, m, {.weight = 0.75, .keep_original_rows = true});
        CHECK(r.active());
        CHECK(r.saved_rows() == m.layout.rows());
        CHECK(count_different(w, w0) > w.size() / 2);
        // The merge itself is the library's merge with coefficient weight * scaling.
        Buffer expect = w0;
        const pm::LoraFactors f{m.lora_a, m.lora_b, m.rank, 0.75 * m.scaling};
        if (dora)
          pm::dora_merge(expect.view(m.layout.rows(), m.layout.cols()), m.layout, {&f, 1}, m.magnitude);
        else
          pm::add_delta(expect.view(m.layout.rows(), m.layout.cols()), m.layout, {&f, 1});
        CHECK(same_bytes(w, expect));
        r.remove(wv, &bv);
        CHECK_FALSE(r.active());
        CHECK(same_bytes(w, w0));
        CHECK(same_bytes(b, b0));
      }
    }
  }
}

TEST_CASE("buffer merge: without saved rows, removal is PEFT's arithmetic unmerge") {
  const Fixture fx = make_fixture(pm::ModuleKind::linear, 50, 64, 4, 2000);
  for (bool dora : {false, true}) {
    CAPTURE(dora);
    const BufferMergeModule m = fx.module(dora, true);
    Buffer w = random_buffer(DType::BF16, 50 * 64, 2001), b = random_buffer(DType::BF16, 50, 2002);
    const Buffer w0 = w;
    auto wv = w.view(50, 64);
    auto bv = b.view(1, 50);
    BufferMerge r = BufferMerge::apply(wv, &bv, m);
    CHECK(r.saved_bytes() == 0);
    CHECK(r.dora_norm().size() == (dora ? 50u : 0u));
    Buffer expect = w, expect_b = b;
    const pm::LoraFactors f{m.lora_a, m.lora_b, m.rank, m.scaling};
    if (dora)
      pm::dora_unmerge(expect.view(50, 64), m.layout, {&f, 1}, m.magnitude, r.dora_norm().data());
    else
      pm::subtract_delta(expect.view(50, 64), m.layout, {&f, 1});
    pm::add_lora_bias(expect_b.view(1, 50), m.lora_bias, m.scaling, true);
    r.remove(wv, &bv);
    CHECK(same_bytes(w, expect));
    CHECK(same_bytes(b, expect_b));
    // Close to the original, but bf16 rounding leaves last-bit differences.
    for (size_t i = 0; i < w.size(); ++i) CHECK(std::fabs(w.get(i) - w0.get(i)) <= 0.02f * (1 + std::fabs(w0.get(i))));
  }
}

TEST_CASE("buffer merge: stacked merges come off in reverse order, and only then") {
  const Fixture a = make_fixture(pm::ModuleKind::linear, 40, 48, 4, 3000);
  const Fixture b = make_fixture(pm::ModuleKind::linear, 40, 48, 2, 3100);
  Buffer w = random_buffer(DType::F16, 40 * 48, 3001);
  const Buffer w0 = w;
  auto wv = w.view(40, 48);
  BufferMerge ra = BufferMerge::apply(wv, nullptr, a.module(false, false), {.keep_original_rows = true});
  BufferMerge rb = BufferMerge::apply(wv, nullptr, b.module(true, false), {.weight = -0.5, .keep_original_rows = true});
  const Buffer merged = w;
  // Removing the first merge while the second is still in: refused, nothing changes.
  CHECK(code_of([&] { ra.remove(wv, nullptr); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(ra.active());
  CHECK(same_bytes(w, merged));
  rb.remove(wv, nullptr);
  ra.remove(wv, nullptr);
  CHECK(same_bytes(w, w0));
  CHECK(code_of([&] { ra.remove(wv, nullptr); }) == PEFT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("buffer merge: only changed rows are kept") {
  Fixture fx = make_fixture(pm::ModuleKind::linear, 64, 32, 3, 4000);
  for (int64_t o = 10; o < 64; ++o)
    for (int64_t k = 0; k < 3; ++k) fx.term.b[static_cast<size_t>(o * 3 + k)] = 0.0f;
  Buffer w = random_buffer(DType::BF16, 64 * 32, 4001);
  const Buffer w0 = w;
  auto wv = w.view(64, 32);
  BufferMerge r = BufferMerge::apply(wv, nullptr, fx.module(false, false), {.keep_original_rows = true});
  CHECK(r.saved_rows() <= 10);
  CHECK(r.saved_rows() >= 8);
  CHECK(r.saved_bytes() == static_cast<size_t>(r.saved_rows()) * 32 * 2);
  r.remove(wv, nullptr);
  CHECK(same_bytes(w, w0));
}

TEST_CASE("buffer merge: bad calls change nothing") {
  const Fixture fx = make_fixture(pm::ModuleKind::linear, 16, 24, 2, 5000);
  Buffer w = random_buffer(DType::BF16, 16 * 24, 5001);
  const Buffer w0 = w;
  auto wv = w.view(16, 24);
  // lora_bias without a bias buffer; wrong shapes; unsupported dtype.
  CHECK(code_of([&] { BufferMerge::apply(wv, nullptr, fx.module(false, true)); }) == PEFT_ERR_INVALID_ARGUMENT);
  Buffer small_bias = random_buffer(DType::BF16, 8, 5002);
  auto sbv = small_bias.view(1, 8);
  CHECK(code_of([&] { BufferMerge::apply(wv, &sbv, fx.module(false, true)); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { BufferMerge::apply(w.view(24, 16), nullptr, fx.module(false, false)); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { BufferMerge::apply({w.bytes.data(), DType::I16, 16, 24}, nullptr, fx.module(false, false)); }) ==
        PEFT_ERR_UNSUPPORTED);
  CHECK(same_bytes(w, w0));
  // Removal from a buffer of another dtype or shape; an empty record.
  BufferMerge r = BufferMerge::apply(wv, nullptr, fx.module(false, false), {.keep_original_rows = true});
  CHECK(code_of([&] { r.remove({w.bytes.data(), DType::F16, 16, 24}, nullptr); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { r.remove(w.view(8, 48), nullptr); }) == PEFT_ERR_SHAPE_MISMATCH);
  BufferMerge empty;
  CHECK(code_of([&] { empty.remove(wv, nullptr); }) == PEFT_ERR_INVALID_ARGUMENT);
  r.remove(wv, nullptr);
  CHECK(same_bytes(w, w0));
}

TEST_CASE("buffer merge: the record keeps the factors' owner alive") {
  auto owner = std::make_shared<Fixture>(make_fixture(pm::ModuleKind::linear, 8, 8, 2, 6000));
  BufferMergeModule m = owner->module(false, false);
  m.keep_alive = owner;
  Buffer w = random_buffer(DType::F32, 64, 6001);
  auto wv = w.view(8, 8);
  BufferMerge r = BufferMerge::apply(wv, nullptr, m);
  m = BufferMergeModule();
  CHECK(owner.use_count() == 2);
  r.remove(wv, nullptr);
  CHECK(owner.use_count() == 1);
}

TEST_CASE("buffer merge: records on different buffers work concurrently") {
  const Fixture fx = make_fixture(pm::ModuleKind::conv1d_gpt2, 300, 200, 16, 7000);
  const BufferMergeModule m = fx.module(true, false);
  constexpr int kThreads = 4;
  std::vector<Buffer> buffers, originals;
  for (int i = 0; i < kThreads; ++i) {
    buffers.push_back(random_buffer(i % 2 ? DType::BF16 : DType::F32, 300 * 200, 7100 + static_cast<uint32_t>(i)));
    originals.push_back(buffers.back());
  }
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      auto wv = buffers[static_cast<size_t>(i)].view(200, 300);
      bool good = true;
      for (int rep = 0; rep < 4; ++rep) {
        BufferMerge r = BufferMerge::apply(wv, nullptr, m, {.weight = 1.0 + rep, .keep_original_rows = true, .threads = 2});
        r.remove(wv, nullptr);
        good = good && same_bytes(buffers[static_cast<size_t>(i)], originals[static_cast<size_t>(i)]);
      }
      ok[static_cast<size_t>(i)] = good;
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) CHECK(ok[static_cast<size_t>(i)] == 1);
}

TEST_CASE("buffer merge: the bound that lets a refusing merge save no rows holds whenever it says so") {
  // Random weights and merge weights around each dtype's overflow: whenever lora_merge_stays_finite
  // answers yes, the merge without any check writes only finite values. Both answers must occur.
  const Fixture fx = make_fixture(pm::ModuleKind::linear, 16, 24, 2, 7100);
  const BufferMergeModule module = fx.module(false, false);
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> exponent(-3.0, 0.0);
  for (int t = 0; t < 3; ++t) {
    CAPTURE(dtype_name(kWeightDtypes[t]));
    int yes = 0, no = 0;
    for (int trial = 0; trial < 300; ++trial) {
      const double weight_scale = kLargestFinite[t] * std::pow(10.0, exponent(rng));  // 0.001x to 1x the largest
      const double merge_weight = kLargestFinite[t] * std::pow(10.0, exponent(rng)) / 8;
      Buffer w(kWeightDtypes[t], 16 * 24);
      const auto values = random_floats(w.size(), 900 + static_cast<uint32_t>(trial), 0.3f);
      for (size_t i = 0; i < w.size(); ++i) {
        const double v = std::clamp(values[i] * weight_scale, -kLargestFinite[t], kLargestFinite[t]);
        w.set(i, static_cast<float>(v));
      }
      auto wv = w.view(16, 24);
      const double coefficient = merge_weight * module.scaling;
      const bool stays_finite = peft::lora_merge_stays_finite(wv, module, coefficient);
      (stays_finite ? yes : no) += 1;
      BufferMergeOptions unchecked;
      unchecked.weight = merge_weight;
      BufferMerge::apply(wv, nullptr, module, unchecked);
      bool all_finite = true;
      for (size_t i = 0; i < w.size(); ++i) all_finite = all_finite && std::isfinite(w.get(i));
      if (stays_finite) REQUIRE(all_finite);
    }
    CHECK(yes > 20);
    CHECK(no > 20);
  }
  // Infinities and NaNs already present, in the weight, the factors or the coefficient: no.
  Buffer w(DType::F32, 16 * 24);
  auto wv = w.view(16, 24);
  CHECK(peft::lora_merge_stays_finite(wv, module, 1.0));
  w.set(5, std::numeric_limits<float>::infinity());
  CHECK_FALSE(peft::lora_merge_stays_finite(wv, module, 1.0));
  w.set(5, std::numeric_limits<float>::quiet_NaN());
  CHECK_FALSE(peft::lora_merge_stays_finite(wv, module, 1.0));
  w.set(5, 0.0f);
  CHECK_FALSE(peft::lora_merge_stays_finite(wv, module, std::numeric_limits<double>::infinity()));
  CHECK_FALSE(peft::lora_merge_stays_finite(wv, module, std::numeric_limits<double>::quiet_NaN()));
  Fixture bad = fx;
  bad.term.a[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(peft::lora_merge_stays_finite(wv, bad.module(false, false), 1.0));
}

TEST_CASE("buffer merge: the magnitude bound after a merge and after its removal holds, and a known one is not read again") {
  // Merges that cannot fail give a bound of |w| once in (largest_magnitude_after) and once out
  // again (largest_magnitude_after_remove); a host model passes them to the next merge instead of
  // reading the weight. Chains of merges and removals on weights from subnormal to near the largest,
  // every dtype: the bounds are never below the buffer's largest magnitude.
  const Fixture fx = make_fixture(pm::ModuleKind::linear, 16, 24, 2, 7200);
  const BufferMergeModule module = fx.module(false, false);
  std::mt19937 rng(13);
  std::uniform_real_distribution<double> exponent(-45.0, 0.0);
  auto largest_of = [](const Buffer& w) {
    double most = 0.0;
    for (size_t i = 0; i < w.size(); ++i) most = std::max(most, std::fabs(static_cast<double>(w.get(i))));
    return most;
  };
  for (int t = 0; t < 3; ++t) {
    CAPTURE(dtype_name(kWeightDtypes[t]));
    int bounded = 0;
    for (int trial = 0; trial < 200; ++trial) {
      const double weight_scale = kLargestFinite[t] * std::pow(2.0, exponent(rng) * (t == 2 ? 0.9 : 3.0));
      const double merge_weight = weight_scale * std::pow(2.0, exponent(rng) / 4);
      Buffer w(kWeightDtypes[t], 16 * 24);
      const auto values = random_floats(w.size(), 1900 + static_cast<uint32_t>(trial), 0.3f);
      for (size_t i = 0; i < w.size(); ++i) w.set(i, static_cast<float>(std::clamp(values[i] * weight_scale, -kLargestFinite[t], kLargestFinite[t])));
      auto wv = w.view(16, 24);
      BufferMergeOptions options;
      options.refuse_non_finite = true;
      options.weight = merge_weight;
      double bound = std::numeric_limits<double>::quiet_NaN();  // not known: read
      for (int step = 0; step < 4; ++step) {
        options.largest_magnitude = bound;
        BufferMerge record;
        try {
          record = BufferMerge::apply(wv, nullptr, module, options);
        } catch (const peft::Error& e) {
          CHECK(e.code() == PEFT_ERR_NON_FINITE);
          break;
        }
        bound = record.largest_magnitude_after();
        if (std::isnan(bound)) break;  // the merge could fail, so it saved rows: no bound
        ++bounded;
        REQUIRE(largest_of(w) <= bound);
        bound = record.largest_magnitude_after_remove(bound);
        record.remove(wv, nullptr);
        REQUIRE(largest_of(w) <= bound);
      }
    }
    CHECK(bounded > 100);
  }
  // A bound given is used instead of reading the weight: told that a weight holding its dtype's
  // largest values is small, the merge saves no rows and finds the infinity it was told could not
  // happen (INTERNAL); not told, it reads the weight, saves the rows and refuses (NON_FINITE, the
  // bytes put back).
  Buffer w(DType::F32, 16 * 24);
  for (size_t i = 0; i < w.size(); ++i) w.set(i, 3.4028234e38f);
  const Buffer w0 = w;
  auto wv = w.view(16, 24);
  BufferMergeOptions options;
  options.refuse_non_finite = true;
  options.weight = 1e36 / module.scaling;  // deltas far above the largest value's last bits, far below it
  CHECK(code_of([&] { BufferMerge::apply(wv, nullptr, module, options); }) == PEFT_ERR_NON_FINITE);
  CHECK(same_bytes(w, w0));
  options.largest_magnitude = 1.0;
  CHECK(code_of([&] { BufferMerge::apply(wv, nullptr, module, options); }) == PEFT_ERR_INTERNAL);
  // A bound too large to show that the merge cannot fail (a host model's after many swaps) is not
  // used: the weight is read, and the merge gives a bound of its own again.
  Buffer small = random_buffer(DType::F32, 16 * 24, 7300);
  auto sv = small.view(16, 24);
  BufferMergeOptions loose;
  loose.refuse_non_finite = true;
  loose.largest_magnitude = 3e38;
  const double after = BufferMerge::apply(sv, nullptr, module, loose).largest_magnitude_after();
  CHECK(after < 1e3);
}

TEST_CASE("buffer merge: a result that is not finite is refused and the buffers keep their bytes") {
  // A buffer holding its dtype's largest values and a large merge weight: plain LoRA, DoRA and
  // lora_bias, kept rows or not, every dtype. Without refuse_non_finite (the GGUF merge, which
  // checks by itself) the same merge writes infinities. (DoRA rescales each row to its magnitude,
  // so in F16 it stays finite: its check is in F32 and BF16, where the sum overflows before.)
  const Fixture fx = make_fixture(pm::ModuleKind::linear, 16, 24, 2, 6000);
  for (int t = 0; t < 3; ++t) {
    CAPTURE(dtype_name(kWeightDtypes[t]));
    Buffer w(kWeightDtypes[t], 16 * 24);
    const auto most = static_cast<float>(kLargestFinite[t]);
    for (size_t i = 0; i < w.size(); ++i) w.set(i, (i % 3 == 0) ? -most : most);
    Buffer b(kWeightDtypes[t], 16);
    for (size_t i = 0; i < b.size(); ++i) b.set(i, 0.5f);
    const Buffer w0 = w, b0 = b;
    auto wv = w.view(16, 24);
    auto bv = b.view(1, 16);
    for (bool dora : {false, true})
      for (bool bias : {false, true})
        for (bool keep : {false, true}) {
          if (dora && kWeightDtypes[t] == DType::F16) continue;
          CAPTURE(dora);
          CAPTURE(bias);
          CAPTURE(keep);
          BufferMergeOptions options;
          options.weight = kWeightDtypes[t] == DType::F16 ? 1e7 : 1e37;
          options.keep_original_rows = keep;
          options.refuse_non_finite = true;
          options.layer = "layers.0.q";
          try {
            BufferMerge::apply(wv, bias ? &bv : nullptr, fx.module(dora, bias), options);
            FAIL("merged");
          } catch (const peft::Error& e) {
            CHECK(e.code() == PEFT_ERR_NON_FINITE);
            CHECK(std::string(e.what()).find("\"layers.0.q\"") != std::string::npos);
          }
          CHECK(same_bytes(w, w0));
          CHECK(same_bytes(b, b0));
        }
    BufferMergeOptions finite;
    finite.refuse_non_finite = true;
    BufferMerge r = BufferMerge::apply(wv, nullptr, fx.module(false, false), finite);
    CHECK(r.saved_bytes() == 0);  // the originals were kept only while the merge ran
    r.remove(wv, nullptr);
    w = w0;
    BufferMergeOptions unchecked;
    unchecked.weight = kWeightDtypes[t] == DType::F16 ? 1e7 : 1e37;
    BufferMerge::apply(wv, nullptr, fx.module(false, false), unchecked);
    bool any_inf = false;
    for (size_t i = 0; i < w.size(); ++i) any_inf |= std::isinf(w.get(i));
    CHECK(any_inf);
  }
}

TEST_CASE("buffer merge: a fused weight merged slice by slice, each by its own module") {
  // Three experts' [8, 12] matrices one after another: slice e gets its own pair, the whole weight
  // equals the three merges done on separate buffers, and removal with kept rows gives the bytes back.
  const Fixture fx[] = {make_fixture(pm::ModuleKind::linear, 8, 12, 2, 7100),
                        make_fixture(pm::ModuleKind::linear, 8, 12, 2, 7200),
                        make_fixture(pm::ModuleKind::linear, 8, 12, 2, 7300)};
  BufferMergeModule fused;
  fused.layout = pm::DeltaLayout{24, 12, false};
  for (int64_t e = 0; e < 3; ++e)
    fused.slices.push_back({e * 8, std::make_shared<const BufferMergeModule>(fx[e].module(false, false))});
  Buffer w(DType::F32, 24 * 12);
  const auto values = random_floats(w.size(), 7400);
  for (size_t i = 0; i < w.size(); ++i) w.set(i, values[i]);
  const Buffer w0 = w;
  auto wv = w.view(24, 12);
  BufferMergeOptions options;
  options.keep_original_rows = true;
  BufferMerge record = BufferMerge::apply(wv, nullptr, fused, options);
  for (int64_t e = 0; e < 3; ++e) {
    Buffer one(DType::F32, 8 * 12);
    for (size_t i = 0; i < one.size(); ++i) one.set(i, values[static_cast<size_t>(e) * 96 + i]);
    auto ov = one.view(8, 12);
    BufferMerge::apply(ov, nullptr, fx[e].module(false, false), options);
    for (size_t i = 0; i < one.size(); ++i) CHECK(w.get(static_cast<size_t>(e) * 96 + i) == one.get(i));
  }
  CHECK(record.saved_rows() == 24);
  record.remove(wv, nullptr);
  CHECK(same_bytes(w, w0));

  // The last slice's result is not finite: the slices merged before it are put back, exactly.
  Buffer big(DType::F32, 24 * 12);
  for (size_t i = 0; i < big.size(); ++i) big.set(i, i < 16 * 12 ? values[i] : 3.4028234e38f);
  const Buffer big0 = big;
  auto bv = big.view(24, 12);
  BufferMergeOptions refuse;
  refuse.weight = 1e37;
  refuse.refuse_non_finite = true;
  CHECK(code_of([&] { BufferMerge::apply(bv, nullptr, fused, refuse); }) == PEFT_ERR_NON_FINITE);
  CHECK(same_bytes(big, big0));

  // A slice that does not fit the weight is refused before any byte changes.
  BufferMergeModule bad = fused;
  bad.slices[2].first_row = 20;
  CHECK(code_of([&] { BufferMerge::apply(wv, nullptr, bad, options); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(same_bytes(w, w0));
}
