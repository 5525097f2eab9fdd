#include "peft/merge/base_quantization.hpp"

#include <vector>

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

const char* const kSupportedQuantizedBases[] = {
    "FP8 block-scale safetensors (quant_method \"fp8\" with weight_block_size and f32 weight_scale_inv)",
    "bitsandbytes 4-bit (NF4/FP4, with or without double quantization, uint8 storage) and 8-bit safetensors",
    "GGUF files",
};

[[noreturn]] void unsupported(const std::string& base_dir, const std::string& what) {
  fail(PEFT_ERR_UNSUPPORTED, "base model " + peft::quoted(base_dir) + " is quantized with " + what +
                                 ", which merge does not support; supported quantized bases: " +
                                 supported_quantized_bases() +
                                 " (or merge into the unquantized model)");
}

std::string string_field(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

BaseQuantization fp8(const nlohmann::json& q, const std::string& base_dir) {
  BaseQuantization result;
  result.method = BaseQuantMethod::fp8_block;
  result.quant_method = "fp8";
  auto block = q.find("weight_block_size");
  if (block == q.end() || block->is_null())
    unsupported(base_dir, "\"fp8\" with per-tensor scales (weight_block_size null)");
  const auto positive = [](const nlohmann::json& v) {
    return v.is_number_unsigned() ? v.get<uint64_t>() > 0 : v.is_number_integer() && v.get<int64_t>() > 0;
  };
  if (!block->is_array() || block->size() != 2 || !positive((*block)[0]) || !positive((*block)[1]))
    fail(PEFT_ERR_INVALID_CHECKPOINT, "base model " + peft::quoted(base_dir) +
                                          ": quantization_config.weight_block_size must be two positive integers, not " +
                                          block->dump());
  result.block_rows = (*block)[0].get<uint64_t>();
  result.block_cols = (*block)[1].get<uint64_t>();
  const std::string scale_fmt = string_field(q, "scale_fmt");
  if (!scale_fmt.empty() && scale_fmt != "float")
    unsupported(base_dir, "\"fp8\" with scale_fmt " + peft::quoted_name(scale_fmt) + " (f32 scales are supported)");
  const std::string experts = string_field(q, "expert_dtype");
  if (!experts.empty() && experts != "fp8")
    unsupported(base_dir, "\"fp8\" with expert_dtype " + peft::quoted_name(experts));
  return result;
}

}  // namespace

std::string supported_quantized_bases() {
  std::vector<std::string> names(std::begin(kSupportedQuantizedBases), std::end(kSupportedQuantizedBases));
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return text;
}

BaseQuantization recognise_base_quantization(const nlohmann::json& config, const std::string& base_dir) {
  if (!config.is_object()) return {};
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return {};
  if (!it->is_object())
    fail(PEFT_ERR_INVALID_CHECKPOINT, "base model " + peft::quoted(base_dir) + ": quantization_config is not an object");
  const nlohmann::json& q = *it;
  const std::string method = string_field(q, "quant_method");
  if (method == "fp8") return fp8(q, base_dir);
  if (method == "bitsandbytes") {
    BaseQuantization result;
    result.method = BaseQuantMethod::bitsandbytes;
    result.quant_method = method;
    return result;
  }
  if (method.empty()) unsupported(base_dir, "a quantization_config without quant_method");
  if (method == "compressed-tensors") {
    const std::string format = string_field(q, "format");
    unsupported(base_dir, "\"compressed-tensors\"" + (format.empty() ? std::string() : " (format " + peft::quoted_name(format) + ")"));
  }
  unsupported(base_dir, peft::quoted_name(method));
}

}  // namespace peft
