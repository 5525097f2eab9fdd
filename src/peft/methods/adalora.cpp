// AdaLoRA (peft/tuners/adalora/layer.py, SVDLinear.get_delta_weight):
// dW = ((B @ (A * E)) * scaling) / (ranknum + 1e-5).
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

std::vector<float> adalora_delta(const MethodTensor& a, const MethodTensor& e, const MethodTensor& b, double scaling,
                                 double ranknum, int64_t out, int64_t in, std::string_view name) {
  detail::expect_shape(a, -1, in, name, "lora_A");
  const int64_t r = a.shape[0];
  detail::expect_shape(e, r, 1, name, "lora_E");
  detail::expect_shape(b, out, r, name, "lora_B");
  std::vector<float> ae(a.values.size());
  for (int64_t k = 0; k < r; ++k)
    for (int64_t i = 0; i < in; ++i) ae[static_cast<size_t>(k * in + i)] = a.values[static_cast<size_t>(k * in + i)] * e.values[static_cast<size_t>(k)];
  std::vector<float> d = matmul_f32(b.values.data(), ae.data(), out, r, in);
  const float s = static_cast<float>(scaling);
  // self.ranknum is an f32 parameter holding float(r); + 1e-5 is an f32 addition.
  const float denominator = static_cast<float>(ranknum) + 1e-5f;
  for (float& v : d) {
    const float scaled = v * s;
    v = scaled / denominator;
  }
  return d;
}

}  // namespace peft::merge
