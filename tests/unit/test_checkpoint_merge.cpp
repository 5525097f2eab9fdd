// The merge pipeline's values: every fixture adapter merged into its base and compared with a plain
// double-precision evaluation of PEFT's formulas (the interop tests compare with PEFT itself).
#include <doctest/doctest.h>

#include <map>

#include "test_checkpoint_merge_support.hpp"

using namespace merge_pipeline_test;
using peft::AdapterModule;
using peft::LayerKind;
using peft::TensorRole;

namespace {

std::vector<double> adapter_values(const peft::Adapter& a, const peft::AdapterTensor& t) {
  std::vector<float> f = a.checkpoint().read_f32(t.index);
  return std::vector<double>(f.begin(), f.end());
}

const std::vector<uint64_t>& adapter_shape(const peft::Adapter& a, const peft::AdapterTensor& t) {
  return a.checkpoint().tensor(t.index).shape;
}

// What every changed base tensor should hold after merging `adapters` (with weights) into `base`,
// in the order the pipeline documents: replacements, LoRA/DoRA, lora_B.bias, token rows.
std::map<std::string, std::vector<double>> reference_merge(
    const peft::Checkpoint& base, const std::vector<std::pair<std::shared_ptr<const peft::Adapter>, double>>& adapters) {
  std::map<std::string, std::vector<double>> expected;
  auto slot = [&](const std::string& name) -> std::vector<double>& {
    auto it = expected.find(name);
    if (it == expected.end()) it = expected.emplace(name, values(base, name)).first;
    return it->second;
  };
  for (const auto& [a, weight] : adapters)
    for (const AdapterModule& m : a->modules())
      for (const auto& t : m.tensors)
        if (t.role == TensorRole::full) slot(t.base_tensor) = adapter_values(*a, t);
  for (const auto& [a, weight] : adapters) {
    for (const AdapterModule& m : a->modules()) {
      if (!m.is_lora()) continue;
      const bool emb = m.kind == LayerKind::embedding;
      const auto& ta = *m.find(emb ? TensorRole::lora_embedding_a : TensorRole::lora_a);
      const auto& tb = *m.find(emb ? TensorRole::lora_embedding_b : TensorRole::lora_b);
      const auto A = adapter_values(*a, ta), B = adapter_values(*a, tb);
      const int64_t rank = static_cast<int64_t>(adapter_shape(*a, ta)[0]);
      const int64_t in = static_cast<int64_t>(A.size()) / rank, out = static_cast<int64_t>(B.size()) / rank;
      const bool transposed = emb || m.kind == LayerKind::conv1d;
      const double c = static_cast<float>(weight * m.scaling);
      std::vector<double>& w = slot(ta.base_tensor);
      if (const auto* mag = m.find(TensorRole::lora_magnitude)) {
        // DoRA (Linear): W' = m / ||W + dW||_row * (W + dW).
        REQUIRE_FALSE(transposed);
        add_reference_delta(w, A, B, out, in, rank, c, false);
        const auto magnitude = adapter_values(*a, *mag);
        for (int64_t o = 0; o < out; ++o) {
          double norm = 0;
          for (int64_t i = 0; i < in; ++i) norm += w[o * in + i] * w[o * in + i];
          norm = std::sqrt(norm);
          for (int64_t i = 0; i < in; ++i) w[o * in + i] *= magnitude[o] / norm;
        }
      } else {
        add_reference_delta(w, A, B, out, in, rank, c, transposed);
      }
      if (const auto* bias = m.find(TensorRole::lora_b_bias)) {
        const auto b = adapter_values(*a, *bias);
        std::vector<double>& target = slot(bias->base_tensor);
        for (size_t j = 0; j < b.size(); ++j) target[j] += static_cast<double>(static_cast<float>(b[j] * c));
      }
    }
  }
  for (const auto& [a, weight] : adapters) {
    for (const AdapterModule& m : a->modules()) {
      if (m.kind != LayerKind::trainable_tokens) continue;
      const auto* delta = m.find(TensorRole::trainable_tokens_delta);
      const auto rows = adapter_values(*a, *delta);
      std::vector<double>& w = slot(delta->base_tensor);
      const size_t dim = adapter_shape(*a, *delta)[1];
      for (size_t r = 0; r < m.token_indices.size(); ++r)
        std::copy_n(rows.begin() + r * dim, dim, w.begin() + m.token_indices[r] * dim);
    }
  }
  return expected;
}

// Merges, then checks every output tensor: changed ones against the reference (relative `tolerance`),
// all others byte for byte against the base; names, order, dtypes and shapes as the base's.
void check_merge(const std::string& base_name, const std::vector<std::pair<std::string, double>>& adapters,
                 double tolerance = 1e-6) {
  Scratch dir;
  const std::string base = model(base_name);
  std::vector<std::pair<std::shared_ptr<const peft::Adapter>, double>> opened;
  peft::CheckpointMergeOptions options;
  for (const auto& [name, weight] : adapters) {
    opened.emplace_back(open_adapter(adapter_dir(name), base), weight);
    options.adapters.push_back({opened.back().first, weight});
  }
  const peft::CheckpointMergeResult result = peft::merge_checkpoint(base, dir.path("out"), options);
  auto in = peft::Checkpoint::open(base);
  auto out = peft::Checkpoint::open(dir.path("out"));
  const auto expected = reference_merge(*in, opened);
  REQUIRE(out->tensor_count() == in->tensor_count());
  CHECK(result.merged + result.replaced + result.copied == in->tensor_count());
  size_t changed = 0;
  for (size_t i = 0; i < in->tensor_count(); ++i) {
    const auto& a = in->tensor(i);
    const auto& b = out->tensor(i);
    CAPTURE(a.name);
    REQUIRE(b.name == a.name);
    CHECK(b.dtype == a.dtype);
    CHECK(b.shape == a.shape);
    auto it = expected.find(a.name);
    if (it == expected.end()) {
      CHECK(raw(*out, a.name) == raw(*in, a.name));
    } else {
      ++changed;
      CHECK(max_relative(values(*out, a.name), it->second) <= tolerance);
    }
  }
  CHECK(changed == result.merged + result.replaced);
  CHECK(read_file(dir.path("out/config.json")) == read_file(base + "/config.json"));
}

}  // namespace

