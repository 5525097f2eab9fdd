#include "gguf/qkv_rows.hpp"

#include "gguf/rope_rows.hpp"

namespace peft {

uint64_t fused_qkv_pytorch_row(uint64_t gguf_row, uint64_t heads, uint64_t kv_heads, uint64_t head_rows) {
  const uint64_t per_group = heads / kv_heads;  // query heads per key/value group
  const uint64_t head = gguf_row / head_rows, within = gguf_row % head_rows;
  uint64_t group = 0, slot = 0;
  if (head < heads) {
    group = head / per_group, slot = head % per_group;
  } else if (head < heads + kv_heads) {
    group = head - heads, slot = per_group;
  } else {
    group = head - heads - kv_heads, slot = per_group + 1;
  }
  return (group * (per_group + 2) + slot) * head_rows + within;
}

void reorder_fused_qkv_rows(void* data, uint64_t rows, uint64_t row_bytes, uint64_t heads, uint64_t kv_heads,
                            bool to_pytorch) {
  const uint64_t head_rows = rows / (heads + 2 * kv_heads);
  move_rows(data, rows, row_bytes, to_pytorch,
            [&](uint64_t gguf_row) { return fused_qkv_pytorch_row(gguf_row, heads, kv_heads, head_rows); });
}

}  // namespace peft
