// Bases saved by transformers with bitsandbytes quantization (config.json "quantization_config" with
// "quant_method": "bitsandbytes"): which tensors are quantized weights, their quantization state, and
// reading and rewriting them through core/quant/bnb_4bit and bnb_int8. BaseModel::open records the
// 4-bit weights' shapes (BaseModel::weight_shapes), so adapters validate against them.
//
// 4-bit (load_in_4bit, NF4 or FP4): "<m>.weight" U8 [(n + 1) / 2, 1] with "<m>.weight.absmax",
// "<m>.weight.quant_map" (the 16 codes), "<m>.weight.quant_state.bitsandbytes__<nf4|fp4>" (U8 bytes of
// the JSON {"quant_type", "blocksize", "dtype", "shape", and with double quantization
// "nested_blocksize", "nested_dtype", "nested_offset"}), and with double quantization
// "<m>.weight.nested_absmax" and "<m>.weight.nested_quant_map" (absmax is then U8).
// 8-bit (load_in_8bit): "<m>.weight" I8 [out, in] with "<m>.SCB" F32 [out] and "<m>.weight_format".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/quant/bnb_4bit.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

struct BnbWeight {
  bool four_bit = true;              // false: LLM.int8()
  bnb::FourBit type = bnb::FourBit::nf4;
  size_t weight = 0;                 // base tensor indices
  std::vector<uint64_t> shape;       // the weight's own shape ([out, in])
  uint64_t blocksize = 64;
  bool nested = false;
  std::optional<size_t> absmax, quant_map, nested_absmax, nested_quant_map, quant_state;  // 4-bit
  std::optional<size_t> scb, weight_format;                                              // 8-bit
  nlohmann::ordered_json state;      // the 4-bit quant_state JSON, keys in their order

  // Every base tensor that belongs to this weight besides `weight` itself.
  std::vector<size_t> companions() const;
};

struct BnbBase {
  std::map<size_t, BnbWeight> weights;  // by the index of "<m>.weight"
  std::map<size_t, size_t> owner;       // companion index -> weight index
};

// nullopt when config.json has no "quantization_config"; the base's bitsandbytes weights when its
// quant_method is "bitsandbytes". PEFT_ERR_UNSUPPORTED naming the method for any other method, and
// for bitsandbytes options this library does not read (a quant_storage other than uint8);
// PEFT_ERR_INVALID_CHECKPOINT naming the tensor when a weight's state is missing or inconsistent.
// `config` is the base's config.json (null when absent), `weights` its tensors, `dir` its folder.
std::optional<BnbBase> recognise_bnb_base(const nlohmann::json& config, const Checkpoint& weights, const std::string& dir);

// The weight as bitsandbytes dequantizes it on CPU, f32, row-major.
std::vector<float> bnb_dequantize(const Checkpoint& base, const BnbWeight& w);

// `values` (the weight's shape) quantized again with the weight's format, type, block size and double
// quantization, as bitsandbytes quantizes an f32 tensor: the bytes of the weight and of every
// companion, by base index (the quant_state JSON rewritten with the new nested_offset; quant maps and
// weight_format as they were). Infinite and NaN values are quantized as bitsandbytes does (the merge
// refuses them first unless allow_nonfinite); PEFT_ERR_NON_FINITE when the values are finite but the mean
// of the absmax values that double quantization subtracts overflows f32.
std::map<size_t, std::vector<uint8_t>> bnb_quantize(const Checkpoint& base, const BnbWeight& w,
                                                    const std::vector<float>& values);

}  // namespace peft
