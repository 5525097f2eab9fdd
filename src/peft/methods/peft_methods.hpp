// The merge arithmetic of the PEFT methods other than LoRA, as PEFT 0.21 does it
// (peft/tuners/<method>/layer.py, get_delta_weight and merge), in f32:
//
//   LoHa   (loha/layer.py HadaWeight):  dW = ((w1a @ w1b) * (w2a @ w2b)) * float(scale)
//          CP form (HadaWeightCP):     dW = (cp(t1, w1a, w1b) * cp(t2, w2a, w2b)) * float(scale)
//   LoKr   (lokr/layer.py make_kron):   dW = kron(w1, w2) * float(scale), with w1 = lokr_w1 or
//                                       lokr_w1_a @ lokr_w1_b and w2 = lokr_w2 or lokr_w2_a @ lokr_w2_b
//                                       or, CP form, cp(lokr_t2, lokr_w2_a, lokr_w2_b)
//   AdaLoRA (adalora/layer.py):         dW = ((B @ (A * E)) * float(scaling)) / (float(ranknum) + 1e-5f)
//   IA3    (ia3/layer.py merge):        W' = W * l, l = ia3_l per output feature, or per input
//                                       feature for a feed-forward module (feedforward_modules)
//   MiSS   (miss/layer.py):             dW[o, j] = miss_block[j % r, o] (mini: miss_block[j % r, o % mini_r]);
//                                       "bat": dW = W_blocks @ miss_block + miss_block per r x r block (needs W)
//   SHiRA  (shira/layer.py):            dW[row_k, col_k] = shira_weight[k] * float(scale) at the saved
//                                       shira_indices (a sparse COO delta), zero elsewhere
//   VeRA   (vera/layer.py):             dW = (lambda_b * vera_B[:out]) @ (lambda_d * vera_A[:, :in])
//   RandLoRA (randlora/layer.py):       dW = (B_flat @ ((lambda * A) * gamma)_flat) * float(scale),
//                                       transposed when out < in (randlora.cpp)
//   FourierFT (fourierft/layer.py):     dW = float(ifft2(spectrum at randperm positions).real) *
//                                       float(scale), the transform in f64 (fourierft.cpp)
//   VB-LoRA (vblora/layer.py):          dW = B @ A, A / B the softmax-weighted mixtures of the topk
//                                       vector-bank rows per logits row, all in f64 (vblora.cpp)
//   C3A    (c3a/layer.py):              dW[Mb+i, Nb+j] = kernel[M, N, (j - i) mod b] / in, the exact
//                                       block-circulant (PEFT's FFT within its f32 rounding; c3a.cpp)
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
// Linear and GPT-2 Conv1D layers are merged here, and LoHa/LoKr also on nn.Conv2d: there a
// weight [out, in, kh, kw] is the matrix [out, in * kh * kw] (PEFT's get_delta_weight reshapes
// its delta to the weight's shape, which is the same row-major order), `in` below is that
// flattened width, and a factor PEFT stores 4-D (LoKr's lokr_w2 [b, d, kh, kw]) is the matrix
// [b, d * kh * kw]. The CP ("use_effective_conv2d") form rebuilds a 4-D factor with an einsum
// (cp_rebuild); torch's einsum sums in an order of its own choosing (opt_einsum path, BLAS
// blocking), so cp_rebuild sums in f64 and rounds once to f32: within one f32 rounding of the
// exact value, hence within about 2^-24 relative of PEFT's f32 einsum plus its own rounding
// error. The dense delta of one weight is materialised in f32: out x in x 4 bytes beside the
// weight.
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

// The CP rebuild of loha/layer.py HadaWeightCP and lokr/layer.py make_weight_cp:
// R[p, q, k, l] = sum_i sum_j t[i, j, k, l] * wa[i, p] * wb[j, q] for t [r, r, kh, kw], wa [r, P],
// wb [r, Q]; returns R [P, Q, kh, kw] row-major, summed in f64 and rounded once to f32.
// PEFT_ERR_SHAPE_MISMATCH naming `name` and the three parameters when the shapes disagree.
std::vector<float> cp_rebuild(const MethodTensor& t, const MethodTensor& wa, const MethodTensor& wb,
                              std::string_view name, const char* t_name, const char* wa_name, const char* wb_name);

