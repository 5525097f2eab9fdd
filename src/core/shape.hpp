// Two facts about shapes and matrices every layer needs: how many elements a shape holds, and a
// row-major matrix transposed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace peft {

// The product of the dimensions (1 for a scalar's shape []). Fails with PEFT_ERR_VALIDATION_OVERFLOW
// ("<what>: size overflows 64 bits") when it does not fit 64 bits.
uint64_t shape_elements(std::span<const uint64_t> shape, const std::string& what);

// The rows x cols row-major matrix `m` as cols x rows.
std::vector<float> transposed(const std::vector<float>& m, uint64_t rows, uint64_t cols);

}  // namespace peft
