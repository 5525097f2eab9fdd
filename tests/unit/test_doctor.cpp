// The adapter doctor: the rename rules of key_renames.hpp, and the report of adapter_doctor.hpp on
// hand-made adapters and bases (tests/interop/test_adapter_doctor.py runs it against PEFT).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peft/doctor/adapter_doctor.hpp"
#include "peft/doctor/key_renames.hpp"
#include "test_adapter_support.hpp"
#include "test_error_support.hpp"

using namespace adapter_test;

namespace {

std::vector<std::string> candidates(const std::string& module) {
  std::vector<std::string> out;
  for (const peft::RenameCandidate& c : peft::rename_candidates(module, "weight")) out.push_back(c.module);
  return out;
}

bool has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

std::vector<std::string> kinds(const nlohmann::json& report) {
  std::vector<std::string> out;
  for (const auto& p : report["problems"]) out.push_back(p["kind"].get<std::string>());
  return out;
}

// A base folder: config.json of a llama and F32 weights of the given names and shapes.
void write_base(const fs::path& dir, const std::vector<TensorSpec>& tensors) {
  write_text(dir / "config.json", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})");
  write_safetensors(dir / "model.safetensors", tensors);
}

nlohmann::json diagnose(const fs::path& adapter, const fs::path& base) {
  return nlohmann::json::parse(peft::diagnose_adapter(adapter.string(), base.string()).json);
}

}  // namespace

TEST_CASE("doctor renames: .weight suffix variants") {
  auto r = peft::rewrite_key("base_model.model.model.layers.0.q_proj.lora_A", {});
  REQUIRE(r);
  CHECK(r->family == peft::KeyRewrite::Family::weight_suffix);
  CHECK(r->module == "model.layers.0.q_proj");
  CHECK(r->suffix == "lora_A.weight");
  r = peft::rewrite_key("base_model.model.model.embed_tokens.lora_embedding_B.weight", {});
  REQUIRE(r);
  CHECK(r->suffix == "lora_embedding_B");
  CHECK_FALSE(peft::rewrite_key("base_model.model.model.layers.0.q_proj.lora_A.weight", {}));
  CHECK_FALSE(peft::rewrite_key("lora_A", {}));  // no module
  CHECK_FALSE(peft::rewrite_key("base_model.model.x.lora_E", {}));
}

TEST_CASE("doctor renames: kohya / LyCORIS names") {
  auto down = peft::rewrite_key("lora_te_model_layers_0_self_attn_q_proj.lora_down.weight", {});
  REQUIRE(down);
  CHECK(down->family == peft::KeyRewrite::Family::kohya);
  CHECK(down->module == "lora_te_model_layers_0_self_attn_q_proj");
  CHECK(down->suffix == "lora_A.weight");
  auto up = peft::rewrite_key("model.layers.0.q_proj.lora_up.weight", {});
  REQUIRE(up);
  CHECK(up->suffix == "lora_B.weight");
  CHECK(peft::kohya_down_module("a.b.lora_down.weight") == std::string("a.b"));
  // "alpha" and "dora_scale" are kohya's only next to kohya factors; else a PEFT full tensor.
  CHECK_FALSE(peft::rewrite_key("a.b.alpha", {}));
  auto alpha = peft::rewrite_key("a.b.alpha", {"a.b"});
  REQUIRE(alpha);
  CHECK(alpha->role == peft::KeyRewrite::Role::kohya_alpha);
  auto dora = peft::rewrite_key("a.b.dora_scale", {"a.b"});
  REQUIRE(dora);
  CHECK(dora->role == peft::KeyRewrite::Role::kohya_dora_scale);
  std::string rest;
  CHECK(peft::kohya_underscore_path("lora_unet_down_blocks_0_attn_to_q", rest));
  CHECK(rest == "down_blocks_0_attn_to_q");
  CHECK(peft::kohya_underscore_path("lora_te2_text_model_fc1", rest));
  CHECK(rest == "text_model_fc1");
  CHECK_FALSE(peft::kohya_underscore_path("model.layers.0.q_proj", rest));
  CHECK_FALSE(peft::kohya_underscore_path("lora_te_", rest));
  CHECK(peft::underscore_path("model.layers.0.q_proj") == "model_layers_0_q_proj");
}

