// Stacked GGUF tensors (Mixtral's experts): where a module is, the table chosen for a GGUF
// architecture several tables read, "gguf_stack" checked when a table loads, and LoRA factors
// stacked (smaller ranks zero-padded: B A unchanged) and unstacked; gpt-oss's interleaved split and
// a GGUF translator's modules of a stacked tensor.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/adapter/adapter_module.hpp"
#include "peft/arch/expert_params.hpp"
#include "peft/arch/gguf_experts.hpp"
#include "peft/arch/translator.hpp"
#include "peft/base/expert_base.hpp"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// B A of single pair i of `f`, row-major (out, in).
std::vector<double> product(const peft::LoraFactors& f, uint64_t i) {
  std::vector<double> out(f.out * f.in, 0.0);
  const float* a = f.a.data() + i * f.rank * f.in;
  const float* b = f.b.data() + i * f.out * f.rank;
  for (uint64_t r = 0; r < f.out; ++r)
    for (uint64_t c = 0; c < f.in; ++c)
      for (uint64_t k = 0; k < f.rank; ++k) out[r * f.in + c] += double(b[r * f.rank + k]) * a[k * f.in + c];
  return out;
}

peft::LoraFactors pair(uint64_t rank, uint64_t in, uint64_t out, float seed) {
  peft::LoraFactors f;
  f.rank = rank, f.in = in, f.out = out;
  for (uint64_t i = 0; i < rank * in; ++i) f.a.push_back(seed + 0.25f * float(i));
  for (uint64_t i = 0; i < out * rank; ++i) f.b.push_back(seed - 0.5f * float(i));
  return f;
}

}  // namespace

TEST_CASE("gguf experts: Mixtral's modules and their slots") {
  auto table = peft::builtin_arch_table("mixtral");
  auto slot = peft::gguf_slot(*table, "model.layers.3.block_sparse_moe.experts.7.w2");
  REQUIRE(slot);
  CHECK(slot->tensor == "blk.3.ffn_down_exps.weight");
  CHECK(slot->slice == 7u);
  slot = peft::gguf_slot(*table, "layers.0.self_attn.q_proj");  // without the base_model_prefix
  REQUIRE(slot);
  CHECK(slot->tensor == "blk.0.attn_q.weight");
  CHECK_FALSE(slot->slice);
  CHECK(slot->rule->gguf_rows == peft::GgufRows::rope_q);
  CHECK_FALSE(peft::gguf_slot(*table, "model.layers.0.input_layernorm"));
  slot = peft::gguf_slot(*table, "model.layers.2.mlp.gate");  // transformers 5's name of the router
  REQUIRE(slot);
  CHECK(slot->tensor == "blk.2.ffn_gate_inp.weight");
  slot = peft::gguf_slot(*table, "layers.2.mlp.gate");
  REQUIRE(slot);
  CHECK(slot->tensor == "blk.2.ffn_gate_inp.weight");
  // A stacked GGUF tensor holds several modules: no single module for it, one per slice.
  CHECK_FALSE(table->module_from_gguf("blk.1.ffn_up_exps"));
  peft::NameTemplate::Captures captures;
  const peft::ModuleRule* rule = table->rule_for_gguf("blk.1.ffn_up_exps", &captures);
  REQUIRE(rule);
  CHECK(peft::gguf_stacked_module(*rule, captures, 2) == "model.layers.1.block_sparse_moe.experts.2.w3");
  CHECK(table->module_from_gguf("blk.1.ffn_gate_inp") == "model.layers.1.block_sparse_moe.gate");
  // An absurd expert number saturates (and is out of range for any base) rather than wrapping.
  slot = peft::gguf_slot(*table, "model.layers.0.block_sparse_moe.experts.99999999999999999999999.w1");
  REQUIRE(slot);
  CHECK(slot->slice == ~uint64_t{0});
}

TEST_CASE("gguf experts: the names an input needs pick among the tables of one GGUF architecture") {
  auto needs = [](const std::string& module) {
    return [module](const peft::ArchTable& t) { return peft::gguf_slot(t, module).has_value(); };
  };
  CHECK(peft::builtin_table_for_gguf("llama")->family() == "llama");
  CHECK(peft::builtin_table_for_gguf("llama", needs("model.layers.0.self_attn.q_proj"))->family() == "llama");
  CHECK(peft::builtin_table_for_gguf("llama", needs("model.layers.0.block_sparse_moe.experts.0.w1"))->family() ==
        "mixtral");
  CHECK(peft::builtin_table_for_gguf("llama", needs("nothing.at.all"))->family() == "llama");
  CHECK(peft::builtin_arch_table("mixtral")->gguf_architecture_of("mixtral") == "llama");
}

