// Buffer merge: merging an adapter module into weight buffers a host (a running server) owns, and
// taking it out again, so the host can swap adapters without reloading the base model (the C API's
// peft_merge_buffer_* with its peft_merge_record handle; docs/architecture.md, "Merge into host buffers and back").
//
//   BufferMerge m = BufferMerge::apply(weight, &bias, module, {.weight = 0.5,
//                                                             .keep_original_rows = true});
//   ... serve with the adapter merged ...
//   m.remove(weight, &bias);   // with keep_original_rows: the buffer is bit-for-bit as before
//
// The math is lora_math.hpp's: W = round(float(W) + c * dW) with c = weight * scaling, once; DoRA
// W = round(f * (float(W) + c * dW)). Removal without keep_original_rows is PEFT's arithmetic
// unmerge (W - c * dW, or W / f - c * dW for DoRA with the norm cached at merge time), which in
// bf16/f16 leaves last-bit differences. With keep_original_rows a BufferMerge saves the original
// bytes of every row the merge changed (at most the size of the weight; rows a zero row of B
// leaves alone cost nothing) and removal copies them back, after checking that those rows still
// hold exactly what the merge wrote; if anything overwrote them since (typically another merge
// applied later and not yet removed), removal fails with PEFT_ERR_INVALID_ARGUMENT and changes
// nothing. So with several merges on one buffer, remove them in reverse order of application.
//
// Thread safety: apply and remove on different buffers may run concurrently from any threads
// (there is no shared mutable state; each call may start its own worker threads). One BufferMerge, and
// one buffer, belong to one thread at a time. A failed call changes nothing: apply and remove
// validate everything (shapes, dtypes, pointers, allocations for saved rows) before the first
// byte is written.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "peft/adapter/method_params.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {

// One adapter module as the merge needs it. Factor pointers are borrowed, row-major f32, and must
// stay valid until the BufferMerge that uses them is destroyed (keep_alive can hold their owner).
struct BufferMergeModule;

// One expert's matrix within a weight that holds several one after another (a fused expert
// parameter, transformers 5's [E, out, in]): its first row in the weight (viewed as the parent
// module's layout.rows() x layout.cols()) and its own module.
struct BufferMergeSlice {
  int64_t first_row = 0;
  std::shared_ptr<const BufferMergeModule> module;
};

struct BufferMergeModule {
  merge::DeltaLayout layout;             // from merge::layout_for (decides transposition)
  const float* lora_a = nullptr;         // [rank, layout.in]
  const float* lora_b = nullptr;         // [layout.out, rank]
  int64_t rank = 0;
  double scaling = 1.0;                  // merge::lora_scaling(alpha, r, rslora)
  const float* magnitude = nullptr;      // DoRA lora_magnitude_vector [layout.out], or null
  const float* lora_bias = nullptr;      // lora_B.bias [layout.out] (lora_bias=True), or null
  std::shared_ptr<const void> keep_alive;  // optional owner of the memory above; the BufferMerge keeps it
  // Another PEFT method (LoHa, LoKr, AdaLoRA, IA3; methods/peft_methods.hpp): its module and
  // parameters, lora_a/lora_b then null. The additive methods add their dense delta (scaling x
  // weight folded in as PEFT's set_scale does); IA3 multiplies the weight by ia3_l (x weight) and,
  // for a module that is not feed-forward, a bias buffer when one is given.
  std::shared_ptr<const AdapterModule> method_module;
  std::shared_ptr<const MethodParams> method_params;
  // A LoRA on a stacked expert parameter held fused: each expert's slice merged by its own module
  // (layout then spans the whole weight; the factor fields above are unused).
  std::vector<BufferMergeSlice> slices;
};

