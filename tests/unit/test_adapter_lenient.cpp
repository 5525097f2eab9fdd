// Lenient loading (Adapter::Options::lenient): what PEFT ignores is dropped and listed as a warning;
// what PEFT refuses or would leave random stays an error. The comparison with PEFT itself is
// tests/interop/test_adapter_lenient.py.
#include <doctest/doctest.h>

#include <algorithm>

#include "peft/adapter/adapter.hpp"
#include "test_adapter_support.hpp"

using namespace adapter_test;
using nlohmann::json;

namespace {

const std::string kP = "base_model.model.";

void write_base(const fs::path& dir) {
  std::vector<TensorSpec> tensors = {{"model.embed_tokens.weight", {32, 8}}, {"lm_head.weight", {32, 8}}};
  for (int layer = 0; layer < 2; ++layer) {
    std::string p = "model.layers." + std::to_string(layer) + ".";
    tensors.push_back({p + "self_attn.q_proj.weight", {8, 8}});
    tensors.push_back({p + "self_attn.v_proj.weight", {4, 8}});
    tensors.push_back({p + "self_attn.v_proj.bias", {4}});
    tensors.push_back({p + "input_layernorm.weight", {8}});
  }
  write_text(dir / "config.json", json{{"model_type", "llama"}}.dump());
  write_safetensors(dir / "model.safetensors", tensors);
}

peft::Adapter::Options lenient(const fs::path* base = nullptr) {
  peft::Adapter::Options options;
  options.lenient = true;
  if (base) options.base_dir = base->string();
  return options;
}

std::vector<std::string> names(const peft::Adapter& a) {
  std::vector<std::string> out;
  for (const auto& m : a.modules()) out.push_back(m.name);
  return out;
}

// The kind and key of every warning: "unexpected <key>" / "missing <key>".
std::vector<std::string> kinds_and_keys(const peft::Adapter& a) {
  std::vector<std::string> out;
  for (const std::string& w : a.warnings()) {
    auto colon = w.find("\": ");
    REQUIRE(colon != std::string::npos);
    std::string head = w.substr(0, colon);  // unexpected key "<key>
    auto quote = head.find(" key \"");
    REQUIRE(quote != std::string::npos);
    out.push_back(head.substr(0, quote) + " " + head.substr(quote + 6));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += s + "\n";
  return out;
}

}  // namespace

TEST_CASE("lenient: strict stays the default, and a clean adapter has no warnings either way") {
  TempDir t;
  write_adapter(t.path, config_text(), llama_tensors());
  CHECK(peft::Adapter::open(t.str(), {})->warnings().empty());
  auto a = peft::Adapter::open(t.str(), lenient());
  CHECK(a->warnings().empty());
  CHECK(a->modules().size() == 4);
}

TEST_CASE("lenient: keys that are not adapter keys and untargeted modules are unexpected keys") {
  TempDir t;
  auto tensors = llama_tensors();
  tensors.push_back({kP + "model.layers.0.self_attn.q_proj.lora_X.weight", {2, 8}});
  for (auto& x : lora_pair("model.layers.0.mlp.up_proj", 2, 8, 16)) tensors.push_back(x);
  write_adapter(t.path, config_text(), tensors);
  CHECK(open_failure(t.path).code == PEFT_ERR_UNRESOLVED_KEY);
  auto a = peft::Adapter::open(t.str(), lenient());
  CHECK(names(*a) == std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                              "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"});
  CHECK(kinds_and_keys(*a) == std::vector<std::string>{
                                  "unexpected " + kP + "model.layers.0.mlp.up_proj.lora_A.weight",
                                  "unexpected " + kP + "model.layers.0.mlp.up_proj.lora_B.weight",
                                  "unexpected " + kP + "model.layers.0.self_attn.q_proj.lora_X.weight"});
  for (const std::string& w : a->warnings()) CHECK(w.ends_with("; PEFT ignores it"));
  CHECK(contains(a->warnings()[1], "is not targeted"));
}

