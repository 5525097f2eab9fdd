// Plain LoRA merge math against reference loops: layouts, deltas of every module kind, merging
// into f32/bf16/f16 with one rounding, unmerge, weighted sums, lora_bias, errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.hpp"
#include "test_merge_math_support.hpp"

using namespace merge_test;
namespace pm = peft::merge;

namespace {

struct KindCase {
  const char* name;
  ModuleKind kind;
  std::vector<int64_t> weight, a, b;
};

// Odd sizes so that row tiles (4), column tiles (16/64) and blocks all have tails.
std::vector<KindCase> kind_cases(int64_t r) {
  return {
      {"linear", ModuleKind::linear, {37, 83}, {r, 83}, {37, r}},
      {"linear wide", ModuleKind::linear, {9, 1031}, {r, 1031}, {9, r}},
      {"conv1d_gpt2", ModuleKind::conv1d_gpt2, {83, 37}, {r, 83}, {37, r}},
      {"embedding", ModuleKind::embedding, {101, 19}, {r, 101}, {19, r}},
      {"conv1d k=3", ModuleKind::conv, {13, 7, 3}, {r, 7, 3}, {13, r, 1}},
      {"conv2d 1x1", ModuleKind::conv, {21, 11, 1, 1}, {r, 11, 1, 1}, {21, r, 1, 1}},
      {"conv2d 3x3", ModuleKind::conv, {17, 5, 3, 3}, {r, 5, 3, 3}, {17, r, 1, 1}},
      {"conv2d 3x2", ModuleKind::conv, {6, 4, 3, 2}, {r, 4, 3, 2}, {6, r, 1, 1}},
      {"conv3d 3x1x1", ModuleKind::conv, {5, 3, 3, 1, 1}, {r, 3, 3, 1, 1}, {5, r, 1, 1, 1}},
  };
}

size_t product(const std::vector<int64_t>& s) {
  size_t n = 1;
  for (auto d : s) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

TEST_CASE("merge math: layouts follow PEFT's module shapes") {
  const int64_t r = 4;
  for (const auto& c : kind_cases(r)) {
    CAPTURE(c.name);
    const pm::DeltaLayout l = pm::layout_for(c.kind, c.weight, c.a, c.b);
    CHECK(l.rows() * l.cols() == static_cast<int64_t>(product(c.weight)));
    CHECK(l.out == c.b[0]);
    CHECK(l.transposed == (c.kind == ModuleKind::conv1d_gpt2 || c.kind == ModuleKind::embedding));
  }
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const peft::Error& e) {
      return e.code();
    }
    return 0;
  };
  using S = std::vector<int64_t>;
  // Factor shapes that do not fit the weight.
  CHECK(code_of([&] { pm::layout_for(ModuleKind::linear, S{8, 6}, S{4, 8}, S{8, 4}); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::linear, S{8, 6}, S{4, 6}, S{8, 3}); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::conv1d_gpt2, S{8, 6}, S{4, 6}, S{8, 4}); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::embedding, S{10, 6}, S{4, 6}, S{10, 4}); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::conv, S{8, 6, 3, 3}, S{4, 6, 1, 1}, S{8, 4, 1, 1}); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::conv, S{8, 6, 3, 3}, S{4, 6, 3, 3}, S{8, 4, 3, 3}); }) ==
        PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::conv, S{8, 6}, S{4, 6}, S{8, 4}); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::linear, S{8, 0}, S{4, 0}, S{8, 4}); }) == PEFT_ERR_INVALID_ARGUMENT);
  // What PEFT cannot merge: grouped conv, and Conv3d with kernel (1, 1, k) (its 1x1 shortcut).
  CHECK(code_of([&] { pm::layout_for(ModuleKind::conv, S{8, 3, 3, 3}, S{4, 6, 3, 3}, S{8, 2, 1, 1}, 2); }) ==
        PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::conv, S{8, 6, 1, 1, 3}, S{4, 6, 1, 1, 3}, S{8, 4, 1, 1, 1}); }) ==
        PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { pm::layout_for(ModuleKind::conv, S{8, 6, 1, 1, 1}, S{4, 6, 1, 1, 1}, S{8, 4, 1, 1, 1}); }) ==
        PEFT_ERR_UNSUPPORTED);
  // Messages name the module.
  try {
    pm::layout_for(ModuleKind::linear, S{8, 6}, S{4, 8}, S{8, 4}, 1, "model.layers.0.q_proj");
    FAIL("expected an error");
  } catch (const peft::Error& e) {
    CHECK(std::string(e.what()).find("model.layers.0.q_proj") != std::string::npos);
  }
  CHECK(pm::lora_scaling(16, 8, false) == 2.0);
  CHECK(pm::lora_scaling(16, 4, true) == 8.0);
}

