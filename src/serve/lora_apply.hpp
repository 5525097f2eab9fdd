// Unmerged LoRA on activations (peft_lora_apply()): adds each row's adapter contribution to the
// output a host computed with the base weight, as PEFT's unmerged forward with mixed-batch
// `adapter_names` does (peft/tuners/lora/layer.py, Linear._mixed_batch_forward):
//
//   y[i] += scaling_g * (x[i] A_g^T) B_g^T  (+ scaling_g * bias_g)    for every row i of group g
//
// with A = lora_A [rank, in], B = lora_B [out, rank] and bias = lora_B.bias [out] (lora_bias=True;
// it is part of lora_B's output, so the scaling multiplies it too). Rows of no group, and rows of a
// group that has no factors (the adapter has no such layer), are left unchanged, bit for bit.
//
// Numerics: everything in f32. Rows of one group are multiplied together, a block of rows at a
// time, by the kernels of serve/apply_kernels.hpp: T = X A^T, then C = Y + float(scaling) * T B^T
// with C holding y's rows as f32; then C += float(scaling) * bias and C is rounded once into y's
// dtype (nearest, ties to even). PEFT computes in the factors' dtype and rounds the LoRA output
// before adding it; for f32 the results agree to f32 rounding, for bf16/f16 ours is the single
// rounding of nearly the exact sum.
//
// Memory and threads: factors are read in their storage dtype (no widened copy); rows are
// processed in blocks of kBlockRows so the scratch stays small. Scratch is per calling thread and
// reused across calls (freed after a call that needed more than kKeptScratchBytes). No copy is
// made of x's rows when x is f32 and a block's rows are consecutive, nor of y's rows when y is f32
// and they are (x and y may have any alignment; f32 rows not aligned to 4 bytes are copied). A
// call of kParallelWork multiply-adds or more splits each group's rows between the cores
// (core/worker_pool.hpp); each thread then reads the factors for its own rows.
//
// DoRA groups (LoraFactors::dora_scale set): PEFT's DoRA forward (dora.py DoraLinearLayer.forward,
// eval mode), with s = dora_scale (magnitude / ||W + scaling B A||, per output feature) and
// bias = base_bias (the base layer's bias, which y includes; zero when null):
//
//   y[i] += (s - 1) * (y[i] - bias) + (s * (x[i] A^T) B^T) * scaling
//
// in f32 with that order of operations, then rounded once into y's dtype. PEFT computes the same in
// f32 when its adapters are f32 (autocast_adapter_dtype, its default); it subtracts the bias in
// y's dtype where we do it in f32. The LoRA groups' arithmetic is the same with or without DoRA
// groups in the batch.
//
// Thread safety: no shared mutable state; calls writing different outputs may run at once, with
// the same factors too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "core/dtype.hpp"

namespace peft::serve {

// One adapter's LoRA factors for one layer, row-major in their storage dtype (F32, BF16 or F16),
// aligned to their element size (as LoadedAdapter's storage is).
struct LoraFactors {
  DType dtype = DType::F32;
  const void* a = nullptr;     // lora_A [rank, in_features]
  const void* b = nullptr;     // lora_B [out_features, rank]
  const void* bias = nullptr;  // lora_B.bias [out_features], or null
  int64_t rank = 0;
  double scaling = 0;
  // DoRA (see above): out_features f32 values each, borrowed for the call; null for plain LoRA.
  // A DoRA group has no lora_B.bias.
  const float* dora_scale = nullptr;
  const float* base_bias = nullptr;  // may be null with dora_scale (a base layer without bias)
};

// One layer's activations for a batch of rows (tokens). x and y must not overlap.
struct LoraBatch {
  const void* x = nullptr;  // [rows, in_features], row-major
  DType x_dtype = DType::F32;
  void* y = nullptr;        // [rows, out_features], row-major; changed in place
  DType y_dtype = DType::F32;
  uint64_t rows = 0;
  uint64_t in_features = 0;
  uint64_t out_features = 0;
  // rows entries: the group of each row, or -1 for none. Null: every row belongs to groups[0].
  const int32_t* row_group = nullptr;
};

// Rows per block of the products: enough for the kernels to reuse each factor element many times,
// few enough that a block of f32 rows of x and y stays in the caches.
inline constexpr uint64_t kBlockRows = 64;
// Multiply-adds (rows x rank x (in + out), summed over the groups) from which a call splits its
// rows between the cores: below it, starting threads costs more than it saves.
inline constexpr uint64_t kParallelWork = uint64_t(1) << 21;
// Multiply-adds of one group (its rows x rank x (in + out)) from which a call that does not split
// its rows splits the group's two products between the cores (the ranks of X A^T, then the output
// columns of T B^T): 2^18 is a rank-32 row of a 4096 x 4096 layer.
inline constexpr uint64_t kSplitWork = uint64_t(1) << 18;
// Fewest rows a thread of such a call takes: fewer would make each thread read all the factors for
// little work, where splitting each product gives each thread a share of them (16 rows of a rank-64
// layer of LLaMA-7B's shapes took 2% to 18% less time split by products than by rows).
inline constexpr size_t kMinRowsPerThread = 16;
// Scratch above this is returned to the allocator at the end of the call.
inline constexpr size_t kKeptScratchBytes = size_t(32) << 20;

// Adds the LoRA contribution of each row's group into batch.y. groups[g] is nullopt when group g's
// adapter has no factors for this layer. Everything is checked before y is written; on failure y
// is unchanged: INVALID_ARGUMENT for no groups, null pointers (x and y may be null when rows is
// 0), misaligned factors, features or ranks below 1 or above 2^31 - 1, a group
// index out of range, sizes that overflow, overlapping x and y, a DoRA group with a lora_B.bias; UNSUPPORTED for dtypes other than
// F32, BF16 and F16.
void apply_lora(std::span<const std::optional<LoraFactors>> groups, const LoraBatch& batch);

}  // namespace peft::serve
