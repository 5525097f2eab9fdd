// FP8 block-scale weights as transformers' FineGrainedFP8 writes and reads them (quant_method "fp8",
// DeepSeek-V3 style): an F8_E4M3 (float8_e4m3fn) weight [..., rows, cols] and an F32
// `weight_scale_inv` [..., ceil(rows / br), ceil(cols / bc)], one scale per br x bc block; the blocks
// of the last row and column of blocks are partial when the shape is not a multiple of the block.
//
// Dequantization (transformers' Fp8Dequantize): w = float(q) * scale_inv, one f32 multiply.
// Quantization (transformers' Fp8Quantize, scale_fmt "float"), per block:
//   amax      = max |w| over the block
//   s         = (1 / amax) * 448, two f32 roundings: what torch computes for `448 / amax` (its
//               scalar-by-tensor division is a reciprocal and a product); s = 1 when amax is 0, and
//               also when s overflows f32 (amax below about 1.3e-36, where transformers would write
//               infinities and NaNs; with s = 1 such values all round to 0, within the bound below)
//   scale_inv = 1 / s (f32 division), the stored scale: amax / 448 within two f32 ulps
//   q         = e4m3(clamp(w * s, -448, 448)): the f32 product rounded to the nearest e4m3fn value,
//               ties to even, saturating at +-448 (e4m3fn has no infinity)
// A block holding an infinity or a NaN cannot be quantized: PEFT_ERR_NON_FINITE.
// Pure functions: no I/O, no allocation beyond their arguments (and fp8_scale_shape's result), same result
// on every machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace peft {

inline constexpr float kE4m3Max = 448.0f;

// The e4m3fn byte nearest to `value` (ties to even), saturating at +-448. `value` must not be NaN.
uint8_t f32_to_e4m3_saturating(float value);

// The geometry of one FP8 block-scale weight: `batch` matrices (the product of the leading
// dimensions, 1 for a 2-D weight) of rows x cols, blocks of block_rows x block_cols.
struct Fp8BlockLayout {
  uint64_t batch = 1;
  uint64_t rows = 0;
  uint64_t cols = 0;
  uint64_t block_rows = 128;
  uint64_t block_cols = 128;

  // ceil(rows / block_rows), ceil(cols / block_cols); the blocks are at least 1 x 1.
  uint64_t scale_rows() const { return rows / block_rows + (rows % block_rows != 0); }
  uint64_t scale_cols() const { return cols / block_cols + (cols % block_cols != 0); }
  uint64_t elements() const { return batch * rows * cols; }
  uint64_t scales() const { return batch * scale_rows() * scale_cols(); }
};

// The layout of a weight of `shape` (at least 2-D: the leading dimensions are the batch; a shorter
// shape gives an empty layout) in blocks of block_rows x block_cols (both at least 1).
Fp8BlockLayout fp8_block_layout(const std::vector<uint64_t>& shape, uint64_t block_rows, uint64_t block_cols);

// The shape of the weight_scale_inv of a weight of `shape` laid out as `layout`: the weight's leading
// dimensions, then scale_rows() x scale_cols().
std::vector<uint64_t> fp8_scale_shape(const std::vector<uint64_t>& shape, const Fp8BlockLayout& layout);

// out[i] = e4m3 value of q[i] times its block's scale_inv (f32). `q` and `out` hold
// layout.elements() values, `scale_inv` layout.scales().
void fp8_block_dequantize(const Fp8BlockLayout& layout, const uint8_t* q, const float* scale_inv, float* out);

// Quantizes `w` (layout.elements() f32 values) into `q` and `scale_inv` by the rule above.
// PEFT_ERR_NON_FINITE naming `what` and the element when a value is infinite or NaN.
void fp8_block_quantize(const Fp8BlockLayout& layout, const float* w, uint8_t* q, float* scale_inv,
                        const std::string& what);

}  // namespace peft
