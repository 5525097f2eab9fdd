// The tied-embeddings rule of a merge into a base whose output embedding is its input embedding
// (tie_word_embeddings; docs/architecture.md, "Tied embeddings"), decided in one place from what
// the adapters change on each side. The checkpoint plan (merge_plan.cpp) and the GGUF merge
// (gguf_merge.cpp) each summarise their own records of changes as two TiedSides and apply the
// decision to those records.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "peft/adapter/adapter.hpp"

namespace peft {

// What a merge does with a base whose output embedding is tied to its input embedding
// (tie_word_embeddings) when the adapters change one side (docs/architecture.md, "Tied embeddings").
enum class TiedEmbeddingsPolicy {
  // The merged model computes what the adapter's forward computes: where the two sides change
  // differently they are untied (the output embedding written as the original embedding plus its
  // own changes, the config key set to false); changes PEFT applies to both sides (trainable tokens,
  // ensure_weight_tying's tied LoRA) land once in the shared tensor, which stays tied.
  untie,
  // PEFT's merge_and_unload: LoRA, DoRA, token and saved base_layer changes of either side land in
  // the one shared tensor; only a modules_to_save copy unties, as in PEFT.
  shared,
};

// What the adapters change on one side of the tied pair.
struct TiedSide {
  bool own_lora = false;      // LoRA (and DoRA) terms of this side alone
  bool shared_lora = false;   // input side: the LoRA of an ensure_weight_tying adapter whose output copy was left out
  bool lora_bias = false;     // lora_B biases
  bool tokens = false;        // trainable token rows (PEFT sets them on both sides)
  bool saved_weight = false;  // a saved base_layer weight (PEFT loads it into the shared parameter)
  bool swapped = false;       // a modules_to_save copy, which replaces this side alone
  bool any() const { return own_lora || shared_lora || lora_bias || tokens || saved_weight || swapped; }
};

// One side's summary from its records: `lora_terms` LoRA terms, `shared_terms` of them an
// ensure_weight_tying adapter's (PEFT applies those to both sides), whether it has lora_B biases and
// token rows, and its replacement: none (nullopt), a saved base_layer weight (false) or a
// modules_to_save copy that swaps the module (true).
TiedSide tied_side(size_t lora_terms, size_t shared_terms, bool lora_bias, bool tokens,
                   std::optional<bool> replacement_swaps_module);

struct TiedDecision {
  // Policy shared, with an output the base does not store: the output's LoRA terms, token rows and
  // saved weight (kept only where the input has none) land in the input, as merge_and_unload does.
  bool move_output_to_input = false;
  // The two sides are written apart: the output gets a tensor of its own (added where the base has
  // none) and the config's tie is set to false.
  bool untie = false;
  // With untie: the output also gets what PEFT applies to both sides (the shared LoRA terms, the
  // token rows, and the input's saved weight where the output has none).
  bool copy_shared_to_output = false;
  // Whether the output has changes of its own (before any shared change is copied to it).
  bool output_changes = false;
  // The shared policy's note on where the changes landed; empty when there is none.
  std::string note;
};

// `output_stored`: the base holds the output tensor (a checkpoint that saves both sides anyway);
// `input` and `output` name the two sides in the note.
TiedDecision decide_tied_embeddings(TiedEmbeddingsPolicy policy, const TiedSide& in, const TiedSide& out,
                                    bool output_stored, const std::string& input, const std::string& output);

// Whether an adapter's LoRA on `output_module` is PEFT's tied copy of the input embedding's LoRA
// (ensure_weight_tying: the same factors, transposed, on both sides), which an untying merge leaves
// out and keeps once, in the shared tensor: the policy unties, the adapter's config asks for the
// tie, and `modules` hold LoRA on both the output module and a module `on_input` accepts.
bool is_tied_lora_copy(TiedEmbeddingsPolicy policy, const Adapter& adapter, std::span<const AdapterModule> modules,
                       const std::string& output_module, const std::function<bool(const AdapterModule&)>& on_input);

}  // namespace peft