TEST_CASE("merge math: delta of every module kind matches its reference loop bit for bit") {
  for (int64_t r : {1, 3, 8, 17}) {
    for (const auto& c : kind_cases(r)) {
      CAPTURE(c.name);
      CAPTURE(r);
      const pm::DeltaLayout l = pm::layout_for(c.kind, c.weight, c.a, c.b);
      std::vector<Term> terms{random_term(r, product(c.a), product(c.b), 1.7, 11 + static_cast<uint32_t>(r))};
      const pm::LoraFactors f = terms[0].factors();
      const std::vector<float> got = pm::compute_delta(l, {&f, 1});
      const std::vector<float> want = reference_delta(c.kind, c.weight, terms);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
    }
  }
}

TEST_CASE("merge math: a delta built a slice of rows at a time equals the whole delta bit for bit") {
  for (int64_t r : {1, 8, 17}) {
    for (const auto& c : kind_cases(r)) {
      CAPTURE(c.name);
      CAPTURE(r);
      const pm::DeltaLayout l = pm::layout_for(c.kind, c.weight, c.a, c.b);
      std::vector<Term> terms{random_term(r, product(c.a), product(c.b), 0.9, 29 + static_cast<uint32_t>(r))};
      const pm::LoraFactors f = terms[0].factors();
      const std::vector<float> whole = pm::compute_delta(l, {&f, 1});
      for (int64_t slice : {int64_t{1}, int64_t{3}, l.rows()}) {
        std::vector<float> sliced(whole.size());
        for (int64_t row = 0; row < l.rows(); row += slice)
          pm::compute_delta_rows(l, {&f, 1}, row, std::min(slice, l.rows() - row), sliced.data() + row * l.cols());
        CHECK(std::memcmp(sliced.data(), whole.data(), whole.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("merge math: f32 delta is accurate") {
  const int64_t out = 29, in = 131, r = 16;
  std::vector<Term> terms{random_term(r, r * in, out * r, 0.37, 5), random_term(r, r * in, out * r, -1.25, 6)};
  std::vector<pm::LoraFactors> f{terms[0].factors(), terms[1].factors()};
  const auto got = pm::compute_delta(pm::layout_for(ModuleKind::linear, out, in), f);
  const auto exact = exact_delta_linear(out, in, terms);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - exact[i]));
    scale = std::max(scale, std::fabs(exact[i]));
  }
  CHECK(worst <= 1e-6 * scale);
}

TEST_CASE("merge math: merging rounds once into f32, bf16 and f16 for every kind") {
  const int64_t r = 5;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (const auto& c : kind_cases(r)) {
      CAPTURE(c.name);
      CAPTURE(peft::dtype_name(dtype));
      const pm::DeltaLayout l = pm::layout_for(c.kind, c.weight, c.a, c.b);
      std::vector<Term> terms{random_term(r, product(c.a), product(c.b), 0.75, 21)};
      const pm::LoraFactors f = terms[0].factors();
      Buffer w = random_buffer(dtype, product(c.weight), 3);
      Buffer want = w;
      const auto d = reference_delta(c.kind, c.weight, terms);
      for (size_t i = 0; i < want.size(); ++i) want.set(i, w.get(i) + d[i]);
      pm::add_delta(w.view(l.rows(), l.cols()), l, {&f, 1});
      CHECK(same_bytes(w, want));
      // Unmerge: one rounding of W - dW.
      Buffer back = w;
      for (size_t i = 0; i < back.size(); ++i) back.set(i, w.get(i) - d[i]);
      pm::subtract_delta(w.view(l.rows(), l.cols()), l, {&f, 1});
      CHECK(same_bytes(w, back));
    }
  }
}

TEST_CASE("merge math: one rounding where rounding the delta first would differ") {
  // W = 1 and dW = half an ulp of 1 plus a little: rounded once, W + dW is above the midpoint and
  // rounds up; rounding dW to the storage dtype first lands exactly on the midpoint (ties to even:
  // 1.0). bf16 ulp(1) = 2^-7, f16 ulp(1) = 2^-10.
  struct Case {
    DType dtype;
    float delta;
    float up;
  };
  for (const Case& c : {Case{DType::BF16, 0x1p-8f + 0x1p-16f, 1.0f + 0x1p-7f},
                        Case{DType::F16, 0x1p-11f + 0x1p-22f, 1.0f + 0x1p-10f}}) {
    CAPTURE(peft::dtype_name(c.dtype));
    const int64_t n = 40;
    std::vector<float> a(n, c.delta), b{1.0f};
    const pm::LoraFactors f{a.data(), b.data(), 1, 1.0};
    const pm::DeltaLayout l = pm::layout_for(ModuleKind::linear, 1, n);
    Buffer w(c.dtype, n);
    for (int64_t i = 0; i < n; ++i) w.set(static_cast<size_t>(i), 1.0f);
    pm::add_delta(w.view(1, n), l, {&f, 1});
    for (int64_t i = 0; i < n; ++i) CHECK(w.get(static_cast<size_t>(i)) == c.up);
    // Double rounding would have given 1.0:
    Buffer rounded_delta(c.dtype, 1);
    rounded_delta.set(0, c.delta);
    Buffer twice(c.dtype, 1);
    twice.set(0, 1.0f + rounded_delta.get(0));
    CHECK(twice.get(0) == 1.0f);

    // Two adapters of half that each: merged one at a time neither moves W; summed in one
    // rounding they do.
    std::vector<float> half(n, c.delta / 2);
    const pm::LoraFactors h{half.data(), b.data(), 1, 1.0};
    const pm::LoraFactors both[2] = {h, h};
    Buffer w2(c.dtype, n), w3(c.dtype, n);
    for (int64_t i = 0; i < n; ++i) w2.set(static_cast<size_t>(i), 1.0f), w3.set(static_cast<size_t>(i), 1.0f);
    pm::add_delta(w2.view(1, n), l, both);
    pm::add_delta(w3.view(1, n), l, {&h, 1});
    pm::add_delta(w3.view(1, n), l, {&h, 1});
    CHECK(w2.get(0) == c.up);
    CHECK(w3.get(0) == 1.0f);
  }
}

TEST_CASE("merge math: weighted sums of several adapters round once") {
  const int64_t out = 45, in = 70;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    CAPTURE(peft::dtype_name(dtype));
    // Different ranks and signs; coefficients are weight * scaling.
    std::vector<Term> terms{random_term(4, 4 * in, out * 4, 0.5 * 2.0, 31), random_term(8, 8 * in, out * 8, -0.25 * 4.0, 32),
                            random_term(2, 2 * in, out * 2, 1.5 * 0.125, 33)};
    std::vector<pm::LoraFactors> f;
    for (auto& t : terms) f.push_back(t.factors());
    const pm::DeltaLayout l = pm::layout_for(ModuleKind::linear, out, in);
    Buffer w = random_buffer(dtype, static_cast<size_t>(out * in), 9);
    Buffer want = w;
    const auto d = reference_delta(ModuleKind::linear, {out, in}, terms);
    for (size_t i = 0; i < want.size(); ++i) want.set(i, w.get(i) + d[i]);
    pm::add_delta(w.view(out, in), l, f);
    CHECK(same_bytes(w, want));
  }
}

TEST_CASE("merge math: lora_bias adds lora_B.bias * scaling rounded to f32 first") {
  const int64_t out = 33;
  const auto lb = random_floats(out, 41);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    CAPTURE(peft::dtype_name(dtype));
    Buffer bias = random_buffer(dtype, out, 42);
    const double s = 16.0 / 3.0;
    Buffer want = bias;
    for (int64_t j = 0; j < out; ++j) {
      const float p = lb[static_cast<size_t>(j)] * static_cast<float>(s);
      want.set(static_cast<size_t>(j), bias.get(static_cast<size_t>(j)) + p);
    }
    Buffer back = want;
    for (int64_t j = 0; j < out; ++j) {
      const float p = lb[static_cast<size_t>(j)] * static_cast<float>(s);
      back.set(static_cast<size_t>(j), want.get(static_cast<size_t>(j)) - p);
    }
    pm::add_lora_bias(bias.view(1, out), lb.data(), s);
    CHECK(same_bytes(bias, want));
    pm::add_lora_bias(bias.view(1, out), lb.data(), s, true);
    CHECK(same_bytes(bias, back));
  }
}

