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
      // Q6_K's.
      const auto x16 = mixed_groups(groups, 16, 2000 + groups);
      std::vector<int8_t> L_ref(groups * 16), L(groups * 16, 0x55);
      std::vector<float> s_ref(groups), s(groups, -1.0f);
      scalar.qx_16(x16.data(), groups, L_ref.data(), s_ref.data());
      t->qx_16(x16.data(), groups, L.data(), s.data());
      CHECK(L == L_ref);
      CHECK(same_bits(s, s_ref));
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
