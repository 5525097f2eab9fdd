// HRA (peft/tuners/hra/layer.py, HRALinear.get_delta_weight and merge): W' = W @ H, H the product of
// the Householder reflections I - 2 u u^T of hra_u's normalised columns in order, or with apply_GS
// I - 2 U U^T for the Gram-Schmidt orthonormalised columns U. Built in f64.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <algorithm>
#include <cmath>

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

InputTransform hra_transform(const MethodTensor& hra_u, bool apply_gs, int64_t in, bool inverse,
                             std::string_view name) {
  detail::expect_shape(hra_u, in, -1, name, "hra_u");
  const int64_t r = hra_u.shape[1];
  // Column k of hra_u [in, r], as f64.
  std::vector<std::vector<double>> cols(static_cast<size_t>(r), std::vector<double>(static_cast<size_t>(in)));
  for (int64_t i = 0; i < in; ++i)
    for (int64_t k = 0; k < r; ++k) cols[static_cast<size_t>(k)][static_cast<size_t>(i)] = hra_u.values[i * r + k];
  auto normalise = [](std::vector<double>& u) {
    double norm = 0.0;
    for (double v : u) norm += v * v;
    norm = std::sqrt(norm);
    for (double& v : u) v = v / norm;
  };
  TransformStep step;
  step.size = in;
  step.count = r;
  if (apply_gs) {
    // weight[j] orthonormal; u_i - (w_j^T u_i) w_j for j < i in turn, then normalised. H is
    // symmetric and its own inverse: PEFT's reverse flag does not change it.
    step.kind = TransformStep::Kind::projector;
    for (int64_t i = 0; i < r; ++i) {
      std::vector<double>& u = cols[static_cast<size_t>(i)];
      for (int64_t j = 0; j < i; ++j) {
        const std::vector<double>& w = cols[static_cast<size_t>(j)];
        double dot = 0.0;
        for (int64_t k = 0; k < in; ++k) dot += w[static_cast<size_t>(k)] * u[static_cast<size_t>(k)];
        for (int64_t k = 0; k < in; ++k) u[static_cast<size_t>(k)] -= dot * w[static_cast<size_t>(k)];
      }
      normalise(u);
    }
  } else {
    // opt_u / opt_u.norm(dim=0); reverse (PEFT's unmerge) applies the reflections last to first.
    step.kind = TransformStep::Kind::reflections;
    for (std::vector<double>& u : cols) normalise(u);
    if (inverse) std::reverse(cols.begin(), cols.end());
  }
  for (const std::vector<double>& u : cols) step.values.insert(step.values.end(), u.begin(), u.end());
  InputTransform t;
  t.in = in;
  t.steps.push_back(std::move(step));
  return t;
}

}  // namespace peft::merge
