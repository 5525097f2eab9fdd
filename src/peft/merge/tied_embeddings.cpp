#include "peft/merge/tied_embeddings.hpp"

namespace peft {

TiedSide tied_side(size_t lora_terms, size_t shared_terms, bool lora_bias, bool tokens,
                   std::optional<bool> replacement_swaps_module) {
  TiedSide side;
  side.shared_lora = shared_terms > 0;
  side.own_lora = shared_terms < lora_terms;
  side.lora_bias = lora_bias;
  side.tokens = tokens;
  side.saved_weight = replacement_swaps_module == false;
  side.swapped = replacement_swaps_module == true;
  return side;
}

TiedDecision decide_tied_embeddings(TiedEmbeddingsPolicy policy, const TiedSide& in, const TiedSide& out,
                                    bool output_stored, const std::string& input, const std::string& output) {
  TiedDecision d;
  d.output_changes = out.any();
  if (policy == TiedEmbeddingsPolicy::shared) {
    // PEFT's merge_and_unload merges each side's layer into the one parameter: only a
    // modules_to_save copy (which swaps a module) or a change the shared tensor cannot take unties.
    TiedSide left = out;  // what stays with the output
    if (!output_stored && (out.own_lora || out.tokens || out.saved_weight)) {
      d.move_output_to_input = true;
      d.note = "tied embeddings policy \"shared\": the changes of " + output + " land in the shared " + input +
               ", as PEFT's merge_and_unload does, so the input embedding changes too";
      left.own_lora = left.tokens = left.saved_weight = false;
    } else if (in.own_lora || in.saved_weight) {
      d.note = "tied embeddings policy \"shared\": the changes of " + input +
               " land in the shared tensor, so the output embedding " + output + " changes too";
    }
    d.untie = in.swapped || left.any();
    return d;
  }
  // Untie where the sides differ in PEFT's forward: the input's own LoRA, biases or copy, or any
  // change of the output. What PEFT applies to both sides alone keeps the tie.
  d.untie = in.swapped || in.own_lora || in.lora_bias || d.output_changes;
  d.copy_shared_to_output = d.untie && (in.shared_lora || in.tokens || (in.saved_weight && !in.swapped));
  return d;
}

bool is_tied_lora_copy(TiedEmbeddingsPolicy policy, const Adapter& adapter, std::span<const AdapterModule> modules,
                       const std::string& output_module, const std::function<bool(const AdapterModule&)>& on_input) {
  if (policy != TiedEmbeddingsPolicy::untie || !adapter.config().ensure_weight_tying) return false;
  bool input = false, output = false;
  for (const AdapterModule& m : modules) {
    if (!m.is_lora()) continue;
    if (m.name == output_module) output = true;
    else if (on_input(m)) input = true;
  }
  return input && output;
}

}  // namespace peft
