// SHiRA (peft/tuners/shira/layer.py, Linear.get_delta_weight): a sparse COO delta of shira_weight *
// scaling at the saved shira_indices, added to the weight.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <cmath>

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

std::vector<float> shira_delta(const MethodTensor& values, const MethodTensor& indices, double scale, int64_t out,
                               int64_t in, std::string_view name) {
  const std::string module = peft::quoted(std::string(name));
  const int64_t k = values.shape.size() == 1 ? values.shape[0] : -1;
  if (k < 1 || static_cast<int64_t>(values.values.size()) != k)
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + module + ": shira_weight is " + shape_text(values.shape) + ", not [K]");
  detail::expect_shape(indices, 2, k, name, "shira_indices");
  // Untouched elements get -0.0, which adds to any value without changing its bits (the sparse add
  // leaves them alone); each saved index adds its value (duplicates, which PEFT's masks never
  // make, add in file order).
  std::vector<float> d(static_cast<size_t>(out * in), -0.0f);
  const float s = static_cast<float>(scale);
  for (int64_t i = 0; i < k; ++i) {
    const float row = indices.values[static_cast<size_t>(i)], col = indices.values[static_cast<size_t>(k + i)];
    if (!(row >= 0 && col >= 0 && row < static_cast<float>(out) && col < static_cast<float>(in)) ||
        row != std::floor(row) || col != std::floor(col))
      fail(PEFT_ERR_INVALID_ARGUMENT, "module " + module + ": shira_indices entry " + std::to_string(i) + " is (" +
                                          std::to_string(row) + ", " + std::to_string(col) + "), outside the " +
                                          std::to_string(out) + " x " + std::to_string(in) + " layer");
    float& slot = d[static_cast<size_t>(static_cast<int64_t>(row) * in + static_cast<int64_t>(col))];
    slot = slot + values.values[static_cast<size_t>(i)] * s;
  }
  return d;
}

}  // namespace peft::merge
