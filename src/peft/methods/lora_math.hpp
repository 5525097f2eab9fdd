// The arithmetic of merging LoRA adapters into base weights, as PEFT does it
// (peft/tuners/lora/layer.py get_delta_weight/merge/unmerge, dora.py, variants.py), done in f32
// and rounded once to the storage dtype (round to nearest, ties to even).
//
// Every module kind reduces to one product. With A = lora_A [rank, in] and B = lora_B [out, rank]
// (conv factors flattened: A [rank, in*k...], B [out, rank]), the base weight in storage holds
//   Linear, Conv1d/2d/3d:                W  [out, in]   and  dW = c * (B @ A)
//   transformers Conv1D (fan_in_fan_out): W  [in, out]   and  dW = c * (B @ A)^T
//   Embedding (A = lora_embedding_A [rank, num_embeddings], B = lora_embedding_B [dim, rank]):
//                                        W  [num_embeddings, dim] and dW = c * (B @ A)^T
// where c is the adapter's scaling (lora_alpha / r, or / sqrt(r) with rslora) times the caller's
// weight. A DoRA magnitude has one entry per row of B (out for Linear/Conv/Conv1D, dim for
// Embedding) and the DoRA norm is taken over the other axis of B @ A: the rows of storage when it
// is not transposed, the columns when it is (docs/peft-semantics.md, "DoRA").
//
// Numerics, chosen to match PEFT's default path (adapters autocast to f32, CPU merge):
// - B @ A is accumulated in f32 with fused multiply-adds, k = 0..rank-1 in order, then multiplied
//   by float(c) (torch multiplies an f32 tensor by a Python float as float). Several adapters add
//   up as fma(c_i, (B_i @ A_i), sum) in the order given. Results do not depend on the thread count
//   or block size, and are the same on every instruction set (FMA is explicit everywhere).
// - W' = round(float(W) + dW): one rounding, as PEFT's unsafe merge `W += delta` does.
// - Unmerge is W' = round(float(W) - dW), one rounding (PEFT rounds the delta to the storage
//   dtype first, which can differ in the last bit).
// - DoRA: n = ||float(W) + dW|| (accumulated in f64, rounded to f32; torch reduces in f32),
//   f = m / n in f32, W' = round(f * (float(W) + dW)); unmerge W' = round(float(W) / f - dW).
//   For a bf16/f16 base PEFT's norm is f32 too: its W + dW promotes to f32 because the adapter
//   is autocast to f32 (autocast_adapter_dtype=True, the default). Adapters kept in bf16
//   (autocast off, e.g. transformers' load_adapter) would give a bf16 delta and norm; not emulated.
//
// Memory: the delta is never materialised for the whole weight; each worker holds one block of
// rows of f32 (~256 KiB, more rows for ranks above 16) plus, for transposed layouts, a transposed
// copy of the factors.
//
// The product is not cblas_sgemm: with k = rank (8..64) OpenBLAS 0.3.21 spends its time packing,
// and reached 5-17 GFLOP/s for 4096 x 11008 x 16 on this machine where the fused register-tiled
// kernel of merge_kernels.cpp reaches 40-90 GFLOP/s per core (bench/bench_merge_math.cpp prints
// both). The kernel also makes the result independent of the BLAS build and thread count.
//
// Thread safety: every function here is pure with respect to library state; calls on different
// buffers may run concurrently. A call writes only into the buffer it is given.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"

