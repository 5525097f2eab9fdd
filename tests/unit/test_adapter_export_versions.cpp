// Adapter export for an older PEFT release: only the fields it knows, refusals where leaving a
// field out (or the release's other reading of a field) would change the adapter.
#include <doctest/doctest.h>

#include <set>

#include "peft/export/adapter_export.hpp"
#include "test_adapter_export_support.hpp"

using namespace export_test;

namespace {

// LoraConfig + base fields per release (docs/peft-semantics.md, "Fields per PEFT release"; extracted
// from each tag).
const std::set<std::string> kFields013 = {
    "task_type", "peft_type", "auto_mapping", "base_model_name_or_path", "revision", "inference_mode",
    "r", "target_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out", "bias", "use_rslora",
    "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern", "rank_pattern",
    "alpha_pattern", "megatron_config", "megatron_core", "loftq_config", "use_dora", "layer_replication"};

std::set<std::string> fields_since(int minor) {
  std::set<std::string> f = kFields013;
  if (minor >= 14) f.insert({"exclude_modules", "eva_config", "lora_bias"});
  if (minor >= 15) f.insert({"trainable_token_indices", "corda_config"});
  if (minor >= 16) f.insert({"use_qalora", "qalora_group_size"});
  if (minor >= 17) f.insert("target_parameters");
  if (minor >= 18) f.insert({"alora_invocation_tokens", "arrow_config", "ensure_weight_tying", "peft_version"});
  if (minor >= 19) f.insert({"lora_ga_config", "use_bdlora"});
  if (minor >= 20) f.insert({"velora_config", "monteclora_config"});
  if (minor >= 21) f.insert("kasa_config");
  return f;
}

peft::ExportOptions for_version(const std::string& v) {
  peft::ExportOptions o;
  o.peft_version = peft::parse_peft_version(v);
  return o;
}

std::set<std::string> keys_of(const nlohmann::json& j) {
  std::set<std::string> out;
  for (const auto& [k, v] : j.items()) out.insert(k);
  return out;
}

}  // namespace

TEST_CASE("adapter export: PEFT versions parse as X.Y or X.Y.Z from 0.13 on") {
  CHECK(peft::parse_peft_version("0.13").minor == 13);
  CHECK(peft::parse_peft_version("0.17.1").minor == 17);
  CHECK(peft::parse_peft_version("1.0").major == 1);
  for (const char* bad : {"", "0", "0.x", "0.13.", ".13", "0.13.1.2", "-0.13", "0.13a", "v0.13"}) {
    const std::string text = bad;
    CAPTURE(text);
    CHECK(code_of([&] { peft::parse_peft_version(bad); }) == PEFT_ERR_INVALID_ARGUMENT);
  }
  CHECK(code_of([] { peft::parse_peft_version("0.12"); }) == PEFT_ERR_UNSUPPORTED);
  CHECK(error_of([] { peft::parse_peft_version("0.9.0"); }).find("0.13") != std::string::npos);
}

TEST_CASE("adapter export: for each release, only the fields it knows") {
  ScratchDir scratch;
  auto adapter = open_adapter(fixture_adapter("llama_lora"));
  const nlohmann::json source = read_json(fixture_adapter("llama_lora") + "/adapter_config.json");
  for (int minor = 13; minor <= 22; ++minor) {
    CAPTURE(minor);
    const std::string out = scratch.path("v" + std::to_string(minor));
    peft::export_adapter(*adapter, out, for_version("0." + std::to_string(minor)));
    const nlohmann::json written = read_json(out + "/adapter_config.json");
    std::set<std::string> expected;
    for (const std::string& k : keys_of(source))
      if (fields_since(std::min(minor, 21)).count(k)) expected.insert(k);
    CHECK(keys_of(written) == expected);
    for (const auto& [k, v] : written.items()) CHECK(v == source[k]);
    // The tensors do not depend on the version.
    CHECK(read_file(out + "/adapter_model.safetensors") ==
          read_file(fixture_adapter("llama_lora") + "/adapter_model.safetensors"));
  }
  // 0.21 is the fixtures' own release: the same bytes.
  CHECK(read_file(scratch.path("v21") + "/adapter_config.json") ==
        read_file(fixture_adapter("llama_lora") + "/adapter_config.json"));
}