TEST_CASE("merge math: results do not depend on threads, blocks or buffer alignment") {
  // Large enough for many blocks and several threads.
  const int64_t out = 1000, in = 333, r = 12;
  for (ModuleKind kind : {ModuleKind::linear, ModuleKind::conv1d_gpt2}) {
    const pm::DeltaLayout l = pm::layout_for(kind, out, in);
    Term t = random_term(r, r * in, out * r, 0.3, 51);
    const pm::LoraFactors f = t.factors();
    const Buffer w0 = random_buffer(DType::BF16, static_cast<size_t>(out * in), 52);
    Buffer ref = w0;
    pm::ExecOptions one;
    one.threads = 1;
    pm::add_delta(ref.view(l.rows(), l.cols()), l, {&f, 1}, one);
    for (unsigned threads : {2u, 3u, 7u}) {
      Buffer w = w0;
      pm::ExecOptions exec;
      exec.threads = threads;
      pm::add_delta(w.view(l.rows(), l.cols()), l, {&f, 1}, exec);
      CHECK(same_bytes(w, ref));
    }
    // A buffer one byte off its element alignment (a view into a packed file) is staged.
    std::vector<unsigned char> packed(w0.bytes.size() + 1);
    std::memcpy(packed.data() + 1, w0.bytes.data(), w0.bytes.size());
    pm::add_delta({packed.data() + 1, DType::BF16, l.rows(), l.cols()}, l, {&f, 1});
    CHECK(std::memcmp(packed.data() + 1, ref.bytes.data(), ref.bytes.size()) == 0);
  }
}