struct BufferMergeOptions {
  double weight = 1.0;               // multiplies the adapter's scaling
  bool keep_original_rows = false;   // save changed rows so that remove() restores them exactly
  unsigned threads = 0;              // worker threads, 0 = one per hardware thread
  // The order of a plain LoRA module's f32 arithmetic (merge::Arithmetic); ggml refuses DoRA and
  // the other methods (UNSUPPORTED).
  merge::Arithmetic arithmetic = merge::Arithmetic::peft;
  // A host's buffers (the C API, host models): a merge that writes an infinity or a NaN (checked
  // in the pass that writes each value) puts the buffers back to their original bytes and throws
  // PEFT_ERR_NON_FINITE naming `layer`. The original rows are kept while the merge runs, as with
  // keep_original_rows, unless the merge cannot fail (a plain LoRA module, lora_merge_stays_finite).
  // Off for callers that check the merged values themselves (the GGUF merge
  // with its --allow-nonfinite, adapter export).
  bool refuse_non_finite = false;
  // With refuse_non_finite: the caller keeps its own copy of the buffers and puts them back when
  // the merge throws NON_FINITE (a host model in exact mode), so no rows are saved while the merge
  // runs and the buffers are left as merged when it throws.
  bool caller_restores = false;
  std::string layer{};  // the name in that error
  // With caller_restores, for a plain LoRA module without a lora_B.bias (merges_from_source): the
  // weight's original, a buffer of its dtype and shape; every row is read from it and written, with
  // the delta added, into the weight in one pass, whatever the weight held (a host model in exact
  // mode putting back its copy and merging the next adapter at once). INVALID_ARGUMENT otherwise.
  const void* source = nullptr;
  // With refuse_non_finite, for a merge that saves no rows when it cannot fail (a plain LoRA module,
  // lora_merge_stays_finite): an upper bound of |w| over the weight that the caller knows (a host
  // model, from its own writes: BufferMerge::largest_magnitude_after), used instead of reading the
  // weight to find its largest magnitude. NaN (the default): not known; a bound too large to show
  // that the merge cannot fail is not used either: the weight is read.
  double largest_magnitude = std::numeric_limits<double>::quiet_NaN();
};

// Whether merging `coefficient` x B A (a plain LoRA module, PEFT's f32 arithmetic) into `weight`
// can only give finite values, decided without computing the product: every |w| stays under half
// the dtype's largest finite value less twice the bound |coefficient| x max_i sum_k |B_ik| x max |A|
// on every |delta| (the factor 2 covers the f32 rounding of the product and the sum). False when
// anything is already an infinity or a NaN. One read of the weight; a merge that refuses non-finite
// results saves no rows when this holds, since it cannot fail (without reading the weight when its
// caller knows a bound of its magnitude: BufferMergeOptions::largest_magnitude).
bool lora_merge_stays_finite(const merge::WeightView& weight, const BufferMergeModule& module, double coefficient,
                             unsigned threads = 0);

// Whether `module` can be merged from a source buffer (BufferMergeOptions::source): plain LoRA,
// without DoRA's magnitude (its norms are the weight's) or a lora_B.bias (a buffer of its own).
bool merges_from_source(const BufferMergeModule& module);

class BufferMerge {
 public:
  BufferMerge() = default;
  BufferMerge(BufferMerge&&) noexcept = default;
  BufferMerge& operator=(BufferMerge&&) noexcept = default;
  BufferMerge(const BufferMerge&) = delete;
  BufferMerge& operator=(const BufferMerge&) = delete;

  // Merges `module` into `weight` (layout.rows() x layout.cols(), F32/BF16/F16) and, when the
  // module has a lora_bias, into `bias` (1 x layout.out; required then, ignored otherwise).
  // Throws SHAPE_MISMATCH, UNSUPPORTED (dtype), INVALID_ARGUMENT (null pointers, missing bias),
  // OUT_OF_MEMORY, NON_FINITE (options.refuse_non_finite); the buffers are untouched (or, after
  // NON_FINITE, put back byte for byte) when it throws.
  static BufferMerge apply(const merge::WeightView& weight, const merge::WeightView* bias,
                           const BufferMergeModule& module, const BufferMergeOptions& options = {});

  // Takes the merge out of the same buffers (same dtype and shape; they may have moved). Throws
  // INVALID_ARGUMENT when the BufferMerge is empty or already removed, when bias is needed but null,
  // or (keep_original_rows) when the merged rows were modified since; SHAPE_MISMATCH for other
  // shapes or dtypes. After success the BufferMerge is empty.
  void remove(const merge::WeightView& weight, const merge::WeightView* bias);