namespace peft::merge {

// What the adapted module is; it decides the storage layout of dW and the DoRA norm axis.
enum class ModuleKind {
  linear,         // torch.nn.Linear: weight [out, in]
  conv1d_gpt2,    // transformers.pytorch_utils.Conv1D (fan_in_fan_out): weight [in, out]
  embedding,      // torch.nn.Embedding: weight [num_embeddings, dim]
  conv,           // torch.nn.Conv1d/2d/3d: weight [out, in/groups, k...]
};

// How a weight in storage relates to the product B @ A ([out, rank] @ [rank, in]).
struct DeltaLayout {
  int64_t out = 0;           // rows of B; length of a DoRA magnitude / norm
  int64_t in = 0;            // columns of A (conv: in * prod(kernel))
  bool transposed = false;   // storage holds (B @ A)^T, i.e. [in, out]
  int64_t rows() const { return transposed ? in : out; }
  int64_t cols() const { return transposed ? out : in; }
};

// Checks the shapes PEFT would create for `kind` and returns the layout. `name` (a tensor or module
// name) goes into error messages. Throws SHAPE_MISMATCH when factors and weight disagree,
// UNSUPPORTED for what PEFT itself cannot merge: conv with groups > 1 ("Merging is not supported
// for _ConvNd layers with groups > 1") and a 5-D conv weight whose dims 2:4 are (1, 1) (PEFT's
// 1x1 shortcut then fails), INVALID_ARGUMENT for a rank or dimension < 1.
DeltaLayout layout_for(ModuleKind kind, std::span<const int64_t> weight_shape,
                       std::span<const int64_t> lora_a_shape, std::span<const int64_t> lora_b_shape,
                       int64_t groups = 1, std::string_view name = {});

// The layout from plain sizes, for callers that already know them.
DeltaLayout layout_for(ModuleKind kind, int64_t out, int64_t in);

// One LoRA term c * B @ A. Borrowed, row-major f32: a is [rank, layout.in], b is [layout.out, rank].
struct LoraFactors {
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t rank = 0;
  double coefficient = 1.0;  // scaling * weight; used as float(coefficient)
};

// PEFT's scaling: lora_alpha / r, or lora_alpha / sqrt(r) with rslora.
double lora_scaling(double lora_alpha, int64_t rank, bool use_rslora);

// weight * scaling, the factor a LoRA delta is multiplied by. Merges compute in f32, so a product
// that is not finite or lies outside the float range would make every merged weight infinite:
// PEFT_ERR_NON_FINITE naming `who` (and the two numbers) instead.
double lora_coefficient(double weight, double scaling, const std::string& who);

// A weight (or bias) buffer the caller owns: rows x cols elements, row-major, contiguous, of dtype
// F32, BF16 or F16 (anything else: UNSUPPORTED). A bias is rows = 1.
struct WeightView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct ConstWeightView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  ConstWeightView() = default;
  ConstWeightView(const void* d, DType t, int64_t r, int64_t c) : data(d), dtype(t), rows(r), cols(c) {}
  ConstWeightView(const WeightView& v) : data(v.data), dtype(v.dtype), rows(v.rows), cols(v.cols) {}  // NOLINT
};

// Receives the original bytes of every row a call is about to change (rows whose new bytes differ
// from the old ones), before they are overwritten. Called from worker threads, but never twice at
// the same time (calls are serialised), and at most once per row per call.
using RowSink = std::function<void(int64_t row, const void* original_bytes, size_t byte_count)>;

// The order of a plain LoRA merge's f32 arithmetic (add_delta only; the other operations ignore it).
//   peft: PEFT's: the delta c * B @ A as one float chain over the rank (the kernel table's order,
//         the same on every table), all terms summed, then added to the weight and rounded once.
//   ggml: llama.cpp's llama-export-lora on ggml's scalar (reference) CPU code, term after term:
//         d = float(sum_k double(float(B[o][k] * A[k][i]))) (float products added in double in rank
//         order, rounded once), then W = d * float(c) + W in float; the weight is rounded to its
//         storage dtype after the last term.
enum class Arithmetic { peft, ggml };

struct ExecOptions {
  unsigned threads = 0;        // worker threads; 0 = one per hardware thread. Small jobs use one.
  const RowSink* row_sink = nullptr;  // optional; see RowSink
  Arithmetic arithmetic = Arithmetic::peft;  // add_delta only
  // Optional: set to true by an operation that writes a weight when any value it writes is infinite
  // or NaN in the weight's dtype (checked in the pass that writes it; add_delta, dora_merge and the
  // methods' rewrites of peft_methods.hpp). Never reset.
  std::atomic<bool>* non_finite = nullptr;
  // Optional, add_delta only (others refuse it): a buffer of the weight's dtype and shape whose rows
  // the merge reads instead of the weight's; each row is copied from it into the weight, then the
  // delta added there, in one pass (a host putting back its original weights before a merge). Not
  // with a row sink.
  const void* source = nullptr;
};

