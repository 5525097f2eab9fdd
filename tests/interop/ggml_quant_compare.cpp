// Compares peft_c's ggml quantizers and dequantizers (core/quant/ggml_quant.hpp) with ggml's own,
// linked from the llama.cpp reference build (scripts/llama-cpp.sh; libggml-base): bytes of
// quantize_rows against ggml_quantize_chunk without an importance matrix, and bits of
// dequantize_rows against the type's to_float (dequantize_row_*).
//
// Quantizers run on rows of many kinds (Gaussian at scales from 2^-30 to 2^30, all zero, denormal,
// huge, one outlier, negative only, constant, values on a grid of ties, random finite bit
// patterns, ...). Dequantizers run on blocks of random bytes (every scale a random f16, NaN and
// infinity included, compared bit for bit) and on the blocks the quantizers made.
//
// Usage: ggml_quant_compare [ROWS_PER_KIND]   exit status 0 when every comparison is equal; prints a
// line per type with the counts, and the first differences when there are any.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/quant/ggml_quant.hpp"
#include "core/quant/ggml_types.hpp"
#include "ggml.h"

// ggml-base exports Q8_K's dequantizer, which its type traits leave to the CPU backend (ggml-quants.h
// declares it with the block type; the symbol is the same).
extern "C" void dequantize_row_q8_K(const void* x, float* y, int64_t k);

namespace {

int failures = 0;

struct RowKind {
  const char* name;
  void (*fill)(std::mt19937_64& rng, float* row, int n);
};

float random_finite(std::mt19937_64& rng) {
  for (;;) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isfinite(f)) return f;
  }
}

void gaussian(std::mt19937_64& rng, float* row, int n, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < n; ++i) row[i] = normal(rng) * scale;
}

float random_scale(std::mt19937_64& rng) { return std::ldexp(1.0f, static_cast<int>(rng() % 61) - 30); }

const RowKind kKinds[] = {
    {"gaussian", [](std::mt19937_64& rng, float* row, int n) { gaussian(rng, row, n, random_scale(rng)); }},
    {"weights", [](std::mt19937_64& rng, float* row, int n) { gaussian(rng, row, n, 0.02f); }},
    {"zero", [](std::mt19937_64&, float* row, int n) { std::fill(row, row + n, 0.0f); }},
    {"signed_zero", [](std::mt19937_64& rng, float* row, int n) {
       for (int i = 0; i < n; ++i) row[i] = rng() & 1 ? -0.0f : 0.0f;
     }},
    {"denormal", [](std::mt19937_64& rng, float* row, int n) {
       for (int i = 0; i < n; ++i) {
         uint32_t bits = static_cast<uint32_t>(rng()) & 0x807FFFFFu;
         std::memcpy(&row[i], &bits, 4);
       }
     }},
    {"tiny", [](std::mt19937_64& rng, float* row, int n) { gaussian(rng, row, n, 1e-36f); }},
    {"huge", [](std::mt19937_64& rng, float* row, int n) {
       gaussian(rng, row, n, std::ldexp(1.0f, 100 + static_cast<int>(rng() % 27)));
     }},
    {"f16_edge", [](std::mt19937_64& rng, float* row, int n) {
       const float edges[] = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 1e5f};
       for (int i = 0; i < n; ++i) row[i] = edges[rng() % 8] * (1.0f + 0.001f * static_cast<float>(rng() % 3));
     }},
    {"outlier", [](std::mt19937_64& rng, float* row, int n) {
       gaussian(rng, row, n, 0.05f);
       row[rng() % n] = (rng() & 1 ? 1.0f : -1.0f) * std::ldexp(1.0f, static_cast<int>(rng() % 20));
     }},
    {"negative", [](std::mt19937_64& rng, float* row, int n) {
       gaussian(rng, row, n, random_scale(rng));
       for (int i = 0; i < n; ++i) row[i] = -std::fabs(row[i]);
     }},
    {"positive", [](std::mt19937_64& rng, float* row, int n) {
       gaussian(rng, row, n, random_scale(rng));
       for (int i = 0; i < n; ++i) row[i] = std::fabs(row[i]) + 1.0f;
     }},
    {"constant", [](std::mt19937_64& rng, float* row, int n) {
       const float v = random_finite(rng);
       std::fill(row, row + n, v);
     }},
    {"grid", [](std::mt19937_64& rng, float* row, int n) {
       const float step = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
       for (int i = 0; i < n; ++i) row[i] = step * (static_cast<float>(rng() % 33) - 16.0f) * 0.5f;
     }},
    {"sparse", [](std::mt19937_64& rng, float* row, int n) {
       gaussian(rng, row, n, 1.0f);
       for (int i = 0; i < n; ++i)
         if (rng() % 8 != 0) row[i] = 0.0f;
     }},
    {"uniform", [](std::mt19937_64& rng, float* row, int n) {
       std::uniform_real_distribution<float> u(-1.0f, 1.0f);
       for (int i = 0; i < n; ++i) row[i] = u(rng);
     }},
    {"random_bits", [](std::mt19937_64& rng, float* row, int n) {
       for (int i = 0; i < n; ++i) row[i] = random_finite(rng);
     }},
    {"mixed_magnitude", [](std::mt19937_64& rng, float* row, int n) {
       std::normal_distribution<float> normal(0.0f, 1.0f);
       for (int i = 0; i < n; ++i) row[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 41) - 20);
     }},
};