TEST_CASE("lenient: magnitudes without use_dora and lora_B.bias without lora_bias are unexpected keys") {
  TempDir t;
  auto tensors = llama_tensors();
  tensors.push_back({kP + "model.layers.0.self_attn.q_proj.lora_magnitude_vector", {8}});
  tensors.push_back({kP + "model.layers.1.self_attn.v_proj.lora_B.bias", {4}});
  write_adapter(t.path, config_text(), tensors);
  CHECK(open_failure(t.path).code == PEFT_ERR_INVALID_CONFIG);
  auto a = peft::Adapter::open(t.str(), lenient());
  CHECK(kinds_and_keys(*a) ==
        std::vector<std::string>{"unexpected " + kP + "model.layers.0.self_attn.q_proj.lora_magnitude_vector",
                                 "unexpected " + kP + "model.layers.1.self_attn.v_proj.lora_B.bias"});
  for (const auto& m : a->modules()) {
    CHECK(m.find(peft::TensorRole::lora_magnitude) == nullptr);
    CHECK(m.find(peft::TensorRole::lora_b_bias) == nullptr);
  }
}

TEST_CASE("lenient: lora_A without lora_B leaves the module out, its lora_B reported missing") {
  TempDir t;
  auto tensors = llama_tensors();
  tensors.push_back({kP + "model.layers.1.self_attn.k_proj.lora_A.weight", {2, 8}});
  write_adapter(t.path, config_text({{"target_modules", {"q_proj", "k_proj", "v_proj"}}}), tensors);
  CHECK(open_failure(t.path).code == PEFT_ERR_INVALID_CHECKPOINT);
  auto a = peft::Adapter::open(t.str(), lenient());
  CHECK(a->find_module("model.layers.1.self_attn.k_proj") == nullptr);
  CHECK(kinds_and_keys(*a) == std::vector<std::string>{"missing " + kP + "model.layers.1.self_attn.k_proj.lora_B.weight"});

  SUBCASE("with DoRA the magnitude is missing too, and nothing else may be present") {
    TempDir d;
    write_adapter(d.path, config_text({{"target_modules", {"q_proj", "k_proj", "v_proj"}}}), tensors);
    auto only_a = peft::Adapter::open(d.str(), lenient());
    CHECK(only_a->warnings().size() == 1);
  }
}

TEST_CASE("lenient: what PEFT would leave random, or refuse, stays an error") {
  TempDir t;
  SUBCASE("lora_B without lora_A") {
    auto tensors = llama_tensors();
    tensors.push_back({kP + "model.layers.1.self_attn.k_proj.lora_B.weight", {4, 2}});
    write_adapter(t.path, config_text({{"target_modules", {"q_proj", "k_proj", "v_proj"}}}), tensors);
    CHECK(open_failure(t.path, lenient()).code == PEFT_ERR_INVALID_CHECKPOINT);
  }
  SUBCASE("lora_A without lora_B when init_lora_weights is false") {
    auto tensors = llama_tensors();
    tensors.push_back({kP + "model.layers.1.self_attn.k_proj.lora_A.weight", {2, 8}});
    write_adapter(t.path,
                  config_text({{"target_modules", {"q_proj", "k_proj", "v_proj"}}, {"init_lora_weights", false}}),
                  tensors);
    CHECK(open_failure(t.path, lenient()).code == PEFT_ERR_INVALID_CHECKPOINT);
  }
  SUBCASE("a rank that r does not give") {
    write_adapter(t.path, config_text({{"r", 4}}), llama_tensors());
    CHECK(open_failure(t.path, lenient()).code == PEFT_ERR_INVALID_CONFIG);
  }
  SUBCASE("a DoRA module without its magnitude") {
    auto tensors = llama_tensors();
    write_adapter(t.path, config_text({{"use_dora", true}}), tensors);
    Failure f = open_failure(t.path, lenient());
    CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(f.message, "lora_magnitude_vector"));
  }
  SUBCASE("two keys for one tensor") {
    auto tensors = llama_tensors();
    tensors.push_back({"model.layers.0.self_attn.q_proj.lora_A.weight", {2, 8}});
    write_adapter(t.path, config_text(), tensors);
    CHECK(open_failure(t.path, lenient()).code == PEFT_ERR_INVALID_CHECKPOINT);
  }
}

