// Translation tables: every built-in table loads and is invertible (a property test over every rule
// with several placeholder values and every role), user tables from strings, errors that list every
// unresolved key, and malformed tables rejected with the rule at fault named.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/translator.hpp"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

peft::Error table_error(const std::string& json) {
  try {
    peft::ArchTable::parse(json, "test-table");
  } catch (const peft::Error& e) {
    return e;
  }
  FAIL("the table was accepted: " << json);
  return peft::Error(0, "");
}

const char* kFamilies[] = {"bert",  "bloom",   "distilbert", "falcon", "gemma", "gpt2", "gpt_neox", "llama",
                           "mistral", "mixtral", "phi3",       "qwen2",  "roberta", "t5", "vit"};

}  // namespace

TEST_CASE("translate tables: every required family is built in and loads") {
  auto families = peft::builtin_families();
  for (const char* family : kFamilies) {
    CAPTURE(family);
    CHECK(std::find(families.begin(), families.end(), family) != families.end());
    auto table = peft::builtin_arch_table(family);
    CHECK(table->family() == family);
    CHECK_FALSE(table->modules().empty());
  }
}

TEST_CASE("translate tables: HF -> native -> HF is the identity for every rule, value and role") {
  for (const std::string& family : peft::builtin_families()) {
    CAPTURE(family);
    peft::Translator tr = peft::Translator::for_family(family);
    for (const peft::ModuleRule& rule : tr.table().modules()) {
      for (const char* value : {"0", "7", "10", "031", "123456789012345678901234567890"}) {
        peft::NameTemplate::Captures captures;
        for (const std::string& name : rule.hf.placeholder_names()) captures.emplace_back(name, value);
        std::string module = rule.hf.fill(captures);
        for (const peft::RoleRule& role : tr.table().roles()) {
          for (bool prefix : {false, true}) {
            std::string key = (prefix ? "base_model.model." : "") + module + "." + role.hf;
            CAPTURE(key);
            std::string native = tr.to_native(key);
            CHECK(native == rule.native.fill(captures) + "/" + role.native);
            CHECK(tr.to_hf(native, prefix) == key);
          }
        }
      }
    }
  }
}

TEST_CASE("translate tables: the example of the documentation") {
  peft::Translator tr = peft::Translator::for_family("llama");
  CHECK(tr.to_native("model.layers.4.self_attn.q_proj.lora_A.weight") == "transformer/layer_4/attention/query/lora_a");
  CHECK(tr.to_native("base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight") ==
        "transformer/layer_4/attention/query/lora_a");
  CHECK(tr.to_hf("transformer/layer_4/attention/query/lora_a", false) ==
        "model.layers.4.self_attn.q_proj.lora_A.weight");
  CHECK(tr.to_hf("transformer/layer_4/attention/query/lora_a", true) ==
        "base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight");
}

TEST_CASE("translate tables: a batch with unresolved keys fails listing every one") {
  peft::Translator tr = peft::Translator::for_family("llama");
  std::vector<std::string> keys = {"model.layers.0.self_attn.q_proj.lora_A.weight",
                                   "model.layers.0.self_attn.qkv_proj.lora_A.weight",
                                   "model.layers.0.self_attn.q_proj.lora_Z.weight", "vision_tower.patch.weight"};
  try {
    tr.to_native(keys);
    FAIL("no error");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_UNRESOLVED_KEY);
    std::string m = e.what();
    CHECK(contains(m, "3 keys"));
    CHECK(contains(m, "qkv_proj"));
    CHECK(contains(m, "lora_Z"));
    CHECK(contains(m, "vision_tower.patch.weight"));
    CHECK_FALSE(contains(m, "\"model.layers.0.self_attn.q_proj.lora_A.weight\""));
  }
  CHECK_THROWS_AS(tr.to_hf("transformer/layer_0/attention/nope/lora_a", false), peft::Error);
  CHECK_THROWS_AS(tr.to_hf("lora_a", false), peft::Error);
  // An adapter name left in a key is not a role: not translated (never passed through).
  CHECK_THROWS_AS(tr.to_native("model.layers.0.self_attn.q_proj.lora_A.default.weight"), peft::Error);
}