const uint32_t kQuantizable[] = {0, 1, 30, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 39, 40, 34, 35, 41, 42};
const uint32_t kDequantizable[] = {0,  1,  30, 2,  3,  6,  7,  8,  10, 11, 12, 13, 14, 15, 20,
                                   23, 39, 40, 34, 35, 41, 42, 16, 17, 22, 18, 21, 19, 29};

std::string type_name(uint32_t type) { return std::string(peft::ggml_type(type)->name); }

// Bitwise comparison of two float arrays; prints the first few differences.
size_t compare_floats(const char* what, uint32_t type, const float* ours, const float* theirs, size_t n, int block) {
  size_t differing = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &ours[i], 4);
    std::memcpy(&b, &theirs[i], 4);
    if (a != b && ++differing <= 3)
      std::fprintf(stderr, "  %s %s: value %zu (block %zu): peft_c %a (0x%08x), ggml %a (0x%08x)\n", what,
                   type_name(type).c_str(), i, i / block, ours[i], a, theirs[i], b);
  }
  return differing;
}

void dequantize_check(uint32_t type, const std::vector<uint8_t>& blocks, size_t values, const char* what,
                      size_t* compared, size_t* equal) {
  const auto t = *peft::ggml_type(type);
  const ggml_type_traits* traits = ggml_get_type_traits(static_cast<ggml_type>(type));
  std::vector<float> ours(values), theirs(values);
  peft::dequantize_rows(type, blocks.data(), 1, values, ours.data());
  if (type == 0) {
    std::memcpy(theirs.data(), blocks.data(), values * 4);  // ggml's F32 has no to_float: it is the identity
  } else if (type == 15) {
    dequantize_row_q8_K(blocks.data(), theirs.data(), static_cast<int64_t>(values));
  } else {
    if (!traits->to_float) {
      std::fprintf(stderr, "FAIL %s: ggml has no to_float\n", t.name.data());
      ++failures;
      return;
    }
    traits->to_float(blocks.data(), theirs.data(), static_cast<int64_t>(values));
  }
  const size_t differing = compare_floats(what, type, ours.data(), theirs.data(), values, t.block_size);
  *compared += values;
  *equal += values - differing;
  if (differing) ++failures;
}