TEST_CASE("merge math: a row sink gets the original bytes of exactly the rows that change") {
  const int64_t out = 300, in = 260, r = 3;
  const pm::DeltaLayout l = pm::layout_for(ModuleKind::linear, out, in);
  Term t = random_term(r, r * in, out * r, 1.0, 61);
  for (int64_t o = 0; o < out; o += 7)  // rows of B that are zero leave their weight rows alone
    for (int64_t k = 0; k < r; ++k) t.b[static_cast<size_t>(o * r + k)] = 0.0f;
  const pm::LoraFactors f = t.factors();
  const Buffer w0 = random_buffer(DType::F16, static_cast<size_t>(out * in), 62);
  Buffer w = w0;
  std::vector<int> seen(out, 0);
  bool bytes_ok = true;
  const pm::RowSink sink = [&](int64_t row, const void* bytes, size_t n) {
    seen[static_cast<size_t>(row)]++;
    bytes_ok = bytes_ok && n == static_cast<size_t>(in) * 2 &&
               std::memcmp(bytes, w0.bytes.data() + static_cast<size_t>(row) * n, n) == 0;
  };
  pm::ExecOptions exec;
  exec.row_sink = &sink;
  exec.threads = 2;
  pm::add_delta(w.view(out, in), l, {&f, 1}, exec);
  CHECK(bytes_ok);
  for (int64_t o = 0; o < out; ++o) {
    const bool changed = std::memcmp(w.bytes.data() + o * in * 2, w0.bytes.data() + o * in * 2, in * 2) != 0;
    CHECK(seen[static_cast<size_t>(o)] == (changed ? 1 : 0));
    if (o % 7 == 0) CHECK_FALSE(changed);
  }
}

