// core/quant/fp8_block: the e4m3fn rounding (nearest, ties to even, saturating), the block geometry
// with partial edge blocks, transformers' scale choice (amax / 448 as 1 / ((1 / amax) * 448), 1 for
// a zero block), the refusal of infinities and NaNs, and round trips within half an e4m3 ulp at the block
// scale. The same rule against a numpy model and transformers' own quantizer is
// tests/interop/test_fp8_merge.py.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/f8.hpp"
#include "core/quant/fp8_block.hpp"
#include "peft_c.h"
#include "test_error_support.hpp"

namespace {

using error_test::code_of;

float e4m3(uint8_t code) { return peft::f8_to_f32(peft::DType::F8_E4M3, code); }

}  // namespace

TEST_CASE("fp8 block: every finite e4m3fn value encodes to its own code") {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    CAPTURE(code);
    CHECK(peft::f32_to_e4m3_saturating(e4m3(static_cast<uint8_t>(code))) == code);
  }
}

TEST_CASE("fp8 block: halfway values round to the even code, others to the nearest") {
  for (int code = 0; code < 0x7E; ++code) {  // positive codes and the one above each
    const float lo = e4m3(static_cast<uint8_t>(code)), hi = e4m3(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;  // exact: both have at most 4 significant bits
    CAPTURE(code);
    const int even = code % 2 == 0 ? code : code + 1;
    CHECK(peft::f32_to_e4m3_saturating(mid) == even);
    CHECK(peft::f32_to_e4m3_saturating(-mid) == (0x80 | even));
    CHECK(peft::f32_to_e4m3_saturating(std::nextafter(mid, 0.0f)) == code);
    CHECK(peft::f32_to_e4m3_saturating(std::nextafter(mid, 1e9f)) == code + 1);
  }
  CHECK(peft::f32_to_e4m3_saturating(std::ldexp(1.0f, -10)) == 0x00);  // half the smallest subnormal: to 0
  CHECK(peft::f32_to_e4m3_saturating(std::ldexp(3.0f, -11)) == 0x01);
  CHECK(peft::f32_to_e4m3_saturating(-0.0f) == 0x80);
}

TEST_CASE("fp8 block: values beyond 448 saturate instead of becoming NaN") {
  CHECK(peft::f32_to_e4m3_saturating(448.0f) == 0x7E);
  CHECK(peft::f32_to_e4m3_saturating(464.0f) == 0x7E);  // halfway to 512, which e4m3fn lacks
  CHECK(peft::f32_to_e4m3_saturating(1e30f) == 0x7E);
  CHECK(peft::f32_to_e4m3_saturating(-std::numeric_limits<float>::infinity()) == 0xFE);
  CHECK(peft::f32_to_e4m3_saturating(std::numeric_limits<float>::max()) == 0x7E);
}

TEST_CASE("fp8 block: scales per block, partial edge blocks, zero blocks get scale 1") {
  // 5 x 7 in blocks of 2 x 3: scales 3 x 3, the last block row 1 high, the last block column 1 wide.
  peft::Fp8BlockLayout layout;
  layout.rows = 5;
  layout.cols = 7;
  layout.block_rows = 2;
  layout.block_cols = 3;
  REQUIRE(layout.scale_rows() == 3);
  REQUIRE(layout.scale_cols() == 3);
  std::vector<float> w(35, 0.0f);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 7; ++c) w[r * 7 + c] = (r < 2 && c < 3) ? 0.0f : 0.01f * float(r * 7 + c) - 0.1f;
  w[4 * 7 + 6] = -3.5f;  // the bottom-right 1 x 1 block
  std::vector<uint8_t> q(35);
  std::vector<float> s(9);
  peft::fp8_block_quantize(layout, w.data(), q.data(), s.data(), "test");
  CHECK(s[0] == 1.0f);  // the all-zero block: transformers keeps scale 1
  for (int k = 0; k < 6; ++k) CHECK(q[(k / 3) * 7 + k % 3] == 0);
  CHECK(s[8] == 1.0f / ((1.0f / 3.5f) * 448.0f));
  CHECK(q[4 * 7 + 6] == 0xFE);  // its amax maps to -448
  for (int br = 0; br < 3; ++br)
    for (int bc = 0; bc < 3; ++bc) {
      float amax = 0;
      for (int r = br * 2; r < std::min(5, br * 2 + 2); ++r)
        for (int c = bc * 3; c < std::min(7, bc * 3 + 3); ++c) amax = std::max(amax, std::fabs(w[r * 7 + c]));
      CAPTURE(br);
      CAPTURE(bc);
      CHECK(s[br * 3 + bc] == (amax > 0 ? 1.0f / ((1.0f / amax) * 448.0f) : 1.0f));
    }
  std::vector<float> back(35);
  peft::fp8_block_dequantize(layout, q.data(), s.data(), back.data());
  for (int i = 0; i < 35; ++i) {
    const int block = (i / 7 / 2) * 3 + (i % 7) / 3;
    CHECK(back[i] == e4m3(q[i]) * s[block]);
  }
}

