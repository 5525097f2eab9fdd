// Building one merged tensor in memory from its plan (merge_plan.hpp): the base's (or a
// replacement's) values in the working dtype, then the LoRA, DoRA, bias and token-row changes.
#pragma once

#include <cstdint>
#include <memory>

#include "peft/merge/merge_plan.hpp"

namespace peft {

// A reusable block of memory for one tensor. Not zeroed: every byte is written before it is read.
class TensorBuffer {
 public:
  // Makes room for `nbytes` (keeping the allocation when it is large enough). PEFT_ERR_OUT_OF_MEMORY
  // naming `what` when the allocation fails.
  void reserve(uint64_t nbytes, const std::string& what);
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }
  uint64_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  uint64_t size_ = 0;
  uint64_t capacity_ = 0;
};

// Fills `out` with tensor `p` (action compute) in p.work_dtype. `threads` as merge::ExecOptions.
// Inputs are read with pread (Checkpoint::read), so nothing of the base model stays resident.
void compute_tensor(const MergePlan& plan, const PlannedTensor& p, unsigned threads, TensorBuffer& out);

// bitsandbytes keep-format merges: the quant_state JSON of a double-quantized weight holds the new
// nested_offset, whose text may change length, so its size is known only once the weight is merged:
// computes those tensors (once more than the executor will) and sets their shape and size.
void settle_bnb_sizes(MergePlan& plan, unsigned threads);

// The first of `elements` values in `work` dtype (at `data`) that is infinite or NaN once rounded to
// `stored`, the dtype written; `elements` when there is none. Integer and 8-bit float `work` dtypes
// have no such values.
uint64_t first_nonfinite(DType work, DType stored, const uint8_t* data, uint64_t elements);

// PEFT_ERR_NON_FINITE naming tensor `name` when one of the merged f32 `values` is an infinity or NaN:
// the merge's rule applied before any quantizer (GGUF block types, bitsandbytes), whose scales would
// otherwise store such a value as 0. Read on `threads` threads (as merge::ExecOptions).
void require_finite_values(const std::string& name, const float* values, size_t count, unsigned threads);

// PEFT_ERR_NON_FINITE naming tensor `p` when `buffer` (its values in p.work_dtype, computed by
// compute_tensor) holds an infinity or a NaN once rounded to p.out_dtype.
void check_finite(const PlannedTensor& p, const TensorBuffer& buffer);

}  // namespace peft
