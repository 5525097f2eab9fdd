// transformers' checkpoint conversions (peft/arch/conversions.hpp): the built-in data's Llava chain
// gives the names save_pretrained writes, steps apply as transformers' rename_source_key does
// (scopes, backreferences, first occurrence), and malformed or unsupported steps are refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "peft/arch/conversions.hpp"
#include "peft_test_paths.h"

namespace {

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

nlohmann::json chain(const char* steps) { return nlohmann::json::parse(std::string(R"({"save": )") + steps + "}"); }

}  // namespace

TEST_CASE("conversions: the built-in data names Llava's saved tensors") {
  CHECK(peft::conversions_transformers_version().starts_with("5."));
  const nlohmann::json llava = {{"model_type", "llava"}, {"architectures", {"LlavaForConditionalGeneration"}}};
  auto q = peft::saved_names(llava, "model.language_model.layers.0.self_attn.q_proj.weight");
  CHECK(has(q, "language_model.model.layers.0.self_attn.q_proj.weight"));
  // transformers drops PrefixChange steps when saving a model it did not load: both names are tried.
  auto v = peft::saved_names(llava, "model.vision_tower.encoder.layers.1.self_attn.v_proj.weight");
  CHECK(has(v, "vision_tower.encoder.layers.1.self_attn.v_proj.weight"));
  CHECK(has(v, "vision_tower.vision_model.encoder.layers.1.self_attn.v_proj.weight"));
  CHECK(has(peft::saved_names(llava, "lm_head.weight"), "language_model.lm_head.weight"));
  // model_type alone (no architectures): transformers' table entry for it.
  auto by_type = peft::saved_names(nlohmann::json{{"model_type", "llava"}}, "model.multi_modal_projector.linear_1.weight");
  CHECK(has(by_type, "multi_modal_projector.linear_1.weight"));
  CHECK(peft::saved_names(nlohmann::json{{"model_type", "no_such_model"}}, "model.layers.0.weight").empty());
  CHECK(peft::saved_names(nlohmann::json(), "model.layers.0.weight").empty());
}

TEST_CASE("conversions: steps apply as transformers' rename_source_key") {
  // A scoped step matches under "<base_model_prefix>.<scope>." or "<scope>." and keeps that prefix.
  auto scoped = chain(R"J([{"kind": "WeightRenaming", "regex": "(?P<g0>^language_model(?!\\w))",
                          "targets": ["language_model.model"], "scope": "", "base_model_prefix": "model"}])J");
  CHECK(peft::apply_save_chain(scoped, "model.language_model.layers.0.w", true, "t") ==
        "model.language_model.model.layers.0.w");
  CHECK(peft::apply_save_chain(scoped, "language_model_x.w", true, "t") == "language_model_x.w");
  auto vision = chain(R"J([{"kind": "PrefixChange", "regex": "(?P<g0>^(?:(?!vision_model\\.))(.+))",
                          "targets": ["vision_model.\\1"], "scope": "vision_tower", "base_model_prefix": "model"}])J");
  CHECK(peft::apply_save_chain(vision, "model.vision_tower.a.w", true, "t") == "model.vision_tower.vision_model.a.w");
  CHECK(peft::apply_save_chain(vision, "model.vision_tower.a.w", false, "t") == "model.vision_tower.a.w");
  CHECK(peft::apply_save_chain(vision, "model.other.a.w", true, "t") == "model.other.a.w");
  // Grouped renames pick the target of the branch that matched; \N counts from that branch's group.
  auto grouped = chain(R"J([{"kind": "GroupWeightRename", "regex": "(?P<g0>norm0(?!\\w))|(?P<g1>blk\\.(\\d+)\\.n(?!\\w))",
                           "targets": ["norm1", "layers.\\1.norm"]}])J");
  CHECK(peft::apply_save_chain(grouped, "a.blk.7.n.weight", true, "t") == "a.layers.7.norm.weight");
  CHECK(peft::apply_save_chain(grouped, "a.norm0.weight", true, "t") == "a.norm1.weight");
  // Steps run in order, each on the previous one's result.
  auto two = chain(R"J([{"kind": "WeightRenaming", "regex": "(?P<g0>a(?!\\w))", "targets": ["b"]},
                       {"kind": "WeightRenaming", "regex": "(?P<g0>b(?!\\w))", "targets": ["c"]}])J");
  CHECK(peft::apply_save_chain(two, "x.a.w", true, "t") == "x.c.w");
}

TEST_CASE("conversions: unsupported and malformed steps") {
  CHECK_FALSE(peft::apply_save_chain(chain(R"J([{"unsupported": "LayerPairCollapse"}])J"), "a.w", true, "t"));
  for (const char* bad : {R"J([{"kind": "WeightRenaming", "regex": "(", "targets": ["x"]}])J",
                          R"J([{"kind": "WeightRenaming", "regex": "(?P<g0>a)", "targets": []}])J",
                          R"J([{"kind": "WeightRenaming", "regex": "(?P<h0>a)", "targets": ["x"]}])J",
                          R"J([{"kind": "WeightRenaming", "targets": ["x"]}])J", R"J([3])J"}) {
    try {
      peft::apply_save_chain(chain(bad), "a.w", true, "t");
      FAIL("accepted: " << bad);
    } catch (const peft::Error& e) {
      CHECK(e.code() == PEFT_ERR_INVALID_CONFIG);
    }
  }
}

TEST_CASE("conversions: every chain of the built-in data compiles") {
  std::ifstream in(std::string(PEFT_TEST_DATA) + "/../../data/conversions/transformers.json");
  REQUIRE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  size_t chains = 0, unsupported = 0;
  auto check = [&](const nlohmann::json& entry, const std::string& what) {
    ++chains;
    // Every regex compiles with the library's engine and every step applies.
    if (!peft::apply_save_chain(entry, "model.language_model.layers.0.mlp.experts.3.w1.weight", true, what)) ++unsupported;
  };
  for (const auto& [name, entry] : doc.at("models").items()) check(entry, "models/" + name);
  for (const auto& [type, classes] : doc.at("composed").items())
    for (const auto& [name, entry] : classes.items()) check(entry, "composed/" + type + "/" + name);
  CHECK(chains > 300);
  CHECK(unsupported < 20);
}
