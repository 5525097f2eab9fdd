// The row orders llama.cpp's converter gives weights in GGUF: the raw permutations (gguf/rope_rows,
// gguf/qkv_rows) against hand-computed examples and the converter's own reshape, each direction the
// inverse of the other; the head counts from config.json; the problems reported before any reorder.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "gguf/qkv_rows.hpp"
#include "gguf/rope_rows.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/gguf_row_order.hpp"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<uint64_t> qkv_rows(uint64_t heads, uint64_t kv_heads, uint64_t head_rows) {
  std::vector<uint64_t> out;
  for (uint64_t r = 0; r < (heads + 2 * kv_heads) * head_rows; ++r)
    out.push_back(peft::fused_qkv_pytorch_row(r, heads, kv_heads, head_rows));
  return out;
}

// conversion/falcon.py, written out: view(kv, heads / kv + 2, d, cols); cat(q, k, v). Each value
// of the result is the PyTorch row it came from.
std::vector<uint64_t> falcon_converter(uint64_t heads, uint64_t kv_heads, uint64_t d) {
  const uint64_t per = heads / kv_heads;
  std::vector<uint64_t> q, k, v;
  for (uint64_t g = 0; g < kv_heads; ++g)
    for (uint64_t s = 0; s < per + 2; ++s)
      for (uint64_t i = 0; i < d; ++i) {
        const uint64_t row = (g * (per + 2) + s) * d + i;
        (s < per ? q : s == per ? k : v).push_back(row);
      }
  q.insert(q.end(), k.begin(), k.end());
  q.insert(q.end(), v.begin(), v.end());
  return q;
}

// A matrix of `rows` rows of 3 floats, row r holding r, r + 0.25, r + 0.5.
std::vector<float> numbered(uint64_t rows) {
  std::vector<float> m;
  for (uint64_t r = 0; r < rows; ++r)
    for (float f : {0.0f, 0.25f, 0.5f}) m.push_back(static_cast<float>(r) + f);
  return m;
}

peft::GgufHeads heads(uint64_t h, uint64_t kv) { return {h, kv}; }

}  // namespace

TEST_CASE("gguf row order: fused QKV per head (GPT-NeoX, BLOOM) against a hand-computed example") {
  // PyTorch [q0 k0 v0 q1 k1 v1] (one row per head) -> GGUF [q0 q1 k0 k1 v0 v1].
  CHECK(qkv_rows(2, 2, 1) == std::vector<uint64_t>{0, 3, 1, 4, 2, 5});
  // Two rows per head.
  CHECK(qkv_rows(2, 2, 2) == std::vector<uint64_t>{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11});
}

