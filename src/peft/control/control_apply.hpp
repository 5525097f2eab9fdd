// A control vector added to a host's buffer and taken out again exactly: the buffer is a layer's
// output (activations, [rows, n_embd]) or the one bias vector a host adds after a layer ([1, n_embd],
// as llama.cpp keeps its control-vector tensors).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.hpp"
#include "peft/control/control_vector.hpp"

namespace peft {

// What an exact removal needs: the bytes the buffer held before and the bytes the apply wrote.
class ControlRecord {
 public:
  ControlRecord(int64_t layer, std::vector<uint8_t> original, std::vector<uint8_t> written)
      : layer_(layer), original_(std::move(original)), written_(std::move(written)) {}
  int64_t layer() const { return layer_; }
  bool active() const { return active_; }
  uint64_t saved_bytes() const { return original_.size() + written_.size(); }
  // Puts the original bytes back after checking that the buffer still holds what the apply wrote.
  // INVALID_ARGUMENT (nothing changed) when the record is spent or the buffer changed since.
  void remove(void* data);

 private:
  int64_t layer_;
  std::vector<uint8_t> original_, written_;
  bool active_ = true;
};

// Adds the layer's direction times `strength` to each of `rows` rows of n_embd elements of `dtype`
// (F32, BF16 or F16) in place: y = round(x + d * float(strength)), the product and the sum in f32 as
// llama.cpp computes them, rounded once to the buffer's dtype. A layer without a direction leaves
// the buffer as it is (llama.cpp's zero vector). With `keep`, returns the record of an exact
// removal (2 x the buffer's bytes), else nullptr. UNSUPPORTED for another dtype; INVALID_ARGUMENT
// for zero rows; VALIDATION_OVERFLOW when rows x n_embd overflows; NON_FINITE naming the layer when a
// finite value would become infinite or NaN (the buffer is then unchanged).
std::unique_ptr<ControlRecord> apply_control_vector(const ControlVector& vector, int64_t layer, double strength,
                                                    void* data, DType dtype, uint64_t rows, bool keep);

}  // namespace peft