TEST_CASE("doctor renames: transformers' checkpoint conversions, both directions") {
  CHECK(has(candidates("language_model.model.layers.0.self_attn.q_proj"), "model.language_model.layers.0.self_attn.q_proj"));
  CHECK(has(candidates("model.language_model.layers.0.self_attn.q_proj"), "language_model.model.layers.0.self_attn.q_proj"));
  CHECK(has(candidates("model.language_model.layers.0.self_attn.q_proj"), "model.layers.0.self_attn.q_proj"));
  CHECK(has(candidates("model.layers.0.self_attn.q_proj"), "model.language_model.layers.0.self_attn.q_proj"));
  CHECK(has(candidates("language_model.lm_head"), "lm_head"));
  CHECK(has(candidates("lm_head"), "language_model.lm_head"));
  CHECK(has(candidates("vision_tower.encoder.layers.0.fc1"), "model.vision_tower.encoder.layers.0.fc1"));
  CHECK(has(candidates("model.multi_modal_projector.linear_1"), "multi_modal_projector.linear_1"));
  CHECK(has(candidates("visual.blocks.0.attn.qkv"), "model.visual.blocks.0.attn.qkv"));
  CHECK(has(candidates("base_model.model.model.layers.0.q_proj"), "model.layers.0.q_proj"));
  // Read from transformers' table, not a list of families: Mllama's vision model, Emu3's text model.
  CHECK(has(candidates("model.vision_model.transformer.layers.0.self_attn.q_proj"),
            "vision_model.transformer.layers.0.self_attn.q_proj"));
  CHECK(has(candidates("text_model.model.layers.0.self_attn.q_proj"), "model.text_model.model.layers.0.self_attn.q_proj"));
  // Only chains that rename leading paths: AltCLIP's "layer" -> "layers" and Swin's "self.query" ->
  // "q_proj" rewrite inner names of their own models' keys and are not applied to others'.
  const std::vector<std::string> bert = candidates("encoder.layer.0.attention.self.query");
  CHECK(!has(bert, "encoder.layers.0.attention.self.query"));
  CHECK(!has(bert, "encoder.layer.0.attention.q_proj"));
  for (const std::string& c : bert) CHECK(c.ends_with(".encoder.layer.0.attention.self.query"));
}

