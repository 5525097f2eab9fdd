// Adapter combination (PEFT's add_weighted_adapter "cat" and "linear") into adapter folders: the
// config PEFT derives, the factors module by module, modules in only some adapters, refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "peft/combine/adapter_combine.hpp"
#include "test_adapter_export_support.hpp"

using namespace export_test;

namespace {

using Adapters = std::vector<std::shared_ptr<const peft::Adapter>>;

Adapters open_all(std::initializer_list<std::string> dirs) {
  Adapters out;
  for (const std::string& d : dirs) out.push_back(open_adapter(d.find('/') == std::string::npos ? fixture_adapter(d) : d));
  return out;
}

void combine(const Adapters& adapters, std::vector<double> weights, peft::CombineMethod method, const std::string& out,
             const peft::ExportOptions& options = {}) {
  peft::combine_adapters(adapters, weights, method, out, options);
}

std::vector<float> factor_of(const peft::Adapter& a, const peft::AdapterModule& m, const char* suffix) {
  return a.checkpoint().read_f32(m.find_suffix(suffix)->index);
}

// The config PEFT's add_weighted_adapter derives: the first adapter's, with these fields replaced.
nlohmann::json derived_config(const std::string& first, int64_t rank, const nlohmann::json& targets) {
  nlohmann::json c = read_json(fixture_adapter(first) + "/adapter_config.json");
  c["r"] = rank;
  c["lora_alpha"] = rank;
  c["target_modules"] = targets;
  c["rank_pattern"] = nlohmann::json::object();
  c["alpha_pattern"] = nlohmann::json::object();
  c["inference_mode"] = true;
  return c;
}

}  // namespace

TEST_CASE("adapter combine: cat stacks w*s*A rows and B columns; the config is PEFT's") {
  ScratchDir scratch;
  const Adapters in = open_all({"llama_lora", "llama_lora_second"});
  const std::vector<double> w = {0.7, -1.3};
  const std::string out = scratch.path("cat");
  combine(in, w, peft::CombineMethod::cat, out);

  const nlohmann::json targets = {"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"};
  CHECK(read_json(out + "/adapter_config.json") == derived_config("llama_lora", 8, targets));
  auto combined = open_adapter(out);
  REQUIRE(combined->modules().size() == in[0]->modules().size());
  for (const peft::AdapterModule& m : combined->modules()) {
    CAPTURE(m.name);
    CHECK(m.rank == 8);
    CHECK(m.scaling == 1.0);
    const auto a = factor_of(*combined, m, "lora_A.weight");
    const auto b = factor_of(*combined, m, "lora_B.weight");
    const size_t in_dim = a.size() / 8, out_dim = b.size() / 8;
    for (size_t i = 0; i < 2; ++i) {
      const peft::AdapterModule* src = in[i]->find_module(m.name);
      REQUIRE(src);
      const auto sa = factor_of(*in[i], *src, "lora_A.weight");
      const auto sb = factor_of(*in[i], *src, "lora_B.weight");
      // torch: lora_A * weight * scaling, two f32 products
      const float fw = static_cast<float>(w[i]), fs = static_cast<float>(src->scaling);
      for (size_t k = 0; k < 4; ++k)
        for (size_t j = 0; j < in_dim; ++j) CHECK(a[(i * 4 + k) * in_dim + j] == (sa[k * in_dim + j] * fw) * fs);
      for (size_t o = 0; o < out_dim; ++o)
        for (size_t k = 0; k < 4; ++k) CHECK(b[o * 8 + i * 4 + k] == sb[o * 4 + k]);
    }
  }
}

