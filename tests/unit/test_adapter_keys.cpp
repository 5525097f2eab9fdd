// The key grammar of adapter_model.safetensors (PEFT's get_peft_model_state_dict layout).
#include <doctest/doctest.h>

#include "peft/arch/key_grammar.hpp"

using peft::TensorRole;

namespace {

struct KeyCase {
  const char* key;
  const char* module;
  TensorRole role;
  const char* suffix;
  const char* base_tensor;  // full tensors only
  bool had_prefix;
  bool had_adapter_name;
};

// Keys as PEFT writes them (save_and_load.py) and as its loader accepts them.
const KeyCase kKeys[] = {
    {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.0.self_attn.q_proj",
     TensorRole::lora_a, "lora_A.weight", "", true, false},
    {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "model.layers.0.self_attn.q_proj",
     TensorRole::lora_b, "lora_B.weight", "", true, false},
    {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", "model.layers.0.self_attn.q_proj",
     TensorRole::lora_b_bias, "lora_B.bias", "", true, false},
    {"base_model.model.model.embed_tokens.lora_embedding_A", "model.embed_tokens", TensorRole::lora_embedding_a,
     "lora_embedding_A", "", true, false},
    {"base_model.model.model.embed_tokens.lora_embedding_B", "model.embed_tokens", TensorRole::lora_embedding_b,
     "lora_embedding_B", "", true, false},
    {"base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector", "model.layers.0.mlp.up_proj",
     TensorRole::lora_magnitude, "lora_magnitude_vector", "", true, false},
    {"base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector.weight", "model.layers.0.mlp.up_proj",
     TensorRole::lora_magnitude, "lora_magnitude_vector", "", true, false},
    {"base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", "model.embed_tokens",
     TensorRole::trainable_tokens_delta, "token_adapter.trainable_tokens_delta", "", true, false},
    // Full replacement tensors.
    {"base_model.model.classifier.weight", "classifier", TensorRole::full, "weight", "classifier.weight", true, false},
    {"base_model.model.score.bias", "score", TensorRole::full, "bias", "score.bias", true, false},
    {"base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias", "model.layers.0.self_attn.q_proj",
     TensorRole::full, "base_layer.bias", "model.layers.0.self_attn.q_proj.bias", true, false},
    {"base_model.model.lm_head.base_layer.weight", "lm_head", TensorRole::full, "base_layer.weight",
     "lm_head.weight", true, false},
    {"base_model.model.classifier.modules_to_save.default.weight", "classifier", TensorRole::full, "weight",
     "classifier.weight", true, true},
    // Without the prefix (transformers' integration), and with the default adapter name left in.
    {"model.layers.3.self_attn.v_proj.lora_A.weight", "model.layers.3.self_attn.v_proj", TensorRole::lora_a,
     "lora_A.weight", "", false, false},
    {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", "model.layers.0.self_attn.q_proj",
     TensorRole::lora_a, "lora_A.weight", "", true, true},
    {"base_model.model.model.embed_tokens.lora_embedding_B.default", "model.embed_tokens",
     TensorRole::lora_embedding_b, "lora_embedding_B", "", true, true},
    {"base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector.default.weight", "model.layers.0.mlp.up_proj",
     TensorRole::lora_magnitude, "lora_magnitude_vector", "", true, true},
};

}  // namespace

TEST_CASE("adapter keys: every role PEFT writes resolves to its module") {
  for (const KeyCase& c : kKeys) {
    CAPTURE(c.key);
    auto parsed = peft::parse_adapter_key(c.key);
    REQUIRE(parsed);
    CHECK(parsed->module == c.module);
    CHECK(parsed->role == c.role);
    CHECK(parsed->role_suffix == c.suffix);
    CHECK(parsed->had_prefix == c.had_prefix);
    CHECK(parsed->had_adapter_name == c.had_adapter_name);
    if (c.role == TensorRole::full) CHECK(parsed->base_tensor == c.base_tensor);
  }
}