TEST_CASE("gguf experts: gguf_stack is checked when a table loads") {
  const char* bad[] = {
      R"({"family": "x", "modules": [{"hf": "e.{i}", "native": "e/{i}", "gguf_stack": "i"}]})",
      R"({"family": "x", "modules": [{"hf": "e.{i}", "native": "e/{i}", "gguf": "t", "gguf_stack": "j"}]})",
      R"({"family": "x", "modules": [{"hf": "e.{i}", "native": "e/{i}", "gguf": "t.{i}", "gguf_stack": "i"}]})",
      R"({"family": "x", "modules": [{"hf": "e.{i}", "native": "e/{i}", "gguf": "t", "gguf_stack": "i",
                                      "gguf_rows": "rope_q"}]})",
  };
  for (const char* json : bad) {
    CAPTURE(json);
    try {
      peft::ArchTable::parse(json, "test-table");
      FAIL("accepted");
    } catch (const peft::Error& e) {
      CHECK(e.code() == PEFT_ERR_INVALID_CONFIG);
      CHECK(contains(e.what(), "modules[0]"));
    }
  }
  auto ok = peft::ArchTable::parse(
      R"({"family": "x", "modules": [{"hf": "l.{l}.e.{i}", "native": "l/{l}/e/{i}", "gguf": "t.{l}", "gguf_stack": "i"}]})",
      "test-table");
  CHECK(ok->modules()[0].gguf_stack == "i");
}

TEST_CASE("gguf experts: stacking zero-pads smaller ranks and keeps every B A; unstacking gives the slices back") {
  const std::vector<peft::LoraFactors> slices = {pair(2, 3, 4, 1.0f), pair(3, 3, 4, -2.0f), pair(1, 3, 4, 0.5f)};
  const peft::LoraFactors stacked = peft::stack_lora(slices, 3, "t");
  CHECK(stacked.count == 3);
  CHECK(stacked.rank == 3);
  CHECK(stacked.a.size() == 3 * 3 * 3);
  CHECK(stacked.b.size() == 3 * 4 * 3);
  for (uint64_t i = 0; i < 3; ++i) CHECK(product(stacked, i) == product(slices[i], 0));
  const std::vector<peft::LoraFactors> back = peft::unstack_lora(stacked);
  REQUIRE(back.size() == 3);
  CHECK(back[1].a == slices[1].a);
  CHECK(back[1].b == slices[1].b);
  CHECK(product(back[0], 0) == product(slices[0], 0));
  CHECK(back[0].rank == 3);

  try {
    peft::stack_lora({pair(2, 3, 4, 1.0f), pair(2, 5, 4, 1.0f)}, 2, "GGUF tensor \"t\"");
    FAIL("accepted");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_SHAPE_MISMATCH);
    CHECK(contains(e.what(), "slice 1"));
  }
  CHECK(peft::missing_slices({2, 0}, 4) == "1, 3");
  CHECK(peft::missing_slices({1, 0}, 2).empty());
}

TEST_CASE("gguf tables: gguf_output_always_tied names GGUF architectures of the table") {
  auto ok = peft::ArchTable::parse(
      R"({"family": "x", "gguf_architectures": {"a": ["a"], "b": ["b"]}, "gguf_output_always_tied": ["a"], "modules": []})", "t");
  CHECK(ok->gguf_output_always_tied("a"));
  CHECK_FALSE(ok->gguf_output_always_tied("b"));
  try {
    peft::ArchTable::parse(R"({"family": "x", "gguf_architectures": {"a": ["a"]}, "gguf_output_always_tied": ["c"], "modules": []})",
                           "t");
    FAIL("accepted");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(e.what(), "\"gguf_output_always_tied\" names \"c\""));
  }
  // The built-in Gemma table: llama.cpp's gemma and gemma2 read no output.weight, gemma3 may.
  const auto gemma = peft::builtin_arch_table("gemma");
  CHECK(gemma->gguf_output_always_tied("gemma2"));
  CHECK_FALSE(gemma->gguf_output_always_tied("gemma3"));
}

