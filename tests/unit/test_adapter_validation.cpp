// Validation against a base model folder: shapes, Linear vs GPT-2 Conv1D, every problem listed.
#include <doctest/doctest.h>

#include "peft/adapter/adapter.hpp"
#include "peft/base/base_validation.hpp"
#include "test_adapter_support.hpp"

using namespace adapter_test;
using nlohmann::json;

namespace {

void write_base(const fs::path& dir, const std::string& model_type, const std::vector<TensorSpec>& tensors) {
  write_text(dir / "config.json", json{{"model_type", model_type}}.dump());
  write_safetensors(dir / "model.safetensors", tensors);
}

std::vector<TensorSpec> llama_base() {
  std::vector<TensorSpec> out = {{"model.embed_tokens.weight", {32, 8}}, {"lm_head.weight", {32, 8}}};
  for (int layer = 0; layer < 2; ++layer) {
    std::string p = "model.layers." + std::to_string(layer) + ".";
    for (const char* proj : {"q_proj", "o_proj"}) out.push_back({p + "self_attn." + proj + ".weight", {8, 8}});
    for (const char* proj : {"k_proj", "v_proj"}) out.push_back({p + "self_attn." + proj + ".weight", {4, 8}});
    out.push_back({p + "mlp.up_proj.weight", {16, 8}});
    out.push_back({p + "input_layernorm.weight", {8}});
  }
  return out;
}

peft::Adapter::Options with_base(const fs::path& base) {
  peft::Adapter::Options options;
  options.base_dir = base.string();
  return options;
}

}  // namespace

TEST_CASE("adapter validation: a fitting adapter validates, with base tensor names resolved") {
  TempDir base, adapter;
  write_base(base.path, "llama", llama_base());
  write_adapter(adapter.path, config_text(), llama_tensors());
  auto a = peft::Adapter::open(adapter.str(), with_base(base.path));
  for (const auto& m : a->modules()) {
    CHECK(m.kind == peft::LayerKind::linear);
    CHECK(m.find(peft::TensorRole::lora_a)->base_tensor == m.name + ".weight");
  }
  CHECK_NOTHROW(a->validate(base.str()));
}

TEST_CASE("adapter validation: every shape mismatch and every missing tensor is listed") {
  TempDir base, adapter;
  write_base(base.path, "llama", llama_base());
  auto tensors = concat({lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8),
                         lora_pair("model.layers.0.self_attn.v_proj", 2, 8, 8),    // v is [4, 8]
                         lora_pair("model.layers.1.self_attn.v_proj", 2, 6, 4),    // in is 8
                         lora_pair("model.layers.5.self_attn.q_proj", 2, 8, 8)});  // no layer 5
  tensors.push_back({"base_model.model.lm_head.weight", {33, 8}});
  tensors.push_back({"base_model.model.score.weight", {2, 8}});
  write_adapter(adapter.path, config_text(), tensors);
  Failure f = open_failure(adapter.path, with_base(base.path));
  CHECK(f.code == PEFT_ERR_UNRESOLVED_KEY);  // unresolved wins over mismatched; both are listed
  CHECK(contains(f.message, "model.layers.0.self_attn.v_proj"));
  CHECK(contains(f.message, "model.layers.1.self_attn.v_proj"));
  CHECK(contains(f.message, "model.layers.5.self_attn.q_proj"));
  CHECK(contains(f.message, "lm_head.weight"));
  CHECK(contains(f.message, "score.weight"));
  CHECK(contains(f.message, "5 problems"));

  // Opened without a base, the same adapter validates on demand with the same verdict.
  TempDir only_shapes;
  write_adapter(only_shapes.path, config_text(),
                concat({lora_pair("model.layers.0.self_attn.v_proj", 2, 8, 8)}));
  auto a = peft::Adapter::open(only_shapes.str(), {});
  try {
    a->validate(base.str());
    FAIL("no error");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_SHAPE_MISMATCH);
    CHECK(contains(e.what(), "[8, 8]"));
    CHECK(contains(e.what(), "[4, 8]"));
  }
}

TEST_CASE("adapter validation: Conv1D from the base's shapes, whatever fan_in_fan_out says") {
  TempDir base, adapter;
  // GPT-2: c_attn weight is [in, out] = [8, 24]; c_proj is square [8, 8].
  write_base(base.path, "gpt2", {{"transformer.h.0.attn.c_attn.weight", {8, 24}},
                                 {"transformer.h.0.attn.c_proj.weight", {8, 8}}});
  write_adapter(adapter.path,
                config_text({{"target_modules", {"c_attn", "c_proj"}}, {"fan_in_fan_out", false},
                             {"base_model_name_or_path", "some/unknown-model"}}),
                concat({lora_pair("transformer.h.0.attn.c_attn", 2, 8, 24),
                        lora_pair("transformer.h.0.attn.c_proj", 2, 8, 8)}));
  auto a = peft::Adapter::open(adapter.str(), with_base(base.path));
  REQUIRE(a->table());
  CHECK(a->table()->family() == "gpt2");  // from config.json's model_type
  CHECK(a->find_module("transformer.h.0.attn.c_attn")->kind == peft::LayerKind::conv1d);  // by shape
  CHECK(a->find_module("transformer.h.0.attn.c_proj")->kind == peft::LayerKind::conv1d);  // square: by table
  bool noted = false;
  for (const auto& n : a->notes()) noted = noted || contains(n, "fan_in_fan_out");
  CHECK(noted);
}

TEST_CASE("adapter validation: a headless base checkpoint resolves through base_model_prefix") {
  TempDir base, adapter;
  write_base(base.path, "gpt2", {{"h.0.attn.c_attn.weight", {8, 24}}});
  write_adapter(adapter.path, config_text({{"target_modules", {"c_attn"}}}),
                lora_pair("transformer.h.0.attn.c_attn", 2, 8, 24));
  auto a = peft::Adapter::open(adapter.str(), with_base(base.path));
  CHECK(a->modules()[0].find(peft::TensorRole::lora_b)->base_tensor == "h.0.attn.c_attn.weight");
}

TEST_CASE("adapter validation: all-linear and an absent target_modules expand as PEFT does") {
  TempDir base;
  write_base(base.path, "llama", llama_base());
  TempDir all_linear, defaults, bad_defaults;
  auto tensors = concat({lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8),
                         lora_pair("model.layers.1.mlp.up_proj", 2, 8, 16)});
  write_adapter(all_linear.path, config_text({{"target_modules", "all-linear"}}), tensors);
  CHECK(peft::Adapter::open(all_linear.str(), with_base(base.path))->modules().size() == 2);
  // lm_head is the output embedding: never part of all-linear.
  TempDir head;
  write_adapter(head.path, config_text({{"target_modules", "all-linear"}}), lora_pair("lm_head", 2, 8, 32));
  CHECK(open_failure(head.path, with_base(base.path)).code == PEFT_ERR_INVALID_CONFIG);
  // Absent: PEFT's default for llama is q_proj and v_proj.
  write_adapter(defaults.path, config_text({{"target_modules", nullptr}}), llama_tensors());
  CHECK(peft::Adapter::open(defaults.str(), with_base(base.path))->modules().size() == 4);
  write_adapter(bad_defaults.path, config_text({{"target_modules", nullptr}}), tensors);
  CHECK(open_failure(bad_defaults.path, with_base(base.path)).code == PEFT_ERR_INVALID_CONFIG);
}
