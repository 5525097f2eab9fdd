#include "core/no_fp_contract.hpp"
#include "core/quant/bnb_4bit.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>


namespace peft::bnb {
namespace {

constexpr std::array<float, 16> kNf4 = {
    -0x1p+0f,        -0x1.647362p-1f, -0x1.0cd66p-1f,  -0x1.94654p-2f, -0x1.23449ap-2f, -0x1.7a6a7ep-3f,
    -0x1.74f0e2p-4f, 0.0f,            0x1.45f5fep-4f,  0x1.4995c6p-3f, 0x1.f809bap-3f,  0x1.5a0674p-2f,
    0x1.c3497p-2f,   0x1.200f56p-1f,  0x1.722766p-1f,  0x1p+0f};
constexpr std::array<float, 16> kFp4 = {
    0.0f,  0x1.555556p-8f,  0x1.555556p-1f,  1.0f,  0x1.555556p-2f,  0.5f,  0x1.555556p-3f,  0.25f,
    0.0f, -0x1.555556p-8f, -0x1.555556p-1f, -1.0f, -0x1.555556p-2f, -0.5f, -0x1.555556p-3f, -0.25f};

// The table sorted (stable, as torch.argsort gives for these tables: FP4's two zeros keep their
// order), and the 15 midpoints of neighbours in f32.
struct Bounds {
  std::array<uint8_t, 16> order{};
  std::array<float, 15> mid{};
  explicit Bounds(const std::array<float, 16>& code) {
    std::iota(order.begin(), order.end(), uint8_t{0});
    std::stable_sort(order.begin(), order.end(), [&](uint8_t a, uint8_t b) { return code[a] < code[b]; });
    for (size_t i = 0; i < 15; ++i) mid[i] = (code[order[i]] + code[order[i + 1]]) / 2.0f;
  }
  // torch.bucketize(x, mid, right=False): the number of midpoints strictly below x.
  uint8_t index(float x) const {
    size_t k = 0;
    while (k < 15 && mid[k] < x) ++k;
    return order[k];
  }
};

const Bounds& bounds(FourBit type) {
  static const Bounds nf4(kNf4), fp4(kFp4);
  return type == FourBit::nf4 ? nf4 : fp4;
}

uint64_t ceil_log2(uint64_t x) {
  if (x <= 1) return 0;
  return 64 - static_cast<uint64_t>(__builtin_clzll(x - 1));
}

// ATen's multi_row_sum + row_sum for one row of `size` elements of width `width` (1: scalars; lanes:
// vectors): 4 interleaved accumulators, each a cascade of 4 levels.
void row_sum(const float* x, uint64_t size, int width, float* out /* width */) {
  constexpr uint64_t ilp = 4, levels = 4;
  const uint64_t size_ilp = size / ilp;
  const uint64_t power = std::max<uint64_t>(4, ceil_log2(size_ilp) / levels);
  const uint64_t step = uint64_t{1} << power, mask0 = step - 1;
  std::vector<float> acc(levels * ilp * width, 0.0f);
  auto at = [&](uint64_t level, uint64_t k) { return acc.data() + (level * ilp + k) * width; };
  auto add_row = [&](uint64_t i) {
    for (uint64_t k = 0; k < ilp; ++k)
      for (int l = 0; l < width; ++l) at(0, k)[l] += x[(i * ilp + k) * width + l];
  };
  uint64_t i = 0;
  while (i + step <= size_ilp) {
    for (uint64_t j = 0; j < step; ++j, ++i) add_row(i);
    for (uint64_t j = 1; j < levels; ++j) {
      for (uint64_t k = 0; k < ilp; ++k)
        for (int l = 0; l < width; ++l) {
          at(j, k)[l] += at(j - 1, k)[l];
          at(j - 1, k)[l] = 0.0f;
        }
      if ((i & (mask0 << (j * power))) != 0) break;
    }
  }
  for (; i < size_ilp; ++i) add_row(i);
  for (uint64_t j = 1; j < levels; ++j)
    for (uint64_t k = 0; k < ilp; ++k)
      for (int l = 0; l < width; ++l) at(0, k)[l] += at(j, k)[l];
  for (uint64_t r = size_ilp * ilp; r < size; ++r)
    for (int l = 0; l < width; ++l) at(0, 0)[l] += x[r * width + l];
  for (uint64_t k = 1; k < ilp; ++k)
    for (int l = 0; l < width; ++l) at(0, 0)[l] += at(0, k)[l];
  std::copy(at(0, 0), at(0, 0) + width, out);
}

}  // namespace

std::span<const float, 16> four_bit_code(FourBit type) {
  return type == FourBit::nf4 ? std::span<const float, 16>(kNf4) : std::span<const float, 16>(kFp4);
}

void cpu_dequantize_code(FourBit type, uint64_t last_dim, uint64_t blocksize, float* code) {
  const bool native = last_dim % 2 == 0 && blocksize < 2048;       // else bitsandbytes' torch fallback
  const bool avx512 = last_dim % 16 == 0 && blocksize >= 16;        // the native kernel's AVX-512 branch
  if (type == FourBit::fp4 && native && !avx512) code[8] = -0.0f;  // its scalar branch's table
}

void dequantize_4bit(const uint8_t* packed, const float* absmax, const float* code, uint64_t blocksize,
                     uint64_t count, float* values) {
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t index = (i % 2 == 0) ? byte >> 4 : byte & 0x0F;
    values[i] = code[index] * absmax[i / blocksize];
  }
}

