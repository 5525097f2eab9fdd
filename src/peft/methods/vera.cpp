// VeRA (peft/tuners/vera/layer.py, Linear.get_delta_weight): the shared projections vera_A
// [r, >= in] and vera_B [>= out, r] sliced to the layer, dW = (lambda_b * B[:out]) @ (lambda_d * A[:, :in]).
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

std::vector<float> vera_delta(const MethodTensor& vera_a, const MethodTensor& vera_b, const MethodTensor& lambda_d,
                              const MethodTensor& lambda_b, double weight, int64_t out, int64_t in,
                              std::string_view name) {
  if (lambda_d.shape.size() != 1 || lambda_d.shape[0] < 1 || lambda_b.shape != std::vector<int64_t>{out} ||
      static_cast<int64_t>(lambda_b.values.size()) != out)
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": vera_lambda_d is " +
                                      shape_text(lambda_d.shape) + " and vera_lambda_b " + shape_text(lambda_b.shape) +
                                      ", the layer needs [r] and [" + std::to_string(out) + "]");
  const int64_t rank = lambda_d.shape[0];
  detail::expect_shape(vera_a, rank, -1, name, "vera_A");
  detail::expect_shape(vera_b, -1, rank, name, "vera_B");
  if (vera_a.shape[1] < in || vera_b.shape[0] < out)
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": the shared vera_A " +
                                      shape_text(vera_a.shape) + " and vera_B " + shape_text(vera_b.shape) +
                                      " are smaller than the layer (" + std::to_string(out) + " x " +
                                      std::to_string(in) + ")");
  // lambda_b.unsqueeze(-1) * sliced_B and lambda_d.unsqueeze(-1) * sliced_A: one f32 product each.
  const int64_t a_cols = vera_a.shape[1];
  std::vector<float> left(static_cast<size_t>(out * rank)), right(static_cast<size_t>(rank * in));
  for (int64_t i = 0; i < out; ++i)
    for (int64_t k = 0; k < rank; ++k)
      left[static_cast<size_t>(i * rank + k)] = lambda_b.values[static_cast<size_t>(i)] * vera_b.values[static_cast<size_t>(i * rank + k)];
  for (int64_t k = 0; k < rank; ++k)
    for (int64_t j = 0; j < in; ++j)
      right[static_cast<size_t>(k * in + j)] = lambda_d.values[static_cast<size_t>(k)] * vera_a.values[static_cast<size_t>(k * a_cols + j)];
  std::vector<float> d = matmul_f32(left.data(), right.data(), out, rank, in);
  if (weight != 1.0) {  // VeRA has no scale: a merge weight other than 1 multiplies the delta once
    const float w = static_cast<float>(weight);
    for (float& v : d) v = v * w;
  }
  return d;
}

}  // namespace peft::merge
