// Which kernel handles which ggml type, and the checks around them (core/quant/ggml_quant.hpp).
#include "core/quant/ggml_quant.hpp"

#include <array>
#include <string>

#include "core/error.hpp"
#include "core/quant/ggml_quant_support.hpp"
#include "core/quant/ggml_types.hpp"

namespace peft {
namespace {

using namespace quant;

struct Kernels {
  uint32_t type;
  DequantizeKernel dequantize;
  QuantizeKernel quantize;  // nullptr: dequantize only
};

constexpr std::array<Kernels, 29> kKernels{{
    {ggml_id::F32, dequantize_f32, quantize_f32},
    {ggml_id::F16, dequantize_f16, quantize_f16},
    {ggml_id::BF16, dequantize_bf16, quantize_bf16},
    {ggml_id::Q4_0, dequantize_q4_0, quantize_q4_0},
    {ggml_id::Q4_1, dequantize_q4_1, quantize_q4_1},
    {ggml_id::Q5_0, dequantize_q5_0, quantize_q5_0},
    {ggml_id::Q5_1, dequantize_q5_1, quantize_q5_1},
    {ggml_id::Q8_0, dequantize_q8_0, quantize_q8_0},
    {ggml_id::Q2_K, dequantize_q2_k, quantize_q2_k},
    {ggml_id::Q3_K, dequantize_q3_k, quantize_q3_k},
    {ggml_id::Q4_K, dequantize_q4_k, quantize_q4_k},
    {ggml_id::Q5_K, dequantize_q5_k, quantize_q5_k},
    {ggml_id::Q6_K, dequantize_q6_k, quantize_q6_k},
    {ggml_id::Q8_K, dequantize_q8_k, nullptr},
    {ggml_id::IQ4_NL, dequantize_iq4_nl, quantize_iq4_nl},
    {ggml_id::IQ4_XS, dequantize_iq4_xs, nullptr},
    {ggml_id::MXFP4, dequantize_mxfp4, quantize_mxfp4},
    {ggml_id::TQ1_0, dequantize_tq1_0, quantize_tq1_0},
    {ggml_id::TQ2_0, dequantize_tq2_0, quantize_tq2_0},
    {ggml_id::IQ2_XXS, dequantize_iq2_xxs, nullptr},
    {ggml_id::IQ2_XS, dequantize_iq2_xs, nullptr},
    {ggml_id::IQ2_S, dequantize_iq2_s, nullptr},
    {ggml_id::IQ3_XXS, dequantize_iq3_xxs, nullptr},
    {ggml_id::IQ3_S, dequantize_iq3_s, nullptr},
    {ggml_id::IQ1_S, dequantize_iq1_s, nullptr},
    {ggml_id::IQ1_M, dequantize_iq1_m, nullptr},
    {ggml_id::NVFP4, dequantize_nvfp4, quantize_nvfp4},
    {ggml_id::Q1_0, dequantize_q1_0, quantize_q1_0},
    {ggml_id::Q2_0, dequantize_q2_0, quantize_q2_0},
}};

const Kernels* kernels_of(uint32_t type) {
  for (const auto& k : kKernels) {
    if (k.type == type) return &k;
  }
  return nullptr;
}

std::string type_text(uint32_t type) {
  const auto known = ggml_type(type);
  return known ? std::string(known->name) : "ggml type " + std::to_string(type);
}

GgmlType checked_type(uint32_t type) {
  const auto known = ggml_type(type);
  if (!known) fail(PEFT_ERR_INVALID_ARGUMENT, "unknown ggml type " + std::to_string(type));
  return *known;
}

}  // namespace

bool ggml_can_dequantize(uint32_t type) { return kernels_of(type) != nullptr; }

bool ggml_can_quantize(uint32_t type) {
  const Kernels* k = kernels_of(type);
  return k != nullptr && k->quantize != nullptr;
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
  const Kernels* k = kernels_of(type);
  if (!k) {
    checked_type(type);
    fail(PEFT_ERR_UNSUPPORTED, "no dequantizer for " + type_text(type) +
                                   " (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                                   "Q4_K, Q5_K, Q6_K, Q8_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, "
                                   "IQ4_NL, IQ4_XS, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q2_0)");
  }
  ggml_rows_bytes(type, rows, cols);
  const uint32_t block = checked_type(type).block_size;
  k->dequantize(static_cast<const uint8_t*>(in), out, rows * (cols / block));
}

void quantize_rows(uint32_t type, const float* in, uint64_t rows, uint64_t cols, void* out) {
  const Kernels* k = kernels_of(type);
  if (!k || !k->quantize) {
    checked_type(type);
    fail(PEFT_ERR_UNSUPPORTED, "no quantizer for " + type_text(type) +
                                   " (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                                   "Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q2_0)");
  }
  ggml_rows_bytes(type, rows, cols);
  const uint32_t block = checked_type(type).block_size;
  k->quantize(in, static_cast<uint8_t*>(out), rows * (cols / block));
}

}  // namespace peft
