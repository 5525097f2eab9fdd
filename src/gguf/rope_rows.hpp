// The row order llama.cpp's converter gives LLaMA-family query and key weights in GGUF
// (conversion/llama.py, permute): the rows of each head, split into the two halves that rotary
// embeddings pair up, are interleaved. A weight (and a LoRA B, and a bias) converted from PyTorch
// holds at GGUF row h*d + 2*i + j the PyTorch row h*d + j*d/2 + i, for heads of d rows.
#pragma once

#include <cstdint>
#include <functional>

namespace peft {

// The PyTorch row that GGUF row `gguf_row` holds, for heads of `rows_per_head` (even) rows.
uint64_t rope_pytorch_row(uint64_t gguf_row, uint64_t rows_per_head);

// Reorders the rows (`row_bytes` each) of a row-major matrix of `rows` rows split into `heads`
// heads: from GGUF's order to PyTorch's (to_pytorch), or back. `rows` must be a multiple of
// 2 x heads (checked by the caller).
void reorder_rope_rows(void* data, uint64_t rows, uint64_t row_bytes, uint64_t heads, bool to_pytorch);

// Any GGUF row order given as the PyTorch row of each GGUF row (a permutation of [0, rows)): moves
// the rows (`row_bytes` each) of a row-major matrix from GGUF's order to PyTorch's (to_pytorch), or
// back. The one row mover of every converter row order (this file's and qkv_rows.hpp's).
void move_rows(void* data, uint64_t rows, uint64_t row_bytes, bool to_pytorch,
               const std::function<uint64_t(uint64_t)>& pytorch_row);

}  // namespace peft
