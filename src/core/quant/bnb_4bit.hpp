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
// bitsandbytes 0.50's native CPU kernel, a lookup table, see there). Dequantizing: absmax = code8[q] x
// nested_absmax[b] + offset, then value = code4[i] x absmax, each a single f32 product.
#pragma once

#include <cstdint>
#include <span>

namespace peft::bnb {

enum class FourBit { nf4, fp4 };

// ceil(count / blocksize), blocksize > 0, without the wrap of (count + blocksize - 1) / blocksize for a
// block size near 2^64 (which gave 0 blocks).
inline uint64_t block_count(uint64_t count, uint64_t blocksize) { return count == 0 ? 0 : (count - 1) / blocksize + 1; }

// bitsandbytes' get_4bit_type(): the 16 codes, exactly as bitsandbytes saves them in quant_map.
std::span<const float, 16> four_bit_code(FourBit type);

// The table bitsandbytes' CPU dequantization uses for a weight whose last dimension is `last_dim`,
// from its stored quant_map. bitsandbytes 0.50.2 (backends/cpu/ops.py, then the native
// dequantizeBlockwise4bitCpu, read in its compiled library): an odd last dimension, or a block size of
// 2048 or more on a CPU torch reports as AVX512, goes to its torch fallback, which uses quant_map as it
// is; otherwise the native kernel takes its AVX-512 branch when the CPU has AVX-512F, the last dimension
// is a multiple of 16 and the block size at least 16 (its table: quant_map), and else its scalar branch,
// whose FP4 table holds -0.0 at index 8 (quant_map: +0.0). We follow an AVX-512 CPU; on a CPU without
// AVX-512F bitsandbytes takes the scalar branch for every even last dimension, so FP4's zeros of a last
// dimension that is a multiple of 16 are -0.0 there (values otherwise equal).
void cpu_dequantize_code(FourBit type, uint64_t last_dim, uint64_t blocksize, float* code);

// values[i] = code[index i] x absmax[i / blocksize], f32; `packed` holds (count + 1) / 2 bytes.
void dequantize_4bit(const uint8_t* packed, const float* absmax, const float* code, uint64_t blocksize,
                     uint64_t count, float* values);

// `packed` receives (count + 1) / 2 bytes and `absmax` ceil(count / blocksize) values.
void quantize_4bit(const float* values, uint64_t count, uint64_t blocksize, FourBit type, uint8_t* packed,
                   float* absmax);

// bitsandbytes' 8-bit blockwise dequantization: values[i] = code[q[i]] x absmax[i / blocksize].
void dequantize_blockwise(const uint8_t* q, const float* absmax, const float* code, uint64_t blocksize,
                          uint64_t count, float* values);

// bitsandbytes 0.50's native CPU quantize_blockwise (csrc/cpu_ops.cpp, quantize_cpu_impl), with the
// 256-entry sorted `code` as given: absmax[b] = max |x| of the block (NaN skipped; a zero block gets
// index 0 everywhere); each value x becomes table[trunc(fma((clamp(x * (1 / absmax), -1, 1) + 1) x 0.5,
// 65535, 0.5))], where table[i] is the number of midpoints 0.5 x (code[j] + code[j + 1]) strictly below
// the point 2i / 65535 - 1 of [-1, 1]. Not always the nearest code: a value within 1/65535 of a midpoint
// takes the code of its table point (measured: bitsandbytes gives these indices; its compiled kernel
// fuses the last multiply-add). `absmax` receives ceil(count / blocksize) values.
void quantize_blockwise(const float* values, uint64_t count, uint64_t blocksize, const float* code, uint8_t* q,
                        float* absmax);

// torch.mean of a contiguous f32 tensor on CPU: the cascade sum of ATen's SumKernel (4 accumulators of
// `lanes`-wide vectors) divided by the count in f32. 8 lanes matches torch 2.x's sum on x86-64 (measured
// on an AVX-512 machine, where torch reports capability AVX512 and still sums in 8-lane vectors).
// torch splits tensors of more than 32768 values between its threads; this is its one-thread order.
float torch_mean_f32(const float* values, uint64_t count, int lanes = 8);

}  // namespace peft::bnb
