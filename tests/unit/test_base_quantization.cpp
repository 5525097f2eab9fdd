// peft/merge/base_quantization: which quantization_config a merge handles, and the message of
// the ones it does not (the method named, the supported list given).
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "peft/merge/base_quantization.hpp"
#include "peft_c.h"
#include "test_error_support.hpp"

namespace {

using error_test::code_of;

nlohmann::json with_quantization(const nlohmann::json& q) { return {{"model_type", "llama"}, {"quantization_config", q}}; }

std::string message_of(const nlohmann::json& config) {
  try {
    peft::recognise_base_quantization(config, "base");
  } catch (const peft::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("base quantization: none, and FP8 blocks with their block size") {
  CHECK(peft::recognise_base_quantization(nullptr, "base").method == peft::BaseQuantMethod::none);
  CHECK(peft::recognise_base_quantization({{"model_type", "llama"}}, "base").method == peft::BaseQuantMethod::none);
  const auto q = peft::recognise_base_quantization(
      with_quantization({{"quant_method", "fp8"}, {"weight_block_size", {128, 64}}, {"activation_scheme", "dynamic"},
                         {"scale_fmt", "float"}, {"modules_to_not_convert", {"lm_head"}}}),
      "base");
  CHECK(q.method == peft::BaseQuantMethod::fp8_block);
  CHECK(q.block_rows == 128);
  CHECK(q.block_cols == 64);
}

TEST_CASE("base quantization: other methods are UNSUPPORTED, named, with the supported list") {
  for (const char* method : {"gptq", "awq", "hqq", "aqlm", "torchao", "fbgemm_fp8", "some-future-method"}) {
    CAPTURE(method);
    const auto config = with_quantization({{"quant_method", method}});
    CHECK(code_of([&] { peft::recognise_base_quantization(config, "base"); }) == PEFT_ERR_UNSUPPORTED);
    const std::string message = message_of(config);
    CHECK(message.find(std::string("\"") + method + "\"") != std::string::npos);
    CHECK(message.find("supported quantized bases: " + peft::supported_quantized_bases()) != std::string::npos);
  }
  CHECK(message_of(with_quantization({{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}}))
            .find("\"compressed-tensors\" (format \"float-quantized\")") != std::string::npos);
  CHECK(message_of(with_quantization({{"bits", 4}})).find("without quant_method") != std::string::npos);
  CHECK(message_of(with_quantization({{"quant_method", "fp8"}, {"weight_block_size", nullptr}}))
            .find("per-tensor scales") != std::string::npos);
  CHECK(message_of(with_quantization({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"scale_fmt", "ue8m0"}}))
            .find("scale_fmt \"ue8m0\"") != std::string::npos);
  CHECK(message_of(with_quantization({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"expert_dtype", "fp4"}}))
            .find("expert_dtype \"fp4\"") != std::string::npos);
  CHECK(peft::supported_quantized_bases().find("FP8 block-scale") != std::string::npos);
}

TEST_CASE("base quantization: a malformed FP8 block size or config is INVALID_CHECKPOINT") {
  for (const nlohmann::json& block : {nlohmann::json{128}, nlohmann::json{0, 128}, nlohmann::json{-1, 128},
                                      nlohmann::json{128.5, 128}, nlohmann::json("128")}) {
    CAPTURE(block.dump());
    CHECK(code_of([&] {
            peft::recognise_base_quantization(with_quantization({{"quant_method", "fp8"}, {"weight_block_size", block}}),
                                              "base");
          }) == PEFT_ERR_INVALID_CHECKPOINT);
  }
  CHECK(code_of([] { peft::recognise_base_quantization(with_quantization("fp8"), "base"); }) ==
        PEFT_ERR_INVALID_CHECKPOINT);
}