TEST_CASE("doctor: a clean adapter, a renamed one, an ambiguous one") {
  TempDir tmp;
  const std::vector<TensorSpec> base_weights = {{"model.layers.0.self_attn.q_proj.weight", {8, 8}},
                                                {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
                                                {"model.layers.1.self_attn.q_proj.weight", {8, 8}},
                                                {"model.layers.1.self_attn.v_proj.weight", {4, 8}}};
  write_base(tmp.path / "base", base_weights);
  write_adapter(tmp.path / "clean", config_text(), llama_tensors());
  nlohmann::json clean = diagnose(tmp.path / "clean", tmp.path / "base");
  CHECK(clean["summary"]["ok"] == true);
  CHECK(clean["summary"]["matched_modules"] == 4);
  CHECK(clean["modules"][0]["scaling"] == 2.0);
  CHECK(clean["modules"][0]["base_shape"] == nlohmann::json::array({8, 8}));

  std::vector<TensorSpec> renamed;
  for (auto [name, shape] : llama_tensors())
    renamed.push_back({"base_model.model.model.language_model." + name.substr(std::string("base_model.model.model.").size()), shape});
  write_adapter(tmp.path / "renamed", config_text(), renamed);
  nlohmann::json report = diagnose(tmp.path / "renamed", tmp.path / "base");
  CHECK(report["summary"]["ok"] == false);
  CHECK(kinds(report) == std::vector<std::string>(4, "renamed_module"));
  CHECK(report["renames"][0]["to"] == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");

  // Both "model.layers..." and "language_model.model.layers..." in the base: two renames fit.
  std::vector<TensorSpec> both = base_weights;
  both.push_back({"language_model.model.layers.0.self_attn.q_proj.weight", {8, 8}});
  write_base(tmp.path / "base2", both);
  report = diagnose(tmp.path / "renamed", tmp.path / "base2");
  CHECK(has(kinds(report), "ambiguous_rename"));
  for (const auto& p : report["problems"])
    if (p["kind"] == "ambiguous_rename") CHECK(p["fix"].is_null());
}

TEST_CASE("doctor: kohya names need a base to be found; the fix writes alpha_pattern") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  std::vector<TensorSpec> kohya = {{"lora_te_model_layers_0_self_attn_q_proj.lora_down.weight", {2, 8}},
                                   {"lora_te_model_layers_0_self_attn_q_proj.lora_up.weight", {8, 2}},
                                   {"lora_te_model_layers_0_self_attn_q_proj.alpha", {}}};
  write_adapter(tmp.path / "kohya", config_text({{"target_modules", {"q_proj"}}}), kohya);
  nlohmann::json alone = nlohmann::json::parse(peft::diagnose_adapter((tmp.path / "kohya").string(), "").json);
  CHECK(kinds(alone) == std::vector<std::string>{"kohya_name"});
  CHECK(alone["problems"][0]["fix"].is_null());

  nlohmann::json report = diagnose(tmp.path / "kohya", tmp.path / "base");
  CHECK(kinds(report) == std::vector<std::string>{"kohya_name"});
  CHECK(report["modules"][0]["module"] == "model.layers.0.self_attn.q_proj");
  CHECK(report["modules"][0]["alpha"] == 0.0);  // the alpha tensor holds zero
  CHECK(report["config_changes"][0]["field"] == "alpha_pattern");

  peft::fix_adapter((tmp.path / "kohya").string(), (tmp.path / "base").string(), (tmp.path / "fixed").string());
  nlohmann::json fixed = diagnose(tmp.path / "fixed", tmp.path / "base");
  CHECK(fixed["summary"]["ok"] == true);
  CHECK(fixed["modules"][0]["alpha"] == 0.0);
  Failure none = open_failure(tmp.path / "fixed", {(tmp.path / "base").string(), nullptr, {}});
  CHECK(none.code == PEFT_OK);
}

TEST_CASE("doctor: errors are errors, not problems") {
  TempDir tmp;
  CHECK(error_test::code_of([&] { peft::diagnose_adapter((tmp.path / "absent").string(), ""); }) == PEFT_ERR_NOT_FOUND);
  write_text(tmp.path / "noweights" / "adapter_config.json", config_text());
  CHECK(error_test::code_of([&] { peft::diagnose_adapter((tmp.path / "noweights").string(), ""); }) ==
        PEFT_ERR_NOT_FOUND);
  write_adapter(tmp.path / "badconfig", "{", llama_tensors());
  CHECK(error_test::code_of([&] { peft::diagnose_adapter((tmp.path / "badconfig").string(), ""); }) ==
        PEFT_ERR_INVALID_CONFIG);
}

TEST_CASE("doctor: an integer LoRA factor is an unsupported_dtype problem") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  // F32 tensors written by hand, then the dtype of lora_B changed to I32 (same size) in the header.
  write_adapter(tmp.path / "a", config_text({{"target_modules", {"q_proj"}}}),
                lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8));
  fs::path file = tmp.path / "a" / "adapter_model.safetensors";
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  size_t at = bytes.rfind("\"F32\"");
  REQUIRE(at != std::string::npos);
  bytes.replace(at, 5, "\"I32\"");
  std::ofstream(file, std::ios::binary) << bytes;
  nlohmann::json report = diagnose(tmp.path / "a", tmp.path / "base");
  CHECK(kinds(report) == std::vector<std::string>{"unsupported_dtype"});
}