TEST_CASE("merge pipeline: every kind of fixture adapter merges as PEFT's formulas say") {
  if (!fixtures_present()) return;
  const std::pair<const char*, const char*> cases[] = {
      {"llama", "llama_lora"},          {"llama", "llama_rslora"},          {"llama", "llama_rank_alpha_pattern"},
      {"llama", "llama_dora"},          {"llama", "llama_embedding"},       {"llama", "llama_regex"},
      {"llama", "llama_all_linear"},    {"llama", "llama_layers_to_transform"}, {"llama", "llama_exclude_modules"},
      {"llama", "llama_trainable_tokens"}, {"mistral", "mistral_lora"},     {"qwen2", "qwen2_lora"},
      {"qwen2", "qwen2_lora_bias"},     {"qwen2", "qwen2_bias_all"},        {"gemma", "gemma_lora"},
      {"gemma3_text", "gemma3_text_lora"}, {"phi3", "phi3_lora"},           {"gpt2", "gpt2_lora"},
      {"gpt_neox", "gpt_neox_lora"},    {"falcon", "falcon_lora"},          {"bloom", "bloom_lora"},
      {"mixtral", "mixtral_lora"},      {"t5", "t5_lora"},                  {"bert", "bert_seqcls_lora"},
      {"roberta", "roberta_lora"},      {"distilbert", "distilbert_lora"},  {"vit", "vit_lora"},
      {"vit", "vit_lora_v4_names"},
  };
  for (const auto& [base, adapter] : cases) {
    const std::string name = adapter;
    CAPTURE(name);
    check_merge(base, {{adapter, 1.0}});
  }
}

TEST_CASE("merge pipeline: two weighted adapters add up before one rounding") {
  if (!fixtures_present()) return;
  check_merge("llama", {{"llama_lora", 0.7}, {"llama_lora_second", -0.3}});
  check_merge("llama", {{"llama_lora", 1.0}, {"llama_dora", 0.5}});
  check_merge("qwen2", {{"qwen2_lora_bias", 0.25}, {"qwen2_lora", 2.0}});
}

TEST_CASE("merge pipeline: half-precision bases are merged in their dtype within one rounding") {
  if (!fixtures_present()) return;
  for (const auto& [base_name, adapter] : {std::pair{"llama_bf16", "llama_bf16_lora"}, {"llama_f16", "llama_f16_lora"}}) {
    const std::string name = adapter;
    CAPTURE(name);
    Scratch dir;
    const std::string base = model(base_name);
    auto a = open_adapter(adapter_dir(adapter), base);
    peft::CheckpointMergeOptions options;
    options.adapters.push_back({a, 1.0});
    peft::merge_checkpoint(base, dir.path("out"), options);
    auto in = peft::Checkpoint::open(base);
    auto out = peft::Checkpoint::open(dir.path("out"));
    const auto expected = reference_merge(*in, {{a, 1.0}});
    CHECK(expected.size() == 6);
    for (const auto& entry : expected) {
      const auto& name = entry.first;
      const auto& want = entry.second;
      CAPTURE(name);
      const auto got = values(*out, name);
      const peft::DType dtype = in->tensor(*in->find(name)).dtype;
      size_t exact = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const double r = rounded(want[i], dtype);
        CHECK(ulps(got[i], r, dtype) <= 1.0);
        exact += got[i] == r;
      }
      CHECK(exact * 1000 >= want.size() * 999);
    }
  }
}

TEST_CASE("merge pipeline: results do not depend on the number of threads") {
  if (!fixtures_present()) return;
  Scratch dir;
  std::vector<std::string> contents;
  for (unsigned threads : {1u, 2u, 0u, 7u}) {
    peft::CheckpointMergeOptions options;
    options.threads = threads;
    const std::string out = dir.path("out" + std::to_string(threads));
    merge(model("llama"), out, {{adapter_dir("llama_dora"), 0.5}, {adapter_dir("llama_lora"), 1.5}}, options);
    contents.push_back(read_file(out + "/model.safetensors"));
  }
  for (const std::string& c : contents) CHECK(c == contents[0]);
}
