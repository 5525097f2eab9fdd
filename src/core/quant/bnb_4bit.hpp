// bitsandbytes' 4-bit blockwise formats (NF4 and FP4) and its 8-bit blockwise "dynamic" format (which
// double quantization uses for the 4-bit absmax values), bit-identical to bitsandbytes 0.50 on CPU.
//
// Layout (what transformers saves for a Params4bit weight of shape [out, in]): the weight flattened
// row-major into n values, cut into blocks of `blocksize` (64 by default; the last block may be
// short); absmax[b] = max |x| of block b (f32); each value becomes the 4-bit index of the nearest code
// of the 16-entry table, x / absmax; two indices per byte, the first in the HIGH nibble; an odd count
// pads a last zero nibble. Stored as U8 [(n + 1) / 2, 1].
//
// Quantizing (bitsandbytes' torch op "quantize_4bit", the one CPU runs): scaled = clamp(x * (1 /
// max(absmax, 1e-38)), -1, 1) for full blocks and clamp(x / max(absmax, 1e-38), -1, 1) for a short
// last block; the index is torch.bucketize(scaled, bounds): the number of midpoints of the sorted
// table strictly below `scaled`, mapped back through the sort order (FP4's table is unsorted and
// holds two zeros; NF4's is sorted).
//
// Double quantization: offset = mean(absmax) as torch computes it (torch_mean_f32), then absmax -
// offset quantized blockwise in blocks of 256 with the 8-bit dynamic code (quantize_blockwise:
// bitsandbytes' native CPU kernel: absmax of the block, x / absmax, the nearest code with the lower one
// on a tie; a block of zeros, 0 / 0, gets index 0). Dequantizing: absmax = code8[q] * nested_absmax[b] + offset, then value = code4[i] x
// absmax, each a single f32 product.
#pragma once

#include <cstdint>
#include <span>

namespace peft::bnb {

enum class FourBit { nf4, fp4 };

// bitsandbytes' get_4bit_type(): the 16 codes, exactly as bitsandbytes saves them in quant_map.
std::span<const float, 16> four_bit_code(FourBit type);

// The table bitsandbytes' CPU dequantization uses for a weight whose last dimension is `last_dim`,
// from its stored quant_map. Measured with bitsandbytes 0.50.2 on an AVX-512 CPU: its native kernel
// (an even last dimension) decodes FP4's index 8 as -0.0, where quant_map holds +0.0, when the last
// dimension is not a multiple of 16; otherwise, and in its torch fallback (an odd last dimension),
// it uses quant_map as it is.
void cpu_dequantize_code(FourBit type, uint64_t last_dim, float* code);

// values[i] = code[index i] x absmax[i / blocksize], f32; `packed` holds (count + 1) / 2 bytes.
void dequantize_4bit(const uint8_t* packed, const float* absmax, const float* code, uint64_t blocksize,
                     uint64_t count, float* values);

// `packed` receives (count + 1) / 2 bytes and `absmax` ceil(count / blocksize) values.
void quantize_4bit(const float* values, uint64_t count, uint64_t blocksize, FourBit type, uint8_t* packed,
                   float* absmax);

// bitsandbytes' 8-bit blockwise dequantization: values[i] = code[q[i]] x absmax[i / blocksize].
void dequantize_blockwise(const uint8_t* q, const float* absmax, const float* code, uint64_t blocksize,
                          uint64_t count, float* values);

// bitsandbytes' native CPU quantize_blockwise with the 256-entry sorted `code` (code[0] is taken as
// -1, as the kernel sets it). `absmax` receives ceil(count / blocksize) values.
void quantize_blockwise(const float* values, uint64_t count, uint64_t blocksize, const float* code, uint8_t* q,
                        float* absmax);

// torch.mean of a contiguous f32 tensor on CPU: the cascade sum of ATen's SumKernel (4 accumulators of
// `lanes`-wide vectors) divided by the count in f32. 8 lanes matches torch 2.x's sum on x86-64 (measured
// on an AVX-512 machine, where torch reports capability AVX512 and still sums in 8-lane vectors).
// torch splits tensors of more than 32768 values between its threads; this is its one-thread order.
float torch_mean_f32(const float* values, uint64_t count, int lanes = 8);

}  // namespace peft::bnb
