// adapter_config.json: typed fields, PEFT's defaults, and one test per kind of bad config, each with
// its stable code and a message naming the field.
#include <doctest/doctest.h>

#include "peft/adapter/adapter_config.hpp"
#include "test_adapter_support.hpp"

using namespace adapter_test;
using nlohmann::json;

namespace {

Failure parse_failure(const std::string& text) {
  try {
    peft::LoraConfig::parse(text, "adapter_config.json");
  } catch (const peft::Error& e) {
    return {e.code(), e.what()};
  }
  return {};
}

void check_fails(const json& patch, int32_t code, const std::string& field) {
  Failure f = parse_failure(config_text(patch));
  CAPTURE(patch.dump());
  CHECK(f.code == code);
  CHECK(contains(f.message, "\"" + field + "\""));
}

}  // namespace

TEST_CASE("adapter config: typed fields and PEFT's defaults") {
  auto c = peft::LoraConfig::parse(R"({"peft_type": "LORA", "target_modules": ["q_proj"]})", "x");
  CHECK(c.r == 8);  // LoraConfig.r default
  CHECK_FALSE(c.r_given);
  CHECK(c.lora_alpha == 8);  // LoraConfig.lora_alpha default
  CHECK(c.bias == "none");
  CHECK(c.init_lora_weights.is_bool);
  CHECK(c.init_lora_weights.flag);
  CHECK(c.scaling(8, 8) == 1.0);
  c.use_rslora = true;
  CHECK(c.scaling(16, 8) == 2.0);

  auto d = peft::LoraConfig::parse(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 11.5, "target_modules": "all-LINEAR",
      "rank_pattern": {"z": 2, "a": 3}, "layers_pattern": null, "exclude_modules": ".*lm_head",
      "trainable_token_indices": {"embed_tokens": [1, 2]}, "init_lora_weights": "gaussian", "task_type": "CAUSAL_LM"})",
                                   "x");
  CHECK(d.lora_alpha == 11.5);
  CHECK(d.target_modules.kind == peft::ModuleSelector::Kind::all_linear);
  CHECK(d.exclude_modules.kind == peft::ModuleSelector::Kind::regex);
  REQUIRE(d.rank_pattern.size() == 2);
  CHECK(d.rank_pattern[0].first == "z");  // file order, not sorted: PEFT takes the first match in file order
  CHECK(d.trainable_token_indices.targets.at(0).second == std::vector<int64_t>{1, 2});
  CHECK(d.init_lora_weights.method == "gaussian");
}

TEST_CASE("adapter config: unknown fields survive, canonical JSON is PEFT's sorted indent-2 form") {
  auto c = peft::LoraConfig::parse(R"({"r": 4, "peft_type": "LORA", "future_field": {"b": 1, "a": [1.5, "é"]}})", "x");
  std::string canonical = c.canonical_json();
  // json.dumps({...}, indent=2, sort_keys=True) in CPython gives exactly this text.
  CHECK(canonical ==
        "{\n  \"future_field\": {\n    \"a\": [\n      1.5,\n      \"\\u00e9\"\n    ],\n    \"b\": 1\n  },\n"
        "  \"peft_type\": \"LORA\",\n  \"r\": 4\n}");
}

TEST_CASE("adapter config: invalid JSON is INVALID_CONFIG") {
  Failure f = parse_failure("{\"peft_type\": \"LORA\",");
  CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
  CHECK(contains(f.message, "invalid JSON"));
}

TEST_CASE("adapter config: missing peft_type is INVALID_CONFIG") {
  check_fails({{"peft_type", nullptr}}, PEFT_ERR_INVALID_CONFIG, "peft_type");
}

TEST_CASE("adapter config: another PEFT method is UNSUPPORTED, an unknown one INVALID_CONFIG") {
  check_fails({{"peft_type", "ROAD"}}, PEFT_ERR_UNSUPPORTED, "peft_type");
  check_fails({{"peft_type", "PROMPT_TUNING"}}, PEFT_ERR_UNSUPPORTED, "peft_type");
  CHECK(contains(parse_failure(config_text({{"peft_type", "PROMPT_TUNING"}})).message, "virtual tokens"));
  CHECK(contains(parse_failure(config_text({{"peft_type", "XLORA"}})).message, "per-token routing"));
  check_fails({{"peft_type", "NOT_A_METHOD"}}, PEFT_ERR_INVALID_CONFIG, "peft_type");
}