TEST_CASE("adapter combine: linear sums sqrt-weighted factors with the sign on A") {
  ScratchDir scratch;
  const Adapters in = open_all({"llama_lora_second", "llama_lora"});
  const std::vector<double> w = {-0.5, 2.0};
  const std::string out = scratch.path("linear");
  combine(in, w, peft::CombineMethod::linear, out);
  const nlohmann::json targets = {"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"};
  CHECK(read_json(out + "/adapter_config.json") == derived_config("llama_lora_second", 4, targets));
  auto combined = open_adapter(out);
  for (const peft::AdapterModule& m : combined->modules()) {
    CAPTURE(m.name);
    CHECK(m.rank == 4);
    auto a = factor_of(*combined, m, "lora_A.weight");
    auto b = factor_of(*combined, m, "lora_B.weight");
    std::vector<float> ea(a.size(), 0.0f), eb(b.size(), 0.0f);
    for (size_t i = 0; i < 2; ++i) {
      const peft::AdapterModule* src = in[i]->find_module(m.name);
      const double c = w[i] * src->scaling;
      const float wa = static_cast<float>(c >= 0 ? std::sqrt(std::fabs(c)) : -std::sqrt(std::fabs(c)));
      const float wb = static_cast<float>(std::sqrt(std::fabs(c)));
      const auto sa = factor_of(*in[i], *src, "lora_A.weight");
      const auto sb = factor_of(*in[i], *src, "lora_B.weight");
      for (size_t j = 0; j < ea.size(); ++j) {
        const float t = sa[j] * wa;
        ea[j] = ea[j] + t;
      }
      for (size_t j = 0; j < eb.size(); ++j) {
        const float t = sb[j] * wb;
        eb[j] = eb[j] + t;
      }
    }
    CHECK(a == ea);
    CHECK(b == eb);
  }
}

TEST_CASE("adapter combine: modules in only some adapters, zero padding, use_rslora inherited") {
  ScratchDir scratch;
  // llama_rslora adapts attention only; llama_lora also the MLP. The first adapter's use_rslora is
  // inherited, as PEFT's replace(config, ...) does.
  const Adapters in = open_all({"llama_rslora", "llama_lora"});
  const std::string out = scratch.path("cat");
  combine(in, {1.0, 1.0}, peft::CombineMethod::cat, out);
  const nlohmann::json config = read_json(out + "/adapter_config.json");
  CHECK(config["use_rslora"] == true);
  CHECK(config["r"] == 8);
  auto combined = open_adapter(out);
  CHECK(combined->modules().size() == in[1]->modules().size());
  const peft::AdapterModule* mlp = combined->find_module("model.layers.0.mlp.up_proj");
  REQUIRE(mlp);
  CHECK(mlp->scaling == doctest::Approx(8.0 / std::sqrt(8.0)));
  const peft::AdapterModule* src = in[1]->find_module("model.layers.0.mlp.up_proj");
  const auto a = factor_of(*combined, *mlp, "lora_A.weight");
  const auto b = factor_of(*combined, *mlp, "lora_B.weight");
  const auto sa = factor_of(*in[1], *src, "lora_A.weight");
  const auto sb = factor_of(*in[1], *src, "lora_B.weight");
  const size_t in_dim = sa.size() / 4, out_dim = sb.size() / 4;
  for (size_t k = 0; k < 8; ++k)
    for (size_t j = 0; j < in_dim; ++j)
      CHECK(a[k * in_dim + j] == (k < 4 ? (sa[k * in_dim + j] * 1.0f) * static_cast<float>(src->scaling) : 0.0f));
  for (size_t o = 0; o < out_dim; ++o)
    for (size_t k = 0; k < 8; ++k) CHECK(b[o * 8 + k] == (k < 4 ? sb[o * 4 + k] : 0.0f));
}

