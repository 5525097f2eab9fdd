// VB-LoRA (peft/tuners/vblora/layer.py, Linear.get_delta_weight): every row of logits picks its
// topk largest entries, softmax-weights them and mixes those vectors of the shared vector bank
// [num_vectors, L]:
//   A = mix(logits_A [r, in / L, nv]).reshape(r, in)
//   B = mix(logits_B [out / L, r, nv]).transpose(1, 2).reshape(out, r)
//   dW = B @ A (transposed by the caller for GPT-2 Conv1D; VB-LoRA has no scale).
// Adapters saved with save_only_topk_weights hold per row the topk indices and the first topk - 1
// softmax weights; PEFT's loader completes the last as 1 - sum (in f32) and turns them back into
// logits log(w), -inf elsewhere, so that the merge's softmax gives w / sum(w) again.
//
// Arithmetic: the softmax, the mixtures and B @ A in f64, rounded to f32 once (PEFT computes each
// step in f32). The error bound against PEFT's f32 value is in docs/peft-semantics.md (VB-LoRA).
#include "core/no_fp_contract.hpp"  // first: before any inline arithmetic of the headers below

#include <algorithm>
#include <cmath>
#include <numeric>

#include "peft/methods/method_shapes.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft::merge {
namespace {

[[noreturn]] void shape_problem(std::string_view name, const std::string& what) {
  fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(std::string(name)) + ": " + what);
}

// The mixture of one logits tensor [d0, d1, nv] (or its top-k form) as f64 [d0, d1, L].
std::vector<double> mixture(const VbloraLogits& logits, const char* which, const MethodTensor& bank, int64_t topk,
                            int64_t d0, int64_t d1, std::string_view name) {
  const int64_t nv = bank.shape[0], len = bank.shape[1];
  const int64_t rows = d0 * d1;
  std::vector<double> mix(static_cast<size_t>(rows * len), 0.0);
  std::vector<int64_t> index(static_cast<size_t>(topk));
  std::vector<double> weight(static_cast<size_t>(topk));
  const std::string param = std::string("vblora_logits_") + which;
  if (logits.logits != nullptr) {
    const MethodTensor& t = *logits.logits;
    if (t.shape != std::vector<int64_t>{d0, d1, nv} || static_cast<int64_t>(t.values.size()) != rows * nv)
      shape_problem(name, param + " is " + shape_text(t.shape) + ", the layer and vector bank need " +
                              shape_text(std::vector<int64_t>{d0, d1, nv}));
    if (topk > nv)
      fail(PEFT_ERR_INVALID_CONFIG, "module " + peft::quoted(std::string(name)) + ": topk " + std::to_string(topk) +
                                        " is more than the vector bank's " + std::to_string(nv) + " vectors");
    std::vector<int64_t> order(static_cast<size_t>(nv));
    for (int64_t row = 0; row < rows; ++row) {
      const float* x = t.values.data() + row * nv;
      std::iota(order.begin(), order.end(), int64_t{0});
      // logits.topk(topk): the largest first; equal logits in index order (a tie at the k-th
      // place is where torch's choice could differ; trained logits have none).
      std::partial_sort(order.begin(), order.begin() + topk, order.end(), [&](int64_t a, int64_t b) {
        return x[a] > x[b] || (x[a] == x[b] && a < b);
      });
      const double top = x[order[0]];
      if (!std::isfinite(top))
        fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(std::string(name)) + ": " + param + " row " +
                                            std::to_string(row) + " has no finite largest logit");
      double sum = 0.0;
      for (int64_t j = 0; j < topk; ++j) {
        index[static_cast<size_t>(j)] = order[static_cast<size_t>(j)];
        weight[static_cast<size_t>(j)] = std::exp(static_cast<double>(x[order[static_cast<size_t>(j)]]) - top);
        sum += weight[static_cast<size_t>(j)];
      }
      for (double& w : weight) w /= sum;
      double* out = mix.data() + row * len;
      for (int64_t j = 0; j < topk; ++j) {
        const float* v = bank.values.data() + index[static_cast<size_t>(j)] * len;
        for (int64_t l = 0; l < len; ++l) out[l] += weight[static_cast<size_t>(j)] * static_cast<double>(v[l]);
      }
    }
    return mix;
  }
  if (logits.topk_indices == nullptr || logits.topk_weights == nullptr)
    fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(std::string(name)) + " lost its " + param);
  const MethodTensor& ix = *logits.topk_indices;
  const MethodTensor& wt = *logits.topk_weights;
  if (ix.shape != std::vector<int64_t>{d0, d1, topk} || static_cast<int64_t>(ix.values.size()) != rows * topk)
    shape_problem(name, param + "_topk_indices is " + shape_text(ix.shape) + ", the layer and topk need " +
                            shape_text(std::vector<int64_t>{d0, d1, topk}));
  if (wt.shape != std::vector<int64_t>{d0, d1, topk - 1} || static_cast<int64_t>(wt.values.size()) != rows * (topk - 1))
    shape_problem(name, param + "_topk_weights is " + shape_text(wt.shape) + ", the layer and topk need " +
                            shape_text(std::vector<int64_t>{d0, d1, topk - 1}));
  for (int64_t row = 0; row < rows; ++row) {
    // PEFT's loader: torch.cat([w, 1 - w.sum(-1)]) in f32 (the sum in index order).
    const float* w = wt.values.data() + row * (topk - 1);
    float partial = 0.0f;
    for (int64_t j = 0; j + 1 < topk; ++j) partial = partial + w[j];
    const float last = 1.0f - partial;
    double sum = 0.0;
    for (int64_t j = 0; j < topk; ++j) {
      const float v = j + 1 < topk ? w[j] : last;
      const float at = ix.values[static_cast<size_t>(row * topk + j)];
      if (!(v >= 0.0f) || !std::isfinite(v))
        fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(std::string(name)) + ": " + param +
                                            "_topk_weights row " + std::to_string(row) + " gives weight " +
                                            std::to_string(v) + (j + 1 < topk ? "" : " (1 - the saved weights' sum)") +
                                            "; PEFT's log of it makes the merge NaN");
      if (!(at >= 0.0f) || at >= static_cast<float>(nv) || at != std::floor(at))
        fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(std::string(name)) + ": " + param +
                                            "_topk_indices row " + std::to_string(row) + " holds " + std::to_string(at) +
                                            ", not a vector of the bank's " + std::to_string(nv));
      index[static_cast<size_t>(j)] = static_cast<int64_t>(at);
      weight[static_cast<size_t>(j)] = v;
      sum += v;
    }
    if (!(sum > 0.0))
      fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(std::string(name)) + ": " + param +
                                          "_topk_weights row " + std::to_string(row) + " sums to 0");
    // softmax(log(w)) = w / sum(w)
    double* out = mix.data() + row * len;
    for (int64_t j = 0; j < topk; ++j) {
      const double c = weight[static_cast<size_t>(j)] / sum;
      if (c == 0.0) continue;  // exp(-inf) = 0: that entry adds nothing
      const float* v = bank.values.data() + index[static_cast<size_t>(j)] * len;
      for (int64_t l = 0; l < len; ++l) out[l] += c * static_cast<double>(v[l]);
    }
  }
  return mix;
}

}  // namespace

