// Which quantization a base model's config.json declares (`quantization_config.quant_method`), and
// the one place where a merge decides whether it can handle it: recognise_base_quantization().
// A method it handles comes back described; every other one is PEFT_ERR_UNSUPPORTED naming the
// method and listing what is supported (kSupportedQuantizedBases, the one list the message is made
// of). Adding a method: one entry in that list and one branch in recognise_base_quantization.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace peft {

enum class BaseQuantMethod {
  none,       // no quantization_config: an ordinary floating-point checkpoint
  fp8_block,  // quant_method "fp8" with weight_block_size (transformers' FineGrainedFP8, core/quant/fp8_block.hpp)
  bitsandbytes,  // quant_method "bitsandbytes": NF4/FP4 or int8 weights (peft/base/bnb_base.hpp)
};

struct BaseQuantization {
  BaseQuantMethod method = BaseQuantMethod::none;
  std::string quant_method;  // as config.json writes it
  uint64_t block_rows = 0;   // fp8_block: weight_block_size
  uint64_t block_cols = 0;
};

// The quantized bases a merge supports, for messages: "a, b and c".
std::string supported_quantized_bases();

// Reads config["quantization_config"] (a null or non-object config means none). PEFT_ERR_UNSUPPORTED
// for an unsupported method (GPTQ, AWQ, HQQ, compressed-tensors, ...) or an FP8 variant other than
// block scales in f32 (per-tensor scales, scale_fmt "ue8m0", FP4 experts), naming `base_dir`, the
// method and what is supported; PEFT_ERR_INVALID_CHECKPOINT for a malformed weight_block_size.
BaseQuantization recognise_base_quantization(const nlohmann::json& config, const std::string& base_dir);

}  // namespace peft
