// adapter_config.json of a PEFT LoRA adapter: every LoraConfig field PEFT 0.6 ... 0.21 writes, as
// typed values, plus the document itself so that nothing is lost on a round trip.
//
// Semantics follow PEFT 0.21 (`peft/tuners/lora/config.py`, `peft/config.py`):
// * only `peft_type` is required; every other field takes PEFT's default when absent (r = 8,
//   lora_alpha = 8, bias = "none", init_lora_weights = true, ...). A missing `r` is therefore not an
//   error by itself; it becomes one (PEFT_ERR_INVALID_CONFIG naming `r`) when the adapter's tensors
//   have another rank, which is exactly when PEFT fails to load the adapter.
// * unknown fields are kept verbatim (PEFT >= 0.14 drops them with a warning).
// * a field of the wrong JSON type, a value PEFT rejects in __post_init__ and invalid JSON are
//   PEFT_ERR_INVALID_CONFIG naming the field.
// * peft_type other than "LORA", initialisations that rewrite the base weights when the adapter is
//   loaded (pissa*, corda, olora, loftq, lora_ga) and LoRA variants whose merge is not plain LoRA
//   (use_qalora, use_bdlora, arrow_config, monteclora_config, velora_config, kasa_config,
//   layer_replication, megatron_config) are PEFT_ERR_UNSUPPORTED naming the field.
// * alora_invocation_tokens (activated LoRA) is read: a non-empty list of token ids (0 ... 2^31-1, as
//   llama.cpp's GGUF key holds them); with another method than LoRA, DoRA or target_parameters it is
//   PEFT_ERR_UNSUPPORTED naming the field (PEFT has no such variant). Such an adapter applies its delta
//   only from the invocation tokens on, so no job that adds it into a weight takes it
//   (refuse_activated_lora in adapter.hpp); it is served unmerged and exported.
// * target_parameters (LoRA on stacked MoE expert parameters, adapter/expert_modules.hpp) is read;
//   with another method than LoRA, with use_dora, lora_bias or a lora_dropout it is
//   PEFT_ERR_UNSUPPORTED naming the field (PEFT's ParamWrapper refuses them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/python_regex.hpp"
#include "peft/methods/method_table.hpp"

namespace peft {

// init_lora_weights: true / false, or a method name ("gaussian", "eva", "orthogonal", "mica").
struct InitLoraWeights {
  bool is_bool = true;
  bool flag = true;
  std::string method;
};

// trainable_token_indices: a list (applies to the input embedding) or {module name: list}.
struct TrainableTokenIndices {
  bool given = false;
  bool is_list = false;              // the list form: `targets` holds one entry with an empty name
  std::vector<std::pair<std::string, std::vector<int64_t>>> targets;  // file order

  // The indices that apply to `module` (the list form applies to any; a dict entry to a module
  // whose path ends with its name), or null.
  const std::vector<int64_t>* for_module(const std::string& module) const {
    if (!given) return nullptr;
    for (const auto& [name, list] : targets)
      if (is_list || module.ends_with(name)) return &list;
    return nullptr;
  }
};

// PeftMethod and its names: methods/method_table.hpp.

// An activated LoRA (alora_invocation_tokens) adds its delta only to the tokens from the last
// invocation sequence on, so no single weight holds it and PEFT refuses to merge it (ALoraLinearVariant).
// Every job that adds an adapter into a weight (checkpoint and GGUF merges, host buffers, hot swap,
// combination) calls this (or its Adapter form, adapter.hpp) first: UNSUPPORTED naming `what` (the
// adapter, quoted) and `job` when `tokens` is not empty, else nothing.
void refuse_activated_lora(const std::string& what, const std::vector<uint32_t>& tokens, const std::string& job);

struct LoraConfig {
  nlohmann::ordered_json document;  // the file as read, in file order, unknown fields included

