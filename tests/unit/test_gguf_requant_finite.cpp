// peft/merge/gguf_requant: the finiteness of Q8_0 / Q4_K / Q5_K / Q6_K outputs decided from
// the blocks' f16 scales (quantize_blocks with figures false) is the finiteness of the values read
// back through the dequantizers (figures true), on rows that store finite values and on rows with a
// value near 1e30, an infinity or a NaN; and the stored bytes are the same. Which of those store a
// non-finite value is ggml's quantizers' business (Q6_K stores finite values for all of them, the
// others an infinity or NaN for the huge value and the infinity); those that do are checked as such,
// so that the test sees both outcomes.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/quant/ggml_types.hpp"
#include "core/quant/ggml_quant.hpp"
#include "peft/merge/gguf_requant.hpp"

TEST_CASE("gguf requant: finiteness from the block scales equals the read-back one") {
  namespace id = peft::ggml_id;
  const uint64_t rows = 3, cols = 512;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  struct Case {
    const char* what;
    float value;  // written at one place of row 1 (0: none)
    bool finite;  // for Q8_0, Q4_K and Q5_K
  };
  const Case cases[] = {{"finite", 0.0f, true},
                        {"huge", 1e30f, false},
                        {"infinity", std::numeric_limits<float>::infinity(), false},
                        {"NaN", std::numeric_limits<float>::quiet_NaN(), true}};
  for (uint32_t type : {id::Q8_0, id::Q4_K, id::Q5_K, id::Q6_K}) {
    for (const Case& c : cases) {
      CAPTURE(type);
      CAPTURE(std::string(c.what));
      std::vector<float> x(rows * cols);
      for (float& v : x) v = normal(rng);
      if (c.value != 0.0f) x[cols + 300] = c.value;
      const uint64_t bytes = peft::ggml_rows_bytes(type, rows, cols);
      std::vector<uint8_t> by_scales(bytes), read_back(bytes);
      peft::StoreError a, b;
      peft::quantize_blocks(type, x.data(), rows, cols, by_scales.data(), 2, &a, false);
      peft::quantize_blocks(type, x.data(), rows, cols, read_back.data(), 2, &b, true);
      CHECK(by_scales == read_back);
      CHECK(a.finite == b.finite);
      if (type != id::Q6_K) CHECK(b.finite == c.finite);
      CHECK(a.values == rows * cols);
    }
  }
}

TEST_CASE("gguf requant: finiteness of float outputs from their stored bits equals the read-back one") {
  // F32, F16 and BF16 outputs (figures false) are judged from the stored values' exponent bits: a
  // value finite in f32 but beyond f16's or bf16's range is stored as an infinity and must be seen.
  namespace id = peft::ggml_id;
  const uint64_t rows = 3, cols = 5000;  // more than one 4096-value scan block per row
  struct Case {
    const char* what;
    float value;  // written at one place of row 2 (0: none)
    bool finite_f32, finite_f16, finite_bf16;
  };
  const Case cases[] = {{"finite", 0.0f, true, true, true},
                        {"beyond f16", 70000.0f, true, false, true},
                        {"beyond bf16", 3.4e38f, true, false, false},
                        {"infinity", std::numeric_limits<float>::infinity(), false, false, false},
                        {"NaN", std::numeric_limits<float>::quiet_NaN(), false, false, false}};
  for (uint32_t type : {id::F32, id::F16, id::BF16}) {
    for (const Case& c : cases) {
      CAPTURE(type);
      CAPTURE(std::string(c.what));
      std::vector<float> x(rows * cols, 0.25f);
      if (c.value != 0.0f) x[2 * cols + 4500] = c.value;
      const uint64_t bytes = peft::ggml_rows_bytes(type, rows, cols);
      std::vector<uint8_t> by_bits(bytes), read_back(bytes);
      peft::StoreError a, b;
      peft::quantize_blocks(type, x.data(), rows, cols, by_bits.data(), 2, &a, false);
      peft::quantize_blocks(type, x.data(), rows, cols, read_back.data(), 2, &b, true);
      CHECK(by_bits == read_back);
      CHECK(a.finite == b.finite);
      CHECK(a.finite == (type == id::F32 ? c.finite_f32 : type == id::F16 ? c.finite_f16 : c.finite_bf16));
      CHECK(a.values == rows * cols);
    }
  }
}
