#include "core/quant/ggml_types.hpp"

#include <array>

#include "core/quant/ggml_quant_support.hpp"

namespace peft {
namespace {

using namespace quant;

constexpr uint32_t kQK = QK_K;

// A row: geometry, kernels, and optionally a dtype and the f16 scales' offsets.
constexpr GgmlType row(uint32_t id, std::string_view name, uint32_t block_size, uint32_t type_size,
                       GgmlToFloat to_float = nullptr, GgmlFromFloat from_float = nullptr,
                       std::optional<DType> dtype = std::nullopt, uint32_t scale0 = 0, uint32_t scale1 = 0,
                       uint8_t scale_count = 0) {
  return GgmlType{id,    name,  block_size, type_size, to_float, from_float, dtype,
                  {static_cast<uint8_t>(scale0), static_cast<uint8_t>(scale1)}, scale_count};
}
constexpr std::nullopt_t kNoDType = std::nullopt;

// ggml.h's enum, the block geometry of ggml's type traits (the same figures as gguf-py's
// GGML_QUANT_SIZES), the kernels (ggml_quant_support.hpp) and the dtypes of the plain types.
constexpr std::array<GgmlType, 35> kTypes{{
    row(0, "F32", 1, 4, dequantize_f32, quantize_f32, DType::F32),
    row(1, "F16", 1, 2, dequantize_f16, quantize_f16, DType::F16),
    row(2, "Q4_0", 32, 2 + 16, dequantize_q4_0, quantize_q4_0),
    row(3, "Q4_1", 32, 2 + 2 + 16, dequantize_q4_1, quantize_q4_1),
    row(6, "Q5_0", 32, 2 + 4 + 16, dequantize_q5_0, quantize_q5_0),
    row(7, "Q5_1", 32, 2 + 2 + 4 + 16, dequantize_q5_1, quantize_q5_1),
    row(8, "Q8_0", 32, 2 + 32, dequantize_q8_0, quantize_q8_0, kNoDType, 0, 0, 1),
    row(9, "Q8_1", 32, 2 + 2 + 32),
    row(10, "Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4, dequantize_q2_k, quantize_q2_k),
    row(11, "Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12, dequantize_q3_k, quantize_q3_k),
    row(12, "Q4_K", kQK, 2 + 2 + kQK / 2 + 12, dequantize_q4_k, quantize_q4_k, kNoDType, 0, 2, 2),
    row(13, "Q5_K", kQK, 2 + 2 + kQK / 2 + kQK / 8 + 12, dequantize_q5_k, quantize_q5_k, kNoDType, 0, 2, 2),
    row(14, "Q6_K", kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16, dequantize_q6_k, quantize_q6_k, kNoDType,
        kQK / 2 + kQK / 4 + kQK / 16, 0, 1),
    row(15, "Q8_K", kQK, 4 + kQK + kQK / 8, dequantize_q8_k),
    row(16, "IQ2_XXS", kQK, 2 + kQK / 4, dequantize_iq2_xxs),
    row(17, "IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32, dequantize_iq2_xs),
    row(18, "IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8, dequantize_iq3_xxs),
    row(19, "IQ1_S", kQK, 2 + kQK / 8 + kQK / 16, dequantize_iq1_s),
    row(20, "IQ4_NL", 32, 2 + 16, dequantize_iq4_nl, quantize_iq4_nl),
    row(21, "IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4, dequantize_iq3_s),
    row(22, "IQ2_S", kQK, 2 + kQK / 4 + kQK / 16, dequantize_iq2_s),
    row(23, "IQ4_XS", kQK, 2 + 2 + kQK / 2 + kQK / 64, dequantize_iq4_xs),
    row(24, "I8", 1, 1, nullptr, nullptr, DType::I8),
    row(25, "I16", 1, 2, nullptr, nullptr, DType::I16),
    row(26, "I32", 1, 4, nullptr, nullptr, DType::I32),
    row(27, "I64", 1, 8, nullptr, nullptr, DType::I64),
    row(28, "F64", 1, 8, nullptr, nullptr, DType::F64),
    row(29, "IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, dequantize_iq1_m),
    row(30, "BF16", 1, 2, dequantize_bf16, quantize_bf16, DType::BF16),
    row(34, "TQ1_0", kQK, 2 + 4 * 13, dequantize_tq1_0, quantize_tq1_0),
    row(35, "TQ2_0", kQK, 2 + 64, dequantize_tq2_0, quantize_tq2_0),
    row(39, "MXFP4", 32, 1 + 16, dequantize_mxfp4, quantize_mxfp4),
    row(40, "NVFP4", 64, 4 + 32, dequantize_nvfp4, quantize_nvfp4),
    row(41, "Q1_0", 128, 2 + 16, dequantize_q1_0, quantize_q1_0),
    row(42, "Q2_0", 64, 2 + 16, dequantize_q2_0, quantize_q2_0),
}};

std::string names_where(bool (*has)(const GgmlType&)) {
  std::string out;
  for (const GgmlType& t : kTypes)
    if (has(t)) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

}  // namespace

std::optional<GgmlType> ggml_type(uint32_t id) {
  for (const GgmlType& t : kTypes) {
    if (t.id == id) return t;
  }
  return std::nullopt;
}

std::optional<GgmlType> ggml_type_by_name(std::string_view name) {
  for (const GgmlType& t : kTypes) {
    if (t.name == name) return t;
  }
  return std::nullopt;
}

uint32_t ggml_type_max_id() { return kTypes.back().id; }

std::string ggml_dequantizable_names() {
  return names_where([](const GgmlType& t) { return t.to_float != nullptr; });
}

std::string ggml_quantizable_names() {
  return names_where([](const GgmlType& t) { return t.from_float != nullptr; });
}

}  // namespace peft
