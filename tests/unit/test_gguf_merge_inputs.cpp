// GGUF LoRA files as inputs of a merge into a GGUF base (peft/merge/gguf_lora_input), on
// files written here: the values against a reference computed in double (llama-export-lora's
// scale, the token_embd pair, a Q8_0 factor), mixing with a PEFT folder refused for a safetensors
// base, and every problem with its code, nothing written. Against llama-export-lora itself:
// tests/interop/test_gguf_merge_inputs.py.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/quant/q8_0.hpp"
#include "gguf/gguf_writer.hpp"
#include "peft/merge/gguf_merge.hpp"
#include "peft/merge/merge_inputs.hpp"
#include "checkpoint/checkpoint.hpp"
#include "test_checkpoint_merge_support.hpp"
#include "test_writer_support.hpp"

using namespace peft;

namespace {

namespace fs = std::filesystem;
constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30;

struct Tensor {
  std::string name;
  uint32_t type = kF32;
  std::vector<uint64_t> shape;  // outermost first
  std::vector<float> values;
};

std::vector<float> ramp(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i % 7) - 0.01f * static_cast<float>(i);
  return v;
}

void write_gguf(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                const std::vector<Tensor>& tensors) {
  GgufWriter writer(path);
  for (const auto& [key, value] : metadata) writer.add_metadata(key, value);
  for (const Tensor& t : tensors) writer.add_tensor(t.name, t.type, t.shape);
  for (const Tensor& t : tensors) {
    if (t.type == kQ8_0) {
      std::vector<uint8_t> blocks(t.values.size() / kQ8_0BlockSize * kQ8_0BlockBytes);
      quantize_q8_0(t.values.data(), t.values.size(), blocks.data());
      writer.write_tensor(t.name, blocks.data(), blocks.size());
    } else if (t.type == kF16 || t.type == kBF16) {
      std::vector<uint16_t> half(t.values.size());
      convert(DType::F32, t.values.data(), t.type == kF16 ? DType::F16 : DType::BF16, half.data(), half.size());
      writer.write_tensor(t.name, half.data(), half.size() * sizeof(uint16_t));
    } else {
      writer.write_tensor(t.name, t.values.data(), t.values.size() * sizeof(float));
    }
  }
  writer.finish();
}

GgufValue str(const std::string& s) { return {GgufValueType::STRING, s}; }
GgufValue f32(double v) { return {GgufValueType::F32, v}; }

// The base: token_embd [5, 3], attn_v [4, 3], ffn_down [3, 32], all F32.
std::vector<Tensor> base_tensors() {
  return {{"token_embd.weight", kF32, {5, 3}, ramp(15, 0.5f, 0.1f)},
          {"blk.0.attn_v.weight", kF32, {4, 3}, ramp(12, -0.3f, 0.05f)},
          {"blk.0.ffn_down.weight", kF32, {3, 32}, ramp(96, 0.1f, -0.02f)}};
}

// A rank-2 adapter on all three (ffn_down's lora_a is Q8_0).
std::vector<Tensor> lora_tensors() {
  return {{"token_embd.weight.lora_a", kF32, {5, 2}, ramp(10, 0.2f, 0.03f)},  // A^T [num, r]
          {"token_embd.weight.lora_b", kF32, {3, 2}, ramp(6, -0.1f, 0.04f)},  // B [dim, r]
          {"blk.0.attn_v.weight.lora_a", kF32, {2, 3}, ramp(6, 0.3f, -0.05f)},
          {"blk.0.attn_v.weight.lora_b", kF32, {4, 2}, ramp(8, 0.05f, 0.02f)},
          {"blk.0.ffn_down.weight.lora_a", kQ8_0, {2, 32}, ramp(64, -0.2f, 0.01f)},
          {"blk.0.ffn_down.weight.lora_b", kF32, {3, 2}, ramp(6, 0.1f, 0.07f)}};
}

std::vector<std::pair<std::string, GgufValue>> lora_metadata(const std::string& architecture = "llama") {
  return {{"general.architecture", str(architecture)}, {"general.type", str("adapter")},
          {"adapter.type", str("lora")}, {"adapter.lora.alpha", f32(3.0)}};
}

struct Files {
  writer_test::ScratchDir dir;
  std::string base = dir.path("base.gguf"), lora = dir.path("lora.gguf"), out = dir.path("out.gguf");
  Files() { write_gguf(base, {{"general.architecture", str("llama")}}, base_tensors()); }
};

CheckpointMergeResult merge_gguf(const Files& f, const std::vector<MergeAdapter>& adapters) {
  CheckpointMergeOptions options;
  options.threads = 1;
  options.adapters = open_merge_inputs(adapters, f.base);
  return merge_into_gguf(f.base, f.out, options);
}