  std::string peft_type;  // "LORA", "LOHA", "LOKR", "ADALORA" or "IA3"
  // The method, and its fields read as LoRA's: LoHa/LoKr "alpha" is lora_alpha (their r,
  // rank_pattern and alpha_pattern are LoRA's); AdaLoRA's "init_r" is r; IA3 has no rank (r and
  // lora_alpha stay unused). The fields that are the method's own are in method_fields, read by
  // its row (methods/method_config.hpp).
  PeftMethod method = PeftMethod::lora;
  MethodConfig method_fields;
  std::optional<std::string> task_type;
  std::optional<std::string> base_model_name_or_path;
  std::optional<std::string> revision;
  std::optional<std::string> peft_version;

  int64_t r = 8;
  bool r_given = false;
  double lora_alpha = 8;
  bool lora_alpha_given = false;
  double lora_dropout = 0;
  bool fan_in_fan_out = false;  // recorded only: layouts are detected from the base model
  std::string bias = "none";    // "none" | "all" | "lora_only"
  bool use_rslora = false;
  bool use_dora = false;
  bool lora_bias = false;
  bool inference_mode = false;
  bool ensure_weight_tying = false;
  ModuleSelector target_modules;
  ModuleSelector exclude_modules;
  std::vector<std::string> target_parameters;  // "mlp.experts.gate_up_proj": matched as name or suffix
  std::vector<uint32_t> alora_invocation_tokens;  // activated LoRA's invocation sequence; empty: not aLoRA
  std::optional<std::vector<std::string>> modules_to_save;
  InitLoraWeights init_lora_weights;
  std::optional<std::vector<int64_t>> layers_to_transform;  // an int is stored as a one-element list
  bool layers_to_transform_is_int = false;
  std::vector<std::string> layers_pattern;  // a string is stored as a one-element list
  std::vector<std::pair<std::string, int64_t>> rank_pattern;  // file order: first match wins
  std::vector<std::pair<std::string, double>> alpha_pattern;  // file order: first match wins
  TrainableTokenIndices trainable_token_indices;
  std::string megatron_core = "megatron.core";

  // Parses adapter_config.json text (time linear in its size, nesting bounded: core/json_parse.hpp).
  // `source` names the file in messages.
  static LoraConfig parse(std::string_view json_text, const std::string& source);
  // Reads and parses a file (PEFT_ERR_IO if it cannot be read).
  static LoraConfig from_file(const std::string& path);

  // lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, for an already resolved r and alpha.
  double scaling(int64_t rank, double alpha) const;

  // Whether PEFT 0.21 creates a LoRA layer with lora_B.weight, lora_B.bias and lora_embedding_A at
  // zero (LoraLayer.reset_lora_parameters: init_lora_weights true or "gaussian"), so that factors
  // missing from the file leave the layer without effect. Other values keep random weights.
  bool zero_initialised() const;

  // The document as PEFT writes it: json.dumps(indent=2, sort_keys=True), ASCII-escaped.
  std::string canonical_json() const;
};

// The Python regular expressions PEFT builds from a config's fields (tuners_utils.py
// check_target_module_exists, other.py get_pattern_key), compiled: what ModuleMatcher matches with.
struct ConfigPatterns {
  std::optional<PythonRegex> target_modules;   // a target_modules string
  std::optional<PythonRegex> exclude_modules;  // an exclude_modules string (even "all-linear")
  std::vector<PythonRegex> modules_to_save;    // one per entry
  std::vector<PythonRegex> layer_index;        // one per layers_pattern entry, or PEFT's default one
  std::vector<PythonRegex> rank_keys;          // one per rank_pattern key, in file order
  std::vector<PythonRegex> alpha_keys;         // one per alpha_pattern key, in file order
};

// PEFT_ERR_INVALID_CONFIG naming the field on a pattern that is not a valid Python regex.
ConfigPatterns compile_patterns(const LoraConfig& config);

}  // namespace peft
