// A GGUF tensor's values to f32 and back to a ggml type, for the merge into a GGUF base: blocks of rows
// on the merge's fork-join threads (kernels/merge_parallel.hpp), with optional error figures.
//
// Plain types (F32, F16, BF16) go through core/convert (rounded to nearest even), the block-quantized
// ones through core/quant/ggml_quant (bit-identical to ggml's to_float and ggml_quantize_chunk without
// an importance matrix). The results do not depend on the number of threads: every block is computed
// on its own and the figures are summed in block order.
#pragma once

#include <cstdint>

namespace peft {

// What storing f32 values in a type costs: the stored values read back against the f32 ones.
struct StoreError {
  uint64_t values = 0;
  double sum_squares = 0;  // of the differences
  double max = 0;          // largest absolute difference
  bool finite = true;      // every stored value read back is finite
  double rms() const;
};

// rows x cols values of ggml type `type` at `in` to f32. Fails as dequantize_rows.
void dequantize_blocks(uint32_t type, const void* in, uint64_t rows, uint64_t cols, float* out, unsigned threads);

// rows x cols f32 values into ggml type `type` at `out` (ggml_rows_bytes(type, rows, cols) bytes). With
// `error` set, each block is read back and compared with its input (finite, and the error figures).
// With `figures` false only error->finite (and values) is set: for Q8_0, Q4_K, Q5_K and Q6_K it is
// decided from the blocks' f16 scales without reading the values back (every stored value is a
// finite scale times a small integer, minus a finite min, so all are finite exactly when the scales
// are; a non-finite scale makes every value of its block inf or NaN), for the float types (F32, F16,
// BF16) from the stored values' own exponent bits, for other types by reading back.
// Fails as quantize_rows.
void quantize_blocks(uint32_t type, const float* in, uint64_t rows, uint64_t cols, void* out, unsigned threads,
                     StoreError* error, bool figures = true);

}  // namespace peft
