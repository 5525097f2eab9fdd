// core/quant/ggml_quant_k_lanes: every lane table this machine can run (portable, avx2, avx512) gives
// the scalar reference's bytes, sub-block by sub-block and for whole Q4_K / Q5_K / Q6_K rows, on rows
// mixing Gaussian, zero, constant, positive-only, denormal, huge, single-spike and non-finite
// sub-blocks, with sub-block counts that are and are not multiples of the lane width. The scalar
// reference itself is compared with ggml's libggml-base by tests/interop/ggml_quant_compare.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/kernel_level.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/quant/ggml_quant_k_lanes.hpp"
#include "core/quant/ggml_types.hpp"

namespace {

using peft::kernels::Level;
using peft::quant::KLanes;

// `groups` sub-blocks of `n` values, each of a kind drawn at random.
std::vector<float> mixed_groups(uint64_t groups, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> v(groups * static_cast<uint64_t>(n));
  for (uint64_t g = 0; g < groups; ++g) {
    float* x = v.data() + g * static_cast<uint64_t>(n);
    const auto kind = rng() % 10;
    for (int i = 0; i < n; ++i) {
      switch (kind) {
        case 0: x[i] = 0.0f; break;
        case 1: x[i] = 0.37f; break;                                        // constant
        case 2: x[i] = uniform(rng) + 0.5f; break;                          // positive only: min > 0
        case 3: x[i] = normal(rng) * 1e-39f; break;                         // denormals
        case 4: x[i] = normal(rng) * 1e30f; break;                          // huge: the sums overflow
        case 5: x[i] = i == 7 ? -2.5f : 0.0f; break;                        // one spike
        case 6: x[i] = i == 3 ? std::numeric_limits<float>::infinity() : normal(rng); break;
        case 7: x[i] = i == 5 ? std::numeric_limits<float>::quiet_NaN() : normal(rng); break;
        case 8: x[i] = static_cast<float>(static_cast<int>(rng() % 7) - 3); break;  // small integers
        default: x[i] = normal(rng) * 0.02f; break;                         // weight-like
      }
    }
  }
  return v;
}

const float kLowClampBlock[32] = {
    0.0868574157f, 0.933758795f, 0.545486629f, 3.0261302f,  1.68342483f,   5.99463224f, 0.127965778f,  2.01075506f,
    -3.54021668f,  0.0957596973f, 17.9702988f, 0.420038879f, 1.59599316f,  5.53439856f, 0.158667117f,  0.0248734225f,
    2.00713563f,   1.55146265f,  -0.648381948f, 0.752815545f, 13.4833803f, -0.540107846f, 4.53136349f,  4.82068205f,
    0.665424168f,  0.126475051f, 9.7848978f,   0.0794056132f, 4.05435658f,  0.0502258725f, 0.22541903f, 12.2737198f};

std::vector<const KLanes*> lane_tables() {
  std::vector<const KLanes*> tables;
  for (Level level : {Level::portable, Level::avx2, Level::avx512})
    if (const KLanes* t = peft::quant::k_lanes(level)) tables.push_back(t);
  return tables;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("ggml quant lanes: the portable table is always there; the active one is one of the tables") {
  REQUIRE(peft::quant::k_lanes(Level::portable) != nullptr);
  const std::string active = peft::quant::k_lanes_active().name;
  CHECK(active == peft::kernels::level_name(peft::kernels::chosen_level()));
  CHECK(std::string(peft::quant::k_lanes_scalar().name) == "scalar");
}

TEST_CASE("ggml quant lanes: sub-block searches equal the scalar reference bit for bit") {
  const KLanes& scalar = peft::quant::k_lanes_scalar();
  for (const KLanes* t : lane_tables()) {
    const std::string name = t->name;
    CAPTURE(name);
    for (uint64_t groups : {uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{33}, uint64_t{64}, uint64_t{301}}) {
      CAPTURE(groups);
      // Q4_K's and Q5_K's parameters.
      const auto x32 = mixed_groups(groups, 32, 1000 + groups);
      for (int variant = 0; variant < 2; ++variant) {
        const int nmax = variant == 0 ? 15 : 31;
        const float rmin = variant == 0 ? -1.0f : -0.5f;
        const int nstep = variant == 0 ? 20 : 15;
        std::vector<uint8_t> L_ref(groups * 32), L(groups * 32, 0xAB);
        std::vector<float> s_ref(groups), m_ref(groups), s(groups, -1.0f), m(groups, -1.0f);
        scalar.qkx2_32(x32.data(), groups, nmax, rmin, nstep, L_ref.data(), s_ref.data(), m_ref.data());
        t->qkx2_32(x32.data(), groups, nmax, rmin, nstep, L.data(), s.data(), m.data());
        CHECK(L == L_ref);
        CHECK(same_bits(s, s_ref));
        CHECK(same_bits(m, m_ref));
      }
      // A sub-block whose search takes a candidate with a min above its lowest value by more than
      // half a level, so that a later candidate's lowest level is below -0.5 before the clamp
      // (found by a random search over heavy-tailed sub-blocks), scaled by powers of two.
      std::vector<float> clamped(groups * 32);
      for (uint64_t g = 0; g < groups; ++g)
        for (int i = 0; i < 32; ++i) clamped[32 * g + i] = std::ldexp(kLowClampBlock[i], static_cast<int>(g % 5) - 2);
      std::vector<uint8_t> Lc_ref(groups * 32), Lc(groups * 32, 0xAB);
      std::vector<float> sc_ref(groups), mc_ref(groups), sc(groups, -1.0f), mc(groups, -1.0f);
      scalar.qkx2_32(clamped.data(), groups, 15, -1.0f, 20, Lc_ref.data(), sc_ref.data(), mc_ref.data());
      t->qkx2_32(clamped.data(), groups, 15, -1.0f, 20, Lc.data(), sc.data(), mc.data());
      CHECK(Lc == Lc_ref);
      CHECK(same_bits(sc, sc_ref));
      CHECK(same_bits(mc, mc_ref));
      // Q6_K's.
      const auto x16 = mixed_groups(groups, 16, 2000 + groups);
      std::vector<int8_t> L_ref(groups * 16), L(groups * 16, 0x55);
      std::vector<float> s_ref(groups), s(groups, -1.0f);
      scalar.qx_16(x16.data(), groups, L_ref.data(), s_ref.data());
      t->qx_16(x16.data(), groups, L.data(), s.data());
      CHECK(L == L_ref);
      CHECK(same_bits(s, s_ref));
      // Q4_K's and Q5_K's final levels, with scales and mins from tiny to huge (levels far out of
      // range, and NaN where x is), one sub-block at a time.
      std::mt19937_64 rng(groups);
      std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
      for (uint64_t g = 0; g < groups; ++g) {
        const float d = std::exp2(exponent(rng)), dm = (rng() % 2 ? 1.0f : -1.0f) * std::exp2(exponent(rng));
        const int nmax = g % 2 ? 15 : 31;
        uint8_t ref[32], got[32];
        std::memset(got, 0xAB, sizeof got);
        scalar.levels_32(x32.data() + 32 * g, d, dm, nmax, ref);
        t->levels_32(x32.data() + 32 * g, d, dm, nmax, got);
        CHECK(std::memcmp(ref, got, sizeof ref) == 0);
      }
    }
    // Quotients exactly halfway between two levels (ties to even), beyond nmax too; a scale whose
    // inverse is inexact, so that multiplying by it instead of dividing moves them off the tie.
    for (const float dm : {0.0f, 0.75f, -0.375f}) {
      const float d = 0.1875f;
      float x[32];
      for (int i = 0; i < 32; ++i) x[i] = (static_cast<float>(i % 18) + 0.5f) * d - dm;
      for (const int nmax : {15, 31}) {
        uint8_t ref[32], got[32];
        scalar.levels_32(x, d, dm, nmax, ref);
        t->levels_32(x, d, dm, nmax, got);
        CAPTURE(dm);
        CHECK(std::memcmp(ref, got, sizeof ref) == 0);
        CHECK(ref[1] == 2);  // 1.5 -> 2
        CHECK(ref[2] == 2);  // 2.5 -> 2
      }
    }
    // Quotients within a few units in the last place of a tie, where the rounding of the division
    // itself decides the level.
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> unit(0.01f, 1.0f);
    for (int round = 0; round < 200; ++round) {
      const float d = unit(rng), dm = unit(rng) - 0.5f;
      float x[32];
      for (int i = 0; i < 32; ++i) x[i] = (static_cast<float>(rng() % 16) + 0.5f) * d - dm;
      uint8_t ref[32], got[32];
      scalar.levels_32(x, d, dm, 15, ref);
      t->levels_32(x, d, dm, 15, got);
      CHECK(std::memcmp(ref, got, sizeof ref) == 0);
    }
  }
}

TEST_CASE("ggml quant lanes: Q4_K, Q5_K and Q6_K rows equal the scalar quantizers byte for byte") {
  using Quantize = void (*)(const KLanes&, const float*, uint8_t*, uint64_t);
  struct Type {
    const char* name;
    Quantize quantize;
    uint64_t block_bytes;
  };
  const Type types[] = {{"Q4_K", peft::quant::quantize_q4_k_with, 144},
                        {"Q5_K", peft::quant::quantize_q5_k_with, 176},
                        {"Q6_K", peft::quant::quantize_q6_k_with, 210}};
  const KLanes& scalar = peft::quant::k_lanes_scalar();
  for (const Type& type : types) {
    CAPTURE(type.name);
    // 37 super-blocks: two full chunks of 16 and a partial one. Sub-blocks of 16 values mixed, so
    // each super-block mixes kinds too.
    const uint64_t blocks = 37;
    const auto x = mixed_groups(blocks * 16, 16, 3000);
    std::vector<uint8_t> ref(blocks * type.block_bytes);
    type.quantize(scalar, x.data(), ref.data(), blocks);
    for (const KLanes* t : lane_tables()) {
      const std::string name = t->name;
      CAPTURE(name);
      std::vector<uint8_t> got(ref.size(), 0xEE);
      type.quantize(*t, x.data(), got.data(), blocks);
      CHECK(got == ref);
    }
    // quantize_rows (the active table) gives the same bytes.
    std::vector<uint8_t> rows(ref.size(), 0xEE);
    peft::quantize_rows(peft::ggml_type_by_name(type.name)->id, x.data(), 1, blocks * 256, rows.data());
    CHECK(rows == ref);
  }
}
