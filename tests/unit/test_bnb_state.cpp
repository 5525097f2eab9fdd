// peft/base/bnb_base: bitsandbytes weights read from an in-memory checkpoint, dequantized and
// quantized again (reproducers of tests/fuzz/bnb_state_fuzzer.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint_test_support.hpp"
#include "core/quant/bnb_4bit.hpp"
#include "peft/base/bnb_base.hpp"
#include "test_error_support.hpp"

namespace {

struct Tensors {
  std::string header = "{", data;
  void add(const std::string& name, const char* dtype, const std::vector<uint64_t>& shape, const void* bytes, size_t size) {
    std::string dims;
    for (uint64_t d : shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    header += std::string(header.size() > 1 ? "," : "") + "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" +
              dims + "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + size) + "]}";
    data.append(static_cast<const char*>(bytes), size);
  }
  void f32(const std::string& name, const std::vector<float>& values) {
    add(name, "F32", {values.size()}, values.data(), values.size() * 4);
  }
  std::shared_ptr<const peft::Checkpoint> open() const {
    const std::string file = checkpoint_test::safetensors_bytes(header + "}", data);
    return peft::Checkpoint::open_memory(file.data(), file.size());
  }
};

const nlohmann::json kConfig = {{"quantization_config", {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}}};

std::vector<float> nf4_code() {
  const auto code = peft::bnb::four_bit_code(peft::bnb::FourBit::nf4);
  return {code.begin(), code.end()};
}

}  // namespace

TEST_CASE("bnb state: a 4-bit weight with an infinite absmax dequantizes to infinities, which quantize again") {
  Tensors t;
  const uint8_t packed[2] = {0xF0, 0x7F};
  t.add("m.weight", "U8", {2, 1}, packed, 2);
  t.f32("m.weight.absmax", {std::numeric_limits<float>::infinity()});
  t.f32("m.weight.quant_map", nf4_code());
  const std::string state = R"({"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [2, 2]})";
  t.add("m.weight.quant_state.bitsandbytes__nf4", "U8", {state.size()}, state.data(), state.size());
  const auto c = t.open();
  const auto base = peft::recognise_bnb_base(kConfig, *c, "mem");
  REQUIRE(base);
  REQUIRE(base->weights.size() == 1);
  const peft::BnbWeight& w = base->weights.begin()->second;
  const std::vector<float> values = peft::bnb_dequantize(*c, w);
  REQUIRE(values.size() == 4);
  CHECK(std::isinf(values[0]));
  // The merge refuses them unless allow_nonfinite; then they are written as bitsandbytes writes them.
  const auto parts = peft::bnb_quantize(*c, w, values);
  CHECK(parts.at(w.weight).size() == 2);
  CHECK(parts.at(*w.absmax).size() == 4);
}

TEST_CASE("bnb state: double quantization whose absmax mean overflows f32 is NON_FINITE, not undefined") {
  // Two blocks of 3e38: their absmax sum overflows, so the offset was infinite and every absmax minus
  // it NaN or -inf, which the blockwise quantizer converted to an integer (undefined behaviour).
  Tensors t;
  std::vector<uint8_t> packed(64, 0x77), absmax(2, 128);
  t.add("m.weight", "U8", {64, 1}, packed.data(), packed.size());
  t.add("m.weight.absmax", "U8", {2}, absmax.data(), absmax.size());
  t.f32("m.weight.quant_map", nf4_code());
  t.f32("m.weight.nested_absmax", {1.0f});
  std::vector<float> dynamic(256);
  for (int i = 0; i < 256; ++i) dynamic[static_cast<size_t>(i)] = -1.0f + static_cast<float>(i) / 127.5f;
  t.f32("m.weight.nested_quant_map", dynamic);
  const std::string state = R"({"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [1, 128], )"
                            R"("nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5})";
  t.add("m.weight.quant_state.bitsandbytes__nf4", "U8", {state.size()}, state.data(), state.size());
  const auto c = t.open();
  const auto base = peft::recognise_bnb_base(kConfig, *c, "mem");
  REQUIRE(base);
  const peft::BnbWeight& w = base->weights.begin()->second;
  CHECK(w.nested);
  const std::vector<float> finite(128, 3e38f);
  CHECK(error_test::code_of([&] { (void)peft::bnb_quantize(*c, w, finite); }) == PEFT_ERR_NON_FINITE);
  // Values already infinite (allow_nonfinite) are written, whatever the offset becomes.
  std::vector<float> infinite = finite;
  infinite[5] = std::numeric_limits<float>::infinity();
  CHECK(peft::bnb_quantize(*c, w, infinite).at(*w.absmax).size() == 2);
  // Ordinary values are written back in place, with a state that says the new offset.
  std::vector<float> values(128);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 7) - 3.0f;
  const auto parts = peft::bnb_quantize(*c, w, values);
  CHECK(parts.at(w.weight).size() == 64);
  CHECK(parts.at(*w.absmax).size() == 2);
  const auto& text = parts.at(*w.quant_state);
  const auto again = nlohmann::json::parse(std::string(text.begin(), text.end()));
  CHECK(again["nested_offset"].is_number());
}

TEST_CASE("bnb state: an empty 4-bit weight (shape [0, 16]) dequantizes and quantizes to empty parts") {
  // bnb_state_fuzzer: its empty absmax was copied with memcpy from a null pointer.
  Tensors t;
  t.add("m.weight", "U8", {0, 1}, nullptr, 0);
  t.add("m.weight.absmax", "F32", {0}, nullptr, 0);
  t.f32("m.weight.quant_map", nf4_code());
  const std::string state = R"({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [0, 16]})";
  t.add("m.weight.quant_state.bitsandbytes__nf4", "U8", {state.size()}, state.data(), state.size());
  const auto c = t.open();
  const auto base = peft::recognise_bnb_base(kConfig, *c, "mem");
  REQUIRE(base);
  const peft::BnbWeight& w = base->weights.begin()->second;
  const std::vector<float> values = peft::bnb_dequantize(*c, w);
  CHECK(values.empty());
  const auto parts = peft::bnb_quantize(*c, w, values);
  CHECK(parts.at(w.weight).empty());
  CHECK(parts.at(*w.absmax).empty());
}
