#include "core/no_fp_contract.hpp"  // first: the product and the sum round separately, as llama.cpp's

#include "peft/control/control_apply.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/shape.hpp"

namespace peft {

void ControlRecord::remove(void* data) {
  if (!active_) fail(PEFT_ERR_INVALID_ARGUMENT, "the control vector of layer " + std::to_string(layer_) + " was removed already");
  if (!data) fail(PEFT_ERR_INVALID_ARGUMENT, "data is NULL");
  if (!written_.empty() && std::memcmp(data, written_.data(), written_.size()) != 0)
    fail(PEFT_ERR_INVALID_ARGUMENT, "the buffer changed since the control vector of layer " + std::to_string(layer_) +
                                        " was added, so it cannot be taken out exactly (remove applies in reverse order)");
  if (!original_.empty()) std::memcpy(data, original_.data(), original_.size());
  active_ = false;
}

std::unique_ptr<ControlRecord> apply_control_vector(const ControlVector& vector, int64_t layer, double strength,
                                                    void* data, DType dtype, uint64_t rows, bool keep) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    fail(PEFT_ERR_UNSUPPORTED, "a buffer of dtype " + std::string(dtype_name(dtype)) + " (F32, BF16 or F16)");
  if (!data) fail(PEFT_ERR_INVALID_ARGUMENT, "data is NULL");
  if (rows == 0) fail(PEFT_ERR_INVALID_ARGUMENT, "rows is 0");
  const size_t width = dtype_bits(dtype) / 8;
  const std::string what = "the buffer of layer " + std::to_string(layer);
  shape_elements(std::vector<uint64_t>{rows, vector.n_embd, width}, what);  // its bytes fit 64 bits
  const uint64_t elements = shape_elements(std::vector<uint64_t>{rows, vector.n_embd}, what);
  const auto direction = vector.directions.find(layer);
  if (direction == vector.directions.end())
    return keep ? std::make_unique<ControlRecord>(layer, std::vector<uint8_t>{}, std::vector<uint8_t>{}) : nullptr;

  const auto scale = static_cast<float>(strength);
  std::vector<float> added(vector.n_embd);
  for (size_t j = 0; j < added.size(); ++j) added[j] = direction->second[j] * scale;
  auto* bytes = static_cast<uint8_t*>(data);
  // Every row converted to f32, the direction added, and rounded once back (core/convert), into a
  // copy: a failure leaves the buffer as it was.
  const uint64_t row_bytes = vector.n_embd * width;
  std::vector<uint8_t> result(bytes, bytes + elements * width);
  std::vector<float> x(vector.n_embd), y(vector.n_embd), stored(vector.n_embd);
  for (uint64_t r = 0; r < rows; ++r) {
    uint8_t* row = result.data() + r * row_bytes;
    convert(dtype, row, DType::F32, x.data(), vector.n_embd);
    for (size_t j = 0; j < x.size(); ++j) y[j] = x[j] + added[j];
    convert(DType::F32, y.data(), dtype, row, vector.n_embd);
    convert(dtype, row, DType::F32, stored.data(), vector.n_embd);
    for (size_t j = 0; j < x.size(); ++j)
      if (std::isfinite(x[j]) && !std::isfinite(stored[j]))
        fail(PEFT_ERR_NON_FINITE, "adding the control vector of layer " + std::to_string(layer) + " at strength " +
                                      std::to_string(strength) + " makes element " +
                                      std::to_string(r * vector.n_embd + j) + " of the buffer infinite or NaN");
  }
  std::vector<uint8_t> original;
  if (keep) original.assign(bytes, bytes + elements * width);
  std::memcpy(bytes, result.data(), result.size());
  if (!keep) return nullptr;
  return std::make_unique<ControlRecord>(layer, std::move(original), std::move(result));
}

}  // namespace peft