TEST_CASE("adapter export: a field the release lacks is refused when it matters") {
  ScratchDir scratch;
  const struct {
    const char* adapter;
    const char* version;
    const char* field;  // nullptr: the export succeeds
  } cases[] = {
      {"qwen2_lora_bias", "0.13", "lora_bias"},        {"qwen2_lora_bias", "0.14", nullptr},
      {"llama_exclude_modules", "0.13", "exclude_modules"}, {"llama_exclude_modules", "0.14", nullptr},
      {"llama_trainable_tokens", "0.14", "trainable_token_indices"},
      {"llama_trainable_tokens", "0.15", nullptr},    {"llama_dora", "0.13", nullptr},
      {"llama_rslora", "0.13", nullptr},              {"llama_embedding", "0.13", nullptr},
      {"gpt2_lora", "0.13", nullptr},                 {"bert_seqcls_lora", "0.13", nullptr},
      {"llama_layers_to_transform", "0.13", nullptr}, {"llama_regex", "0.13", nullptr},
      // keys that name a full module path match nothing before 0.15 (".*\.key$" needs a dot before)
      // (the first module at fault is layer 0's v_proj, whose alpha key starts with "^model.")
      {"llama_rank_alpha_pattern", "0.13", "alpha_pattern"},
      {"llama_rank_alpha_pattern", "0.14", "alpha_pattern"},
      {"llama_rank_alpha_pattern", "0.15", nullptr},
  };
  int k = 0;
  for (const auto& c : cases) {
    const std::string name = std::string(c.adapter) + " for " + c.version;
    CAPTURE(name);
    auto adapter = open_adapter(fixture_adapter(c.adapter));
    const std::string out = scratch.path(std::to_string(k++));
    const std::string message = error_of([&] { peft::export_adapter(*adapter, out, for_version(c.version)); });
    if (c.field == nullptr) {
      CHECK(message.empty());
      const nlohmann::json written = read_json(out + "/adapter_config.json");
      for (const std::string& key : keys_of(written))
        CHECK(fields_since(peft::parse_peft_version(c.version).minor).count(key) == 1);
      CHECK(open_adapter(out)->modules().size() == adapter->modules().size());
    } else {
      CHECK(code_of([&] { peft::export_adapter(*adapter, out, for_version(c.version)); }) == PEFT_ERR_UNSUPPORTED);
      CAPTURE(message);
      CHECK(message.find(std::string("\"") + c.field + "\"") != std::string::npos);
      CHECK_FALSE(fs::exists(out));
    }
  }
}

TEST_CASE("adapter export: inert fields the release lacks are dropped") {
  ScratchDir scratch;
  const std::string src = scratch.path("src");
  write_adapter(src,
                config_text({{"eva_config", {{"rho", 2.0}}},
                             {"corda_config", nullptr},
                             {"qalora_group_size", 32},
                             {"peft_version", "0.21.2"},
                             {"use_qalora", false},
                             {"ensure_weight_tying", false},
                             {"exclude_modules", nlohmann::ordered_json::array()},
                             {"target_parameters", nlohmann::ordered_json::array()},
                             {"some_future_field", {{"x", 1}}},
                             {"init_lora_weights", "eva"}}),
                lora_pair("model.layers.0.self_attn.q_proj", 4, 8, 8, 1));
  auto adapter = open_adapter(src);
  peft::export_adapter(*adapter, scratch.path("o13"), for_version("0.13"));
  const nlohmann::json written = read_json(scratch.path("o13") + "/adapter_config.json");
  CHECK(keys_of(written) == std::set<std::string>{"peft_type", "r", "lora_alpha", "task_type", "target_modules",
                                                  "inference_mode", "init_lora_weights"});
  CHECK(written["init_lora_weights"] == true);  // "eva" is unknown to 0.13
  // Without a version every field stays, the unknown one included.
  peft::export_adapter(*adapter, scratch.path("now"), {});
  CHECK(read_json(scratch.path("now") + "/adapter_config.json").contains("some_future_field"));

  // ensure_weight_tying=true matters: refused before 0.18.
  const std::string tying = scratch.path("tying");
  write_adapter(tying, config_text({{"ensure_weight_tying", true}}), lora_pair("model.layers.0.self_attn.q_proj", 4, 8, 8, 1));
  CHECK(error_of([&] { peft::export_adapter(*open_adapter(tying), scratch.path("t17"), for_version("0.17")); })
            .find("\"ensure_weight_tying\"") != std::string::npos);
  CHECK(error_of([&] { peft::export_adapter(*open_adapter(tying), scratch.path("t18"), for_version("0.18")); }).empty());
}