// LoHa's CP form on a Conv2d [out, c, kh, kw] (use_effective_conv2d, kernel not 1x1):
// hada_t1/hada_t2 [r, r, kh, kw], hada_w1_a/hada_w2_a [r, out], hada_w1_b/hada_w2_b [r, c];
// dW = (rebuild1 * rebuild2) * float(scale), each rebuild cp_rebuild's f32 tensor, the products f32
// as torch's `rebuild1 * rebuild2 * scale`; `in` is c * kh * kw.
std::vector<float> loha_cp_delta(const MethodTensor& t1, const MethodTensor& w1a, const MethodTensor& w1b,
                                 const MethodTensor& t2, const MethodTensor& w2a, const MethodTensor& w2b,
                                 double scale, int64_t out, int64_t in, std::string_view name);

// LoKr: w1 = lokr_w1 [a, c] or lokr_w1_a [a, r] @ lokr_w1_b [r, c]; w2 = lokr_w2 [b, d] or
// lokr_w2_a [b, r] @ lokr_w2_b [r, d]; out = a * b, in = c * d. Pass null for absent tensors.
// On a Conv2d: lokr_w2 [b, d, kh, kw], or lokr_w2_b [r, d * kh * kw], or the CP form lokr_t2
// [r, r, kh, kw] with lokr_w2_a [r, b] and lokr_w2_b [r, d] (w2 = cp_rebuild); in = c * d * kh * kw.
struct LokrFactors {
  const MethodTensor* w1 = nullptr;
  const MethodTensor* w1_a = nullptr;
  const MethodTensor* w1_b = nullptr;
  const MethodTensor* w2 = nullptr;
  const MethodTensor* w2_a = nullptr;
  const MethodTensor* w2_b = nullptr;
  const MethodTensor* t2 = nullptr;
};
std::vector<float> lokr_delta(const LokrFactors& f, double scale, int64_t out, int64_t in, std::string_view name);

// AdaLoRA: lora_A [r, in], lora_E [r, 1], lora_B [out, r].
std::vector<float> adalora_delta(const MethodTensor& a, const MethodTensor& e, const MethodTensor& b, double scaling,
                                 double ranknum, int64_t out, int64_t in, std::string_view name);

// VeRA: the shared vera_A [r, >= in] and vera_B [>= out, r], lambda_d [r], lambda_b [out]. VeRA has
// no scale; `weight` != 1 (a merge weight) multiplies the delta in f32.
std::vector<float> vera_delta(const MethodTensor& vera_a, const MethodTensor& vera_b, const MethodTensor& lambda_d,
                              const MethodTensor& lambda_b, double weight, int64_t out, int64_t in,
                              std::string_view name);

// RandLoRA: randlora_A [r, 1 or >= nb, >= min(out, in)], randlora_B [>= max(out, in), >= nb, r],
// randlora_lambda [r, nb], randlora_gamma [nb, min(out, in)], nb = ceil(min(out, in) / r).
std::vector<float> randlora_delta(const MethodTensor& a, const MethodTensor& b, const MethodTensor& lambda,
                                  const MethodTensor& gamma, double scale, int64_t out, int64_t in,
                                  std::string_view name);

// The first `count` entries of torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on
// the CPU, bit for bit (PEFT_ERR_UNSUPPORTED for n >= 2^32 / 20, where torch changes algorithm).
std::vector<int64_t> torch_randperm(int64_t n, int64_t seed, int64_t count);

// FourierFT: fourierft_spectrum [n] at the positions torch_randperm(out * in, seed, n) draws.
std::vector<float> fourierft_delta(const MethodTensor& spectrum, int64_t seed, double scale, int64_t out, int64_t in,
                                   std::string_view name);

