// Opening adapters: modules, ranks, notes, and one test per kind of bad adapter or bad key.
#include <doctest/doctest.h>

#include "peft/adapter/adapter.hpp"
#include "peft/arch/arch_table.hpp"
#include "test_adapter_support.hpp"

using namespace adapter_test;
using nlohmann::json;

TEST_CASE("adapter open: modules in file order with rank, alpha and scaling") {
  TempDir t;
  write_adapter(t.path, config_text({{"rank_pattern", {{"v_proj", 3}}}, {"alpha_pattern", {{"layers.1.self_attn.q_proj", 9}}}}),
                concat({lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8),
                        lora_pair("model.layers.0.self_attn.v_proj", 3, 8, 4),
                        lora_pair("model.layers.1.self_attn.q_proj", 2, 8, 8)}));
  auto a = peft::Adapter::open(t.str(), {});
  REQUIRE(a->modules().size() == 3);
  const peft::AdapterModule& v = a->modules()[1];
  CHECK(v.name == "model.layers.0.self_attn.v_proj");
  CHECK(v.rank == 3);
  CHECK(v.alpha == 4);
  CHECK(v.scaling == doctest::Approx(4.0 / 3.0));
  CHECK(v.rank_key == "v_proj");
  const peft::AdapterModule& q1 = a->modules()[2];
  CHECK(q1.alpha == 9);
  CHECK(q1.scaling == 4.5);
  CHECK(q1.kind == peft::LayerKind::linear);
  REQUIRE(q1.find(peft::TensorRole::lora_a));
  CHECK(a->checkpoint().tensor(q1.find(peft::TensorRole::lora_a)->index).name ==
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  REQUIRE(a->table());  // detected from base_model_name_or_path "TinyLlama/TinyLlama-unit-test"
  CHECK(a->table()->family() == "llama");
}

TEST_CASE("adapter open: a missing r is PEFT's default 8, and wrong only when the tensors disagree") {
  TempDir ok, bad;
  write_adapter(ok.path, config_text({{"r", nullptr}}), llama_tensors(8));
  CHECK(peft::Adapter::open(ok.str(), {})->modules()[0].rank == 8);
  write_adapter(bad.path, config_text({{"r", nullptr}}), llama_tensors(4));
  Failure f = open_failure(bad.path);
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "\"r\""));
  CHECK(contains(f.message, "default 8"));
  // Every module at fault is listed.
  CHECK(contains(f.message, "model.layers.0.self_attn.q_proj"));
  CHECK(contains(f.message, "model.layers.1.self_attn.v_proj"));
}

TEST_CASE("adapter open: a rank_pattern that disagrees with the tensors names rank_pattern") {
  TempDir t;
  write_adapter(t.path, config_text({{"rank_pattern", {{"q_proj", 4}}}}), llama_tensors(2));
  Failure f = open_failure(t.path);
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "\"rank_pattern\""));
}

TEST_CASE("adapter open: keys that are not adapter keys are UNRESOLVED_KEY, every one listed") {
  TempDir t;
  auto tensors = llama_tensors();
  tensors.push_back({"base_model.model.model.layers.0.self_attn.q_proj.lora_E", {2, 1}});
  tensors.push_back({"base_model.model.model.layers.0.self_attn.k_proj.lora_A.task2.weight", {2, 8}});
  write_adapter(t.path, config_text(), tensors);
  Failure f = open_failure(t.path);
  CHECK(f.code == PEFT_ERR_UNRESOLVED_KEY);
  CHECK(contains(f.message, "lora_E"));
  CHECK(contains(f.message, "lora_A.task2.weight"));
}

TEST_CASE("adapter open: the default adapter name in keys is removed, with a note") {
  TempDir t;
  write_adapter(t.path, config_text(),
                {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", {2, 8}},
                 {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", {8, 2}}});
  auto a = peft::Adapter::open(t.str(), {});
  REQUIRE(a->modules().size() == 1);
  CHECK(a->modules()[0].rank == 2);
  bool noted = false;
  for (const std::string& n : a->notes()) noted = noted || contains(n, "\"default\"");
  CHECK(noted);
}

TEST_CASE("adapter open: LoRA tensors of modules the config does not target are INVALID_CONFIG") {
  TempDir t;
  auto tensors = llama_tensors();
  for (auto& x : lora_pair("model.layers.0.self_attn.k_proj", 2, 8, 4)) tensors.push_back(x);
  for (auto& x : lora_pair("model.layers.1.mlp.up_proj", 2, 8, 16)) tensors.push_back(x);
  write_adapter(t.path, config_text(), tensors);
  Failure f = open_failure(t.path);
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "\"target_modules\""));
  CHECK(contains(f.message, "model.layers.0.self_attn.k_proj"));
  CHECK(contains(f.message, "model.layers.1.mlp.up_proj"));
}

TEST_CASE("adapter open: exclude_modules and modules_to_save exclusions are errors for LoRA tensors") {
  TempDir t;
  write_adapter(t.path, config_text({{"exclude_modules", {"model.layers.1.self_attn.v_proj"}}}), llama_tensors());
  Failure f = open_failure(t.path);
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "\"model.layers.1.self_attn.v_proj\" (excluded)"));
}

TEST_CASE("adapter open: lora_A without lora_B is INVALID_CHECKPOINT") {
  TempDir t;
  auto tensors = llama_tensors();
  tensors.push_back({"base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight", {2, 8}});
  write_adapter(t.path, config_text(), tensors);
  Failure f = open_failure(t.path);
  CHECK(f.code == PEFT_ERR_INVALID_CHECKPOINT);
  CHECK(contains(f.message, "model.layers.2.self_attn.q_proj"));
  CHECK(contains(f.message, "lora_B.weight"));
}

