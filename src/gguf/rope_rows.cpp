#include "gguf/rope_rows.hpp"

#include <cstring>
#include <vector>

namespace peft {

uint64_t rope_pytorch_row(uint64_t gguf_row, uint64_t rows_per_head) {
  const uint64_t head = gguf_row / rows_per_head, within = gguf_row % rows_per_head;
  return head * rows_per_head + (within % 2) * (rows_per_head / 2) + within / 2;
}

void move_rows(void* data, uint64_t rows, uint64_t row_bytes, bool to_pytorch,
               const std::function<uint64_t(uint64_t)>& pytorch_row) {
  auto* bytes = static_cast<uint8_t*>(data);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  for (uint64_t r = 0; r < rows; ++r) {
    const uint64_t p = pytorch_row(r);
    const uint64_t from = to_pytorch ? r : p, to = to_pytorch ? p : r;
    std::memcpy(out.data() + to * row_bytes, bytes + from * row_bytes, static_cast<size_t>(row_bytes));
  }
  std::memcpy(bytes, out.data(), out.size());
}

void reorder_rope_rows(void* data, uint64_t rows, uint64_t row_bytes, uint64_t heads, bool to_pytorch) {
  const uint64_t per_head = rows / heads;
  move_rows(data, rows, row_bytes, to_pytorch, [&](uint64_t gguf_row) { return rope_pytorch_row(gguf_row, per_head); });
}

}  // namespace peft