TEST_CASE("translate tables: a user table given as a JSON string") {
  peft::Translator tr = peft::Translator::from_json(R"({
    "family": "mine",
    "modules": [
      {"hf": "blocks.{n}.attn.{head}", "native": "b{n}/h{head}", "kind": "linear"},
      {"hf": "embed", "native": "emb", "kind": "embedding"}
    ],
    "roles": [{"hf": "lora_A.weight", "native": "A"}, {"hf": "weight", "native": "W"}]
  })");
  CHECK(tr.table().family() == "mine");
  CHECK(tr.to_native("blocks.3.attn.12.lora_A.weight") == "b3/h12/A");
  CHECK(tr.to_hf("b3/h12/A", true) == "base_model.model.blocks.3.attn.12.lora_A.weight");
  CHECK(tr.to_native("embed.weight") == "emb/W");
  CHECK_THROWS_AS(tr.to_native("embed.bias"), peft::Error);  // "bias" is not a role of this table
}

TEST_CASE("translate tables: malformed or non-invertible tables are INVALID_CONFIG naming the rule") {
  struct Bad {
    const char* json;
    const char* says;
  };
  const Bad bad[] = {
      {"{", "invalid JSON"},
      {R"({"modules": []})", "\"family\""},
      {R"({"family": "x"})", "\"modules\""},
      {R"({"family": "x", "modules": [], "extra": 1})", "unknown field \"extra\""},
      {R"({"family": "x", "modules": [{"hf": "a.{i}", "native": "a"}]})", "same placeholders"},
      {R"({"family": "x", "modules": [{"hf": "a.{i}{j}", "native": "a/{i}/{j}"}]})", "two placeholders"},
      {R"({"family": "x", "modules": [{"hf": "a.{i}0", "native": "a/{i}"}]})", "digit right after"},
      {R"({"family": "x", "modules": [{"hf": "a.{1x}", "native": "a/{1x}"}]})", "bad placeholder"},
      {R"({"family": "x", "modules": [{"hf": "a..b", "native": "a/b"}]})", "empty segment"},
      {R"({"family": "x", "modules": [{"hf": "a.b", "native": "a/b", "kind": "dense"}]})", "\"kind\""},
      {R"({"family": "x", "modules": [{"hf": "a.{i}", "native": "a/{i}"}, {"hf": "a.1", "native": "one"}]})",
       "modules[1] is shadowed by modules[0]"},
      {R"({"family": "x", "modules": [{"hf": "a", "native": "n"}, {"hf": "b", "native": "n"}]})",
       "modules[1] is shadowed by modules[0]"},
      {R"({"family": "x", "modules": [], "extra_roles": [{"hf": "weight", "native": "w2"}]})", "listed twice"},
      {R"({"family": "x", "modules": [], "roles": [{"hf": "w", "native": "a/b"}]})", "one segment"},
      {R"({"family": "x", "version": 2, "modules": []})", "\"version\""},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.json);
    peft::Error e = table_error(b.json);
    CHECK(e.code() == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(e.what(), b.says));
  }
}

TEST_CASE("translate tables: family detection from config.json and from the model name") {
  nlohmann::json config = {{"model_type", "gemma3_text"}};
  CHECK(peft::detect_family(&config, std::nullopt)->family == "gemma");
  nlohmann::json by_arch = {{"architectures", {"GPT2ForSequenceClassification"}}};
  CHECK(peft::detect_family(&by_arch, std::nullopt)->family == "gpt2");
  const std::pair<const char*, const char*> names[] = {
      {"distilbert-base-uncased", "distilbert"}, {"bert-base-uncased", "bert"},
      {"FacebookAI/roberta-base", "roberta"},     {"distilbert/distilgpt2", "gpt2"},
      {"google/gemma-3-270m-it", "gemma"},        {"Qwen/Qwen2.5-0.5B-Instruct", "qwen2"},
      {"HuggingFaceTB/SmolLM2-135M-Instruct", "llama"}, {"Maykeye/TinyLLama-v0", "llama"},
      {"bigscience/bloom-560m", "bloom"},        {"google/vit-base-patch16-224", "vit"},
      {"EleutherAI/pythia-70m", "gpt_neox"},     {"google/flan-t5-small", "t5"},
      {"microsoft/Phi-3-mini-4k-instruct", "phi3"}, {"mistralai/Mixtral-8x7B-v0.1", "mixtral"},
      {"tiiuae/falcon-7b", "falcon"},            {"mistralai/Mistral-7B-v0.1", "mistral"},
  };
  for (const auto& entry : names) {
    const auto& name = entry.first;
    const auto& family = entry.second;
    CAPTURE(name);
    auto guess = peft::detect_family(nullptr, std::string(name));
    REQUIRE(guess);
    CHECK(guess->family == family);
  }
  CHECK_FALSE(peft::detect_family(nullptr, std::string("my-own-model")));
}