TEST_CASE("adapter open: the same tensor under two keys is INVALID_CHECKPOINT") {
  TempDir t;
  auto tensors = llama_tensors();
  tensors.push_back({"model.layers.0.self_attn.q_proj.lora_A.weight", {2, 8}});
  write_adapter(t.path, config_text(), tensors);
  CHECK(open_failure(t.path).code == PEFT_ERR_INVALID_CHECKPOINT);
}

TEST_CASE("adapter open: A and B that disagree on the rank are INVALID_CHECKPOINT") {
  TempDir t;
  write_adapter(t.path, config_text(),
                {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", {2, 8}},
                 {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", {8, 3}}});
  CHECK(open_failure(t.path).code == PEFT_ERR_INVALID_CHECKPOINT);
}

TEST_CASE("adapter open: DoRA and lora_bias tensors must match use_dora and lora_bias") {
  TempDir dora, bias;
  auto tensors = llama_tensors();
  tensors.push_back({"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", {8}});
  write_adapter(dora.path, config_text(), tensors);
  Failure f = open_failure(dora.path);
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "\"use_dora\""));

  auto with_bias = llama_tensors();
  with_bias.push_back({"base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", {8}});
  write_adapter(bias.path, config_text(), with_bias);
  f = open_failure(bias.path);
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "\"lora_bias\""));
}

TEST_CASE("adapter open: adapter_model.bin is UNSUPPORTED, a missing folder or file NOT_FOUND") {
  TempDir t;
  write_text(t.path / "adapter_config.json", config_text());
  write_text(t.path / "adapter_model.bin", "pickle");
  Failure f = open_failure(t.path);
  CHECK(f.code == PEFT_ERR_UNSUPPORTED);
  CHECK(contains(f.message, "adapter_model.bin"));
  CHECK(open_failure(t.path / "missing").code == PEFT_ERR_NOT_FOUND);
  TempDir empty;
  CHECK(open_failure(empty.path).code == PEFT_ERR_NOT_FOUND);
}

TEST_CASE("adapter open: full replacement tensors, trainable tokens and embeddings") {
  TempDir t;
  auto tensors = llama_tensors();
  tensors.push_back({"base_model.model.lm_head.weight", {32, 8}});
  tensors.push_back({"base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias", {8}});
  tensors.push_back({"base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", {3, 8}});
  write_adapter(t.path, config_text({{"trainable_token_indices", {1, 5, 7}}, {"bias", "all"}}), tensors);
  auto a = peft::Adapter::open(t.str(), {});
  const peft::AdapterModule* head = a->find_module("lm_head");
  REQUIRE(head);
  CHECK(head->kind == peft::LayerKind::full);
  const peft::AdapterModule* q = a->find_module("model.layers.0.self_attn.q_proj");
  REQUIRE(q);
  REQUIRE(q->find_suffix("base_layer.bias"));
  CHECK(q->find_suffix("base_layer.bias")->base_tensor == "model.layers.0.self_attn.q_proj.bias");
  const peft::AdapterModule* embed = a->find_module("model.embed_tokens");
  REQUIRE(embed);
  CHECK(embed->kind == peft::LayerKind::trainable_tokens);
  CHECK(embed->token_indices == std::vector<int64_t>{1, 5, 7});

  TempDir wrong;
  write_adapter(wrong.path, config_text({{"trainable_token_indices", {1, 5}}}), tensors);
  Failure f = open_failure(wrong.path);
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "\"trainable_token_indices\""));
}

TEST_CASE("adapter open: LoRA on embeddings") {
  TempDir t;
  write_adapter(t.path, config_text({{"target_modules", {"embed_tokens"}}}),
                {{"base_model.model.model.embed_tokens.lora_embedding_A", {2, 32}},
                 {"base_model.model.model.embed_tokens.lora_embedding_B", {8, 2}}});
  auto a = peft::Adapter::open(t.str(), {});
  REQUIRE(a->modules().size() == 1);
  CHECK(a->modules()[0].kind == peft::LayerKind::embedding);
  CHECK(a->modules()[0].rank == 2);
}

TEST_CASE("adapter open: a regex target_modules is a full match (re.fullmatch)") {
  TempDir ok, partial;
  write_adapter(ok.path, config_text({{"target_modules", R"(model\.layers\.\d+\.self_attn\.(q|v)_proj)"}}),
                llama_tensors());
  CHECK(peft::Adapter::open(ok.str(), {})->modules().size() == 4);
  write_adapter(partial.path, config_text({{"target_modules", R"(self_attn\.(q|v)_proj)"}}), llama_tensors());
  CHECK(open_failure(partial.path).code == PEFT_ERR_INVALID_CONFIG);
}

TEST_CASE("adapter open: layers_to_transform picks the first numbered segment (PEFT >= 0.20)") {
  TempDir t;
  // "model.layers.1.block_sparse_moe.experts.0.w1": the layer is 1, not the expert 0.
  write_adapter(t.path, config_text({{"target_modules", {"w1"}}, {"layers_to_transform", {1}}}),
                lora_pair("model.layers.1.block_sparse_moe.experts.0.w1", 2, 8, 16));
  CHECK(peft::Adapter::open(t.str(), {})->modules().size() == 1);
  TempDir other;
  write_adapter(other.path, config_text({{"target_modules", {"w1"}}, {"layers_to_transform", {0}}}),
                lora_pair("model.layers.1.block_sparse_moe.experts.0.w1", 2, 8, 16));
  CHECK(open_failure(other.path).code == PEFT_ERR_INVALID_CONFIG);
}
