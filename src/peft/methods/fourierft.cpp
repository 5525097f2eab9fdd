// FourierFT (peft/tuners/fourierft/layer.py, FourierFTLayer.update_layer and get_delta_weight):
// the n spectrum entries sit at the first n positions of torch.randperm(out * in) drawn from a CPU
// generator seeded with random_loc_seed (row = index / in, column = index % in), and
// dW = ifft2(dense spectrum).real * scaling.
//
// torch.randperm on the CPU (aten/src/ATen/native/TensorFactories.cpp, randperm_cpu) swaps
// r[i] with r[i + z], z = generator->random() % (n - i), for i = 0..n-2, where random() is the next
// 32-bit output of mt19937 seeded with the low 32 bits of the seed (at::mt19937, the standard
// engine); for n >= 2^32 / 20 it switches to another algorithm, which is refused here.
//
// The inverse transform is computed in f64 straight from its definition, one nonzero row at a time:
//   X[p, q] = 1/(out * in) * sum over entries (j, k, s) of s * cos(2 pi (j p / out + k q / in)),
// with exact integer reduction of the angles, then rounded to f32 and multiplied by float(scaling)
// in f32 as torch does. torch's f32 pocketfft result differs from the exact value by its own
// rounding (see docs/peft-semantics.md for the bound the tests check).
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>
#include <map>
#include <numbers>
#include <random>

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

std::vector<int64_t> torch_randperm(int64_t n, int64_t seed, int64_t count) {
  constexpr int64_t kLimit = int64_t{0xffffffff} / 20;  // std::numeric_limits<uint32_t>::max() / 20
  if (n < 1 || n >= kLimit)
    fail(PEFT_ERR_UNSUPPORTED, "torch.randperm(" + std::to_string(n) +
                                   "): only sizes from 1 to " + std::to_string(kLimit - 1) +
                                   " are reproduced (larger ones use another algorithm)");
  if (count < 0 || count > n) fail(PEFT_ERR_INVALID_ARGUMENT, "randperm: count out of range");
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  std::mt19937 engine(static_cast<uint32_t>(static_cast<uint64_t>(seed)));
  // Only the first `count` places are needed: place i is final once step i has run.
  const int64_t steps = std::min(count, n - 1);
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t z = static_cast<int64_t>(engine() % static_cast<uint64_t>(n - i));
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(z + i)]);
  }
  r.resize(static_cast<size_t>(count));
  return r;
}

std::vector<float> fourierft_delta(const MethodTensor& spectrum, int64_t seed, double scale, int64_t out, int64_t in,
                                   std::string_view name) {
  const int64_t n = spectrum.shape.size() == 1 ? spectrum.shape[0] : -1;
  if (n < 1 || n > out * in || static_cast<int64_t>(spectrum.values.size()) != n)
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": fourierft_spectrum is " +
                                      shape_text(spectrum.shape) + ", the layer needs [n] with 1 <= n <= " +
                                      std::to_string(out * in));
  const std::vector<int64_t> positions = torch_randperm(out * in, seed, n);
  // The entries of each row of the dense spectrum, rows in increasing order.
  std::map<int64_t, std::vector<std::pair<int64_t, double>>> rows;
  for (int64_t e = 0; e < n; ++e) {
    const int64_t idx = positions[static_cast<size_t>(e)];
    rows[idx / in].emplace_back(idx % in, static_cast<double>(spectrum.values[static_cast<size_t>(e)]));
  }
  auto table = [](int64_t size, bool sine) {
    std::vector<double> t(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) {
      const double angle = 2.0 * std::numbers::pi * static_cast<double>(i) / static_cast<double>(size);
      t[static_cast<size_t>(i)] = sine ? std::sin(angle) : std::cos(angle);
    }
    return t;
  };
  const std::vector<double> cos_in = table(in, false), sin_in = table(in, true);
  const std::vector<double> cos_out = table(out, false), sin_out = table(out, true);
  // Row transform: R_j[q] = sum_k s * e^{2 pi i k q / in}, for each row j holding entries.
  std::vector<int64_t> row_index;
  std::vector<double> re, im;
  for (const auto& [j, entries] : rows) {
    row_index.push_back(j);
    const size_t base = re.size();
    re.resize(base + static_cast<size_t>(in), 0.0);
    im.resize(base + static_cast<size_t>(in), 0.0);
    for (const auto& [k, s] : entries)
      for (int64_t q = 0; q < in; ++q) {
        const size_t t = static_cast<size_t>((k * q) % in);
        re[base + static_cast<size_t>(q)] += s * cos_in[t];
        im[base + static_cast<size_t>(q)] += s * sin_in[t];
      }
  }
  // Column transform, real part: X[p, q] = sum_j cos(2 pi j p / out) Re R_j[q] - sin(...) Im R_j[q].
  const double norm = 1.0 / (static_cast<double>(out) * static_cast<double>(in));
  const float sc = static_cast<float>(scale);
  std::vector<float> d(static_cast<size_t>(out * in));
  std::vector<double> acc(static_cast<size_t>(in));
  for (int64_t p = 0; p < out; ++p) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (size_t r = 0; r < row_index.size(); ++r) {
      const size_t t = static_cast<size_t>((row_index[r] * p) % out);
      const double c = cos_out[t], s = sin_out[t];
      const double* rr = re.data() + r * static_cast<size_t>(in);
      const double* ri = im.data() + r * static_cast<size_t>(in);
      for (int64_t q = 0; q < in; ++q) acc[static_cast<size_t>(q)] += c * rr[q] - s * ri[q];
    }
    for (int64_t q = 0; q < in; ++q) {
      const float x = static_cast<float>(acc[static_cast<size_t>(q)] * norm);  // ifft2(...).real, f32
      d[static_cast<size_t>(p * in + q)] = x * sc;
    }
  }
  return d;
}

}  // namespace peft::merge