TEST_CASE("doctor: a kohya folder without adapter_config.json gets a config made from its tensors") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}},
                                 {"model.layers.0.self_attn.v_proj.weight", {4, 8}}});
  write_safetensors(tmp.path / "k" / "adapter_model.safetensors",
                    {{"lora_te_model_layers_0_self_attn_q_proj.lora_down.weight", {2, 8}},
                     {"lora_te_model_layers_0_self_attn_q_proj.lora_up.weight", {8, 2}},
                     {"lora_te_model_layers_0_self_attn_v_proj.lora_down.weight", {2, 8}},
                     {"lora_te_model_layers_0_self_attn_v_proj.lora_up.weight", {4, 2}}});
  nlohmann::json report = diagnose(tmp.path / "k", tmp.path / "base");
  CHECK(has(kinds(report), "missing_config"));
  CHECK(has(kinds(report), "kohya_name"));
  CHECK(report["summary"]["fixable_problems"] == report["summary"]["problems"]);
  peft::fix_adapter((tmp.path / "k").string(), (tmp.path / "base").string(), (tmp.path / "fixed").string());
  std::ifstream config_file(tmp.path / "fixed" / "adapter_config.json");
  nlohmann::json config = nlohmann::json::parse(config_file);
  CHECK(config["r"] == 2);
  CHECK(config["lora_alpha"] == 2.0);
  CHECK(config["target_modules"] ==
        nlohmann::json::array({"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"}));
  CHECK(diagnose(tmp.path / "fixed", tmp.path / "base")["summary"]["ok"] == true);
  CHECK(open_failure(tmp.path / "fixed", {(tmp.path / "base").string(), nullptr, {}}).code == PEFT_OK);
}

namespace {

// Sets the last F32 value of a file written by write_safetensors (its last tensor's last element).
void set_last_f32(const fs::path& file, float value) {
  std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
  io.seekp(-4, std::ios::end);
  io.write(reinterpret_cast<const char*>(&value), 4);
}

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<TensorSpec> kohya_q_proj() {
  return {{"lora_te_model_layers_0_self_attn_q_proj.lora_down.weight", {2, 8}},
          {"lora_te_model_layers_0_self_attn_q_proj.lora_up.weight", {8, 2}},
          {"lora_te_model_layers_0_self_attn_q_proj.alpha", {}}};
}

}  // namespace

TEST_CASE("doctor: a non-finite kohya alpha is an invalid_value problem; the report stays JSON") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  for (float alpha : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(alpha);
    write_adapter(tmp.path / "k", config_text({{"target_modules", {"q_proj"}}}), kohya_q_proj());
    set_last_f32(tmp.path / "k" / "adapter_model.safetensors", alpha);
    peft::DoctorResult result = peft::diagnose_adapter((tmp.path / "k").string(), (tmp.path / "base").string());
    CHECK_FALSE(result.ok);
    CHECK(result.json.find("NaN") == std::string::npos);
    CHECK(result.json.find("Infinity") == std::string::npos);
    nlohmann::json report = nlohmann::json::parse(result.json);
    CHECK(has(kinds(report), "invalid_value"));
    CHECK(report["modules"][0]["alpha"].is_null());
    CHECK(report["modules"][0]["scaling"].is_null());
    CHECK(report["config_changes"].empty());
    fs::remove_all(tmp.path / "fixed");
    peft::fix_adapter((tmp.path / "k").string(), (tmp.path / "base").string(), (tmp.path / "fixed").string());
    const std::string config = read_all(tmp.path / "fixed" / "adapter_config.json");
    CHECK(config.find("Infinity") == std::string::npos);
    CHECK(config.find("NaN") == std::string::npos);
    CHECK_FALSE(diagnose(tmp.path / "fixed", tmp.path / "base")["summary"]["ok"]);  // the problem stays
  }
}

TEST_CASE("doctor: without a config, a NaN kohya alpha is a problem, not a config error") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  write_safetensors(tmp.path / "k" / "adapter_model.safetensors", kohya_q_proj());
  set_last_f32(tmp.path / "k" / "adapter_model.safetensors", std::numeric_limits<float>::quiet_NaN());
  nlohmann::json report = diagnose(tmp.path / "k", tmp.path / "base");
  CHECK(has(kinds(report), "missing_config"));
  CHECK(has(kinds(report), "invalid_value"));
  CHECK(report["modules"][0]["alpha"].is_null());
}