std::vector<float> vblora_delta(const MethodTensor& bank, const VbloraLogits& a, const VbloraLogits& b, int64_t topk,
                                double weight, int64_t out, int64_t in, std::string_view name) {
  if (bank.shape.size() != 2 || bank.shape[0] < 1 || bank.shape[1] < 1 ||
      static_cast<int64_t>(bank.values.size()) != bank.shape[0] * bank.shape[1])
    shape_problem(name, "the shared vblora_vector_bank is " + shape_text(bank.shape) + ", not [num_vectors, vector_length]");
  if (topk < 1) fail(PEFT_ERR_INVALID_CONFIG, "module " + peft::quoted(std::string(name)) + ": topk must be positive");
  const int64_t len = bank.shape[1];
  if (in % len != 0 || out % len != 0)
    shape_problem(name, "the layer's " + std::to_string(in) + " input and " + std::to_string(out) +
                            " output features are not multiples of vector_length " + std::to_string(len) +
                            " (PEFT refuses such a layer)");
  const MethodTensor* a_shape = a.logits != nullptr ? a.logits : a.topk_indices;
  if (a_shape == nullptr || a_shape->shape.size() != 3 || a_shape->shape[0] < 1)
    shape_problem(name, "vblora_logits_A is " + (a_shape ? shape_text(a_shape->shape) : std::string("absent")) +
                            ", not [r, in / vector_length, num_vectors]");
  const int64_t rank = a_shape->shape[0];
  const int64_t in_tiles = in / len, out_tiles = out / len;
  const std::vector<double> ma = mixture(a, "A", bank, topk, rank, in_tiles, name);   // [r, in/L, L] = A [r, in]
  const std::vector<double> mb = mixture(b, "B", bank, topk, out_tiles, rank, name);  // [out/L, r, L]
  std::vector<float> d(static_cast<size_t>(out * in));
  std::vector<double> row(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    const int64_t tile = o / len, l = o % len;
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < rank; ++k) {
      const double bk = mb[static_cast<size_t>((tile * rank + k) * len + l)];  // B[o, k]
      const double* ak = ma.data() + k * in;
      for (int64_t i = 0; i < in; ++i) row[static_cast<size_t>(i)] += bk * ak[i];
    }
    for (int64_t i = 0; i < in; ++i) d[static_cast<size_t>(o * in + i)] = static_cast<float>(row[static_cast<size_t>(i)]);
  }
  if (weight != 1.0) {  // VB-LoRA has no scale: a merge weight other than 1 multiplies the delta once
    const float w = static_cast<float>(weight);
    for (float& v : d) v = v * w;
  }
  return d;
}

}  // namespace peft::merge