TEST_CASE("adapter combine: cat allocates max(r, rank_pattern) per adapter; linear needs equal ranks") {
  ScratchDir scratch;
  const Adapters in = open_all({"llama_rank_alpha_pattern", "llama_lora"});
  const std::string out = scratch.path("cat");
  combine(in, {1.0, 0.5}, peft::CombineMethod::cat, out);
  auto combined = open_adapter(out);
  CHECK(read_json(out + "/adapter_config.json")["r"] == 12);
  for (const peft::AdapterModule& m : combined->modules()) CHECK(m.rank == 12);
  // layer 1 k_proj: rank 2 (rank_pattern) + 4, padded to 12 with zero rows.
  const peft::AdapterModule* k1 = combined->find_module("model.layers.1.self_attn.k_proj");
  REQUIRE(k1);
  const auto a = factor_of(*combined, *k1, "lora_A.weight");
  const size_t in_dim = a.size() / 12;
  for (size_t j = 6 * in_dim; j < a.size(); ++j) CHECK(a[j] == 0.0f);
  bool nonzero = false;
  for (size_t j = 0; j < 6 * in_dim; ++j) nonzero = nonzero || a[j] != 0.0f;
  CHECK(nonzero);

  CHECK(code_of([&] { combine(in, {1.0, 0.5}, peft::CombineMethod::linear, scratch.path("lin")); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK_FALSE(fs::exists(scratch.path("lin")));
}

TEST_CASE("adapter combine: one adapter combines as linear, as in PEFT") {
  ScratchDir scratch;
  const Adapters in = open_all({"llama_lora"});
  combine(in, {2.0}, peft::CombineMethod::cat, scratch.path("one"));
  auto combined = open_adapter(scratch.path("one"));
  const peft::AdapterModule& m = combined->modules().at(0);
  CHECK(m.rank == 4);
  const peft::AdapterModule* src = in[0]->find_module(m.name);
  const float root = static_cast<float>(std::sqrt(2.0 * src->scaling));
  const auto a = factor_of(*combined, m, "lora_A.weight");
  const auto sa = factor_of(*in[0], *src, "lora_A.weight");
  for (size_t j = 0; j < a.size(); ++j) CHECK(a[j] == 0.0f + sa[j] * root);
}

TEST_CASE("adapter combine: regex targets are joined, embeddings combine like linear layers") {
  ScratchDir scratch;
  const Adapters regex = open_all({"llama_regex", "llama_regex"});
  combine(regex, {1.0, 1.0}, peft::CombineMethod::cat, scratch.path("regex"));
  const std::string pattern = read_json(fixture_adapter("llama_regex") + "/adapter_config.json")["target_modules"];
  CHECK(read_json(scratch.path("regex") + "/adapter_config.json")["target_modules"] ==
        "(" + pattern + ")|(" + pattern + ")");

  // llama_embedding holds full embedding / lm_head copies, which add_weighted_adapter does not carry.
  const Adapters emb = open_all({"llama_embedding", "llama_lora"});
  CHECK(code_of([&] { combine(emb, {1.0, 1.0}, peft::CombineMethod::cat, scratch.path("emb")); }) ==
        PEFT_ERR_UNSUPPORTED);

  // Without them (a synthetic pair), lora_embedding_A/B stack like lora_A/B.
  const std::string e1 = scratch.path("e1"), e2 = scratch.path("e2");
  const auto emb_pair = [](uint32_t seed) {
    return std::vector<FakeTensor>{
        {"base_model.model.model.embed_tokens.lora_embedding_A", {4, 32}, pseudo_random(128, seed)},
        {"base_model.model.model.embed_tokens.lora_embedding_B", {8, 4}, pseudo_random(32, seed + 1)}};
  };
  write_adapter(e1, config_text({{"target_modules", {"embed_tokens"}}}), emb_pair(1));
  write_adapter(e2, config_text({{"target_modules", {"embed_tokens"}}}), emb_pair(7));
  combine(open_all({e1, e2}), {1.0, 1.0}, peft::CombineMethod::cat, scratch.path("emb_cat"));
  CHECK(tensor_shape(scratch.path("emb_cat"), "base_model.model.model.embed_tokens.lora_embedding_A") ==
        std::vector<uint64_t>{8, 32});
  CHECK(tensor_shape(scratch.path("emb_cat"), "base_model.model.model.embed_tokens.lora_embedding_B") ==
        std::vector<uint64_t>{8, 8});
  CHECK(open_adapter(scratch.path("emb_cat"))->modules().at(0).kind == peft::LayerKind::embedding);
}

TEST_CASE("adapter combine: what PEFT cannot combine is refused, naming the reason") {
  ScratchDir scratch;
  const struct {
    std::vector<std::string> adapters;
    int32_t code;
    const char* needle;
  } cases[] = {
      {{"llama_dora", "llama_lora"}, PEFT_ERR_UNSUPPORTED, "DoRA"},
      {{"llama_lora", "llama_dora"}, PEFT_ERR_UNSUPPORTED, "DoRA"},
      {{"qwen2_lora_bias", "qwen2_lora"}, PEFT_ERR_UNSUPPORTED, "lora_bias"},
      {{"bert_seqcls_lora", "bert_seqcls_lora"}, PEFT_ERR_UNSUPPORTED, "modules_to_save"},
      {{"llama_trainable_tokens", "llama_lora"}, PEFT_ERR_UNSUPPORTED, "trainable"},
      {{"llama_regex", "llama_lora"}, PEFT_ERR_UNSUPPORTED, "regular expressions"},
      // the first adapter's layers_to_transform=[1] is inherited: layer 0 would be dropped
      {{"llama_layers_to_transform", "llama_lora"}, PEFT_ERR_UNSUPPORTED, "model.layers.0."},
      {{"llama_exclude_modules", "llama_lora"}, PEFT_ERR_UNSUPPORTED, "model.layers.0.mlp"},
  };
  int k = 0;
  for (const auto& c : cases) {
    CAPTURE(c.adapters[0]);
    CAPTURE(c.adapters[1]);
    Adapters in;
    for (const std::string& a : c.adapters) in.push_back(open_adapter(fixture_adapter(a)));
    const std::string out = scratch.path(std::to_string(k++));
    std::string message;
    int32_t code = PEFT_OK;
    try {
      combine(in, {1.0, 1.0}, peft::CombineMethod::cat, out);
    } catch (const peft::Error& e) {
      code = e.code();
      message = e.what();
    }
    CHECK(code == c.code);
    CHECK(message.find(c.needle) != std::string::npos);
    CHECK_FALSE(fs::exists(out));
  }
  // The other order works: llama_lora targets every layer.
  combine(open_all({"llama_lora", "llama_layers_to_transform"}), {1.0, 1.0}, peft::CombineMethod::cat,
          scratch.path("ok"));
  CHECK(open_adapter(scratch.path("ok"))->modules().size() == 14);
}

TEST_CASE("adapter combine: shapes must agree, arguments must make sense") {
  ScratchDir scratch;
  write_adapter(scratch.path("a"), config_text({}), lora_pair("m.q_proj", 4, 8, 8, 1));
  write_adapter(scratch.path("b"), config_text({}), lora_pair("m.q_proj", 4, 6, 8, 3));
  const Adapters mismatched = open_all({scratch.path("a"), scratch.path("b")});
  const std::string message = error_of([&] { combine(mismatched, {1, 1}, peft::CombineMethod::cat, scratch.path("x")); });
  CHECK(message.find("m.q_proj") != std::string::npos);
  CHECK(code_of([&] { combine(mismatched, {1, 1}, peft::CombineMethod::cat, scratch.path("x")); }) ==
        PEFT_ERR_SHAPE_MISMATCH);

  const Adapters two = open_all({"llama_lora", "llama_lora_second"});
  CHECK(code_of([&] { combine({}, {}, peft::CombineMethod::cat, scratch.path("x")); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { combine(two, {1.0}, peft::CombineMethod::cat, scratch.path("x")); }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] {
          combine(two, {1.0, std::numeric_limits<double>::quiet_NaN()}, peft::CombineMethod::cat, scratch.path("x"));
        }) == PEFT_ERR_INVALID_ARGUMENT);
  CHECK(code_of([&] { combine({two[0], nullptr}, {1, 1}, peft::CombineMethod::cat, scratch.path("x")); }) ==
        PEFT_ERR_INVALID_ARGUMENT);
  CHECK_FALSE(fs::exists(scratch.path("x")));
}

TEST_CASE("adapter combine: all-linear targets count as the adapter's modules; options apply") {
  ScratchDir scratch;
  std::vector<FakeTensor> t1 = lora_pair("m.layers.0.q_proj", 4, 8, 8, 1);
  for (auto& t : lora_pair("m.layers.0.fc", 4, 8, 8, 5)) t1.push_back(t);
  write_adapter(scratch.path("a"), config_text({{"target_modules", "all-linear"}}), t1);
  write_adapter(scratch.path("b"), config_text({{"target_modules", {"q_proj"}}}), lora_pair("m.layers.0.q_proj", 4, 8, 8, 9));
  peft::ExportOptions options;
  options.dtype = peft::DType::BF16;
  options.peft_version = peft::parse_peft_version("0.13");
  combine(open_all({scratch.path("a"), scratch.path("b")}), {1.0, 1.0}, peft::CombineMethod::linear, scratch.path("c"),
          options);
  const nlohmann::json config = read_json(scratch.path("c") + "/adapter_config.json");
  CHECK(config["target_modules"] == nlohmann::json{"m.layers.0.fc", "m.layers.0.q_proj", "q_proj"});
  auto combined = open_adapter(scratch.path("c"));
  CHECK(combined->modules().size() == 2);
  for (size_t i = 0; i < combined->checkpoint().tensor_count(); ++i)
    CHECK(combined->checkpoint().tensor(i).dtype == peft::DType::BF16);
}