TEST_CASE("doctor: a rank of 2^64-1 (zero-byte factors) is an invalid_value problem") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  write_adapter(tmp.path / "a", config_text({{"target_modules", {"q_proj"}}, {"use_rslora", true}}),
                {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", {huge, 0}},
                 {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", {0, huge}}});
  peft::DoctorResult result = peft::diagnose_adapter((tmp.path / "a").string(), (tmp.path / "base").string());
  CHECK_FALSE(result.ok);
  nlohmann::json report = nlohmann::json::parse(result.json);
  CHECK(has(kinds(report), "invalid_value"));
  CHECK(report["modules"][0]["rank"].is_null());
  CHECK(report["modules"][0]["scaling"].is_null());
  // Without a config, no rank is made of it.
  fs::remove(tmp.path / "a" / "adapter_config.json");
  nlohmann::json alone = diagnose(tmp.path / "a", tmp.path / "base");
  CHECK(has(kinds(alone), "invalid_value"));
  CHECK(has(kinds(alone), "missing_config"));
  for (const auto& p : alone["problems"])
    if (p["kind"] == "missing_config") CHECK(p["message"].get<std::string>().find("r = 8") != std::string::npos);
}

TEST_CASE("doctor: --fix keeps keys whose renames collide, and the copy still reports them") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  std::vector<TensorSpec> tensors = lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8);
  tensors.push_back({"model.layers.0.self_attn.q_proj.lora_B.weight", {8, 2}});
  write_adapter(tmp.path / "dup", config_text({{"target_modules", {"q_proj"}}}), tensors);
  nlohmann::json report = diagnose(tmp.path / "dup", tmp.path / "base");
  CHECK(has(kinds(report), "duplicate_key"));
  CHECK(report["renames"].empty());
  peft::DoctorResult fixed_result =
      peft::fix_adapter((tmp.path / "dup").string(), (tmp.path / "base").string(), (tmp.path / "fixed").string());
  CHECK_FALSE(fixed_result.ok);
  nlohmann::json fixed = diagnose(tmp.path / "fixed", tmp.path / "base");
  CHECK(fixed["summary"]["keys"] == 3);
  CHECK(has(kinds(fixed), "duplicate_key"));
  CHECK_FALSE(fixed["summary"]["ok"]);
}