// VB-LoRA: one logits tensor as saved, whole (logits) or in save_only_topk_weights form
// (topk_indices [.., topk] and topk_weights [.., topk - 1]); the pointers stay owned by the caller.
struct VbloraLogits {
  const MethodTensor* logits = nullptr;
  const MethodTensor* topk_indices = nullptr;
  const MethodTensor* topk_weights = nullptr;
};

// VB-LoRA: the shared vector bank [num_vectors, L], logits_A [r, in / L, num_vectors] and logits_B
// [out / L, r, num_vectors]. No scale; `weight` != 1 multiplies the delta once in f32.
// INVALID_ARGUMENT for top-k weights PEFT would turn into NaN (a negative completed weight) and
// indices outside the bank; INVALID_CONFIG for topk > num_vectors.
std::vector<float> vblora_delta(const MethodTensor& bank, const VbloraLogits& a, const VbloraLogits& b, int64_t topk,
                                double weight, int64_t out, int64_t in, std::string_view name);

// C3A: c3a_kernel [out / b, in / b, b], the exact block-circulant divided by `in` in f32.
std::vector<float> c3a_delta(const MethodTensor& kernel, double weight, int64_t out, int64_t in,
                             std::string_view name);

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

// MiSS (miss/layer.py): block [r, out] (standard, the init_weights true/false form), [r, mini_r]
// (mini_r > 0, init_weights "mini") or, with bat, [out / r, r, r] (init_weights "bat"). bat's delta
// is W_blocks @ block + block from the weight W [out, in] (PyTorch order, f32) as it stands: pass
// `weight`; a null weight checks the shapes only and returns an empty vector for bat.
std::vector<float> miss_delta(const MethodTensor& block, int64_t mini_r, bool bat, const float* weight, int64_t out,
                              int64_t in, std::string_view name);

// SHiRA (shira/layer.py): shira_weight [K] at shira_indices [2, K] (row, column pairs), times
// float(scale); PEFT_ERR_INVALID_ARGUMENT names an index outside the layer.
std::vector<float> shira_delta(const MethodTensor& values, const MethodTensor& indices, double scale, int64_t out,
                               int64_t in, std::string_view name);

// The weight of `layout` as f32 in PyTorch order [out, in] (what MiSS's bat form multiplies).
std::vector<float> weight_f32(const WeightView& weight, const DeltaLayout& layout);

// ---- Multiplicative methods: W' = (W @ M) * s, a dense [in, in] matrix M on the input side -----
//
//   OFT  (oft/layer.py, Linear.merge):  W' = (R @ W^T)^T = W @ R^T, R block diagonal from oft_R
//                                       (one block per row of oft_R, or one shared block repeated
//                                       in / block_size times when block_share), each block the
//                                       Cayley transform of a skew-symmetric Q built from the upper
//                                       triangle: (I - Q)(I + Q)^-1, or its truncated Neumann series
//                                       I + 2Q + 2Q^2 + ... + Q^(n-1) (use_cayley_neumann, n terms,
//                                       exactly as _cayley_batch sums them); coft first projects each
//                                       Q onto the Frobenius ball of radius eps / sqrt(blocks).
//   BOFT (boft/layer.py, Linear.merge): W' = (W @ M^T) * boft_s, M = B_(N-1) ... B_0, B_i = P_i D_i
//                                       P_i^T with D_i block diagonal of the Cayley transforms of
//                                       0.5 (R - R^T) (boft_R [N, D, H, H]) and P_i the butterfly
//                                       permutation block_butterfly_perm(in, D / 2^i, H / 2, N - 1).
//   HRA  (hra/layer.py, Linear.merge):  W' = W @ H, H = (I - 2 u_1 u_1^T) ... (I - 2 u_r u_r^T) with
//                                       u_i the normalised columns of hra_u [in, r], or with apply_GS
//                                       H = I - 2 U U^T, U the Gram-Schmidt orthonormalised columns.
//
// The rotation is built and applied in f64, and each merged element rounds once to f32 (BOFT's
// boft_s product is then an f32 product, as PEFT's `orig_weight * boft_s`) and once more to a
// 16-bit weight dtype. PEFT builds R in f32 (torch.linalg.solve for the exact Cayley transform) and
// multiplies in f32 with torch.mm, so bits are not expected to agree: the merged weights agree with
// PEFT's within 1e-6 of the weight's largest value (tests/interop/test_oft_merge.py).
//
// Unmerge: PEFT's own unmerge inverts (OFT: torch.linalg.inv(R); BOFT: M^T and 1 / boft_s; HRA:
// the reflections in reverse order), approximate in floating point; `inverse` builds that inverse
// transform. Exact removal keeps the original rows instead (buffer_merge.hpp).
// PEFT has no merge weight for these methods (set_scale warns and keeps 1): callers refuse a
// weight != 1. Only Linear layers ([out, in] weights) are merged: PEFT refuses GPT-2 Conv1D.