int32_t code_of_merge(const Files& f, const std::vector<MergeAdapter>& adapters, std::string* message) {
  try {
    merge_gguf(f, adapters);
  } catch (const Error& e) {
    *message = e.what();
    return e.code();
  }
  return PEFT_OK;
}

}  // namespace

TEST_CASE("a GGUF LoRA merges as llama-export-lora computes it") {
  Files f;
  std::vector<Tensor> lora = lora_tensors();
  write_gguf(f.lora, lora_metadata(), lora);
  const double weight = 0.5;
  const CheckpointMergeResult result = merge_gguf(f, {{nullptr, f.lora, weight}});
  CHECK(result.merged == 3);
  CHECK(result.copied == 0);

  // The Q8_0 factor as stored.
  std::vector<uint8_t> blocks(64 / kQ8_0BlockSize * kQ8_0BlockBytes);
  quantize_q8_0(lora[4].values.data(), 64, blocks.data());
  dequantize_q8_0(blocks.data(), 64, lora[4].values.data());

  const float scale = static_cast<float>(weight) * 3.0f / 2.0f;  // weight * alpha / rank, in f32
  const auto out = Checkpoint::open(f.out);
  const std::vector<Tensor> base = base_tensors();
  for (size_t t = 0; t < base.size(); ++t) {
    const Tensor& w = base[t];
    const Tensor& a = lora[2 * t];
    const Tensor& b = lora[2 * t + 1];
    const uint64_t rows = w.shape[0], cols = w.shape[1], r = 2;
    const std::vector<float> got = out->read_f32(*out->find(w.name));
    for (uint64_t i = 0; i < rows; ++i) {
      for (uint64_t j = 0; j < cols; ++j) {
        double delta = 0;
        for (uint64_t k = 0; k < r; ++k)
          delta += t == 0 ? double(a.values[i * r + k]) * b.values[j * r + k]   // A^T B^T
                          : double(b.values[i * r + k]) * a.values[k * cols + j]; // B A
        const double want = w.values[i * cols + j] + scale * delta;
        CHECK_MESSAGE(std::abs(got[i * cols + j] - want) <= 1e-6 * (1 + std::abs(want)), w.name << " " << i << "," << j);
      }
    }
  }
}

TEST_CASE("a GGUF LoRA with alpha 0 is scaled by the weight alone") {
  Files f;
  std::vector<std::pair<std::string, GgufValue>> metadata = lora_metadata();
  metadata.back().second = f32(0.0);
  std::vector<Tensor> lora = lora_tensors();
  lora.resize(4);  // token_embd and attn_v
  write_gguf(f.lora, metadata, lora);
  merge_gguf(f, {{nullptr, f.lora, 2.0}});
  const auto out = Checkpoint::open(f.out);
  const std::vector<float> got = out->read_f32(*out->find("blk.0.attn_v.weight"));
  const Tensor w = base_tensors()[1];
  double delta = 0;
  for (uint64_t k = 0; k < 2; ++k) delta += double(lora[3].values[k]) * lora[2].values[k * 3];
  CHECK(std::abs(got[0] - (w.values[0] + 2.0 * delta)) <= 1e-6);
  CHECK(out->read_f32(*out->find("blk.0.ffn_down.weight")) == base_tensors()[2].values);  // copied
}