TEST_CASE("doctor: --fix refuses the adapter folder, the base folder and hub cache snapshots") {
  TempDir tmp;
  write_base(tmp.path / "base", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  std::vector<TensorSpec> unprefixed = lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8, false);
  write_adapter(tmp.path / "a", config_text({{"target_modules", {"q_proj"}}}), unprefixed);
  const std::string before = read_all(tmp.path / "a" / "adapter_model.safetensors");
  const std::string a = (tmp.path / "a").string(), base = (tmp.path / "base").string();
  CHECK(error_test::code_of([&] { peft::fix_adapter(a, base, a); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_test::code_of([&] { peft::fix_adapter(a, base, (tmp.path / "a" / ".").string()); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  fs::create_directory_symlink(tmp.path / "a", tmp.path / "link");
  CHECK(error_test::code_of([&] { peft::fix_adapter(a, base, (tmp.path / "link").string()); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK(read_all(tmp.path / "a" / "adapter_model.safetensors") == before);
  CHECK(error_test::code_of([&] { peft::fix_adapter(a, base, base); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK_FALSE(fs::exists(tmp.path / "base" / "adapter_config.json"));
  const fs::path snapshot = tmp.path / "hub" / "models--org--name" / "snapshots" / "0123abcd";
  fs::create_directories(snapshot);
  CHECK(error_test::code_of([&] { peft::fix_adapter(a, base, snapshot.string()); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(error_test::code_of([&] { peft::fix_adapter(a, base, (snapshot / "sub").string()); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK_FALSE(fs::exists(snapshot / "adapter_config.json"));
  peft::fix_adapter(a, base, (tmp.path / "elsewhere").string());
  CHECK(fs::exists(tmp.path / "elsewhere" / "adapter_model.safetensors"));
}

TEST_CASE("doctor: an incomplete hub download of the config is NOT_FOUND; adapter_model.bin is UNSUPPORTED") {
  TempDir tmp;
  const fs::path repo = tmp.path / "models--org--adapter";
  const fs::path snapshot = repo / "snapshots" / "0123abcd";
  write_safetensors(repo / "blobs" / "weights", lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8));
  fs::create_directories(snapshot);
  fs::create_symlink("../../blobs/weights", snapshot / "adapter_model.safetensors");
  fs::create_symlink("../../blobs/config", snapshot / "adapter_config.json");  // not downloaded
  write_text(repo / "blobs" / "config.incomplete", "{\"peft_ty");
  Failure failure;
  try {
    peft::diagnose_adapter(snapshot.string(), "");
  } catch (const peft::Error& e) {
    failure = {e.code(), e.what()};
  }
  CHECK(failure.code == PEFT_ERR_NOT_FOUND);
  CHECK(failure.message.find("incomplete") != std::string::npos);
  write_text(tmp.path / "bin" / "adapter_config.json", config_text());
  write_text(tmp.path / "bin" / "adapter_model.bin", "pickle");
  CHECK(error_test::code_of([&] { peft::diagnose_adapter((tmp.path / "bin").string(), ""); }) == PEFT_ERR_UNSUPPORTED);
}

TEST_CASE("doctor: an adapter on a tied base's embeddings gets its tied case and what each merge policy does") {
  TempDir tmp;
  // A llama whose lm_head is tied to model.embed_tokens (vocabulary 16, hidden 8): the input only stored.
  write_text(tmp.path / "base" / "config.json",
             R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": true})");
  write_safetensors(tmp.path / "base" / "model.safetensors",
                    {{"model.embed_tokens.weight", {16, 8}}, {"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
  const std::vector<TensorSpec> embed = {{"base_model.model.model.embed_tokens.lora_embedding_A", {2, 16}},
                                         {"base_model.model.model.embed_tokens.lora_embedding_B", {8, 2}}};
  const std::vector<TensorSpec> head = lora_pair("lm_head", 2, 8, 16);
  const std::vector<TensorSpec> tokens = {{"base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", {2, 8}}};
  struct Case {
    const char* name;
    nlohmann::json config;
    std::vector<TensorSpec> tensors;
    const char* kind;
    bool tied_after_untie;
  };
  const std::vector<Case> cases = {
      {"head", {{"target_modules", {"lm_head"}}}, head, "output_only", false},
      {"embed", {{"target_modules", {"embed_tokens"}}}, embed, "input_only", false},
      {"both", {{"target_modules", {"embed_tokens", "lm_head"}}}, concat({embed, head}), "both", false},
      {"ewt", {{"target_modules", {"embed_tokens"}}, {"ensure_weight_tying", true}}, concat({embed, head}),
       "ensure_weight_tying", true},
      {"tokens", {{"target_modules", {"q_proj"}}, {"trainable_token_indices", {3, 5}}},
       concat({tokens, lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8)}), "trainable_tokens", true},
      {"copy", {{"target_modules", {"q_proj"}}, {"modules_to_save", {"lm_head"}}},
       concat({{{"base_model.model.lm_head.weight", {16, 8}}}, lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8)}),
       "modules_to_save", false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    write_adapter(tmp.path / c.name, config_text(c.config), c.tensors);
    nlohmann::json report = diagnose(tmp.path / c.name, tmp.path / "base");
    CHECK(report["summary"]["ok"] == true);  // ensure_weight_tying's lm_head is targeted through the tie
    const nlohmann::json& tied = report["tied_embeddings"];
    REQUIRE(tied.is_object());
    CHECK(tied["case"] == c.kind);
    CHECK(tied["input"] == "model.embed_tokens.weight");
    CHECK(tied["output"] == "lm_head");
    CHECK(tied["output_stored"] == false);
    CHECK(tied["config_key"] == "tie_word_embeddings");
    const std::string untie = tied["untie"].get<std::string>();
    CHECK(contains(untie, "tie_word_embeddings is set to false") != c.tied_after_untie);
    CHECK(contains(untie, "\"lm_head.weight\" is added") != c.tied_after_untie);
    if (std::string(c.kind) != "modules_to_save" && std::string(c.kind) != "trainable_tokens")
      CHECK(contains(tied["shared"].get<std::string>(), "differs from the adapter's forward"));
  }
  // Without the tie, or with an adapter that leaves both embeddings alone: no tied_embeddings entry.
  write_adapter(tmp.path / "plain", config_text({{"target_modules", {"q_proj"}}}),
                lora_pair("model.layers.0.self_attn.q_proj", 2, 8, 8));
  CHECK(diagnose(tmp.path / "plain", tmp.path / "base")["tied_embeddings"].is_null());
  write_text(tmp.path / "base" / "config.json",
             R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": false})");
  nlohmann::json untied = diagnose(tmp.path / "embed", tmp.path / "base");
  CHECK(untied["tied_embeddings"].is_null());
}