TEST_CASE("adapter export: layers_to_transform is read from the last numbered segment before 0.20") {
  ScratchDir scratch;
  const std::string src = scratch.path("moe");
  // Layer 1's expert 0: PEFT >= 0.20 reads layer 1, PEFT <= 0.19 reads 0 (the last number).
  const std::string module = "model.layers.1.block_sparse_moe.experts.0.w1";
  write_adapter(src, config_text({{"target_modules", {"w1"}}, {"layers_to_transform", {1}}}),
                lora_pair(module, 4, 8, 8, 1));
  auto adapter = open_adapter(src);
  CHECK(error_of([&] { peft::export_adapter(*adapter, scratch.path("o20"), for_version("0.20")); }).empty());
  const std::string message = error_of([&] { peft::export_adapter(*adapter, scratch.path("o19"), for_version("0.19")); });
  CHECK(message.find("layers_to_transform") != std::string::npos);
  CHECK(message.find(module) != std::string::npos);
  // With a layers_pattern, the old greedy match still finds the layer here.
  const std::string with_pattern = scratch.path("pattern");
  write_adapter(with_pattern,
                config_text({{"target_modules", {"w1"}}, {"layers_to_transform", {1}}, {"layers_pattern", "layers"}}),
                lora_pair(module, 4, 8, 8, 1));
  CHECK(error_of([&] { peft::export_adapter(*open_adapter(with_pattern), scratch.path("p19"), for_version("0.19")); })
            .empty());
}

TEST_CASE("adapter export: rank_pattern keys that only match in file order are refused") {
  ScratchDir scratch;
  const std::string src = scratch.path("src");
  // PEFT takes the first matching key in file order: "q_proj" (rank 2) for layer 0's q_proj. The
  // written file is sorted, which would put "layers.0.self_attn.q_proj" (rank 6) first.
  nlohmann::ordered_json rank_pattern = nlohmann::ordered_json::object();
  rank_pattern["q_proj"] = 2;
  rank_pattern["layers.0.self_attn.q_proj"] = 6;
  write_adapter(src, config_text({{"rank_pattern", rank_pattern}, {"target_modules", {"q_proj"}}}),
                lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8, 1));
  auto adapter = open_adapter(src);
  REQUIRE(adapter->modules().at(0).rank == 2);
  const std::string message = error_of([&] { peft::export_adapter(*adapter, scratch.path("out"), {}); });
  CHECK(message.find("\"rank_pattern\"") != std::string::npos);
  CHECK(code_of([&] { peft::export_adapter(*adapter, scratch.path("out"), {}); }) == PEFT_ERR_UNSUPPORTED);
  CHECK_FALSE(fs::exists(scratch.path("out")));
}

TEST_CASE("adapter export: PEFT 0.13 looks rank and alpha up under one combined key") {
  ScratchDir scratch;
  const std::string src = scratch.path("src");
  // 0.13: the first key of rank_pattern + alpha_pattern matching "...q_proj" is "q_proj" from
  // rank_pattern, so alpha_pattern["self_attn.q_proj"] is never consulted: alpha falls back to 8.
  write_adapter(src,
                config_text({{"rank_pattern", {{"q_proj", 4}}},
                             {"alpha_pattern", {{"self_attn.q_proj", 16}}},
                             {"target_modules", {"q_proj"}}}),
                lora_pair("model.layers.0.self_attn.q_proj", 4, 8, 8, 1));
  auto adapter = open_adapter(src);
  REQUIRE(adapter->modules().at(0).alpha == 16);
  CHECK(error_of([&] { peft::export_adapter(*adapter, scratch.path("o14"), for_version("0.14")); }).empty());
  const std::string message = error_of([&] { peft::export_adapter(*adapter, scratch.path("o13"), for_version("0.13")); });
  CHECK(message.find("\"alpha_pattern\"") != std::string::npos);
}