struct OftSettings {
  bool coft = false;
  double eps = 6e-5;
  bool block_share = false;
  bool use_cayley_neumann = true;
  int64_t num_cayley_neumann_terms = 5;
};

// One step of a transform, applied to each weight row x (length in) in f64.
struct TransformStep {
  enum class Kind {
    blocks,       // x[b*k + i] = sum_j x[b*k + j] * values[blk][i][j] (W @ block^T), blk = 0 when shared
    permute,      // x[i] = x[index[i]]
    reflections,  // for each unit vector u in values (in order): x -= 2 (x . u) u
    projector,    // x -= 2 sum_u (x . u) u over the vectors in values (I - 2 U U^T)
  };
  Kind kind = Kind::blocks;
  int64_t size = 0;            // blocks: the block size; reflections/projector: in
  int64_t count = 0;           // blocks: stored blocks (1 when shared); reflections/projector: vectors
  std::vector<double> values;  // row-major blocks, or vectors
  std::vector<int64_t> index;  // permute
};

struct InputTransform {
  int64_t in = 0;
  std::vector<TransformStep> steps;  // applied in order
  std::vector<float> out_scale;      // empty, or one f32 factor per output feature applied last
};

// Each builder checks the shapes PEFT creates for a layer of `out` x `in` features
// (PEFT_ERR_SHAPE_MISMATCH naming `name`). `inverse` gives PEFT's unmerge transform.
InputTransform oft_transform(const MethodTensor& oft_r, const OftSettings& settings, int64_t in, bool inverse,
                             std::string_view name);
InputTransform boft_transform(const MethodTensor& boft_r, const MethodTensor& boft_s, int64_t out, int64_t in,
                              bool inverse, std::string_view name);
InputTransform hra_transform(const MethodTensor& hra_u, bool apply_gs, int64_t in, bool inverse,
                             std::string_view name);

// The Cayley transform (I - S)(I + S)^-1 of an n x n skew-symmetric S (row-major), by Gaussian
// elimination with partial pivoting in f64; PEFT_ERR_INVALID_CHECKPOINT naming `name` when I + S is
// singular (it never is for a real skew-symmetric S). Also the inverse of a general matrix.
std::vector<double> cayley_f64(const std::vector<double>& s, int64_t n, std::string_view name);
std::vector<double> inverse_f64(const std::vector<double>& a, int64_t n, std::string_view name);

// W = round((W @ M) * s) per element, M the transform, for a Linear weight [out, in] (layout not
// transposed). exec.row_sink sees the original bytes of every row that changes.
void transform_input(const WeightView& weight, const DeltaLayout& layout, const InputTransform& transform,
                     const ExecOptions& exec = {});

// Replacements (LN_TUNING norms, trainable-token rows, full tensors): the weight's rows `rows`
// (every row, in order, when empty) become `values` ([count, weight.cols] f32, row i for rows[i])
// rounded once to the weight's dtype, as torch's copy_ / index_copy_ of an f32 tensor into it.
// PEFT_ERR_INVALID_ARGUMENT for a row outside the weight; exec.row_sink as above.
void replace_rows(const WeightView& weight, const float* values, std::span<const int64_t> rows,
                  const ExecOptions& exec = {});

}  // namespace peft::merge