TEST_CASE("adapter keys: keys that are not LoRA adapter keys do not resolve") {
  const char* bad[] = {
      "",
      "base_model.model.",
      "weight",                                                         // no module
      "base_model.model.model..layers.0.lora_A.weight",                  // empty segment
      "base_model.model.model.layers.0.q_proj.lora_A.my_task.weight",   // another adapter name
      "base_model.model.model.layers.0.q_proj.lora_diag.weight",        // KaSA
      "base_model.model.model.layers.0.q_proj.lora_A.weight.extra",
      "base_model.model.classifier.modules_to_save.task2.weight",       // another adapter name
      "base_model.model.classifier.original_module.weight",             // not saved by PEFT
      "lora_A.weight",                                                  // no module
      "base_model.model.model.embed_tokens.token_adapter.other",
  };
  for (const char* key : bad) {
    CAPTURE(key);
    CHECK_FALSE(peft::parse_adapter_key(key));
  }
}

TEST_CASE("adapter keys: the canonical key drops the adapter name and keeps the prefix choice") {
  auto parsed = peft::parse_adapter_key("base_model.model.x.y.lora_A.default.weight");
  REQUIRE(parsed);
  CHECK(parsed->key(true) == "base_model.model.x.y.lora_A.weight");
  CHECK(parsed->key(false) == "x.y.lora_A.weight");
}

TEST_CASE("adapter keys: parameters of other methods are method_param keys named by the parameter") {
  const std::pair<const char*, const char*> cases[] = {
      {"base_model.model.model.layers.0.q_proj.lora_E", "lora_E"},        // AdaLoRA
      {"base_model.model.model.layers.0.q_proj.lora_A", "lora_A"},        // AdaLoRA (no .weight)
      {"base_model.model.model.layers.0.q_proj.hada_w1_a", "hada_w1_a"},  // LoHa
      {"model.layers.0.mlp.up_proj.lokr_w2.default", "lokr_w2"},          // LoKr, adapter name
      {"base_model.model.transformer.h.0.attn.c_attn.ia3_l", "ia3_l"},    // IA3
  };
  for (const auto& c : cases) {
    const char* key = c.first;  // plain variables: clang 15 cannot capture structured bindings in CAPTURE
    const char* param = c.second;
    CAPTURE(key);
    auto parsed = peft::parse_adapter_key(key);
    REQUIRE(parsed);
    CHECK(parsed->role == peft::TensorRole::method_param);
    CHECK(parsed->role_suffix == param);
  }
  CHECK_FALSE(peft::parse_adapter_key("hada_w1_a"));  // no module
}

TEST_CASE("adapter keys: LN_TUNING norm copies and TRAINABLE_TOKENS rows") {
  auto ln = peft::parse_adapter_key("base_model.model.model.layers.0.input_layernorm.ln_tuning_layers.weight");
  REQUIRE(ln);
  CHECK(ln->role == peft::TensorRole::full);
  CHECK(ln->module == "model.layers.0.input_layernorm");
  CHECK(ln->role_suffix == "ln_tuning_layers.weight");
  CHECK(ln->base_tensor == "model.layers.0.input_layernorm.weight");
  CHECK(ln->key(true) == "base_model.model.model.layers.0.input_layernorm.ln_tuning_layers.weight");
  auto bias = peft::parse_adapter_key("base_model.model.encoder.ln.ln_tuning_layers.bias");
  REQUIRE(bias);
  CHECK(bias->base_tensor == "encoder.ln.bias");
  CHECK(peft::suffix_parameter(bias->role_suffix) == "bias");

  auto tokens = peft::parse_adapter_key("base_model.model.model.embed_tokens.trainable_tokens_delta");
  REQUIRE(tokens);
  CHECK(tokens->role == peft::TensorRole::trainable_tokens_delta);
  CHECK(tokens->module == "model.embed_tokens");
  CHECK(tokens->role_suffix == "trainable_tokens_delta");
  auto named = peft::parse_adapter_key("model.embed_tokens.trainable_tokens_delta.default");
  REQUIRE(named);
  CHECK(named->had_adapter_name);
  CHECK(named->module == "model.embed_tokens");
  auto lora_form = peft::parse_adapter_key("base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta");
  REQUIRE(lora_form);  // LoRA's trainable_token_indices form is unchanged
  CHECK(lora_form->role_suffix == "token_adapter.trainable_tokens_delta");
  CHECK_FALSE(peft::parse_adapter_key("trainable_tokens_delta"));  // no module
}