TEST_CASE("adapter config: fields of the wrong type are INVALID_CONFIG naming the field") {
  check_fails({{"r", "8"}}, PEFT_ERR_INVALID_CONFIG, "r");
  check_fails({{"r", 8.5}}, PEFT_ERR_INVALID_CONFIG, "r");
  check_fails({{"r", 0}}, PEFT_ERR_INVALID_CONFIG, "r");
  check_fails({{"lora_alpha", "16"}}, PEFT_ERR_INVALID_CONFIG, "lora_alpha");
  check_fails({{"target_modules", 3}}, PEFT_ERR_INVALID_CONFIG, "target_modules");
  check_fails({{"target_modules", {"q_proj", 1}}}, PEFT_ERR_INVALID_CONFIG, "target_modules");
  check_fails({{"use_rslora", "yes"}}, PEFT_ERR_INVALID_CONFIG, "use_rslora");
  check_fails({{"modules_to_save", "classifier"}}, PEFT_ERR_INVALID_CONFIG, "modules_to_save");
  check_fails({{"layers_to_transform", {0, "1"}}}, PEFT_ERR_INVALID_CONFIG, "layers_to_transform");
  check_fails({{"rank_pattern", {{"q_proj", "4"}}}}, PEFT_ERR_INVALID_CONFIG, "rank_pattern");
  check_fails({{"alpha_pattern", {1, 2}}}, PEFT_ERR_INVALID_CONFIG, "alpha_pattern");
  check_fails({{"init_lora_weights", 1}}, PEFT_ERR_INVALID_CONFIG, "init_lora_weights");
  check_fails({{"trainable_token_indices", "1"}}, PEFT_ERR_INVALID_CONFIG, "trainable_token_indices");
  check_fails({{"loftq_config", {1, 2}}}, PEFT_ERR_INVALID_CONFIG, "loftq_config");
  check_fails({{"megatron_core", 3}}, PEFT_ERR_INVALID_CONFIG, "megatron_core");
  check_fails({{"qalora_group_size", "16"}}, PEFT_ERR_INVALID_CONFIG, "qalora_group_size");
}

TEST_CASE("adapter config: integers beyond 64 bits are refused as written, never wrapped around") {
  // Python's ints are unbounded; nlohmann reads 2^63 .. 2^64 - 1 as unsigned, which a plain
  // get<int64_t>() would turn negative.
  const char* huge = "18446744073709551615";
  for (const std::string& patch :
       {std::string(R"("layers_to_transform": [0, )") + huge + "]",
        std::string(R"("layers_to_transform": )") + huge,
        std::string(R"("trainable_token_indices": [)") + huge + "]",
        std::string(R"("rank_pattern": {"q_proj": )") + huge + "}"}) {
    const std::string text = R"({"peft_type": "LORA", "target_modules": ["q_proj"], )" + patch + "}";
    Failure f = parse_failure(text);
    CAPTURE(text);
    CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(f.message, std::string("holds ") + huge + ", more than the largest integer"));
  }
  // The largest one that fits is read as it is.
  auto c = peft::LoraConfig::parse(
      R"({"peft_type": "LORA", "target_modules": ["q_proj"], "layers_to_transform": [9223372036854775807]})", "x");
  REQUIRE(c.layers_to_transform);
  CHECK(c.layers_to_transform->at(0) == INT64_MAX);
  check_fails({{"rank_pattern", {{"q_proj", 0}}}}, PEFT_ERR_INVALID_CONFIG, "rank_pattern");
}

TEST_CASE("adapter config: values PEFT rejects are INVALID_CONFIG") {
  check_fails({{"bias", "some"}}, PEFT_ERR_INVALID_CONFIG, "bias");
  check_fails({{"task_type", "CLASSIFY"}}, PEFT_ERR_INVALID_CONFIG, "task_type");
  check_fails({{"init_lora_weights", "xavier"}}, PEFT_ERR_INVALID_CONFIG, "init_lora_weights");
  check_fails({{"layers_pattern", "layers"}}, PEFT_ERR_INVALID_CONFIG, "layers_pattern");
  check_fails({{"target_modules", ".*q_proj"}, {"layers_to_transform", {0}}}, PEFT_ERR_INVALID_CONFIG,
              "layers_to_transform");
  check_fails({{"lora_bias", true}, {"use_dora", true}}, PEFT_ERR_INVALID_CONFIG, "lora_bias");
  check_fails({{"lora_bias", true}, {"init_lora_weights", "gaussian"}}, PEFT_ERR_INVALID_CONFIG, "lora_bias");
}

TEST_CASE("adapter config: initialisations that rewrite the base weights are UNSUPPORTED") {
  for (const char* init : {"pissa", "pissa_niter_4", "olora", "corda", "loftq", "lora_ga"})
    check_fails({{"init_lora_weights", init}, {"loftq_config", {{"loftq_bits", 4}}}}, PEFT_ERR_UNSUPPORTED,
                "init_lora_weights");
  for (const char* init : {"gaussian", "eva", "orthogonal", "mica"})
    CHECK(parse_failure(config_text({{"init_lora_weights", init}})).code == PEFT_OK);
}