TEST_CASE("GGUF LoRA problems are all listed, with their codes, and nothing is written") {
  Files f;
  std::string message;

  SUBCASE("architecture") {
    write_gguf(f.lora, lora_metadata("qwen2"), lora_tensors());
    CHECK(code_of_merge(f, {{nullptr, f.lora, 1.0}}, &message) == PEFT_ERR_INVALID_ARGUMENT);
    CHECK(message.find("\"qwen2\"") != std::string::npos);
  }
  SUBCASE("several problems") {
    std::vector<Tensor> lora = lora_tensors();
    lora.erase(lora.begin() + 3);                       // attn_v without lora_b
    lora[0].shape = {2, 5};                             // token_embd's lora_a the wrong way round
    lora.push_back({"blk.7.attn_v.weight.lora_a", kF32, {2, 3}, ramp(6, 0, 1)});
    lora.push_back({"blk.7.attn_v.weight.lora_b", kF32, {4, 2}, ramp(8, 0, 1)});
    lora.push_back({"output_norm.weight", kF32, {3}, ramp(3, 0, 1)});
    write_gguf(f.lora, lora_metadata(), lora);
    CHECK(code_of_merge(f, {{nullptr, f.lora, 1.0}}, &message) == PEFT_ERR_INVALID_CHECKPOINT);
    CHECK(message.find("4 problems") != std::string::npos);
    CHECK(message.find("INVALID_CHECKPOINT: tensor \"blk.0.attn_v.weight\": \"blk.0.attn_v.weight.lora_b\" is missing") !=
          std::string::npos);
    CHECK(message.find("UNRESOLVED_KEY: tensor \"blk.7.attn_v.weight\" is not in the base") != std::string::npos);
    CHECK(message.find("SHAPE_MISMATCH: tensor \"token_embd.weight\"") != std::string::npos);
    CHECK(message.find("UNSUPPORTED: tensor \"output_norm.weight\"") != std::string::npos);
  }
  SUBCASE("a model file as the adapter") {
    CHECK(code_of_merge(f, {{nullptr, f.base, 1.0}}, &message) == PEFT_ERR_INVALID_ARGUMENT);
    CHECK(message.find("not a GGUF adapter") != std::string::npos);
  }
  SUBCASE("another adapter type") {
    std::vector<std::pair<std::string, GgufValue>> metadata = lora_metadata();
    metadata[2].second = str("control_vector");
    write_gguf(f.lora, metadata, lora_tensors());
    CHECK(code_of_merge(f, {{nullptr, f.lora, 1.0}}, &message) == PEFT_ERR_UNSUPPORTED);
  }
  SUBCASE("a safetensors base") {
    if (!merge_pipeline_test::fixtures_present()) return;
    write_gguf(f.lora, lora_metadata(), lora_tensors());
    try {
      open_merge_inputs({{nullptr, f.lora, 1.0}}, merge_pipeline_test::model("llama"));
      FAIL("a GGUF LoRA was taken for a safetensors base");
    } catch (const Error& e) {
      CHECK(e.code() == PEFT_ERR_UNSUPPORTED);
      CHECK(std::string(e.what()).find("peft_adapter_import_gguf") != std::string::npos);
    }
  }
  CHECK(!fs::exists(f.out));
}

TEST_CASE("a GGUF merge of one LoRA into F32, F16 and BF16 tensors in their own values gives the f32 path's bytes") {
  // One plain LoRA term is merged in the stored values (gguf_merge's merged_as_stored); a report
  // sends every tensor through the f32 path, which adds in f32 and rounds to the type once. The
  // output files must be the same bytes, in PEFT's and in llama-export-lora's arithmetic, and a
  // result beyond the type's range must be refused by both.
  auto file_bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  for (uint32_t type : {kF32, kF16, kBF16}) {
    Files f;
    std::vector<Tensor> base = base_tensors();
    for (Tensor& t : base) {
      if (t.shape[1] == 32) t.shape = {3, 256}, t.values = ramp(768, 0.1f, -0.02f);  // rows longer than a block
      t.type = type;
    }
    write_gguf(f.base, {{"general.architecture", str("llama")}}, base);
    std::vector<Tensor> lora = lora_tensors();
    lora[4] = {"blk.0.ffn_down.weight.lora_a", kF32, {2, 256}, ramp(512, -0.2f, 0.01f)};
    write_gguf(f.lora, lora_metadata(), lora);
    for (merge::Arithmetic arithmetic : {merge::Arithmetic::peft, merge::Arithmetic::ggml}) {
      CAPTURE(type);
      CAPTURE(static_cast<int>(arithmetic));
      std::vector<std::vector<char>> outputs;
      for (bool report : {false, true}) {
        CheckpointMergeOptions options;
        options.threads = 2;
        options.report = report;
        options.arithmetic = arithmetic;
        options.adapters = open_merge_inputs({{nullptr, f.lora, 0.7}}, f.base);
        const CheckpointMergeResult result = merge_into_gguf(f.base, f.out, options);
        CHECK(result.merged == 3);
        CHECK(result.store_report.size() == (report ? 3u : 0u));
        outputs.push_back(file_bytes(f.out));
      }
      CHECK(outputs[0].size() > 0);
      CHECK(outputs[0] == outputs[1]);
      // lora_b 1e4 times larger: results finite in f32 but beyond f16's range; for F32 and BF16
      // (f32's range), beyond f32's.
      std::vector<Tensor> large = lora;
      for (Tensor& t : large)
        if (t.name.ends_with("lora_b"))
          for (float& v : t.values) v *= 1e4f;
      const std::string large_lora = f.dir.path("large.gguf");
      write_gguf(large_lora, lora_metadata(), large);
      for (bool report : {false, true}) {
        CheckpointMergeOptions options;
        options.report = report;
        options.arithmetic = arithmetic;
        options.adapters = open_merge_inputs({{nullptr, large_lora, type == kF16 ? 2e5 : 1e36}}, f.base);
        CAPTURE(report);
        int32_t code = PEFT_OK;
        std::string message;
        try {
          merge_into_gguf(f.base, f.out, options);
        } catch (const Error& e) {
          code = e.code();
          message = e.what();
        }
        CHECK(code == PEFT_ERR_NON_FINITE);
        CHECK(message.find("\"token_embd.weight\" holds an infinity or") != std::string::npos);
      }
    }
  }
}
