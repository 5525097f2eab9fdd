// Opening the adapters of a checkpoint merge against the base (merge_inputs.hpp).
#include "peft/merge/merge_inputs.hpp"

#include "checkpoint/hub_cache.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "gguf/gguf_file.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/adapter/gguf_lora_file.hpp"

namespace peft {

std::vector<MergeInput> open_merge_inputs(const std::vector<MergeAdapter>& adapters, const std::string& base_dir) {
  std::vector<MergeInput> inputs;
  std::vector<std::string> problems;
  bool unresolved = false;
  const bool gguf_base = is_gguf_path(base_dir);
  for (const MergeAdapter& a : adapters) {
    if (a.adapter) {
      inputs.push_back({a.adapter, a.weight});
      continue;
    }
    if (is_gguf_path(a.dir)) {
      if (!gguf_base)
        fail(PEFT_ERR_UNSUPPORTED, peft::quoted(a.dir) + " is a GGUF file: GGUF LoRA adapters merge into GGUF bases "
                                   "only; for the base " + peft::quoted(base_dir) + " convert it to a PEFT adapter "
                                   "folder first (peft_adapter_import_gguf, or `peftc adapter export " + a.dir +
                                   " OUT --format peft --base " + base_dir + "`)");
      inputs.push_back({open_gguf_lora(a.dir), a.weight});
      continue;
    }
    Adapter::Options options;
    if (!base_dir.empty() && !gguf_base) options.base_dir = resolve_model_location(base_dir);
    try {
      inputs.push_back({Adapter::open(a.dir, options), a.weight});
    } catch (const Error& error) {
      if (error.code() != PEFT_ERR_UNRESOLVED_KEY && error.code() != PEFT_ERR_SHAPE_MISMATCH) throw;
      unresolved = unresolved || error.code() == PEFT_ERR_UNRESOLVED_KEY;
      problems.push_back(error.what());
    }
  }
  if (problems.empty()) {
    for (const MergeInput& input : inputs)
      if (input.adapter)
        refuse_activated_lora(*input.adapter, "a merged weight");
      else if (input.gguf_lora)
        refuse_activated_lora(peft::quoted(input.gguf_lora->path), input.gguf_lora->alora_invocation_tokens,
                              "a merged weight");
    return inputs;
  }
  const int32_t code = unresolved ? PEFT_ERR_UNRESOLVED_KEY : PEFT_ERR_SHAPE_MISMATCH;
  if (problems.size() == 1) fail(code, problems[0]);
  std::string message = std::to_string(problems.size()) + " adapters do not fit the base: ";
  for (size_t i = 0; i < problems.size(); ++i) message += (i ? " | " : "") + problems[i];
  fail(code, message);
}

}  // namespace peft