// Fails with INVALID_ARGUMENT, naming the value, unless the merge weight `weight` is a finite f32
// (|weight| <= FLT_MAX): the weight scales f32 factors, and llama.cpp's merge takes it as a float. The
// C API's setters of a merge weight check it when they are called.
void require_merge_weight(double weight);

// llama-export-lora's scale of an adapter merged with weight `weight`, in its f32 arithmetic:
// float(weight) * float(alpha) / float(rank), or float(weight) when alpha is 0. For a PEFT LoRA
// module whose scaling is lora_alpha / r (what convert_lora_to_gguf.py writes as adapter.lora.alpha);
// other scalings (rslora, alpha 0 in PEFT, which scales by 0) keep float(weight * scaling).
double ggml_lora_coefficient(double weight, double alpha, int64_t rank, double scaling, const std::string& who);

// The largest |value| of the buffer (F32, BF16 or F16), or an infinity or a NaN when it holds one.
// An IEEE value's bits without the sign order as its magnitude, with the infinities and NaNs above
// every finite value: the largest of them (a loop compilers vectorise), read back as a number.
// `threads` as ExecOptions::threads.
double largest_magnitude(const ConstWeightView& view, unsigned threads = 0);

// Whether any value of the buffer (F32, BF16 or F16) is an infinity or a NaN.
bool holds_non_finite(const ConstWeightView& view);

// ---- deltas ---------------------------------------------------------------------------------

// Writes sum_i c_i * (B_i @ A_i) in storage layout into out[layout.rows() * layout.cols()].
void compute_delta(const DeltaLayout& layout, std::span<const LoraFactors> terms, float* out,
                   const ExecOptions& exec = {});
std::vector<float> compute_delta(const DeltaLayout& layout, std::span<const LoraFactors> terms,
                                 const ExecOptions& exec = {});
// Rows [row0, row0 + rows) of compute_delta's result (storage layout), the same values, into
// out[rows * layout.cols()]: a delta built a slice at a time.
void compute_delta_rows(const DeltaLayout& layout, std::span<const LoraFactors> terms, int64_t row0, int64_t rows,
                        float* out);

// ---- plain LoRA -----------------------------------------------------------------------------

// W = round(float(W) + sum_i c_i * B_i @ A_i). The weight must be layout.rows() x layout.cols().
void add_delta(const WeightView& weight, const DeltaLayout& layout, std::span<const LoraFactors> terms,
               const ExecOptions& exec = {});

// W = round(float(W) - sum_i c_i * B_i @ A_i): PEFT's unmerge, rounded once.
void subtract_delta(const WeightView& weight, const DeltaLayout& layout,
                    std::span<const LoraFactors> terms, const ExecOptions& exec = {});

// lora_bias (PEFT >= 0.14): bias = round(float(bias) + sign * float(lora_b_bias[j] * c)), one
// rounding after the f32 product, as `bias.data += lora_B.bias * scaling`. bias is 1 x out.
void add_lora_bias(const WeightView& bias, const float* lora_b_bias, double coefficient, bool subtract = false,
                   const RowSink* row_sink = nullptr);

// ---- DoRA -----------------------------------------------------------------------------------

// ||float(W0) + dW|| for each of the layout.out channels: rows of storage, or columns when the
// layout is transposed. PEFT computes the norm from the unmerged base weight W0 and caches it for
// unmerge.
std::vector<float> dora_weight_norm(const ConstWeightView& base, const DeltaLayout& layout,
                                    std::span<const LoraFactors> terms, const ExecOptions& exec = {});

// W = round(f * (float(W) + dW)) with f = magnitude / norm (f32), per output channel. `norm` is
// dora_weight_norm of the unmerged base; pass nullptr to take it from W itself (W is then the
// base), the usual case. Returns the norm used, which dora_unmerge needs. magnitude has
// layout.out entries (a conv magnitude [1, out, 1, 1] flattened).
std::vector<float> dora_merge(const WeightView& weight, const DeltaLayout& layout,
                              std::span<const LoraFactors> terms, const float* magnitude,
                              const float* norm = nullptr, const ExecOptions& exec = {});