TEST_CASE("adapter config: LoRA variants with another merge are UNSUPPORTED naming the field") {
  const std::vector<std::pair<std::string, json>> variants = {
      {"use_qalora", true},
      {"use_bdlora", json::object()},
      {"arrow_config", json::object()},
      {"monteclora_config", json::object()},
      {"velora_config", json::object()},
      {"kasa_config", json::object()},
      {"layer_replication", {{0, 2}}},
      {"megatron_config", json::object()},
  };
  for (const auto& [field, value] : variants) check_fails({{field, value}}, PEFT_ERR_UNSUPPORTED, field);
  // LoRA on stacked expert parameters is read, but not with what PEFT's ParamWrapper refuses.
  const json experts = {"mlp.experts.gate_up_proj"};
  CHECK(parse_failure(config_text({{"target_parameters", experts}})).code == PEFT_OK);
  check_fails({{"target_parameters", experts}, {"use_dora", true}}, PEFT_ERR_UNSUPPORTED, "use_dora");
  check_fails({{"target_parameters", experts}, {"lora_bias", true}}, PEFT_ERR_UNSUPPORTED, "lora_bias");
  check_fails({{"target_parameters", experts}, {"lora_dropout", 0.1}}, PEFT_ERR_UNSUPPORTED, "lora_dropout");
  check_fails({{"target_parameters", {"x."}}}, PEFT_ERR_INVALID_CONFIG, "target_parameters");
  // Activated LoRA is read (its merges are refused, refuse_activated_lora), as a LoRA variant only.
  const auto alora = peft::LoraConfig::parse(config_text({{"alora_invocation_tokens", {7, 0, 2147483647}}}), "x");
  CHECK(alora.alora_invocation_tokens == std::vector<uint32_t>{7, 0, 2147483647u});
  for (const json& bad : {json::array(), json{1, -1}, json{2147483648LL}, json{1.5}, json("12"), json{{"a", 1}}})
    check_fails({{"alora_invocation_tokens", bad}}, PEFT_ERR_INVALID_CONFIG, "alora_invocation_tokens");
  check_fails({{"alora_invocation_tokens", {1}}, {"use_dora", true}}, PEFT_ERR_UNSUPPORTED, "alora_invocation_tokens");
  check_fails({{"alora_invocation_tokens", {1}}, {"target_parameters", experts}}, PEFT_ERR_UNSUPPORTED,
              "alora_invocation_tokens");
  check_fails({{"alora_invocation_tokens", {1}}, {"peft_type", "LOHA"}}, PEFT_ERR_UNSUPPORTED, "alora_invocation_tokens");
  try {
    peft::refuse_activated_lora("\"a\"", alora.alora_invocation_tokens, "a merged weight");
    FAIL("an activated LoRA was not refused");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_UNSUPPORTED);
    CHECK(contains(e.what(), "[7, 0, 2147483647]"));
    CHECK(contains(e.what(), "a merged weight"));
  }
  peft::refuse_activated_lora("\"a\"", {}, "a merged weight");  // not an aLoRA: nothing
  // Their "off" values are fine.
  CHECK(parse_failure(config_text({{"use_qalora", false}, {"layer_replication", nullptr},
                                   {"target_parameters", json::array()}, {"use_bdlora", nullptr},
                                   {"alora_invocation_tokens", nullptr}}))
            .code == PEFT_OK);
}

TEST_CASE("adapter config: a bad regex is INVALID_CONFIG naming the field") {
  check_fails({{"target_modules", ".*(q_proj"}}, PEFT_ERR_INVALID_CONFIG, "target_modules");
}

