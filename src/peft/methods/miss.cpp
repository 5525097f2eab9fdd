// MiSS (peft/tuners/miss/layer.py, MissLinear.merge): get_delta_weight_miss adds the block to every
// r-column block of the weight; the "bat" form's get_delta_weight multiplies each r x r block of the
// weight by the block of its output rows and adds that block.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

namespace {

[[noreturn]] void refuse(std::string_view name, const std::string& what) {
  fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": " + what);
}

}  // namespace

std::vector<float> miss_delta(const MethodTensor& block, int64_t mini_r, bool bat, const float* weight, int64_t out,
                              int64_t in, std::string_view name) {
  const auto size = [](int64_t v) { return static_cast<size_t>(v); };
  if (bat) {
    // miss_block [out / r, r, r]; W.reshape(out / r, r, in / r, r).permute(2, 0, 1, 3) @ block + block.
    const bool ok = block.shape.size() == 3 && block.shape[1] >= 1 && block.shape[1] == block.shape[2] &&
                    out % block.shape[1] == 0 && in % block.shape[1] == 0 && block.shape[0] == out / block.shape[1] &&
                    static_cast<int64_t>(block.values.size()) == block.shape[0] * block.shape[1] * block.shape[2];
    if (!ok)
      refuse(name, "miss_block is " + shape_text(block.shape) + ", the \"bat\" form of a " + std::to_string(out) +
                       " x " + std::to_string(in) + " layer needs [out / r, r, r] with r dividing both");
    if (weight == nullptr) return {};
    const int64_t r = block.shape[1];
    std::vector<float> d(size(out * in));
    for (int64_t o = 0; o < out; ++o) {
      const int64_t a = o / r, i = o % r;
      const float* b = block.values.data() + a * r * r;  // block a: [r, r]
      for (int64_t j = 0; j < in; ++j) {
        const int64_t c = j / r, jj = j % r;
        const float* w = weight + o * in + c * r;  // W[o, c*r .. c*r + r)
        float acc = w[0] * b[jj];
        for (int64_t k = 1; k < r; ++k) acc = std::fma(w[k], b[k * r + jj], acc);
        d[size(o * in + j)] = acc + b[i * r + jj];
      }
    }
    return d;
  }
  const int64_t cols = mini_r > 0 ? mini_r : out;
  detail::expect_shape(block, -1, cols, name, "miss_block");
  const int64_t r = block.shape[0];
  if (r > in) refuse(name, "miss_block has r = " + std::to_string(r) + " rows, more than the " + std::to_string(in) +
                               " input features");
  if (mini_r > 0 && out % mini_r != 0)
    refuse(name, "mini_r " + std::to_string(mini_r) + " does not divide the " + std::to_string(out) + " output features");
  std::vector<float> d(size(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) d[size(o * in + j)] = block.values[size((j % r) * cols + o % cols)];
  return d;
}

}  // namespace peft::merge
