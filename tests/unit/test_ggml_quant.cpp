// core/quant/ggml_quant: the geometry every kernel writes and reads (no byte outside a row's
// ggml_rows_bytes), the refusals, hand-computed blocks, and round trips within each type's error.
// Bit-identity with ggml itself is tests/interop/ggml_quant_compare.cpp (ctest ggml_quants).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/quant/ggml_types.hpp"
#include "peft_c.h"
#include "test_error_support.hpp"

namespace {

using error_test::code_of;

struct Bound {
  const char* name;
  double relative_rms;  // of the round trip of N(0, 1) rows, against the rows' RMS
};
// Each bound is about twice what the format gives on these Gaussian rows (the ternary, 1-bit and
// 2-bit types keep little of Gaussian rows: they are meant for weights trained for them).
const Bound kQuantizable[] = {
    {"F32", 0.0},    {"F16", 5e-4},   {"BF16", 4e-3},  {"Q4_0", 0.18},    {"Q4_1", 0.16},  {"Q5_0", 0.09},
    {"Q5_1", 0.08},  {"Q8_0", 0.011}, {"Q2_K", 0.6},   {"Q3_K", 0.3},     {"Q4_K", 0.15},  {"Q5_K", 0.075},
    {"Q6_K", 0.036}, {"IQ4_NL", 0.15}, {"MXFP4", 0.24}, {"TQ1_0", 1.0},   {"TQ2_0", 1.0},
    {"NVFP4", 0.19}, {"Q1_0", 0.8},   {"Q2_0", 0.95},
};
const char* const kDequantizeOnly[] = {"Q8_K",   "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                       "IQ3_XXS", "IQ3_S",  "IQ1_S",   "IQ1_M"};

uint32_t id_of(const char* name) { return peft::ggml_type_by_name(name)->id; }

std::vector<float> gaussian(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

}  // namespace

TEST_CASE("ggml quant: rows take whole blocks of the type's size") {
  for (const auto& bound : kQuantizable) {
    const auto t = *peft::ggml_type_by_name(bound.name);
    CHECK(peft::ggml_rows_bytes(t.id, 3, 4 * t.block_size) == 3ull * 4 * t.type_size);
    CHECK(peft::ggml_rows_bytes(t.id, 0, 4 * t.block_size) == 0);
    if (t.block_size > 1) CHECK(code_of([&] { peft::ggml_rows_bytes(t.id, 1, t.block_size + 1); }) == PEFT_ERR_INVALID_ARGUMENT);
  }
  CHECK(peft::ggml_rows_bytes(id_of("Q4_K"), 2, 512) == 2 * 2 * 144);
  CHECK(code_of([] { peft::ggml_rows_bytes(4, 1, 32); }) == PEFT_ERR_INVALID_ARGUMENT);  // Q4_2, removed
  CHECK(code_of([] { peft::ggml_rows_bytes(id_of("Q8_0"), UINT64_MAX / 2, 64); }) == PEFT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("ggml quant: kernels write and read exactly ggml_rows_bytes") {
  for (const auto& bound : kQuantizable) {
    CAPTURE(bound.name);
    const auto t = *peft::ggml_type_by_name(bound.name);
    const uint64_t cols = 2 * t.block_size * (t.block_size == 1 ? 16 : 1);
    const uint64_t bytes = peft::ggml_rows_bytes(t.id, 3, cols);
    const auto values = gaussian(3 * cols, 7);
    std::vector<uint8_t> out(bytes + 64, 0xEE);
    peft::quantize_rows(t.id, values.data(), 3, cols, out.data());
    for (uint64_t i = bytes; i < out.size(); ++i) REQUIRE(out[i] == 0xEE);
    std::vector<float> back(3 * cols + 16, 12345.0f);
    peft::dequantize_rows(t.id, out.data(), 3, cols, back.data());
    for (uint64_t i = 3 * cols; i < back.size(); ++i) REQUIRE(back[i] == 12345.0f);
  }
  for (const char* name : kDequantizeOnly) {
    CAPTURE(name);
    const auto t = *peft::ggml_type_by_name(name);
    std::vector<uint8_t> blocks(2 * t.type_size, 0);
    std::vector<float> back(2 * t.block_size + 16, 12345.0f);
    peft::dequantize_rows(t.id, blocks.data(), 1, 2 * t.block_size, back.data());
    for (uint64_t i = 0; i < 2 * t.block_size; ++i) REQUIRE(back[i] == 0.0f);  // scale 0
    for (uint64_t i = 2 * t.block_size; i < back.size(); ++i) REQUIRE(back[i] == 12345.0f);
  }
}

TEST_CASE("ggml quant: round trips stay within each type's error") {
  const uint64_t cols = 1024;
  for (const auto& bound : kQuantizable) {
    CAPTURE(bound.name);
    const uint32_t id = id_of(bound.name);
    const auto values = gaussian(4 * cols, 11);
    std::vector<uint8_t> q(peft::ggml_rows_bytes(id, 4, cols));
    peft::quantize_rows(id, values.data(), 4, cols, q.data());
    std::vector<float> back(values.size());
    peft::dequantize_rows(id, q.data(), 4, cols, back.data());
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < values.size(); ++i) {
      err += (double(back[i]) - values[i]) * (double(back[i]) - values[i]);
      ref += double(values[i]) * values[i];
    }
    CHECK(std::sqrt(err / ref) <= bound.relative_rms);
    if (bound.relative_rms > 0.0) CHECK(err > 0.0);  // a lossy type that loses nothing is a broken test
    // A row of zeros comes back as zeros.
    const std::vector<float> zeros(cols, 0.0f);
    std::vector<uint8_t> qz(peft::ggml_rows_bytes(id, 1, cols));
    peft::quantize_rows(id, zeros.data(), 1, cols, qz.data());
    std::vector<float> backz(cols, 1.0f);
    peft::dequantize_rows(id, qz.data(), 1, cols, backz.data());
    for (float v : backz) REQUIRE(v == 0.0f);
  }
}

TEST_CASE("ggml quant: hand-computed blocks") {
  // Q4_0: d = 0.5 (f16 0x3800); byte j holds value j (low nibble) and value j + 16 (high nibble),
  // each (q - 8) x d.
  std::vector<uint8_t> q4_0(18);
  q4_0[0] = 0x00;
  q4_0[1] = 0x38;
  for (int j = 0; j < 16; ++j) q4_0[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> out(32);
  peft::dequantize_rows(id_of("Q4_0"), q4_0.data(), 1, 32, out.data());
  for (int j = 0; j < 16; ++j) {
    CHECK(out[j] == 0.5f * float(j - 8));
    CHECK(out[16 + j] == 0.5f * float(7 - j));
  }
  // Quantizing those values gives the block back: max |x| is -4 (value 0), so d = -4 / -8 = 0.5.
  std::vector<uint8_t> again(18);
  peft::quantize_rows(id_of("Q4_0"), out.data(), 1, 32, again.data());
  CHECK(again == q4_0);

  // Q8_0 of 0..31: d = 31 / 127, q = round(x / d).
  std::vector<float> ramp(32);
  for (int j = 0; j < 32; ++j) ramp[j] = float(j);
  std::vector<uint8_t> q8(34);
  peft::quantize_rows(id_of("Q8_0"), ramp.data(), 1, 32, q8.data());
  CHECK(static_cast<int8_t>(q8[2 + 31]) == 127);
  CHECK(static_cast<int8_t>(q8[2 + 0]) == 0);
  CHECK(static_cast<int8_t>(q8[2 + 16]) == 66);  // 16 x 127 / 31 = 65.55 -> 66

  // MXFP4: e = 127 gives d = 1/2, level 7 (doubled E2M1 12) is 6.0, level 9 is -0.5.
  std::vector<uint8_t> mx(17, 0);
  mx[0] = 127;
  mx[1] = 0x97;
  peft::dequantize_rows(id_of("MXFP4"), mx.data(), 1, 32, out.data());
  CHECK(out[0] == 6.0f);
  CHECK(out[16] == -0.5f);
  CHECK(out[1] == 0.0f);

  // Q8_K: f32 d = 0.25, q = -3 -> -0.75.
  std::vector<uint8_t> q8k(292, 0);
  const float d = 0.25f;
  std::memcpy(q8k.data(), &d, 4);
  q8k[4] = static_cast<uint8_t>(-3);
  std::vector<float> k(256);
  peft::dequantize_rows(id_of("Q8_K"), q8k.data(), 1, 256, k.data());
  CHECK(k[0] == -0.75f);
  CHECK(k[1] == 0.0f);
}

TEST_CASE("ggml quant: types without a kernel are refused, naming the type") {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> values(256);
  for (const char* name : {"Q8_1", "I8", "I32", "F64"}) {
    CAPTURE(name);
    const auto t = *peft::ggml_type_by_name(name);
    CHECK_FALSE(peft::ggml_can_dequantize(t.id));
    CHECK_FALSE(peft::ggml_can_quantize(t.id));
    try {
      peft::dequantize_rows(t.id, bytes.data(), 1, 256, values.data());
      FAIL("no error");
    } catch (const peft::Error& e) {
      CHECK(e.code() == PEFT_ERR_UNSUPPORTED);
      CHECK(std::string(e.what()).find(name) != std::string::npos);
    }
  }
  for (const char* name : kDequantizeOnly) {
    CAPTURE(name);
    const uint32_t id = id_of(name);
    CHECK(peft::ggml_can_dequantize(id));
    CHECK_FALSE(peft::ggml_can_quantize(id));
    CHECK(code_of([&] { peft::quantize_rows(id, values.data(), 1, 256, bytes.data()); }) == PEFT_ERR_UNSUPPORTED);
  }
  CHECK(code_of([&] { peft::dequantize_rows(4, bytes.data(), 1, 32, values.data()); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { peft::quantize_rows(id_of("Q4_K"), values.data(), 1, 100, bytes.data()); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
}