TEST_CASE("merge math: merges on different buffers run concurrently") {
  const int64_t out = 257, in = 515, r = 16;
  const pm::DeltaLayout l = pm::layout_for(ModuleKind::linear, out, in);
  Term t = random_term(r, r * in, out * r, 0.5, 71);
  const pm::LoraFactors f = t.factors();
  std::vector<Buffer> buffers, expected;
  for (uint32_t i = 0; i < 6; ++i) {
    buffers.push_back(random_buffer(i % 2 ? DType::BF16 : DType::F16, static_cast<size_t>(out * in), 100 + i));
    expected.push_back(buffers.back());
    pm::add_delta(expected.back().view(out, in), l, {&f, 1});
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < buffers.size(); ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 3; ++rep) {
        pm::add_delta(buffers[i].view(out, in), l, {&f, 1});
        if (rep < 2) pm::subtract_delta(buffers[i].view(out, in), l, {&f, 1});
      }
    });
  for (auto& th : threads) th.join();
  // add/subtract round trips are not exact in 16 bits, so compare one fresh merge per buffer
  // with a sequential replay of the same sequence.
  for (size_t i = 0; i < buffers.size(); ++i) {
    Buffer replay = random_buffer(i % 2 ? DType::BF16 : DType::F16, static_cast<size_t>(out * in), 100 + static_cast<uint32_t>(i));
    for (int rep = 0; rep < 3; ++rep) {
      pm::add_delta(replay.view(out, in), l, {&f, 1});
      if (rep < 2) pm::subtract_delta(replay.view(out, in), l, {&f, 1});
    }
    CHECK(same_bytes(buffers[i], replay));
  }
}

TEST_CASE("merge math: bad arguments fail before anything is written") {
  const int64_t out = 8, in = 6, r = 2;
  const pm::DeltaLayout l = pm::layout_for(ModuleKind::linear, out, in);
  Term t = random_term(r, r * in, out * r, 1.0, 81);
  const pm::LoraFactors f = t.factors();
  Buffer w = random_buffer(DType::BF16, out * in, 82);
  const Buffer w0 = w;
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const peft::Error& e) {
      return e.code();
    }
    return 0;
  };
  CHECK(code_of([&] { pm::add_delta(w.view(in, out), l, {&f, 1}); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(code_of([&] { pm::add_delta({w.bytes.data(), DType::I32, out, in}, l, {&f, 1}); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { pm::add_delta({w.bytes.data(), DType::F8_E4M3, out, in}, l, {&f, 1}); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(code_of([&] { pm::add_delta({nullptr, DType::BF16, out, in}, l, {&f, 1}); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { pm::add_delta(w.view(out, in), l, {}); }) == PEFT_ERR_INVALID_ARGUMENT);
  pm::LoraFactors bad = f;
  bad.a = nullptr;
  CHECK(code_of([&] { pm::add_delta(w.view(out, in), l, {&bad, 1}); }) == PEFT_ERR_INVALID_ARGUMENT);
  bad = f;
  bad.rank = 0;
  CHECK(code_of([&] { pm::add_delta(w.view(out, in), l, {&bad, 1}); }) == PEFT_ERR_INVALID_ARGUMENT);
  const pm::DeltaLayout huge{int64_t(1) << 40, int64_t(1) << 40, false};
  CHECK(code_of([&] { pm::compute_delta(huge, {&f, 1}); }) == PEFT_ERR_VALIDATION_OVERFLOW);
  CHECK(code_of([&] { pm::add_lora_bias(w.view(2, 24), t.a.data(), 1.0); }) == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(same_bytes(w, w0));
}

TEST_CASE("merge math: largest_magnitude over many pieces and threads finds the one largest value") {
  // 4 MiB pieces: 2.5 pieces of F32 values, 2.5 and more of 16-bit ones, so the last piece is short.
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const size_t n = (size_t{5} << 20) / dtype_bytes(dt) + 3;
    Buffer w(dt, n);
    for (size_t i = 0; i < n; i += 4099) w.set(i, (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i % 97) / 97.0f);
    const pm::ConstWeightView view{w.bytes.data(), dt, 1, static_cast<int64_t>(n)};
    for (unsigned threads : {1u, 2u, 0u}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(threads);
      CHECK(pm::largest_magnitude(view, threads) == doctest::Approx(96.0 / 97.0).epsilon(0.01));
      for (size_t at : {size_t{0}, n / 2, n - 1}) {  // first piece, a middle one, the short last one
        CAPTURE(at);
        const float before = w.get(at);
        w.set(at, -3.5f);
        CHECK(pm::largest_magnitude(view, threads) == 3.5);
        w.set(at, INFINITY);
        CHECK(pm::largest_magnitude(view, threads) == INFINITY);
        w.set(at, std::nanf(""));
        CHECK(std::isnan(pm::largest_magnitude(view, threads)));
        CHECK(pm::holds_non_finite(view));
        w.set(at, before);
      }
    }
  }
}
