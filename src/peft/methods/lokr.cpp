// LoKr (peft/tuners/lokr/layer.py, get_delta_weight and make_kron): dW = kron(w1, w2) * scale, with
// each factor stored whole or as a product of two low-rank tensors, and on a Conv2d w2 also 4-D
// or in the CP form (make_weight_cp); the kron of w1 [a, c] with w2 [b, d, kh, kw] is, in the
// flattened weight [out, in * kh * kw], the kron with the matrix [b, d * kh * kw].
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {

namespace {

struct Factor {
  std::vector<float> values;
  int64_t rows = 0, cols = 0;
};

Factor factor(const MethodTensor* whole, const MethodTensor* a, const MethodTensor* b, std::string_view name,
              const char* whole_name, const char* a_name, const char* b_name) {
  Factor f;
  if (whole != nullptr) {
    if (whole->shape.size() == 4) {  // lokr_w2 [b, d, kh, kw] of a Conv2d: the matrix [b, d * kh * kw]
      const auto& s = whole->shape;
      if (s[0] < 1 || s[1] < 1 || s[2] < 1 || s[3] < 1 ||
          static_cast<int64_t>(whole->values.size()) != s[0] * s[1] * s[2] * s[3])
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": " + whole_name + " is " +
                                          shape_text(s) + ", which does not hold its values");
      f.rows = s[0];
      f.cols = s[1] * s[2] * s[3];
      f.values = whole->values;
      return f;
    }
    detail::expect_shape(*whole, -1, -1, name, whole_name);
    f.rows = whole->shape[0];
    f.cols = whole->shape[1];
    f.values = whole->values;
    return f;
  }
  if (a == nullptr || b == nullptr)
    fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(std::string(name)) + ": LoKr needs " + whole_name +
                                          " or both " + a_name + " and " + b_name);
  detail::expect_shape(*a, -1, -1, name, a_name);
  detail::expect_shape(*b, a->shape[1], -1, name, b_name);
  f.rows = a->shape[0];
  f.cols = b->shape[1];
  f.values = matmul_f32(a->values.data(), b->values.data(), f.rows, a->shape[1], f.cols);
  return f;
}

}  // namespace

std::vector<float> lokr_delta(const LokrFactors& f, double scale, int64_t out, int64_t in, std::string_view name) {
  const Factor w1 = factor(f.w1, f.w1_a, f.w1_b, name, "lokr_w1", "lokr_w1_a", "lokr_w1_b");
  Factor w2;
  if (f.t2 != nullptr) {  // the CP form: make_weight_cp(lokr_t2, lokr_w2_a, lokr_w2_b) [b, d, kh, kw]
    if (f.w2 != nullptr || f.w2_a == nullptr || f.w2_b == nullptr)
      fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(std::string(name)) +
                                            ": LoKr's CP form needs lokr_t2 with lokr_w2_a and lokr_w2_b (and no lokr_w2)");
    w2.values = cp_rebuild(*f.t2, *f.w2_a, *f.w2_b, name, "lokr_t2", "lokr_w2_a", "lokr_w2_b");
    w2.rows = f.w2_a->shape[1];
    w2.cols = f.w2_b->shape[1] * f.t2->shape[2] * f.t2->shape[3];
  } else {
    w2 = factor(f.w2, f.w2_a, f.w2_b, name, "lokr_w2", "lokr_w2_a", "lokr_w2_b");
  }
  if (w1.rows * w2.rows != out || w1.cols * w2.cols != in)
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": kron of w1 [" +
                                      std::to_string(w1.rows) + ", " + std::to_string(w1.cols) + "] and w2 [" +
                                      std::to_string(w2.rows) + ", " + std::to_string(w2.cols) +
                                      "] does not give the layer's [" + std::to_string(out) + ", " +
                                      std::to_string(in) + "]");
  const float s = static_cast<float>(scale);  // rebuild * scale, a Python float: an f32 product
  std::vector<float> d(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < w1.rows; ++i)
    for (int64_t k = 0; k < w2.rows; ++k) {
      float* row = d.data() + (i * w2.rows + k) * in;
      for (int64_t j = 0; j < w1.cols; ++j) {
        const float x = w1.values[static_cast<size_t>(i * w1.cols + j)];
        for (int64_t l = 0; l < w2.cols; ++l) {
          const float kron = x * w2.values[static_cast<size_t>(k * w2.cols + l)];
          row[j * w2.cols + l] = kron * s;
        }
      }
    }
  return d;
}

}  // namespace peft::merge
