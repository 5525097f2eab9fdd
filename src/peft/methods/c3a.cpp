// C3A (peft/tuners/c3a/layer.py get_delta_weight, utils.get_circulant_fast): the kernel
// [out / b, in / b, b] holds one circulant b x b block per (output block, input block):
//   dW[M b + i, N b + j] = float(kernel[M, N, (j - i) mod b]) / in
// PEFT builds the blocks with f32 FFTs (fft(ifft(eye) * fft(kernel)).real); its entries are the
// kernel's values up to the FFT's rounding. Here each entry is the kernel value itself (no
// arithmetic) divided by `in` in f32, i.e. the exact circulant; the bound between the two is in
// docs/peft-semantics.md (C3A). C3A has no scale; a merge weight other than 1 multiplies once.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

std::vector<float> c3a_delta(const MethodTensor& kernel, double weight, int64_t out, int64_t in,
                             std::string_view name) {
  const auto& s = kernel.shape;
  const bool ok = s.size() == 3 && s[2] >= 1 && s[0] * s[2] == out && s[1] * s[2] == in &&
                  static_cast<int64_t>(kernel.values.size()) == out * (in / s[2]);
  if (!ok)
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": c3a_kernel is " + shape_text(s) +
                                      ", the layer (" + std::to_string(out) + " x " + std::to_string(in) +
                                      ") needs [out / block_size, in / block_size, block_size]");
  const int64_t b = s[2], nin = s[1];
  const float divisor = static_cast<float>(in);  // base_layer.weight.size(-1), exact below 2^24
  std::vector<float> d(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o) {
    const int64_t mb = o / b, i = o % b;
    for (int64_t c = 0; c < in; ++c) {
      const int64_t nb = c / b, j = c % b;
      const float v = kernel.values[static_cast<size_t>((mb * nin + nb) * b + ((j - i + b) % b))];
      d[static_cast<size_t>(o * in + c)] = v / divisor;
    }
  }
  if (weight != 1.0) {
    const float w = static_cast<float>(weight);
    for (float& v : d) v = v * w;
  }
  return d;
}

}  // namespace peft::merge
