// The base model an adapter is checked against and merged into: a transformers model folder with
// its config.json and safetensors weights, and the module names PEFT's "all-linear" expands to in it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/module_matcher.hpp"
#include "peft/arch/arch_table.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

// A base whose output embedding is tied to its input embedding (the table's tie_embeddings_config
// key true in config.json): the input embedding's tensor, the output embedding's module and weight
// name, and its tensor when the checkpoint stores one anyway (transformers saves only the input).
struct TiedEmbeddings {
  size_t input = 0;
  std::string output_module;  // "lm_head"
  std::string output_weight;  // "lm_head.weight"
  std::optional<size_t> output;
  std::string config_key;     // "tie_word_embeddings"
};

struct BaseModel {
  std::string dir;
  nlohmann::json config;  // config.json; null when the folder has none
  std::shared_ptr<const Checkpoint> weights;
  // Quantized weights whose stored shape is not the module's (bitsandbytes' packed 4-bit weights):
  // base tensor index -> the weight's shape (set by open(), bnb_base.hpp).
  std::map<size_t, std::vector<uint64_t>> weight_shapes;

  // PEFT_ERR_NOT_FOUND / PEFT_ERR_IO / format errors from the checkpoint; a config.json that is not
  // valid JSON is PEFT_ERR_INVALID_CONFIG.
  static BaseModel open(const std::string& dir, const OpenOptions& options);

  std::optional<std::string> model_type() const;
  // The index of the base tensor "<module>.<param>", trying the name as is, then without and with
  // the table's base_model_prefix, then the table's checkpoint_aliases, then the names transformers
  // saves the in-memory name under (saved_names(), peft/arch/conversions.hpp).
  // Tensor i's shape as the module sees it: weight_shapes[i] if set, else its stored shape.
  const std::vector<uint64_t>& weight_shape(size_t i) const;
  // A tied output embedding's weight that the checkpoint does not store is found as the input
  // embedding's tensor it shares (is_tied_output() tells that case apart).
  std::optional<size_t> find(std::string_view module, std::string_view param, const ArchTable* table) const;
  // Whether `module` is a tied output embedding that the checkpoint does not store: its weight keeps
  // its own name ("lm_head.weight") as an adapter's base tensor, so that merges keep its changes
  // apart from the input embedding's.
  bool is_tied_output(std::string_view module, const ArchTable* table) const;
  // nullopt unless the table names the tied pair, config.json ties them and the input is stored.
  std::optional<TiedEmbeddings> tied_embeddings(const ArchTable* table) const;
};

// The base model's Linear / Conv1D module names as PEFT's "all-linear" expands them: modules whose
// table kind is linear or conv1d and that have a 2-D weight, minus the output embedding (or, for
// SEQ_CLS models without one, the first of "score" / "classifier").
std::vector<std::string> all_linear_modules(const BaseModel& base, const ArchTable& table, const LoraConfig& config);

// What PEFT expands target_modules to when it is "all-linear" (all_linear_modules) or absent (the
// table's default targets for the base's model_type); nullopt when it is absent and the table has
// no defaults for that model_type (PEFT then refuses the config).
std::optional<std::vector<std::string>> implicit_targets(const BaseModel& base, const ArchTable& table,
                                                         const LoraConfig& config);

// A base module that target_modules selects and PEFT would wrap in a LoRA layer.
struct TargetedBaseModule {
  std::string module;  // "<module>"
  size_t weight = 0;   // index of "<module>.weight" in base.weights
  ModuleKind kind = ModuleKind::linear;
};

// The base modules `matcher` targets (Verdict::targeted) that PEFT can wrap, in the weights' order:
// modules with a 2-D or 4-D "<module>.weight" whose kind (from `table`, the name tried as is and
// with the table's base_model_prefix; else linear for 2-D and conv2d for 4-D) is not norm or other.
std::vector<TargetedBaseModule> targeted_base_modules(const BaseModel& base, const ModuleMatcher& matcher,
                                                      const ArchTable* table);

}  // namespace peft