TEST_CASE("lenient: with a base, absent modules are unexpected and targets without tensors missing") {
  TempDir base, t;
  write_base(base.path);
  auto tensors = concat({lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8),
                         lora_pair("model.layers.0.self_attn.v_proj", 2, 8, 4),
                         lora_pair("model.layers.5.self_attn.q_proj", 2, 8, 8)});
  tensors.push_back({kP + "model.extra.weight", {3, 8}});
  write_adapter(t.path, config_text({{"lora_bias", true}}), concat({tensors, {{kP + "model.layers.0.self_attn.v_proj.lora_B.bias", {4}}}}));
  peft::Adapter::Options strict;
  strict.base_dir = base.str();
  CHECK(open_failure(t.path, strict).code == PEFT_ERR_INVALID_CONFIG);  // q_proj's lora_B.bias, first

  auto a = peft::Adapter::open(t.str(), lenient(&base.path));
  CHECK(names(*a) == std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"});
  INFO(join(kinds_and_keys(*a)));
  CHECK(kinds_and_keys(*a) == std::vector<std::string>{
                                  "missing " + kP + "model.layers.0.self_attn.q_proj.lora_B.bias",
                                  "missing " + kP + "model.layers.1.self_attn.q_proj.lora_A.weight",
                                  "missing " + kP + "model.layers.1.self_attn.q_proj.lora_B.bias",
                                  "missing " + kP + "model.layers.1.self_attn.q_proj.lora_B.weight",
                                  "missing " + kP + "model.layers.1.self_attn.v_proj.lora_A.weight",
                                  "missing " + kP + "model.layers.1.self_attn.v_proj.lora_B.bias",
                                  "missing " + kP + "model.layers.1.self_attn.v_proj.lora_B.weight",
                                  "unexpected " + kP + "model.extra.weight",
                                  "unexpected " + kP + "model.layers.5.self_attn.q_proj.lora_A.weight",
                                  "unexpected " + kP + "model.layers.5.self_attn.q_proj.lora_B.weight"});

  SUBCASE("target_modules selecting nothing of the base is refused, as PEFT refuses it") {
    TempDir none;
    write_adapter(none.path, config_text({{"target_modules", {"k_proj"}}}),
                  lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8));
    Failure f = open_failure(none.path, lenient(&base.path));
    CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(f.message, "selects no module"));
  }
  SUBCASE("lora_A without lora_B: unexpected where the base lacks the module, checked against it otherwise") {
    TempDir inert;
    auto tensors = lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8);
    tensors.push_back({kP + "model.layers.6.self_attn.v_proj.lora_A.weight", {2, 8}});
    tensors.push_back({kP + "model.layers.1.self_attn.v_proj.lora_A.weight", {2, 8}});
    write_adapter(inert.path, config_text({{"target_modules", {"model.layers.0.self_attn.q_proj", "v_proj"}}}),
                  tensors);
    auto b = peft::Adapter::open(inert.str(), lenient(&base.path));
    CHECK(names(*b) == std::vector<std::string>{"model.layers.0.self_attn.q_proj"});
    CHECK(kinds_and_keys(*b) == std::vector<std::string>{
                                    "missing " + kP + "model.layers.0.self_attn.v_proj.lora_A.weight",
                                    "missing " + kP + "model.layers.0.self_attn.v_proj.lora_B.weight",
                                    "missing " + kP + "model.layers.1.self_attn.v_proj.lora_B.weight",
                                    "unexpected " + kP + "model.layers.6.self_attn.v_proj.lora_A.weight"});
    TempDir wrong;
    write_adapter(wrong.path, config_text(),
                  concat({lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8),
                          {{kP + "model.layers.1.self_attn.v_proj.lora_A.weight", {2, 6}}}}));
    Failure f = open_failure(wrong.path, lenient(&base.path));
    CHECK(f.code == PEFT_ERR_SHAPE_MISMATCH);
    CHECK(contains(f.message, "model.layers.1.self_attn.v_proj"));
  }
  SUBCASE("shape mismatches stay errors") {
    TempDir bad;
    write_adapter(bad.path, config_text(), lora_pair("model.layers.0.self_attn.q_proj", 2, 6, 8));
    CHECK(open_failure(bad.path, lenient(&base.path)).code == PEFT_ERR_SHAPE_MISMATCH);
  }
}
