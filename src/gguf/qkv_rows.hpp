// The row order llama.cpp's converter gives fused query/key/value weights in GGUF (conversion/
// falcon.py, gptneox.py, bloom.py): PyTorch interleaves the heads, GGUF holds all query heads, then
// all key heads, then all value heads. PyTorch's rows come in `kv_heads` groups, each of
// heads / kv_heads query heads followed by one key and one value head (Falcon; GPT-NeoX and BLOOM
// are the case kv_heads == heads: per head [q, k, v]); every head is head_rows rows. A weight (and a
// LoRA B, and a bias) converted from PyTorch holds at GGUF row
//   q head h, row i:  h * d + i                          (PyTorch: (g * (Q + 2) + h % Q) * d + i, g = h / Q)
//   k head g, row i:  heads * d + g * d + i              (PyTorch: (g * (Q + 2) + Q) * d + i)
//   v head g, row i:  (heads + kv_heads) * d + g * d + i (PyTorch: (g * (Q + 2) + Q + 1) * d + i)
// for Q = heads / kv_heads query heads per group and d = head_rows.
#pragma once

#include <cstdint>

namespace peft {

// The PyTorch row that GGUF row `gguf_row` holds. heads a nonzero multiple of kv_heads, head_rows
// nonzero, gguf_row < (heads + 2 * kv_heads) * head_rows (checked by the caller).
uint64_t fused_qkv_pytorch_row(uint64_t gguf_row, uint64_t heads, uint64_t kv_heads, uint64_t head_rows);

// Reorders the rows (`row_bytes` each) of a row-major matrix of `rows` rows, rows a multiple of
// heads + 2 * kv_heads (checked by the caller): from GGUF's order to PyTorch's (to_pytorch), or back.
void reorder_fused_qkv_rows(void* data, uint64_t rows, uint64_t row_bytes, uint64_t heads, uint64_t kv_heads,
                            bool to_pytorch);

}  // namespace peft