void quantize_4bit(const float* values, uint64_t count, uint64_t blocksize, FourBit type, uint8_t* packed,
                   float* absmax) {
  const Bounds& b = bounds(type);
  const uint64_t blocks = block_count(count, blocksize);
  std::fill(packed, packed + (count + 1) / 2, uint8_t{0});
  for (uint64_t k = 0; k < blocks; ++k) {
    const uint64_t begin = k * blocksize, end = std::min(count, begin + blocksize);
    float m = 0.0f;
    for (uint64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(values[i]));
    absmax[k] = m;
    const float clamped = std::max(m, 1e-38f);
    const bool full = end - begin == blocksize;
    const float reciprocal = 1.0f / clamped;
    for (uint64_t i = begin; i < end; ++i) {
      const float scaled = std::clamp(full ? values[i] * reciprocal : values[i] / clamped, -1.0f, 1.0f);
      const uint8_t index = b.index(scaled);
      packed[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? index << 4 : index);
    }
  }
  if (count % 2 == 1) packed[count / 2] |= b.index(0.0f);  // the zero padding's index
}

void dequantize_blockwise(const uint8_t* q, const float* absmax, const float* code, uint64_t blocksize,
                          uint64_t count, float* values) {
  for (uint64_t i = 0; i < count; ++i) values[i] = code[q[i]] * absmax[i / blocksize];
}

void quantize_blockwise(const float* values, uint64_t count, uint64_t blocksize, const float* code, uint8_t* q,
                        float* absmax) {
  // The table: 65536 points of [-1, 1], each the index of its nearest code (the number of midpoints of
  // neighbouring codes strictly below it).
  constexpr int kPoints = 65536;
  std::array<float, 255> mid;
  for (size_t i = 0; i < mid.size(); ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
  std::vector<uint8_t> table(kPoints);
  size_t k = 0;
  for (int i = 0; i < kPoints; ++i) {
    const float point = (2.0f * static_cast<float>(i)) / static_cast<float>(kPoints - 1) - 1.0f;
    while (k < mid.size() && mid[k] < point) ++k;
    table[static_cast<size_t>(i)] = static_cast<uint8_t>(k);
  }
  const uint64_t blocks = block_count(count, blocksize);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t begin = b * blocksize, end = std::min(count, begin + blocksize);
    float m = 0.0f;
    for (uint64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(values[i]));  // NaN skipped
    absmax[b] = m;
    if (m == 0.0f) {
      std::fill(q + begin, q + end, uint8_t{0});
      continue;
    }
    const float inverse = 1.0f / m;
    for (uint64_t i = begin; i < end; ++i) {
      const float x = std::clamp(values[i] * inverse, -1.0f, 1.0f);
      const float point = std::fma((x + 1.0f) * 0.5f, static_cast<float>(kPoints - 1), 0.5f);
      // A NaN here is 0 x inf: a zero in a block whose absmax is so small (subnormal) that 1 / absmax
      // overflows. It takes table[0], the entry of what x86's truncating conversion makes of a NaN
      // (0x80000000, low 16 bits 0); converting a NaN to an integer is undefined in C++.
      q[i] = std::isnan(point) ? table[0] : table[static_cast<uint16_t>(static_cast<int32_t>(point))];
    }
  }
}

float torch_mean_f32(const float* values, uint64_t count, int lanes) {
  float sum = 0.0f;
  if (count < static_cast<uint64_t>(lanes)) {
    row_sum(values, count, 1, &sum);
  } else {
    const uint64_t vectors = count / static_cast<uint64_t>(lanes);
    std::vector<float> partial(static_cast<size_t>(lanes));
    row_sum(values, vectors, lanes, partial.data());
    float acc = 0.0f;
    for (uint64_t k = vectors * static_cast<uint64_t>(lanes); k < count; ++k) acc += values[k];
    for (float p : partial) acc += p;
    sum = acc;
  }
  sum = 0.0f + sum;
  return sum / static_cast<float>(count);
}

}  // namespace peft::bnb