// W = round(float(W) / f - dW) with f = magnitude / norm, the norm dora_merge returned.
void dora_unmerge(const WeightView& weight, const DeltaLayout& layout, std::span<const LoraFactors> terms,
                  const float* magnitude, const float* norm, const ExecOptions& exec = {});

// ---- combining adapters (PEFT add_weighted_adapter) ------------------------------------------

// One adapter's factors for combination: a [rank, in], b [out, rank], its scaling and the
// user's weight.
struct WeightedFactors {
  const float* a = nullptr;
  const float* b = nullptr;
  int64_t rank = 0;
  double scaling = 1.0;
  double weight = 1.0;
};

// New factors: a is [rank, in] and b is [out, rank], row-major f32. The new adapter's scaling is
// lora_alpha / r = 1 (PEFT writes r = lora_alpha = new rank; with use_rslora inherited it is
// sqrt(rank), PEFT's over-scaling, which the caller must account for).
struct CombinedFactors {
  std::vector<float> a;
  std::vector<float> b;
  int64_t rank = 0;
  int64_t in = 0;
  int64_t out = 0;
};

// combination_type="cat": A = rows of float(float(A_i * w_i) * s_i), B = columns of B_i;
// rank = sum of ranks; dW = sum_i w_i s_i B_i A_i exactly (up to f32 rounding of the rows).
CombinedFactors combine_cat(std::span<const WeightedFactors> adapters, int64_t out, int64_t in);

// combination_type="linear": c_i = w_i * s_i (f64); A = sum_i float(sign(c_i) sqrt|c_i|) * A_i,
// B = sum_i float(sqrt|c_i|) * B_i, summed in f32 in the order given. All ranks must be equal
// (INVALID_ARGUMENT otherwise). Exact only for a single adapter (cross terms B_i A_j otherwise).
CombinedFactors combine_linear(std::span<const WeightedFactors> adapters, int64_t out, int64_t in);

// The task-arithmetic combination types of add_weighted_adapter (peft/utils/merge_utils.py), each
// applied to the A factors (weights sign(c_i) sqrt|c_i|) and to the B factors (weights sqrt|c_i|)
// separately, as PEFT does:
// * linear: sum_i w_i T_i;
// * magnitude_prune: each T_i keeps its int(density * numel) largest magnitudes (ties broken by the
//   lower index), then linear;
// * ties: magnitude pruning, then per element the majority sign of the pruned tensors (sign of
//   their sum, or of the sum of their signs for `frequency`; 0 counts as +), and the mean of the
//   weighted values that have it: sum_i w_i P_i [sign P_i = s] / max(1, count);
// * dare_linear / dare_ties: each element is kept with probability `density` (dare_keep) and the
//   kept ones divided by float(density), then linear / the ties election.
// A density >= 1 prunes nothing (PEFT warns); below 0 or NaN is INVALID_ARGUMENT.
enum class TaskArithmetic { linear, ties, dare_linear, dare_ties, magnitude_prune };
enum class MajoritySign { total, frequency };

struct TaskSettings {
  TaskArithmetic how = TaskArithmetic::linear;
  double density = 1.0;
  MajoritySign sign = MajoritySign::total;
  uint64_t seed = 0;        // DARE's masks
  std::string_view stream;  // DARE's masks: one stream per module (its name)
};

// Whether DARE keeps element `element` of factor `factor` (0 = A, 1 = B, 2 = the delta of the SVD
// types) of the `adapter`-th input that has module `stream`: a counter-based draw, the same on every
// machine and in any order,
//   mix(x) = splitmix64's output function of x + 0x9E3779B97F4A7C15,
//   s = mix(mix(seed ^ fnv1a64(stream)) ^ (2 * adapter + factor)),
//   u = (mix(s ^ element) >> 11) * 2^-53, kept iff u < density.
bool dare_keep(uint64_t seed, std::string_view stream, size_t adapter, int factor, uint64_t element, double density);

// Combines equal-rank factors with one of the task-arithmetic types (see above); rank = the
// adapters' rank (INVALID_ARGUMENT when they differ).
CombinedFactors combine_task_arithmetic(std::span<const WeightedFactors> adapters, int64_t out, int64_t in,
                                        const TaskSettings& settings);