TEST_CASE("gguf names: a vision-language model's language model is named as its text model, as llama.cpp's converter does") {
  CHECK(peft::language_model_path("model.language_model.layers.0.self_attn.q_proj") == "model.layers.0.self_attn.q_proj");
  CHECK(peft::language_model_path("language_model.model.layers.0.self_attn.q_proj") == "model.layers.0.self_attn.q_proj");
  CHECK(peft::language_model_path("language_model.lm_head") == "lm_head");
  CHECK_FALSE(peft::language_model_path("model.vision_tower.encoder.layers.0.self_attn.q_proj"));
  CHECK_FALSE(peft::language_model_path("model.my_language_model.layers.0.self_attn.q_proj"));  // a component only
  CHECK_FALSE(peft::language_model_path("model.layers.0.language_model"));

  const auto llama = peft::builtin_arch_table("llama");
  for (const char* name : {"model.language_model.layers.1.self_attn.v_proj", "language_model.model.layers.1.self_attn.v_proj",
                           "model.layers.1.self_attn.v_proj"}) {
    const auto slot = peft::gguf_slot(*llama, name);
    REQUIRE_MESSAGE(slot, name);
    CHECK(slot->tensor == "blk.1.attn_v.weight");
  }
  CHECK_FALSE(peft::gguf_slot(*llama, "model.vision_tower.encoder.layers.1.self_attn.v_proj"));
  // Gemma's table names model.language_model.* for its native names only; GGUF takes the text model's.
  const auto gemma = peft::builtin_arch_table("gemma");
  const auto slot = peft::gguf_slot(*gemma, "model.language_model.layers.0.mlp.down_proj");
  REQUIRE(slot);
  CHECK(slot->tensor == "blk.0.ffn_down.weight");
}

TEST_CASE("gguf experts: gpt-oss's fused gate_up_proj splits by interleaved rows, as llama.cpp's converter does") {
  auto table = peft::builtin_arch_table("gpt_oss");
  const std::vector<peft::ExpertsRule> rules = peft::expert_rules(*table);
  REQUIRE(rules.size() == 1);
  REQUIRE(rules[0].params.size() == 2);
  CHECK(rules[0].params[0].name == "gate_up_proj");
  CHECK(rules[0].params[0].transposed);
  CHECK(rules[0].params[0].interleaved);
  CHECK_FALSE(rules[0].params[1].interleaved);
  auto slot = peft::gguf_slot(*table, "model.layers.1.mlp.experts.2.up_proj");
  REQUIRE(slot);
  CHECK(slot->tensor == "blk.1.ffn_up_exps.weight");
  CHECK(slot->slice == 2u);

  // Expert 1 of 2, rank 1, out 4 (gate rows 0 and 2, up rows 1 and 3).
  peft::AdapterModule m;
  m.name = "model.layers.0.mlp.experts.base_layer";
  m.expert = peft::ExpertTarget{"model.layers.0.mlp.experts", "gate_up_proj", "model.layers.0.mlp.experts", true,
                                {"gate_proj.weight", "up_proj.weight"}, 2, true};
  const std::vector<peft::ExpertPart> parts = peft::per_expert_parts(m, {2, 1, 3, 4});
  REQUIRE(parts.size() == 4);
  CHECK(parts[2].tensor == "model.layers.0.mlp.experts.1.gate_proj.weight");
  CHECK(parts[2].expert == 1);
  CHECK(parts[2].row_begin == 0);
  CHECK(parts[3].row_begin == 1);
  CHECK(parts[3].rows == 2);
  CHECK(parts[3].row_stride == 2);

  // A table whose split is neither "consecutive" nor "interleaved" is refused.
  auto bad = peft::ArchTable::parse(R"({"family": "x", "modules": [{"hf": "l.{l}.e", "native": "l/{l}/e"}],
    "experts": [{"module": "l.{l}.e", "params": [{"name": "gate_up_proj", "per_expert": ["g.weight", "u.weight"],
                                                   "split": "odd"}]}]})",
                                    "test-table");
  try {
    peft::expert_rules(*bad);
    FAIL("a split of \"odd\" was accepted");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_INVALID_CONFIG);
    CHECK(contains(e.what(), "\"split\""));
  }
}

TEST_CASE("gguf experts: a translator of GGUF names gives a stacked tensor's module per slice") {
  const peft::Translator t = peft::Translator::for_gguf("qwen3moe", {4, 2});
  CHECK(t.gguf_slice_modules("blk.3.ffn_down_exps.weight", 2) ==
        std::vector<std::string>{"model.layers.3.mlp.experts.0.down_proj", "model.layers.3.mlp.experts.1.down_proj"});
  CHECK(t.gguf_slice_modules("blk.3.attn_q.weight", 2).empty());
  CHECK(peft::Translator::for_family("qwen3_moe").gguf_slice_modules("blk.3.ffn_down_exps.weight", 2).empty());
}
