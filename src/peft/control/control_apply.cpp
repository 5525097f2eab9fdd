#include "core/no_fp_contract.hpp"  // first: the product and the sum round separately, as llama.cpp's

#include "peft/control/control_apply.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/f16.hpp"
#include "core/shape.hpp"

namespace peft {
namespace {

float load(DType dtype, const uint8_t* at) {
  uint16_t half = 0;
  float value = 0;
  switch (dtype) {
    case DType::F32: std::memcpy(&value, at, sizeof value); return value;
    case DType::BF16: std::memcpy(&half, at, sizeof half); return bf16_to_f32(half);
    default: std::memcpy(&half, at, sizeof half); return f16_to_f32(half);
  }
}

void store(DType dtype, float value, uint8_t* at) {
  uint16_t half = 0;
  switch (dtype) {
    case DType::F32: std::memcpy(at, &value, sizeof value); return;
    case DType::BF16: half = f32_to_bf16(value); break;
    default: half = f32_to_f16(value); break;
  }
  std::memcpy(at, &half, sizeof half);
}

// The value `value` becomes once stored in `dtype`.
float rounded(DType dtype, float value) {
  uint8_t bytes[sizeof(float)];
  store(dtype, value, bytes);
  return load(dtype, bytes);
}

}  // namespace

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
  // A first pass only checks, so that a failure leaves the buffer as it was.
  for (uint64_t i = 0; i < elements; ++i) {
    const float x = load(dtype, bytes + i * width);
    const float y = x + added[i % vector.n_embd];
    if (std::isfinite(x) && !std::isfinite(rounded(dtype, y)))
      fail(PEFT_ERR_NON_FINITE, "adding the control vector of layer " + std::to_string(layer) + " at strength " +
                                    std::to_string(strength) + " makes element " + std::to_string(i) +
                                    " of the buffer infinite or NaN");
  }
  std::vector<uint8_t> original;
  if (keep) original.assign(bytes, bytes + elements * width);
  for (uint64_t i = 0; i < elements; ++i)
    store(dtype, load(dtype, bytes + i * width) + added[i % vector.n_embd], bytes + i * width);
  if (!keep) return nullptr;
  return std::make_unique<ControlRecord>(layer, std::move(original), std::vector<uint8_t>(bytes, bytes + elements * width));
}

}  // namespace peft