TEST_CASE("gguf row order: fused QKV per key/value group (Falcon) against a hand-computed example") {
  // PyTorch [q0 q1 k0 v0 | q2 q3 k1 v1] -> GGUF [q0 q1 q2 q3 k0 k1 v0 v1].
  CHECK(qkv_rows(4, 2, 1) == std::vector<uint64_t>{0, 1, 4, 5, 2, 6, 3, 7});
  // One key/value head (multi-query): PyTorch [q0 q1 k v] is already GGUF's order.
  CHECK(qkv_rows(2, 1, 2) == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("gguf row order: fused QKV equals the converter's reshape and is a permutation") {
  for (const auto& heads : std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>{
           {1, 1, 4}, {2, 2, 8}, {4, 2, 3}, {8, 2, 4}, {6, 3, 2}, {4, 1, 5}, {12, 4, 6}}) {
    // Plain variables (not structured bindings), which clang 15's CAPTURE lambdas cannot capture.
    const uint64_t h = std::get<0>(heads), kv = std::get<1>(heads), d = std::get<2>(heads);
    CAPTURE(h);
    CAPTURE(kv);
    CAPTURE(d);
    const std::vector<uint64_t> rows = qkv_rows(h, kv, d);
    CHECK(rows == falcon_converter(h, kv, d));
    std::vector<uint64_t> sorted = rows;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint64_t> all(rows.size());
    std::iota(all.begin(), all.end(), uint64_t{0});
    CHECK(sorted == all);
  }
}

TEST_CASE("gguf row order: reorder to GGUF and back is the identity, for every order") {
  struct Case {
    peft::GgufRows order;
    peft::GgufHeads heads;
    uint64_t rows;
  };
  for (const Case& c : {Case{peft::GgufRows::rope_q, heads(2, 1), 8}, Case{peft::GgufRows::rope_k, heads(4, 2), 12},
                        Case{peft::GgufRows::qkv_per_head, heads(2, 2), 12},
                        Case{peft::GgufRows::qkv_per_kv_group, heads(4, 2), 16},
                        Case{peft::GgufRows::qkv_per_kv_group, heads(6, 2), 20}}) {
    CAPTURE(static_cast<int>(c.order));
    const std::vector<float> original = numbered(c.rows);
    std::vector<float> m = original;
    peft::reorder_gguf_rows(c.order, c.heads, m.data(), c.rows, 3 * sizeof(float), false, "test");
    CHECK(m != original);
    peft::reorder_gguf_rows(c.order, c.heads, m.data(), c.rows, 3 * sizeof(float), true, "test");
    CHECK(m == original);
  }
}

TEST_CASE("gguf row order: to GGUF moves whole rows where the permutation says") {
  // GPT-NeoX with 2 heads of one row: GGUF row 1 is PyTorch row 3 (q1), row 2 is PyTorch row 1 (k0).
  std::vector<float> m = numbered(6);
  peft::reorder_gguf_rows(peft::GgufRows::qkv_per_head, heads(2, 2), m.data(), 6, 3 * sizeof(float), false, "t");
  CHECK(m == std::vector<float>{0, 0.25f, 0.5f, 3, 3.25f, 3.5f, 1, 1.25f, 1.5f, 4, 4.25f, 4.5f, 2, 2.25f, 2.5f,
                                5, 5.25f, 5.5f});
  // qkv_per_head runs over the attention heads whatever the key/value count says.
  std::vector<float> n = numbered(6);
  peft::reorder_gguf_rows(peft::GgufRows::qkv_per_head, heads(2, 1), n.data(), 6, 3 * sizeof(float), false, "t");
  CHECK(n == m);
  // RoPE: heads of 4 rows, GGUF row 1 is PyTorch row 2 (the second half's first row).
  std::vector<float> r = numbered(4);
  peft::reorder_gguf_rows(peft::GgufRows::rope_q, heads(1, 1), r.data(), 4, 3 * sizeof(float), false, "t");
  CHECK(r == std::vector<float>{0, 0.25f, 0.5f, 2, 2.25f, 2.5f, 1, 1.25f, 1.5f, 3, 3.25f, 3.5f});
}

TEST_CASE("gguf row order: problems are reported before any reorder") {
  using peft::GgufRows;
  CHECK_FALSE(peft::gguf_rows_problem(GgufRows::same, {}, 7));
  CHECK_FALSE(peft::gguf_rows_problem(GgufRows::qkv_per_kv_group, heads(4, 2), 32));
  CHECK(contains(*peft::gguf_rows_problem(GgufRows::qkv_per_head, {}, 12), "no attention head count"));
  CHECK(contains(*peft::gguf_rows_problem(GgufRows::qkv_per_kv_group, {4, std::nullopt}, 12), "no key/value head count"));
  CHECK(contains(*peft::gguf_rows_problem(GgufRows::qkv_per_kv_group, heads(4, 3), 30), "do not split into 3"));
  // Falcon's multi-query layout read with as many key/value heads as attention heads: 2 + 2 x 2
  // heads do not divide 32 rows (llama.cpp's converter fails on it too).
  const auto problem = peft::gguf_rows_problem(GgufRows::qkv_per_kv_group, heads(2, 2), 32);
  REQUIRE(problem);
  CHECK(contains(*problem, "32 rows are not 2 query + 2 key + 2 value heads"));
  CHECK(peft::gguf_rows_problem(GgufRows::qkv_per_head, heads(2, 2), 0));
  CHECK(contains(*peft::gguf_rows_problem(GgufRows::rope_k, heads(4, 3), 8), "key/value head count"));
  std::vector<float> m = numbered(32);
  try {
    peft::reorder_gguf_rows(GgufRows::qkv_per_kv_group, heads(2, 2), m.data(), 32, 3 * sizeof(float), true,
                            "tensor \"blk.0.attn_qkv.weight\"");
    FAIL("reordered");
  } catch (const peft::Error& e) {
    CHECK(e.code() == PEFT_ERR_SHAPE_MISMATCH);
    CHECK(contains(e.what(), "blk.0.attn_qkv.weight"));
  }
  CHECK(m == numbered(32));
}

TEST_CASE("gguf row order: head counts from config.json as llama.cpp's converter reads them") {
  using nlohmann::json;
  auto check = [](const char* text, std::optional<uint64_t> h, std::optional<uint64_t> kv) {
    CAPTURE(text);
    const json config = json::parse(text);
    const peft::GgufHeads got = peft::gguf_heads_from_config(config);
    CHECK(got.heads == h);
    CHECK(got.kv_heads == kv);
  };
  check(R"({"num_attention_heads": 8, "num_key_value_heads": 2})", 8, 2);                        // llama
  check(R"({"num_attention_heads": 8})", 8, 8);                                                  // gpt_neox
  check(R"({"model_type": "bloom", "n_head": 4})", 4, 4);                                        // bloom
  check(R"({"model_type": "falcon", "num_attention_heads": 4, "num_kv_heads": 2})", 4, 2);
  check(R"({"model_type": "falcon", "num_attention_heads": 4})", 4, 4);                          // FalconConfig
  check(R"({"model_type": "RefinedWeb", "n_head": 8, "n_head_kv": 2})", 8, 2);                   // falcon-40b
  check(R"({"model_type": "RefinedWebModel", "n_head": 8})", 8, 1);                              // falcon-7b
  check(R"({"model_type": "gpt2", "n_head": -1})", std::nullopt, std::nullopt);
  check("[]", std::nullopt, std::nullopt);
}

TEST_CASE("gguf row order: the fused-QKV tables name their orders") {
  struct Case {
    const char* family;
    const char* module;
    peft::GgufRows rows;
  };
  for (const Case& c : {Case{"gpt_neox", "gpt_neox.layers.3.attention.query_key_value", peft::GgufRows::qkv_per_head},
                        Case{"bloom", "transformer.h.3.self_attention.query_key_value", peft::GgufRows::qkv_per_head},
                        Case{"falcon", "transformer.h.3.self_attention.query_key_value", peft::GgufRows::qkv_per_kv_group},
                        Case{"gpt2", "transformer.h.3.attn.c_attn", peft::GgufRows::same}}) {
    CAPTURE(c.family);
    const auto table = peft::builtin_arch_table(c.family);
    const peft::ModuleRule* rule = table->rule_for_hf(c.module);
    REQUIRE(rule != nullptr);
    CHECK(rule->gguf_rows == c.rows);
    CHECK(table->module_to_gguf(c.module) == std::optional<std::string>("blk.3.attn_qkv"));
    CHECK(table->module_from_gguf("blk.3.attn_qkv") == std::optional<std::string>(c.module));
  }
  CHECK(peft::builtin_arch_table("gpt_neox")->reads_gguf_architecture("gptneox"));
  CHECK(peft::builtin_arch_table("falcon")->gguf_architecture_of("RefinedWebModel") == std::optional<std::string>("falcon"));
  try {
    peft::ArchTable::parse(R"({"family": "x", "modules": [
        {"hf": "a", "native": "a", "kind": "linear", "gguf": "a", "gguf_rows": "qkv"}]})", "test-table");
    FAIL("accepted");
  } catch (const peft::Error& e) {
    CHECK(contains(e.what(), "qkv_per_head or qkv_per_kv_group"));
  }
}