TEST_CASE("adapter config: LoHa, LoKr, AdaLoRA and IA3 fields read in LoRA's names") {
  auto loha = peft::LoraConfig::parse(R"({"peft_type": "LOHA", "r": 4, "alpha": 6, "rank_pattern": {"q_proj": 2}})", "x");
  CHECK(loha.method == peft::PeftMethod::loha);
  CHECK(loha.r == 4);
  CHECK(loha.lora_alpha == 6);
  CHECK(loha.rank_pattern.size() == 1);
  auto ada = peft::LoraConfig::parse(
      R"({"peft_type": "ADALORA", "r": 8, "init_r": 4, "lora_alpha": 16, "rank_pattern": {"m.lora_E": [true, false]}})",
      "x");
  CHECK(ada.method == peft::PeftMethod::adalora);
  CHECK(ada.r == 4);
  REQUIRE(ada.method_fields.adalora_rank_masks.size() == 1);
  CHECK(ada.method_fields.adalora_rank_masks[0].second == std::vector<bool>{true, false});
  CHECK(ada.rank_pattern.empty());
  auto ia3 = peft::LoraConfig::parse(R"({"peft_type": "IA3", "feedforward_modules": ["down_proj"]})", "x");
  CHECK(ia3.method == peft::PeftMethod::ia3);
  CHECK(ia3.method_fields.feedforward_modules.names == std::vector<std::string>{"down_proj"});
  CHECK(loha.canonical_json().find("\"alpha\": 6") != std::string::npos);  // the document is kept
  check_fails({{"peft_type", "ADALORA"}, {"rank_pattern", {{"m", {1, 0}}}}}, PEFT_ERR_INVALID_CONFIG, "rank_pattern");
}

TEST_CASE("adapter config: OFT, BOFT and HRA read their own fields (r 0, *_only bias, init_weights)") {
  auto c = peft::LoraConfig::parse(R"({"peft_type": "OFT", "r": 0, "oft_block_size": 4, "coft": true, "eps": 0.5,
      "block_share": true, "use_cayley_neumann": false, "num_cayley_neumann_terms": 7, "bias": "oft_only",
      "init_weights": false, "target_modules": ["q_proj"]})", "x");
  CHECK(c.method == peft::PeftMethod::oft);
  CHECK(c.method_fields.settings.oft.coft);
  CHECK(c.method_fields.settings.oft.eps == 0.5);
  CHECK(c.method_fields.settings.oft.block_share);
  CHECK_FALSE(c.method_fields.settings.oft.use_cayley_neumann);
  CHECK(c.method_fields.settings.oft.num_cayley_neumann_terms == 7);
  CHECK(c.bias == "lora_only");
  auto h = peft::LoraConfig::parse(R"({"peft_type": "HRA", "r": 6, "apply_GS": true, "target_modules": ["q_proj"]})", "x");
  CHECK(h.method == peft::PeftMethod::hra);
  CHECK(h.r == 6);
  CHECK(h.method_fields.settings.hra_apply_gs);
  auto b = peft::LoraConfig::parse(R"({"peft_type": "BOFT", "boft_block_size": 4, "bias": "boft_only"})", "x");
  CHECK(b.method == peft::PeftMethod::boft);
  CHECK(b.bias == "lora_only");
  check_fails({{"peft_type", "OFT"}, {"num_cayley_neumann_terms", 0}}, PEFT_ERR_INVALID_CONFIG, "num_cayley_neumann_terms");
  check_fails({{"peft_type", "OFT"}, {"coft", "yes"}}, PEFT_ERR_INVALID_CONFIG, "coft");
  check_fails({{"peft_type", "HRA"}, {"apply_GS", 1}}, PEFT_ERR_INVALID_CONFIG, "apply_GS");
}

TEST_CASE("adapter config: LN_TUNING and TRAINABLE_TOKENS are replacement methods") {
  auto ln = peft::LoraConfig::parse(R"({"peft_type": "LN_TUNING", "target_modules": ["input_layernorm", "norm"]})", "x");
  CHECK(ln.method == peft::PeftMethod::ln_tuning);
  CHECK(ln.target_modules.names == std::vector<std::string>{"input_layernorm", "norm"});
  CHECK(std::string(peft::peft_method_name(ln.method)) == "LN_TUNING");

  auto tt = peft::LoraConfig::parse(
      R"({"peft_type": "TRAINABLE_TOKENS", "target_modules": "model.embed_tokens", "token_indices": [1, 3]})", "x");
  CHECK(tt.method == peft::PeftMethod::trainable_tokens);
  const std::vector<int64_t>* rows = tt.trainable_token_indices.for_module("model.embed_tokens");
  REQUIRE(rows);
  CHECK(*rows == std::vector<int64_t>{1, 3});
  CHECK_FALSE(tt.trainable_token_indices.for_module("lm_head"));
  auto by_default = peft::LoraConfig::parse(R"({"peft_type": "TRAINABLE_TOKENS", "token_indices": [0]})", "x");
  CHECK(by_default.trainable_token_indices.for_module("model.embed_tokens"));  // PEFT's default "embed_tokens"
  check_fails({{"peft_type", "TRAINABLE_TOKENS"}}, PEFT_ERR_INVALID_CONFIG, "token_indices");
  check_fails({{"peft_type", "TRAINABLE_TOKENS"}, {"token_indices", "x"}}, PEFT_ERR_INVALID_CONFIG, "token_indices");
}
