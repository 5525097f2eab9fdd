// core/quant/bnb_4bit and bnb_int8: hand-computed values, the nibble order, short and zero blocks,
// and round trips of values the formats hold exactly. Bit-identity with the bitsandbytes package is
// tests/interop/test_bnb_quant.py.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/quant/bnb_4bit.hpp"
#include "core/quant/bnb_int8.hpp"

namespace bnb = peft::bnb;

TEST_CASE("bnb 4-bit: the first value of a byte is its high nibble, scaled by its block's absmax") {
  const auto code = bnb::four_bit_code(bnb::FourBit::nf4);
  const uint8_t packed[2] = {0xF0, 0x7F};
  const float absmax[2] = {2.0f, 0.5f};
  float out[3];
  bnb::dequantize_4bit(packed, absmax, code.data(), 2, 3, out);
  CHECK(out[0] == 2.0f);          // code[15] = 1
  CHECK(out[1] == -2.0f);         // code[0] = -1
  CHECK(out[2] == 0.0f);          // code[7] = 0, block 1
}

TEST_CASE("bnb 4-bit: values on the code grid survive a round trip; a short last block and a zero block") {
  for (auto type : {bnb::FourBit::nf4, bnb::FourBit::fp4}) {
    const auto code = bnb::four_bit_code(type);
    std::vector<float> values;
    for (int i = 0; i < 16; ++i) values.push_back(code[static_cast<size_t>(i)] * 3.0f);
    values[3] = 3.0f;  // make sure each block's absmax is 3 (FP4's table is not sorted)
    for (int i = 0; i < 8; ++i) values.push_back(0.0f);                       // a zero block
    for (int i = 0; i < 5; ++i) values.push_back(code[static_cast<size_t>(i)] * 3.0f);  // a short block
    values.back() = 3.0f;
    const uint64_t n = values.size(), blocksize = 8;
    std::vector<uint8_t> packed((n + 1) / 2);
    std::vector<float> absmax((n + blocksize - 1) / blocksize), back(n);
    bnb::quantize_4bit(values.data(), n, blocksize, type, packed.data(), absmax.data());
    CHECK(absmax[2] == 0.0f);
    bnb::dequantize_4bit(packed.data(), absmax.data(), code.data(), blocksize, n, back.data());
    for (uint64_t i = 0; i < n; ++i) CHECK(back[i] == values[i]);
  }
}

TEST_CASE("bnb 8-bit blockwise: a code value times the absmax comes back; a zero block gets index 0") {
  std::vector<float> code(256);
  for (int i = 0; i < 256; ++i) code[static_cast<size_t>(i)] = -1.0f + static_cast<float>(i) / 127.5f;
  const float values[6] = {code[10] * 4.0f, 4.0f, code[200] * 4.0f, 0.0f, 0.0f, 0.0f};
  uint8_t q[6];
  float absmax[2], back[6];
  bnb::quantize_blockwise(values, 6, 3, code.data(), q, absmax);
  CHECK(q[0] == 10);
  CHECK(q[2] == 200);
  CHECK(absmax[1] == 0.0f);
  CHECK(q[3] == 0);
  bnb::dequantize_blockwise(q, absmax, code.data(), 3, 3, back);
  CHECK(back[1] == code[255] * 4.0f);
}

TEST_CASE("bnb 8-bit blockwise: bitsandbytes' 65536-point table, not always the nearest code") {
  std::vector<float> code(256);
  for (int i = 0; i < 256; ++i) code[static_cast<size_t>(i)] = -1.0f + static_cast<float>(i) / 127.6f;  // midpoints off the table's grid
  // Just above a midpoint (so nearer the upper code) but with its table point below it: the lower code.
  int found = 0;
  for (size_t j = 1; j + 1 < 255 && found == 0; ++j) {
    const float mid = 0.5f * (code[j] + code[j + 1]);
    const float x = std::nextafter(mid, 2.0f);
    const float point = std::trunc(std::fma((x + 1.0f) * 0.5f, 65535.0f, 0.5f));
    if ((2.0f * point) / 65535.0f - 1.0f >= mid) continue;
    const float values[2] = {1.0f, x};
    uint8_t q[2];
    float absmax[1];
    bnb::quantize_blockwise(values, 2, 2, code.data(), q, absmax);
    CHECK(std::fabs(x - code[j + 1]) < std::fabs(x - code[j]));
    CHECK(q[1] == j);
    found = 1;
  }
  CHECK(found == 1);
}

TEST_CASE("torch mean: short and vector-wide inputs") {
  std::vector<float> ones(100, 0.5f);
  CHECK(bnb::torch_mean_f32(ones.data(), 3) == 0.5f);
  CHECK(bnb::torch_mean_f32(ones.data(), 100) == 0.5f);
  const float v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  CHECK(bnb::torch_mean_f32(v, 4) == 2.5f);
}

TEST_CASE("bnb int8: rows scaled by 127 / max |row|, zero rows stay zero") {
  const float values[6] = {1.0f, -0.5f, 0.25f, 0.0f, 0.0f, 0.0f};
  int8_t q[6];
  float scb[2], back[6];
  bnb::quantize_int8(values, 2, 3, q, scb);
  CHECK(scb[0] == 1.0f);
  CHECK(scb[1] == 0.0f);
  CHECK(q[0] == 127);
  CHECK(q[1] == -64);  // -63.5 rounds to even
  CHECK(q[2] == 32);   // 31.75
  CHECK(q[3] == 0);
  bnb::dequantize_int8(q, scb, 2, 3, back);
  CHECK(back[0] == (127.0f * 1.0f) * static_cast<float>(7.874015718698502e-3));
  CHECK(back[4] == 0.0f);
}

TEST_CASE("bnb 4-bit: a block size near 2^64 makes one block, not zero (the count does not wrap)") {
  CHECK(bnb::block_count(0, UINT64_MAX) == 0);
  CHECK(bnb::block_count(4, UINT64_MAX) == 1);
  CHECK(bnb::block_count(129, 64) == 3);
  const float values[4] = {0.5f, -2.0f, 1.0f, 0.0f};
  uint8_t packed[2];
  float absmax[1] = {-1.0f};
  bnb::quantize_4bit(values, 4, UINT64_MAX, bnb::FourBit::nf4, packed, absmax);
  CHECK(absmax[0] == 2.0f);
  CHECK((packed[0] & 0x0F) == 0);  // -2 / 2 = -1: code 0
}

TEST_CASE("bnb 8-bit blockwise: a zero in a block whose absmax is subnormal takes index 0 (bnb_state_fuzzer)") {
  // 1 / 1e-40 overflows to infinity, so the zero scales to 0 x inf = NaN, which took an undefined
  // float-to-int conversion before.
  std::vector<float> code(256);
  for (int i = 0; i < 256; ++i) code[static_cast<size_t>(i)] = -1.0f + static_cast<float>(i) / 127.5f;
  const float values[2] = {1e-40f, 0.0f};
  uint8_t q[2];
  float absmax[1];
  bnb::quantize_blockwise(values, 2, 2, code.data(), q, absmax);
  CHECK(absmax[0] == 1e-40f);
  CHECK(q[0] == 255);
  CHECK(q[1] == 0);
}
