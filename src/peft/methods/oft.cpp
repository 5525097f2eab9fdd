// OFT (peft/tuners/oft/layer.py, OFTRotationModule.get_weight and Linear.merge): W' = W @ R^T, R
// block diagonal, each block the Cayley transform (or its Neumann series) of a skew-symmetric
// matrix whose upper triangle is a row of oft_R; coft projects first. Built in f64.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

namespace {

// The block size b with b (b - 1) / 2 == n_elements, or 0.
int64_t block_size_for(int64_t n_elements) {
  for (int64_t b = 2; b * (b - 1) / 2 <= n_elements; ++b)
    if (b * (b - 1) / 2 == n_elements) return b;
  return 0;
}

// Q - Q^T from the upper triangle (torch.triu_indices(b, b, 1): row-major over i < j).
std::vector<double> skew(const float* vec, int64_t b) {
  std::vector<double> q(static_cast<size_t>(b * b), 0.0);
  size_t k = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = i + 1; j < b; ++j, ++k) {
      q[i * b + j] = vec[k];
      q[j * b + i] = -static_cast<double>(vec[k]);
    }
  return q;
}

std::vector<double> matmul(const std::vector<double>& x, const std::vector<double>& y, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < n; ++j) out[i * n + j] += x[i * n + k] * y[k * n + j];
  return out;
}

// _cayley_batch with use_cayley_neumann: the series as PEFT sums it.
std::vector<double> neumann(const std::vector<double>& q, int64_t b, int64_t terms) {
  std::vector<double> r(static_cast<size_t>(b * b), 0.0);
  for (int64_t i = 0; i < b; ++i) r[i * b + i] = 1.0;
  auto add = [&](const std::vector<double>& m, double alpha) {
    for (size_t i = 0; i < r.size(); ++i) r[i] += alpha * m[i];
  };
  if (terms > 1) {
    add(q, 2.0);
    if (terms > 2) {
      std::vector<double> power = matmul(q, q, b);
      add(power, 2.0);
      for (int64_t k = 3; k < terms - 1; ++k) {
        power = matmul(power, q, b);
        add(power, 2.0);
      }
      power = matmul(power, q, b);
      add(power, 1.0);
    }
  }
  return r;
}

}  // namespace

InputTransform oft_transform(const MethodTensor& oft_r, const OftSettings& settings, int64_t in, bool inverse,
                             std::string_view name) {
  detail::expect_shape(oft_r, -1, -1, name, "oft_R");
  const int64_t stored = oft_r.shape[0];
  const int64_t b = block_size_for(oft_r.shape[1]);
  const std::string who = "module " + peft::quoted(std::string(name));
  if (b == 0 || in % b != 0)
    fail(PEFT_ERR_SHAPE_MISMATCH, who + ": oft_R " + shape_text(oft_r.shape) + " holds no block size b (b (b - 1) / 2 = " +
                                      std::to_string(oft_r.shape[1]) + ") dividing the layer's " + std::to_string(in) +
                                      " input features");
  if (settings.block_share ? stored != 1 : stored * b != in)
    fail(PEFT_ERR_SHAPE_MISMATCH, who + ": oft_R " + shape_text(oft_r.shape) + " has " + std::to_string(stored) +
                                      " blocks of " + std::to_string(b) + ", the layer needs " +
                                      (settings.block_share ? std::string("1 (block_share)") : std::to_string(in / b)) +
                                      " for " + std::to_string(in) + " input features");
  if (settings.use_cayley_neumann && settings.num_cayley_neumann_terms < 1)
    fail(PEFT_ERR_INVALID_CONFIG, who + ": num_cayley_neumann_terms must be at least 1");
  TransformStep step;
  step.kind = TransformStep::Kind::blocks;
  step.size = b;
  step.count = stored;
  const int64_t n = oft_r.shape[1];
  // coft: _project_batch, eps / sqrt(number of stored blocks).
  const double eps = settings.eps / std::sqrt(static_cast<double>(stored));
  for (int64_t k = 0; k < stored; ++k) {
    std::vector<double> q = skew(oft_r.values.data() + k * n, b);
    if (settings.coft) {
      double norm = 0.0;
      for (double v : q) norm += v * v;
      norm = std::sqrt(norm);
      if (!(norm <= eps))
        for (double& v : q) v = eps * (v / norm);
    }
    std::vector<double> r = settings.use_cayley_neumann ? neumann(q, b, settings.num_cayley_neumann_terms)
                                                        : cayley_f64(q, b, name);
    if (inverse) r = inverse_f64(r, b, name);
    step.values.insert(step.values.end(), r.begin(), r.end());
  }
  InputTransform t;
  t.in = in;
  t.steps.push_back(std::move(step));
  return t;
}

}  // namespace peft::merge