void quantize_type(uint32_t type, int rows_per_kind) {
  const auto t = *peft::ggml_type(type);
  const int cols = 512;
  const size_t row_bytes = peft::ggml_rows_bytes(type, 1, cols);
  std::mt19937_64 rng(0x5eed0000u + type);
  size_t rows = 0, equal_rows = 0;
  std::vector<float> row(cols);
  std::vector<uint8_t> all_blocks;
  for (const RowKind& kind : kKinds) {
    size_t kind_differing = 0;
    std::vector<float> data(static_cast<size_t>(rows_per_kind) * cols);
    for (int r = 0; r < rows_per_kind; ++r) kind.fill(rng, data.data() + static_cast<size_t>(r) * cols, cols);
    std::vector<uint8_t> ours(row_bytes * rows_per_kind, 0xA5), theirs(row_bytes * rows_per_kind, 0x5A);
    peft::quantize_rows(type, data.data(), rows_per_kind, cols, ours.data());
    ggml_quantize_chunk(static_cast<ggml_type>(type), data.data(), theirs.data(), 0, rows_per_kind, cols, nullptr);
    for (int r = 0; r < rows_per_kind; ++r) {
      const uint8_t* a = ours.data() + r * row_bytes;
      const uint8_t* b = theirs.data() + r * row_bytes;
      ++rows;
      if (std::memcmp(a, b, row_bytes) == 0) {
        ++equal_rows;
        continue;
      }
      if (++kind_differing <= 2) {
        size_t at = 0;
        while (a[at] == b[at]) ++at;
        std::fprintf(stderr, "  quantize %s, %s row %d: byte %zu (block %zu, offset %zu): peft_c %02x, ggml %02x\n",
                     t.name.data(), kind.name, r, at, at / t.type_size, at % t.type_size, a[at], b[at]);
      }
    }
    all_blocks.insert(all_blocks.end(), theirs.begin(), theirs.end());
  }
  if (equal_rows != rows) ++failures;
  std::printf("%-7s quantize:   %zu/%zu rows of %d bit-identical to ggml_quantize_chunk\n", t.name.data(),
              equal_rows, rows, cols);
  // ggml's own blocks back to floats.
  size_t compared = 0, equal = 0;
  dequantize_check(type, all_blocks, all_blocks.size() / t.type_size * t.block_size, "dequantize (quantized)",
                   &compared, &equal);
  std::printf("%-7s dequantize: %zu/%zu values of quantized rows bit-identical to to_float\n", t.name.data(),
              equal, compared);
}

void dequantize_type(uint32_t type, int blocks) {
  const auto t = *peft::ggml_type(type);
  std::mt19937_64 rng(0xb10c0000u + type);
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks) * t.type_size);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  size_t compared = 0, equal = 0;
  dequantize_check(type, bytes, static_cast<size_t>(blocks) * t.block_size, "dequantize (random bytes)", &compared,
                   &equal);
  std::printf("%-7s dequantize: %zu/%zu values of %d random blocks bit-identical to to_float\n", t.name.data(), equal,
              compared, blocks);
}

}  // namespace

int main(int argc, char** argv) {
  const int rows_per_kind = argc > 1 ? std::atoi(argv[1]) : 200;
  try {
    for (uint32_t type : kQuantizable) {
      if (!peft::ggml_can_quantize(type)) {
        std::fprintf(stderr, "FAIL %s: no quantizer\n", type_name(type).c_str());
        ++failures;
        continue;
      }
      quantize_type(type, rows_per_kind);
    }
    for (uint32_t type : kDequantizable) {
      if (!peft::ggml_can_dequantize(type)) {
        std::fprintf(stderr, "FAIL %s: no dequantizer\n", type_name(type).c_str());
        ++failures;
        continue;
      }
      dequantize_type(type, 20000);
    }
  } catch (const peft::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (failures) {
    std::fprintf(stderr, "%d comparisons differ\n", failures);
    return 1;
  }
  std::printf("every comparison equal\n");
  return 0;
}
