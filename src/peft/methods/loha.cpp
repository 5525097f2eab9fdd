// LoHa (peft/tuners/loha/layer.py, HadaWeight.forward): dW = ((w1a @ w1b) * (w2a @ w2b)) * scale,
// and its CP form on Conv2d (HadaWeightCP.forward), with the CP rebuild shared with LoKr.
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

#include <cstddef>

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

namespace {

std::string dims_text(const MethodTensor& t) { return shape_text(t.shape); }

bool holds(const MethodTensor& t, size_t rank) {
  if (t.shape.size() != rank) return false;
  int64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 1) return false;
    n *= d;
  }
  return static_cast<int64_t>(t.values.size()) == n;
}

}  // namespace

std::vector<float> cp_rebuild(const MethodTensor& t, const MethodTensor& wa, const MethodTensor& wb,
                              std::string_view name, const char* t_name, const char* wa_name, const char* wb_name) {
  if (!holds(t, 4) || !holds(wa, 2) || !holds(wb, 2) || wa.shape[0] != t.shape[0] || wb.shape[0] != t.shape[1])
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": " + t_name + " " + dims_text(t) +
                                      ", " + wa_name + " " + dims_text(wa) + " and " + wb_name + " " + dims_text(wb) +
                                      " are not the CP form [r, r, kh, kw], [r, out], [r, in]");
  const int64_t ri = t.shape[0], rj = t.shape[1], kernel = t.shape[2] * t.shape[3];
  const int64_t p_dim = wa.shape[1], q_dim = wb.shape[1];
  // tmp[i, q, s] = sum_j t[i, j, s] * wb[j, q], then R[p, q, s] = sum_i wa[i, p] * tmp[i, q, s].
  std::vector<double> tmp(static_cast<size_t>(ri * q_dim * kernel), 0.0);
  for (int64_t i = 0; i < ri; ++i)
    for (int64_t j = 0; j < rj; ++j) {
      const float* ts = t.values.data() + (i * rj + j) * kernel;
      const float* wr = wb.values.data() + j * q_dim;
      for (int64_t q = 0; q < q_dim; ++q) {
        double* row = tmp.data() + (i * q_dim + q) * kernel;
        const double w = wr[q];
        for (int64_t s = 0; s < kernel; ++s) row[s] += static_cast<double>(ts[s]) * w;
      }
    }
  std::vector<double> sum(static_cast<size_t>(p_dim * q_dim * kernel), 0.0);
  for (int64_t i = 0; i < ri; ++i)
    for (int64_t p = 0; p < p_dim; ++p) {
      const double a = wa.values[static_cast<size_t>(i * p_dim + p)];
      const double* from = tmp.data() + i * q_dim * kernel;
      double* to = sum.data() + p * q_dim * kernel;
      for (int64_t x = 0; x < q_dim * kernel; ++x) to[x] += a * from[x];
    }
  std::vector<float> out(sum.size());
  for (size_t x = 0; x < sum.size(); ++x) out[x] = static_cast<float>(sum[x]);
  return out;
}

std::vector<float> loha_cp_delta(const MethodTensor& t1, const MethodTensor& w1a, const MethodTensor& w1b,
                                 const MethodTensor& t2, const MethodTensor& w2a, const MethodTensor& w2b,
                                 double scale, int64_t out, int64_t in, std::string_view name) {
  const std::vector<float> first = cp_rebuild(t1, w1a, w1b, name, "hada_t1", "hada_w1_a", "hada_w1_b");
  const std::vector<float> second = cp_rebuild(t2, w2a, w2b, name, "hada_t2", "hada_w2_a", "hada_w2_b");
  const int64_t out1 = w1a.shape[1], flat1 = w1b.shape[1] * t1.shape[2] * t1.shape[3];
  const int64_t out2 = w2a.shape[1], flat2 = w2b.shape[1] * t2.shape[2] * t2.shape[3];
  if (out1 != out || out2 != out || flat1 != in || flat2 != in || t1.shape[2] != t2.shape[2] ||
      t1.shape[3] != t2.shape[3])
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": the CP factors hada_t1 " +
                                      dims_text(t1) + ", hada_w1_a " + dims_text(w1a) + ", hada_w1_b " +
                                      dims_text(w1b) + ", hada_t2 " + dims_text(t2) + ", hada_w2_a " +
                                      dims_text(w2a) + ", hada_w2_b " + dims_text(w2b) + " do not give a Conv2d of " +
                                      std::to_string(out) + " x " + std::to_string(in) + " (out x in * kh * kw)");
  const float s = static_cast<float>(scale);  // torch.tensor(self.scaling): an f32 scalar tensor
  std::vector<float> d(first.size());
  for (size_t i = 0; i < d.size(); ++i) {
    const float product = first[i] * second[i];
    d[i] = product * s;
  }
  return d;
}

}  // namespace peft::merge
