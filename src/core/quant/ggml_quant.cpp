// The checks around the kernels of the ggml type table (core/quant/ggml_quant.hpp).
#include "core/quant/ggml_quant.hpp"

#include <string>

#include "core/error.hpp"
#include "core/quant/ggml_types.hpp"

namespace peft {
namespace {

GgmlType checked_type(uint32_t type) {
  const auto known = ggml_type(type);
  if (!known) fail(PEFT_ERR_INVALID_ARGUMENT, "unknown ggml type " + std::to_string(type));
  return *known;
}

}  // namespace

bool ggml_can_dequantize(uint32_t type) {
  const auto t = ggml_type(type);
  return t && t->to_float != nullptr;
}

bool ggml_can_quantize(uint32_t type) {
  const auto t = ggml_type(type);
  return t && t->from_float != nullptr;
}

uint64_t ggml_rows_bytes(uint32_t type, uint64_t rows, uint64_t cols) {
  const GgmlType t = checked_type(type);
  if (cols % t.block_size != 0)
    fail(PEFT_ERR_INVALID_ARGUMENT, "a row of " + std::string(t.name) + " holds whole blocks of " +
                                        std::to_string(t.block_size) + " values; " + std::to_string(cols) +
                                        " is not a multiple");
  const uint64_t row_bytes = cols / t.block_size * t.type_size;
  if (rows != 0 && row_bytes > UINT64_MAX / rows)
    fail(PEFT_ERR_INVALID_ARGUMENT, std::to_string(rows) + " rows of " + std::to_string(cols) + " " +
                                        std::string(t.name) + " values overflow 64 bits");
  return row_bytes * rows;
}

void dequantize_rows(uint32_t type, const void* in, uint64_t rows, uint64_t cols, float* out) {
  const GgmlType t = checked_type(type);
  if (!t.to_float)
    fail(PEFT_ERR_UNSUPPORTED, "no dequantizer for " + std::string(t.name) + " (supported: " + ggml_dequantizable_names() + ")");
  ggml_rows_bytes(type, rows, cols);
  t.to_float(static_cast<const uint8_t*>(in), out, rows * (cols / t.block_size));
}

void quantize_rows(uint32_t type, const float* in, uint64_t rows, uint64_t cols, void* out) {
  const GgmlType t = checked_type(type);
  if (!t.from_float)
    fail(PEFT_ERR_UNSUPPORTED, "no quantizer for " + std::string(t.name) + " (supported: " + ggml_quantizable_names() + ")");
  ggml_rows_bytes(type, rows, cols);
  t.from_float(in, static_cast<uint8_t*>(out), rows * (cols / t.block_size));
}

}  // namespace peft