  bool active() const { return active_; }
  bool keeps_original_rows() const { return keep_rows_; }
  int64_t saved_rows() const;
  size_t saved_bytes() const;
  // The DoRA weight norm cached at merge time (empty for plain LoRA).
  const std::vector<float>& dora_norm() const { return dora_norm_; }
  // An upper bound of |w| over the weight once this merge is in, when the merge was shown not to
  // fail (a plain LoRA module merged with refuse_non_finite and no rows saved); NaN otherwise.
  double largest_magnitude_after() const { return largest_after_; }
  // Such a bound once remove() has taken this merge out again, given one (`before`) while it is in:
  // for a merge that gave largest_magnitude_after(); NaN otherwise (and for a NaN `before`).
  double largest_magnitude_after_remove(double before) const;

 private:
  void check_same_buffers(const merge::WeightView& weight, const merge::WeightView* bias) const;
  // keep_original_rows: INVALID_ARGUMENT when a row the merge wrote (or the bias) changed since.
  void check_unchanged_rows(const merge::WeightView& weight, const merge::WeightView* bias) const;
  // The bytes of one row of the weight (layout.cols() elements of dtype_).
  size_t row_bytes() const;
  // What a merge into this record's buffers runs with: the execution options and, when the record
  // keeps the original rows or the merge must be able to refuse non-finite values, the sinks that
  // save the original rows and bias into the record (reserved up front, so the merge itself cannot
  // fail halfway) and the flag a non-finite value raises. Lives only while the merge runs.
  struct Saving {
    // cannot_fail: the merge was shown to stay finite (lora_merge_stays_finite), so no rows are saved.
    Saving(BufferMerge& record, const BufferMergeOptions& options, bool changes_bias, bool cannot_fail = false);
    merge::ExecOptions exec;
    merge::RowSink rows_sink;
    merge::RowSink bias_sink;
    std::atomic<bool> non_finite{false};
    merge::RowSink* bias_sink_or_null() { return bias_sink ? &bias_sink : nullptr; }
  };
  // After a merge: with refuse_non_finite, when the merge wrote an infinity or a NaN, writes the
  // originals back and throws NON_FINITE; then drops the originals unless keep_original_rows asked
  // for them, or hashes the merged rows for remove().
  void finish(bool non_finite, const merge::WeightView& weight, const merge::WeightView* bias,
              const BufferMergeOptions& options);
  struct MethodChange;
  static BufferMerge apply_method(const merge::WeightView& weight, const merge::WeightView* bias,
                                  const BufferMergeModule& module, const BufferMergeOptions& options);
  static BufferMerge apply_slices(const merge::WeightView& weight, const BufferMergeModule& module,
                                  const BufferMergeOptions& options);
  std::vector<BufferMerge> slice_merges_;  // apply_slices: one per slice of module_.slices
  std::shared_ptr<const MethodChange> method_;  // another method's delta or scale (apply_method)

  BufferMergeModule module_;
  double coefficient_ = 0.0;
  unsigned threads_ = 0;
  bool active_ = false;
  bool keep_rows_ = false;
  DType dtype_ = DType::F32;
  DType bias_dtype_ = DType::F32;
  std::vector<float> dora_norm_;
  // A merge shown not to fail: the bound on every |delta| it adds (lora_delta_bound), and the bound
  // of the weight's magnitude after it; NaN for other merges.
  double delta_bound_ = std::numeric_limits<double>::quiet_NaN();
  double largest_after_ = std::numeric_limits<double>::quiet_NaN();
  // keep_original_rows: row indices, their original bytes (row_bytes each, in the same order) and
  // a hash of what the merge wrote into each, checked before restoring.
  std::vector<int64_t> saved_row_index_;
  std::vector<unsigned char> saved_bytes_;
  std::vector<uint64_t> merged_row_hash_;
  std::vector<unsigned char> saved_bias_;  // empty when the bias was unchanged or not merged
  uint64_t merged_bias_hash_ = 0;
};

}  // namespace peft
