// The merge arithmetic of the PEFT methods other than LoRA, as PEFT 0.21 does it
// (peft/tuners/<method>/layer.py, get_delta_weight and merge), in f32:
//
//   LoHa   (loha/layer.py HadaWeight):  dW = ((w1a @ w1b) * (w2a @ w2b)) * float(scale)
//   LoKr   (lokr/layer.py make_kron):   dW = kron(w1, w2) * float(scale), with w1 = lokr_w1 or
//                                       lokr_w1_a @ lokr_w1_b and w2 = lokr_w2 or lokr_w2_a @ lokr_w2_b
//   AdaLoRA (adalora/layer.py):         dW = ((B @ (A * E)) * float(scaling)) / (float(ranknum) + 1e-5f)
//   IA3    (ia3/layer.py merge):        W' = W * l, l = ia3_l per output feature, or per input
//                                       feature for a feed-forward module (feedforward_modules)
//
// where every product and sum is an f32 operation rounded as torch rounds it, left to right as
// written; the matrix products accumulate k = 0..rank-1 in order with explicit fused
// multiply-adds (torch's BLAS may order a rank-r sum otherwise: the results then differ by the f32
// rounding of that sum, well inside 1e-6 of the weight). scale is PEFT's alpha / r times the
// caller's weight (set_scale), for AdaLoRA lora_alpha (or r when lora_alpha <= 0) times the
// weight. Each delta is returned in PyTorch's weight order [out, in]; add_dense_delta puts it into
// storage (transposed for GPT-2 Conv1D) with one rounding, round(float(W) + dW), as PEFT's
// `weight.data += delta` does for an f32 delta on any base dtype. IA3's W * l is also one
// rounding (torch.mul promotes to f32, .to(orig_dtype) rounds once).
//
// Unmerge: additive methods subtract the same delta (one rounding; PEFT's own unmerge is the same
// subtraction). IA3's arithmetic unmerge divides by (l + 1e-8) as PEFT does, which is not exact;
// exact removal keeps the original rows (buffer_merge.hpp).
//
// Only Linear and GPT-2 Conv1D layers are merged here (LoHa/LoKr on Conv layers and their CP /
// effective-conv2d form are PEFT_ERR_UNSUPPORTED). The dense delta of one weight is materialised
// in f32: out x in x 4 bytes beside the weight.
//
// Thread safety: pure functions; calls on different buffers may run concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "peft/methods/lora_math.hpp"

namespace peft::merge {

// One adapter parameter as f32, row-major, with its shape as stored.
struct MethodTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Each delta function checks the shapes PEFT creates for a layer of `out` x `in` features
// (PEFT_ERR_SHAPE_MISMATCH naming `name` otherwise) and returns dW [out * in] in PyTorch order.

// LoHa: hada_w1_a [out, r], hada_w1_b [r, in], hada_w2_a [out, r], hada_w2_b [r, in].
std::vector<float> loha_delta(const MethodTensor& w1a, const MethodTensor& w1b, const MethodTensor& w2a,
                              const MethodTensor& w2b, double scale, int64_t out, int64_t in, std::string_view name);

// LoKr: w1 = lokr_w1 [a, c] or lokr_w1_a [a, r] @ lokr_w1_b [r, c]; w2 = lokr_w2 [b, d] or
// lokr_w2_a [b, r] @ lokr_w2_b [r, d]; out = a * b, in = c * d. Pass null for absent tensors.
struct LokrFactors {
  const MethodTensor* w1 = nullptr;
  const MethodTensor* w1_a = nullptr;
  const MethodTensor* w1_b = nullptr;
  const MethodTensor* w2 = nullptr;
  const MethodTensor* w2_a = nullptr;
  const MethodTensor* w2_b = nullptr;
};
std::vector<float> lokr_delta(const LokrFactors& f, double scale, int64_t out, int64_t in, std::string_view name);

// AdaLoRA: lora_A [r, in], lora_E [r, 1], lora_B [out, r].
std::vector<float> adalora_delta(const MethodTensor& a, const MethodTensor& e, const MethodTensor& b, double scaling,
                                 double ranknum, int64_t out, int64_t in, std::string_view name);

// The product x @ y of row-major f32 matrices x [m, k] and y [k, n], accumulated in k order with
// fused multiply-adds (torch.matmul's value up to the order of its sum).
std::vector<float> matmul_f32(const float* x, const float* y, int64_t m, int64_t k, int64_t n);

// W = round(float(W) + delta) (or - delta), delta [layout.out, layout.in] in PyTorch order, put in
// storage order (transposed when layout.transposed). The weight must be layout.rows() x cols().
// exec.row_sink sees the original bytes of every row that changes.
void add_dense_delta(const WeightView& weight, const DeltaLayout& layout, const float* delta, bool subtract,
                     const ExecOptions& exec = {});

// IA3: W = round(float(W) * l[j]) with l per output feature (input_features false) or per input
// feature; `divide` is PEFT's unmerge, W = round(float(W) / (l + 1e-8f)). exec.row_sink as above.
void ia3_scale(const WeightView& weight, const DeltaLayout& layout, const float* l, bool input_features, bool divide,
               const ExecOptions& exec = {});

// IA3 on a bias (non-feed-forward modules): bias = round(float(bias) * l[j]) (or / (l + 1e-8f)).
void ia3_scale_bias(const WeightView& bias, const float* l, bool divide, const RowSink* row_sink = nullptr);

// Replacements (LN_TUNING norms, trainable-token rows, full tensors): the weight's rows `rows`
// (every row, in order, when empty) become `values` ([count, weight.cols] f32, row i for rows[i])
// rounded once to the weight's dtype, as torch's copy_ / index_copy_ of an f32 tensor into it.
// PEFT_ERR_INVALID_ARGUMENT for a row outside the weight; exec.row_sink as above.
void replace_rows(const WeightView& weight, const float* values, std::span<const int64_t> rows,
                  const ExecOptions& exec = {});

}  // namespace peft::merge
