#include "core/shape.hpp"

#include "core/error.hpp"

namespace peft {

uint64_t shape_elements(std::span<const uint64_t> shape, const std::string& what) {
  uint64_t count = 1;
  for (uint64_t dim : shape)
    if (__builtin_mul_overflow(count, dim, &count)) fail(PEFT_ERR_VALIDATION_OVERFLOW, what + ": size overflows 64 bits");
  return count;
}

std::vector<float> transposed(const std::vector<float>& m, uint64_t rows, uint64_t cols) {
  std::vector<float> out(m.size());
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < cols; ++c) out[c * rows + r] = m[r * cols + c];
  return out;
}

}  // namespace peft
