// peft/adapter/gguf_lora_file over the seeds of tests/fuzz/corpus/gguf_lora/ (written by
// tests/fuzz/make_seeds.py): each seed opened from memory as gguf_lora_fuzzer opens it, then checked by
// gguf_lora_terms with the file as its own base, must give the code its name says.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "peft/adapter/gguf_lora_file.hpp"
#include "peft/merge/gguf_lora_input.hpp"
#include "test_error_support.hpp"
#include "peft_test_paths.h"

namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// "OPEN_CODE/TERMS_CODE": the code of open_gguf_lora, then (when it opens) that of gguf_lora_terms.
std::string outcome(const std::string& bytes) {
  const auto file = peft::Checkpoint::open_memory(bytes.data(), bytes.size());
  std::shared_ptr<const peft::GgufLoraFile> lora;
  const int32_t open = error_test::code_of([&] { lora = peft::open_gguf_lora(file, "seed.gguf"); });
  if (open != PEFT_OK) return peft::code_name(open);
  peft::GgufLoraFile alone = *lora;
  alone.others.clear();  // the base tensors the file holds for its pairs
  const int32_t terms = error_test::code_of([&] {
    for (const peft::GgufLoraTerm& term : peft::gguf_lora_terms(alone, 1.0, *file, lora->architecture))
      CHECK(term.module.rank > 0);
  });
  return std::string("OK/") + (terms == PEFT_OK ? "OK" : peft::code_name(terms));
}

}  // namespace

TEST_CASE("gguf lora fuzz corpus: each seed gets the code of the rule it breaks") {
  const std::map<std::string, std::string> expected = {
      {"f32_pair", "OK/OK"},
      {"f16_pair_no_alpha", "OK/OK"},
      {"bf16_pair", "OK/OK"},
      {"q8_0_pair", "OK/OK"},
      {"embedding_pair", "OK/OK"},
      {"stacked_experts", "OK/OK"},
      {"two_pairs", "OK/OK"},
      {"alpha_zero", "OK/OK"},
      {"alpha_nan", "INVALID_CHECKPOINT"},
      {"alpha_inf", "INVALID_CHECKPOINT"},
      {"alpha_u32", "INVALID_CHECKPOINT"},
      {"adapter_type_control_vector", "UNSUPPORTED"},
      {"general_type_model", "INVALID_ARGUMENT"},
      {"architecture_array", "INVALID_CHECKPOINT"},
      {"lone_lora_a", "OK/INVALID_CHECKPOINT"},
      {"q4_k_factor", "OK/UNSUPPORTED"},
      {"rank_mismatch", "OK/SHAPE_MISMATCH"},
      {"factor_1d", "OK/INVALID_CHECKPOINT"},
      {"no_base_tensor", "OK/UNRESOLVED_KEY"},
      {"empty_adapter", "OK/INVALID_CHECKPOINT"},
      {"suffix_only_names", "OK/UNRESOLVED_KEY"},
  };
  const fs::path dir = fs::path(PEFT_TEST_DATA).parent_path() / "fuzz" / "corpus" / "gguf_lora";
  REQUIRE_MESSAGE(fs::is_directory(dir), "missing seed corpus " << dir);
  size_t named = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().stem().string();
    CAPTURE(name);
    const auto it = expected.find(name);
    if (it == expected.end()) {  // a fuzzer finding added by hand: opening it must not crash
      (void)error_test::code_of([&] { (void)outcome(read_bytes(item.path())); });
      continue;
    }
    CHECK(outcome(read_bytes(item.path())) == it->second);
    ++named;
  }
  CHECK(named == expected.size());
}
