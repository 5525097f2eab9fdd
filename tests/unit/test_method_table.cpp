// The method table (src/peft/methods/method_table.hpp) against every place that must know a
// method: a row that some part of the library does not support fails here.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "peft/adapter/adapter.hpp"
#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/method_params.hpp"
#include "peft/arch/key_grammar.hpp"
#include "peft/methods/method_table.hpp"
#include "test_adapter_support.hpp"

using namespace adapter_test;
using nlohmann::json;

namespace {

// Whether a row's function is there (doctest cannot print function pointers).
template <typename F>
bool set(F* f) {
  return f != nullptr;
}

}  // namespace

TEST_CASE("method table: one row per method, in order, each named by its peft_type") {
  const auto table = peft::method_table();
  CHECK(table.size() == static_cast<size_t>(peft::PeftMethod::c3a) + 1);
  std::set<std::string> types;
  for (size_t i = 0; i < table.size(); ++i) {
    const peft::MethodRow& row = table[i];
    const std::string type = row.peft_type;
    CAPTURE(type);
    CHECK(static_cast<size_t>(row.method) == i);
    CHECK(&peft::method_row(row.method) == &row);
    CHECK(std::string(peft::peft_method_name(row.method)) == row.peft_type);
    CHECK(peft::method_row_for_type(row.peft_type) == &row);
    CHECK(types.insert(row.peft_type).second);
  }
}

TEST_CASE("method table: every row is supported everywhere a method must be known") {
  std::set<std::string> names;
  for (const peft::MethodRow& row : peft::method_table()) {
    const std::string type = row.peft_type;
    CAPTURE(type);
    // The config reader reads the peft_type as this method.
    json config = {{"peft_type", row.peft_type}, {"target_modules", {"q_proj"}}};
    if (row.method == peft::PeftMethod::trainable_tokens) config["token_indices"] = {1, 2};
    CHECK(peft::LoraConfig::parse(config.dump(), "adapter_config.json").method == row.method);

    const bool has_params = row.effect != peft::MethodEffect::lora && row.effect != peft::MethodEffect::replacement;
    CHECK(has_params == !row.params.empty());
    for (std::string_view param : row.params) {
      const std::string name(param);
      CAPTURE(name);
      // Each name belongs to one method: the loader and the doctor read it as this row's.
      CHECK(names.insert(name).second);
      CHECK(peft::method_row_for_param(name) == &row);
      CHECK(peft::row_has_param(row, name));
      // The key grammar parses it as a method parameter of the module, with and without the
      // adapter name, as PEFT saves it.
      const std::string tail = row.key_tail ? std::string(".") + row.key_tail : std::string();
      for (const std::string& key : {"base_model.model.model.layers.0.self_attn.q_proj." + name + tail,
                                     "base_model.model.model.layers.0.self_attn.q_proj." + name + ".default" + tail}) {
        CAPTURE(key);
        const auto parsed = peft::parse_adapter_key(key);
        CHECK(parsed.has_value());
        if (!parsed) continue;
        CHECK(parsed->role == peft::TensorRole::method_param);
        CHECK(parsed->role_suffix == name);
        CHECK(parsed->module == "model.layers.0.self_attn.q_proj");
      }
    }
    for (std::string_view shared : row.shared) CHECK(peft::row_has_param(row, shared));

    // The merges (checkpoint, buffer, swap) and conversion: what the effect needs is there.
    switch (row.effect) {
      case peft::MethodEffect::delta:
        CHECK(set(row.delta));
        CHECK_FALSE(set(row.transform));
        break;
      case peft::MethodEffect::rotation:
        CHECK(set(row.transform));
        CHECK_FALSE(set(row.delta));
        CHECK(peft::is_rotation(row.method));
        break;
      case peft::MethodEffect::scale:
      case peft::MethodEffect::lora:
      case peft::MethodEffect::replacement:
        CHECK_FALSE(set(row.delta));
        CHECK_FALSE(set(row.transform));
        break;
    }
    if (row.effect != peft::MethodEffect::rotation) CHECK_FALSE(peft::is_rotation(row.method));
    // Validation against a base and conversion read the layer's out x in from the parameters.
    CHECK(set(row.features) == has_params);
    // The loader reads every other method's own config fields through its row, and resolves every
    // module of a method with parameters through its row (LoRA's own are the loader's).
    CHECK(set(row.read_config) == (row.effect != peft::MethodEffect::lora));
    CHECK(set(row.resolve) == has_params);
    // Converting without a base needs the features and a delta that does not read the weight.
    if (row.converts_without_base && row.effect != peft::MethodEffect::lora) {
      CHECK(row.effect == peft::MethodEffect::delta);
      CHECK_FALSE(set(row.reads_weight));
    }
    // Export refuses every method but LoRA, saying what to do instead.
    CHECK((row.export_hint == nullptr) == (row.effect == peft::MethodEffect::lora));
  }
}

