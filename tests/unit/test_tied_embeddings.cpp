// The tied-embeddings rule both merges apply (peft/merge/tied_embeddings.hpp), case by case as the
// interop tests meet them against PEFT (tests/interop/test_tied_embeddings.py, test_gguf_tied.py).
#include <doctest/doctest.h>

#include "peft/merge/tied_embeddings.hpp"

using peft::TiedDecision;
using peft::TiedEmbeddingsPolicy;
using peft::TiedSide;

namespace {

TiedSide own_lora() { TiedSide s; s.own_lora = true; return s; }
TiedSide shared_lora() { TiedSide s; s.shared_lora = true; return s; }
TiedSide tokens() { TiedSide s; s.tokens = true; return s; }
TiedSide saved_weight() { TiedSide s; s.saved_weight = true; return s; }
TiedSide swapped() { TiedSide s; s.swapped = true; return s; }

TiedDecision untie(const TiedSide& in, const TiedSide& out, bool output_stored = false) {
  return peft::decide_tied_embeddings(TiedEmbeddingsPolicy::untie, in, out, output_stored, "IN", "OUT");
}
TiedDecision shared(const TiedSide& in, const TiedSide& out, bool output_stored = false) {
  return peft::decide_tied_embeddings(TiedEmbeddingsPolicy::shared, in, out, output_stored, "IN", "OUT");
}

}  // namespace

TEST_CASE("tied embeddings, policy untie: the sides are written apart exactly where PEFT's forward tells them apart") {
  SUBCASE("nothing changes: tied") {
    const TiedDecision d = untie({}, {});
    CHECK_FALSE(d.untie);
    CHECK(d.note.empty());
  }
  SUBCASE("lm_head alone: untied, the output holds changes of its own") {
    const TiedDecision d = untie({}, own_lora());
    CHECK(d.untie);
    CHECK(d.output_changes);
    CHECK_FALSE(d.copy_shared_to_output);
  }
  SUBCASE("embed_tokens alone: untied, the output is the original embedding") {
    const TiedDecision d = untie(own_lora(), {});
    CHECK(d.untie);
    CHECK_FALSE(d.output_changes);
  }
  SUBCASE("a lora_B bias on the input unties") { TiedSide in; in.lora_bias = true; CHECK(untie(in, {}).untie); }
  SUBCASE("ensure_weight_tying (the output copy left out) and trainable tokens keep the tie") {
    CHECK_FALSE(untie(shared_lora(), {}).untie);
    CHECK_FALSE(untie(tokens(), {}).untie);
    CHECK_FALSE(untie(saved_weight(), {}).untie);
  }
  SUBCASE("tokens with an lm_head LoRA: untied, and the output gets the token rows too") {
    const TiedDecision d = untie(tokens(), own_lora());
    CHECK(d.untie);
    CHECK(d.copy_shared_to_output);
  }
  SUBCASE("a saved base_layer weight goes to both sides of an untied pair") {
    TiedSide in = own_lora();
    in.saved_weight = true;
    CHECK(untie(in, {}).copy_shared_to_output);
  }
  SUBCASE("a modules_to_save copy of either side unties; the input's copy is not shared") {
    CHECK(untie(swapped(), {}).untie);
    CHECK_FALSE(untie(swapped(), {}).copy_shared_to_output);
    CHECK(untie({}, swapped()).untie);
  }
  SUBCASE("the untie policy writes no note of its own") { CHECK(untie(own_lora(), own_lora()).note.empty()); }
}

TEST_CASE("tied embeddings, policy shared: every change lands in the shared tensor, as merge_and_unload does") {
  SUBCASE("lm_head's LoRA, tokens and saved weight move to the input, which stays tied") {
    for (const TiedSide& out : {own_lora(), tokens(), saved_weight()}) {
      const TiedDecision d = shared({}, out);
      CHECK(d.move_output_to_input);
      CHECK_FALSE(d.untie);
      CHECK(d.note.find("the changes of OUT land in the shared IN") != std::string::npos);
    }
  }
  SUBCASE("embed_tokens' LoRA stays where it is, with a note that the output changes too") {
    const TiedDecision d = shared(own_lora(), {});
    CHECK_FALSE(d.move_output_to_input);
    CHECK_FALSE(d.untie);
    CHECK(d.note.find("so the output embedding OUT changes too") != std::string::npos);
  }
  SUBCASE("only a modules_to_save copy unties, as in PEFT") {
    CHECK(shared(swapped(), {}).untie);
    CHECK(shared({}, swapped()).untie);
    TiedSide out = own_lora();
    out.swapped = true;
    const TiedDecision d = shared({}, out);
    CHECK(d.move_output_to_input);
    CHECK(d.untie);
  }
  SUBCASE("an output the base stores is its own tensor: nothing moves") {
    const TiedDecision d = shared({}, own_lora(), /*output_stored=*/true);
    CHECK_FALSE(d.move_output_to_input);
    CHECK(d.untie);
  }
  SUBCASE("trainable tokens on the input need no note") { CHECK(shared(tokens(), {}).note.empty()); }
}
