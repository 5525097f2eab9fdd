// Every real adapter of the corpus opens, and its modules hold every tensor of the file exactly once.
// (The interop test tests/interop/test_adapter_matching.py compares ranks, alphas and scalings with
// PEFT's own functions.)
#include <doctest/doctest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/translator.hpp"
#include "peft_test_paths.h"

namespace fs = std::filesystem;

namespace {

std::vector<std::string> corpus_adapters() {
  std::vector<std::string> dirs;
  std::error_code ec;
  if (!fs::is_directory(PEFT_CORPUS, ec)) return dirs;
  for (const auto& entry : fs::recursive_directory_iterator(PEFT_CORPUS, ec))
    if (entry.path().filename() == "adapter_config.json") dirs.push_back(entry.path().parent_path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

}  // namespace

TEST_CASE("adapter corpus: every real adapter opens and accounts for every tensor") {
  auto dirs = corpus_adapters();
  if (dirs.empty()) {
    MESSAGE("skipped: corpus not found at " PEFT_CORPUS);
    return;
  }
  CHECK(dirs.size() >= 10);
  for (const std::string& dir : dirs) {
    CAPTURE(dir);
    std::shared_ptr<const peft::Adapter> adapter;
    REQUIRE_NOTHROW(adapter = peft::Adapter::open(dir, {}));
    std::set<size_t> seen;
    size_t lora_modules = 0;
    for (const peft::AdapterModule& m : adapter->modules()) {
      for (const peft::AdapterTensor& t : m.tensors) CHECK(seen.insert(t.index).second);
      if (m.is_lora()) {
        ++lora_modules;
        CHECK(m.rank > 0);
        CHECK(m.scaling == doctest::Approx(m.alpha / static_cast<double>(m.rank)));
      }
    }
    CHECK(seen.size() == adapter->checkpoint().tensor_count());
    CHECK(lora_modules > 0);
    // Every corpus adapter names a base whose family the built-in tables know.
    CHECK(adapter->table() != nullptr);
  }
}

TEST_CASE("adapter corpus: GPT-2 adapters are Conv1D whatever fan_in_fan_out says") {
  std::string dir = std::string(PEFT_CORPUS) + "/stathopoan__Apply-Lightweight-Fine-Tuning-to-a-Foundation-LLM-Model/lora_model";
  if (!fs::exists(dir)) {
    MESSAGE("skipped: corpus not found");
    return;
  }
  auto adapter = peft::Adapter::open(dir, {});
  const peft::AdapterModule* m = adapter->find_module("transformer.h.0.attn.c_attn");
  REQUIRE(m != nullptr);
  CHECK(m->kind == peft::LayerKind::conv1d);
  const peft::AdapterModule* score = adapter->find_module("score");
  REQUIRE(score != nullptr);
  CHECK(score->kind == peft::LayerKind::full);
  REQUIRE(score->find_suffix("weight") != nullptr);
  CHECK(score->find_suffix("weight")->base_tensor == "score.weight");
}

TEST_CASE("translate corpus: HF -> native -> HF is the identity for every corpus key") {
  auto dirs = corpus_adapters();
  if (dirs.empty()) {
    MESSAGE("skipped: corpus not found at " PEFT_CORPUS);
    return;
  }
  for (const std::string& dir : dirs) {
    CAPTURE(dir);
    auto adapter = peft::Adapter::open(dir, {});
    REQUIRE(adapter->table());
    peft::Translator translator(adapter->table());
    for (size_t i = 0; i < adapter->checkpoint().tensor_count(); ++i) {
      const std::string& key = adapter->checkpoint().tensor(i).name;
      CAPTURE(key);
      std::string native = translator.to_native(key);
      CHECK(native.find('.') == std::string::npos);  // native names are slash-separated
      CHECK(translator.to_hf(native, peft::has_peft_prefix(key)) == key);
    }
  }
}