namespace {

void write_vblora_base(const fs::path& dir) {
  write_text(dir / "config.json", json{{"model_type", "llama"}}.dump());
  write_safetensors(dir / "model.safetensors", {{"model.layers.0.self_attn.q_proj.weight", {8, 8}}});
}

// A VB-LoRA adapter on q_proj: bank [4 vectors, length 4], logits_A [r, in / 4, 4],
// logits_B [out / 4, r, 4].
void write_vblora(const fs::path& dir, uint64_t out, uint64_t in) {
  const std::string m = "base_model.model.model.layers.0.self_attn.q_proj.";
  write_adapter(dir, json{{"peft_type", "VBLORA"}, {"r", 2}, {"topk", 2}, {"target_modules", {"q_proj"}}}.dump(),
                {{"base_model.vblora_vector_bank", {4, 4}},
                 {m + "vblora_logits_A", {2, in / 4, 4}},
                 {m + "vblora_logits_B", {out / 4, 2, 4}}});
}

}  // namespace

TEST_CASE("method table: VB-LoRA's layer size comes from its parameters in validation as in conversion") {
  TempDir base, fits, wrong;
  write_vblora_base(base.path);
  peft::Adapter::Options options;
  options.base_dir = base.str();
  write_vblora(fits.path, 8, 8);
  CHECK_NOTHROW(peft::Adapter::open(fits.str(), options));
  // logits_B for 12 output features: the base's q_proj has 8, so the adapter does not fit it
  // (validation used to take any size for VB-LoRA and leave the mismatch to the merge).
  write_vblora(wrong.path, 12, 8);
  const Failure f = open_failure(wrong.path, options);
  CHECK(f.code == PEFT_ERR_SHAPE_MISMATCH);
  CHECK(contains(f.message, "VBLORA parameters for 12 output and 8 input features"));
}

TEST_CASE("method table: a peft_type not merged is refused naming every row's peft_type") {
  std::string message;
  try {
    peft::LoraConfig::parse(R"({"peft_type": "ADAMSS"})", "adapter_config.json");
  } catch (const peft::Error& e) {
    message = e.what();
  }
  CHECK(contains(message, "merging this method is not implemented (LORA, LOHA, LOKR, "));
  for (const peft::MethodRow& row : peft::method_table()) {
    CAPTURE(row.peft_type);
    CHECK(contains(message, row.peft_type));
  }
}

TEST_CASE("method table: VeRA's and RandLoRA's lambdas are checked against r") {
  const std::string m = "base_model.model.model.layers.0.self_attn.q_proj.";
  // vera_lambda_d [r], vera_lambda_b [out]; randlora_lambda [r, bases], randlora_gamma [out, bases].
  for (const bool vera : {true, false}) {
    CAPTURE(vera);
    const std::string type = vera ? "VERA" : "RANDLORA";
    auto write = [&](const fs::path& dir, uint64_t saved_rank) {
      const std::vector<TensorSpec> tensors =
          vera ? std::vector<TensorSpec>{{"base_model.vera_A", {4, 8}},
                                         {"base_model.vera_B", {8, 4}},
                                         {m + "vera_lambda_b", {8}},
                                         {m + "vera_lambda_d", {saved_rank}}}
               : std::vector<TensorSpec>{{"base_model.randlora_A", {4, 2, 8}},
                                         {"base_model.randlora_B", {8, 2, 4}},
                                         {m + "randlora_gamma", {8, 2}},
                                         {m + "randlora_lambda", {saved_rank, 2}}};
      write_adapter(dir, json{{"peft_type", type}, {"r", 4}, {"target_modules", {"q_proj"}}}.dump(), tensors);
    };
    TempDir fits, wrong;
    write(fits.path, 4);
    CHECK_NOTHROW(peft::Adapter::open(fits.str(), {}));
    write(wrong.path, 2);
    const Failure f = open_failure(wrong.path);
    CHECK(f.code == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(f.message, "module \"model.layers.0.self_attn.q_proj\" has rank 2 but r is 4"));
  }
}