TEST_CASE("fp8 block: a block of values too small for 448 / amax gets scale 1") {
  peft::Fp8BlockLayout layout;
  layout.rows = 1;
  layout.cols = 2;
  layout.block_rows = layout.block_cols = 2;
  const float w[2] = {1e-40f, -1e-41f};  // 448 / 1e-40 overflows f32
  uint8_t q[2];
  float s[1];
  peft::fp8_block_quantize(layout, w, q, s, "test");
  CHECK(s[0] == 1.0f);
  CHECK(q[0] == 0x00);
  CHECK(q[1] == 0x80);
}

TEST_CASE("fp8 block: infinities and NaNs are refused with NON_FINITE") {
  peft::Fp8BlockLayout layout;
  layout.rows = 2;
  layout.cols = 2;
  layout.block_rows = layout.block_cols = 1;
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    const float w[4] = {1.0f, 2.0f, bad, 4.0f};
    uint8_t q[4];
    float s[4];
    CHECK(code_of([&] { peft::fp8_block_quantize(layout, w, q, s, "weight \"x\""); }) == PEFT_ERR_NON_FINITE);
    try {
      peft::fp8_block_quantize(layout, w, q, s, "weight \"x\"");
    } catch (const peft::Error& e) {
      CHECK(std::string(e.what()).find("weight \"x\"") != std::string::npos);
      CHECK(std::string(e.what()).find("element 2") != std::string::npos);
    }
  }
}

TEST_CASE("fp8 block: round trips are within half an e4m3 ulp at the block scale, batched") {
  peft::Fp8BlockLayout layout;
  layout.batch = 3;
  layout.rows = 37;
  layout.cols = 45;
  layout.block_rows = 16;
  layout.block_cols = 8;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(layout.elements());
  for (float& v : w) v = normal(rng) * 0.02f;
  std::vector<uint8_t> q(w.size());
  std::vector<float> s(layout.scales());
  peft::fp8_block_quantize(layout, w.data(), q.data(), s.data(), "test");
  std::vector<float> back(w.size());
  peft::fp8_block_dequantize(layout, q.data(), s.data(), back.data());
  for (uint64_t i = 0; i < w.size(); ++i) {
    const uint64_t m = i / (37 * 45), r = i / 45 % 37, c = i % 45;
    const double scale = s[(m * layout.scale_rows() + r / 16) * layout.scale_cols() + c / 8];
    const double x = std::fabs(double(w[i])) / scale;  // the value in e4m3 units
    const double half_ulp = x < std::ldexp(1.0, -6) ? std::ldexp(1.0, -10) : std::ldexp(1.0, std::ilogb(x) - 4);
    CAPTURE(i);
    CHECK(std::fabs(double(back[i]) - double(w[i])) <= half_ulp * scale * (1 + 1e-6));
  }
}