// The task arithmetic above on whole tensors: t_i of n values each, weights w_i (f32, used as they
// are), DARE's masks drawn with `factor` (the delta-space combine uses 2, as combine_svd). Returns
// the combined n values. INVALID_ARGUMENT for a density below 0 or NaN.
std::vector<float> combine_task_tensors(std::span<const float* const> tensors, std::span<const float> weights,
                                        size_t n, const TaskSettings& settings, int factor);

// Which elements magnitude pruning keeps of a tensor of n values: the int(density * n) largest
// magnitudes, the lower index first among equal ones, as torch.topk does. With magnitudes ordered by
// |x|'s bits (NaN above infinity), element j is kept iff key(t_j) > threshold, or key(t_j) ==
// threshold and fewer than `equal_kept` earlier elements equal the threshold.
struct MagnitudeCut {
  uint32_t threshold = 0xFFFFFFFFu;  // above every key: nothing kept
  uint64_t equal_kept = 0;
};
// Calls its argument once per slice of the tensor, in order: visit(values, count).
using SliceVisitor = std::function<void(const float*, size_t)>;
// The cut of a tensor that `for_each_slice(visit)` shows slice by slice (it is called twice: a
// two-level histogram of the keys, 32768 and 65536 bins, so memory does not grow with n).
MagnitudeCut magnitude_cut(uint64_t n, double density, const std::function<void(const SliceVisitor&)>& for_each_slice);

// combine_task_tensors for tensors too large to hold at once, the same values: m tensors of n values,
// read by `read(i, offset, count, out)` (elements [offset, offset + count) of tensor i as f32) in
// slices of at most `slice` values, combined, and handed to `write(offset, values, count)` in order.
// Memory: m + 1 slices (twice that while pruning). The magnitude-pruning types read every tensor two
// more times first (magnitude_cut).
using SliceReader = std::function<void(size_t tensor, uint64_t offset, size_t count, float* out)>;
using SliceWriter = std::function<void(uint64_t offset, const float* values, size_t count)>;
void combine_task_slices(size_t m, std::span<const float> weights, uint64_t n, const TaskSettings& settings, int factor,
                         size_t slice, const SliceReader& read, const SliceWriter& write);

// The SVD combination types of add_weighted_adapter (svd, ties_svd, dare_linear_svd, dare_ties_svd,
// magnitude_prune_svd: `settings.how` linear, ties, dare_linear, dare_ties, magnitude_prune), as
// _svd_generalized_task_arithmetic_weighted_adapter does them:
// * each adapter's delta s_i * B_i @ A_i (compute_delta, in `layout`'s storage order: PEFT's
//   get_delta_weight, [in, out] for a Conv1D or an embedding) is pruned and summed with the f32
//   weights w_i (not sqrt'd: the deltas hold the scalings) by the task arithmetic above, DARE's
//   masks drawn with factor 2 (the delta's row-major index in that storage order);
// * the sum, as [out, in], is factored by truncated_svd (sgesdd, as torch.linalg.svd on CPU):
//   B = U[:, :k] S[:k], A = V^T[:k] with k = min(rank, out, in), the sign of each component chosen so
//   that the largest magnitude in B's column (the first of equal ones) is positive; rows of A and
//   columns of B from k to rank are zero (PEFT makes lora_B [out, k] there, whose forward fails);
// * with a clamp q in [0, 1]: hi = the q-quantile of B's and A's values together (torch.quantile,
//   linear interpolation, in f32), and every value of both clamped to [-hi, hi] (PEFT's svd_clamp).
// Returns the factors at `rank`; INVALID_ARGUMENT for a rank < 1 or a clamp outside [0, 1]; the
// errors of truncated_svd (NON_FINITE for a delta that is not finite).
CombinedFactors combine_svd(std::span<const WeightedFactors> adapters, const DeltaLayout& layout,
                            const TaskSettings& settings, int64_t rank, std::optional<double> clamp);

// Name of the kernel set in use ("avx512", "avx2", "portable"), for benchmarks and reports.
const char* kernel_name();

}  // namespace peft::merge
