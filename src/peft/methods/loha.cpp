// LoHa (peft/tuners/loha/layer.py, HadaWeight.forward): dW = ((w1a @ w1b) * (w2a @ w2b)) * scale.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

std::vector<float> loha_delta(const MethodTensor& w1a, const MethodTensor& w1b, const MethodTensor& w2a,
                              const MethodTensor& w2b, double scale, int64_t out, int64_t in, std::string_view name) {
  detail::expect_shape(w1a, out, -1, name, "hada_w1_a");
  const int64_t r = w1a.shape[1];
  detail::expect_shape(w1b, r, in, name, "hada_w1_b");
  detail::expect_shape(w2a, out, r, name, "hada_w2_a");
  detail::expect_shape(w2b, r, in, name, "hada_w2_b");
  std::vector<float> d = matmul_f32(w1a.values.data(), w1b.values.data(), out, r, in);
  const std::vector<float> second = matmul_f32(w2a.values.data(), w2b.values.data(), out, r, in);
  const float s = static_cast<float>(scale);  // torch.tensor(self.scaling): an f32 scalar tensor
  for (size_t i = 0; i < d.size(); ++i) {
    const float hadamard = d[i] * second[i];
    d[i] = hadamard * s;
  }
  return d;
}

}  // namespace peft::merge
