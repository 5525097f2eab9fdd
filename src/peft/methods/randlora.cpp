// RandLoRA (peft/tuners/randlora/layer.py, get_scaled_bases and get_delta_weight). With
// min_dim = min(out, in), max_dim = max(out, in) and nb = ceil(min_dim / r) bases:
//   S = (lambda[:, :, None] * A[:, :nb, :min_dim]) * gamma[None]   [r, nb, min_dim] -> [r * nb, min_dim]
//   L = B[:max_dim, :nb, :]                                         [max_dim, nb, r] -> [max_dim, nb * r]
//   dW = (L @ S) * scaling, [max_dim, min_dim], transposed when out < in,
// the rows of S and the columns of L paired by their flat index as PEFT's flatten() pairs them.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <algorithm>

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

std::vector<float> randlora_delta(const MethodTensor& a, const MethodTensor& b, const MethodTensor& lambda,
                                  const MethodTensor& gamma, double scale, int64_t out, int64_t in,
                                  std::string_view name) {
  const int64_t min_dim = std::min(out, in), max_dim = std::max(out, in);
  detail::expect_shape(lambda, -1, -1, name, "randlora_lambda");
  const int64_t r = lambda.shape[0], nb = lambda.shape[1];
  const std::string who = "module " + peft::quoted(std::string(name));
  if (nb != (min_dim + r - 1) / r)
    fail(PEFT_ERR_SHAPE_MISMATCH, who + ": randlora_lambda is " + shape_text(lambda.shape) + " but a layer of " +
                                      std::to_string(out) + " x " + std::to_string(in) + " with rank " +
                                      std::to_string(r) + " has " + std::to_string((min_dim + r - 1) / r) + " bases");
  detail::expect_shape(gamma, nb, min_dim, name, "randlora_gamma");
  // A [r, 1 or >= nb, >= min_dim] (a single base broadcasts), B [>= max_dim, >= nb, r].
  const bool a_ok = a.shape.size() == 3 && a.shape[0] == r && (a.shape[1] == 1 || a.shape[1] >= nb) &&
                    a.shape[2] >= min_dim;
  const bool b_ok = b.shape.size() == 3 && b.shape[0] >= max_dim && b.shape[1] >= nb && b.shape[2] == r;
  if (!a_ok || !b_ok)
    fail(PEFT_ERR_SHAPE_MISMATCH, who + ": randlora_A " + shape_text(a.shape) + " and randlora_B " +
                                      shape_text(b.shape) + " do not fit a layer of " + std::to_string(out) + " x " +
                                      std::to_string(in) + " with rank " + std::to_string(r) + " and " +
                                      std::to_string(nb) + " bases");
  const int64_t rows = r * nb;
  std::vector<float> s(static_cast<size_t>(rows * min_dim));
  for (int64_t k = 0; k < r; ++k)
    for (int64_t base = 0; base < nb; ++base) {
      const int64_t a_base = a.shape[1] == 1 ? 0 : base;
      const float l = lambda.values[static_cast<size_t>(k * nb + base)];
      const float* a_row = a.values.data() + (k * a.shape[1] + a_base) * a.shape[2];
      const float* g_row = gamma.values.data() + base * min_dim;
      float* s_row = s.data() + (k * nb + base) * min_dim;
      for (int64_t j = 0; j < min_dim; ++j) {
        const float la = l * a_row[j];
        s_row[j] = la * g_row[j];
      }
    }
  std::vector<float> left(static_cast<size_t>(max_dim * rows));
  for (int64_t i = 0; i < max_dim; ++i)
    for (int64_t base = 0; base < nb; ++base)
      for (int64_t k = 0; k < r; ++k)
        left[static_cast<size_t>(i * rows + base * r + k)] =
            b.values[static_cast<size_t>((i * b.shape[1] + base) * r + k)];
  const std::vector<float> p = matmul_f32(left.data(), s.data(), max_dim, rows, min_dim);
  const float sc = static_cast<float>(scale);  // output_tensor * self.scaling: an f32 product
  std::vector<float> d(static_cast<size_t>(out * in));
  const bool transpose = min_dim != in;  // out < in: PEFT returns the transposed bases
  for (int64_t i = 0; i < max_dim; ++i)
    for (int64_t j = 0; j < min_dim; ++j) {
      const float v = p[static_cast<size_t>(i * min_dim + j)] * sc;
      d[static_cast<size_t>(transpose ? j * in + i : i * in + j)] = v;
    }
  return d;
}

}  // namespace peft::merge
