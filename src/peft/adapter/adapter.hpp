// A loaded PEFT LoRA adapter: its config, its tensors (an opened Checkpoint), and its modules with
// the rank, alpha and scaling PEFT computes for each, and the index of every tensor in the file.
//
// Opening follows PEFT 0.21's loader and is strict where PEFT is silently lossy:
// * a key the grammar (key_grammar.hpp) does not resolve -> PEFT_ERR_UNRESOLVED_KEY listing every one;
// * LoRA tensors of a module that the config does not target (PEFT ignores them as unexpected keys),
//   a module with lora_A but no lora_B, DoRA magnitudes without use_dora (or the reverse),
//   lora_B.bias without lora_bias, a rank that differs from what r / rank_pattern give (PEFT fails
//   with a size mismatch) -> PEFT_ERR_INVALID_CONFIG naming the field and every module at fault;
// * two keys for the same tensor (e.g. with and without "base_model.model.") -> PEFT_ERR_INVALID_CHECKPOINT.
// With a base model (Options::base_dir), "all-linear" and an absent target_modules are expanded as
// PEFT does, Linear vs GPT-2 Conv1D is decided from the base's shapes and architecture (never from
// fan_in_fan_out alone), and every module is validated against the base (base_validation.hpp).
//
// Lenient mode (Options::lenient) loads what PeftModel.from_pretrained + set_peft_model_state_dict
// load, and reports as warnings() what they ignore:
// * unexpected keys (dropped): keys that are not PEFT adapter keys; LoRA tensors of a module that
//   target_modules / exclude_modules / modules_to_save / layers_to_transform do not select;
//   lora_magnitude_vector without use_dora; lora_B.bias without lora_bias; trainable-token rows
//   that trainable_token_indices does not configure; and, with a base, tensors for modules or
//   weights the base does not have;
// * missing keys that leave a layer without effect (init_lora_weights true or "gaussian"):
//   lora_B.weight of a module holding lora_A (its module is dropped), lora_embedding_A of an
//   embedding holding lora_embedding_B, lora_B.bias with lora_bias, and, with a base, every key of
//   a base module that target_modules selects but the file has no tensors for.
// Everything PEFT would refuse or leave at a random value stays an error: rank or shape
// mismatches, lora_A missing where lora_B is present (or lora_embedding_B), a DoRA module without
// its magnitude vector (PEFT would derive it from the base weight), two keys for one tensor,
// initialisations other than true / "gaussian" with factors missing, and target_modules selecting
// no module of the base.
//
// An Adapter is immutable once opened; every const method may be called from many threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/adapter_module.hpp"
#include "peft/arch/arch_table.hpp"
#include "peft/arch/key_grammar.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

// Adapter::dir() of an adapter opened from memory (as SafetensorsFile names memory files).
inline constexpr std::string_view kMemoryAdapterDir = "<memory>";

// The two files of an adapter folder (or hub model id): `dir` the folder as resolved
// (resolve_model_location, which reports an incomplete hub download of either file as
// PEFT_ERR_NOT_FOUND), `config` and `weights` their paths, `has_config` whether adapter_config.json
// exists. A missing folder or adapter_model.safetensors is PEFT_ERR_NOT_FOUND (adapter_model.bin, a
// pickle, is PEFT_ERR_UNSUPPORTED); a missing adapter_config.json is PEFT_ERR_NOT_FOUND when
// `config_required`.
struct AdapterFiles {
  std::string dir, config, weights;
  bool has_config = false;
};
AdapterFiles adapter_folder_files(const std::string& dir_or_id, bool config_required);

class Adapter {
 public:
  struct Options {
    std::string base_dir;                          // optional: a base model folder to validate against
    std::shared_ptr<const ArchTable> table;        // optional: otherwise detected (may stay null)
    OpenOptions open;                              // for the adapter's and the base's safetensors
    bool lenient = false;                          // PEFT's rules: ignore and warn (see above)
  };

  // A folder holding adapter_config.json and adapter_model.safetensors. PEFT's fallback
  // adapter_model.bin (a pickle) is PEFT_ERR_UNSUPPORTED; a missing file is PEFT_ERR_NOT_FOUND.
  static std::shared_ptr<const Adapter> open(const std::string& dir, const Options& options);
  // The same from explicit paths (a config file and a safetensors file).
  static std::shared_ptr<const Adapter> open_files(const std::string& config_path, const std::string& weights_path,
                                                   const Options& options);
  // The same from memory: the text of adapter_config.json and the bytes of adapter_model.safetensors
  // (both copied). dir() is then kMemoryAdapterDir. PEFT_ERR_INVALID_CONFIG for a config that is not
  // valid, format errors for bytes that are not a valid safetensors file.
  static std::shared_ptr<const Adapter> open_memory(std::string_view config_json, const void* weights,
                                                    size_t weights_size, const Options& options);

  const std::string& dir() const { return dir_; }
  const LoraConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  const std::shared_ptr<const Checkpoint>& checkpoint_ptr() const { return checkpoint_; }
  const std::vector<AdapterModule>& modules() const { return modules_; }  // first appearance in the file
  const AdapterModule* find_module(std::string_view name) const;
  // The architecture table used (given or detected); null when none applies.
  const std::shared_ptr<const ArchTable>& table() const { return table_; }
  const std::string& family_reason() const { return family_reason_; }  // why that table was chosen
  const std::string& base_dir() const { return base_dir_; }  // "" when opened without a base
  // Things a user should know that are not errors (adapter names stripped, unverifiable targets,
  // rank_pattern keys that match nothing, a fan_in_fan_out flag that contradicts the base layout).
  const std::vector<std::string>& notes() const { return notes_; }
  // What lenient mode ignored, one sentence each, starting with a stable kind:
  //   unexpected key "<key as in the file>": <why>; PEFT ignores it
  //   missing key "base_model.model.<module>.<role>": <why>; ...
  // (the names of PEFT's load result without the adapter name). Empty in strict mode.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // VeRA / RandLoRA: the checkpoint index of a projection shared by every layer, saved by PEFT as
  // "base_model.vera_A" ("vera_A", "vera_B", "randlora_A", "randlora_B"); null when not saved.
  const size_t* shared_param(const std::string& name) const {
    auto it = shared_params_.find(name);
    return it == shared_params_.end() ? nullptr : &it->second;
  }

  // Validates this adapter against a base model folder (config.json + weights), without changing
  // it: PEFT_ERR_UNRESOLVED_KEY / PEFT_ERR_SHAPE_MISMATCH listing every problem.
  void validate(const std::string& base_dir, const OpenOptions& open = {}) const;

 private:
  friend struct AdapterBuilder;
  std::string dir_;
  LoraConfig config_;
  std::shared_ptr<const Checkpoint> checkpoint_;
  std::vector<AdapterModule> modules_;
  std::shared_ptr<const ArchTable> table_;
  std::string family_reason_;
  std::string base_dir_;
  std::vector<std::string> notes_;
  std::vector<std::string> warnings_;
  std::map<std::string, size_t> shared_params_;
};

// Whether whole tensor `t` of module `m` is a modules_to_save copy, which PEFT's merge swaps in for
// the base module, rather than a weight of the base module itself (a saved base_layer weight, a
// bias="all" bias), which PEFT loads into the base module's own parameter.
bool is_modules_to_save_copy(const Adapter& adapter, const AdapterModule& m, const AdapterTensor& t);

// refuse_activated_lora (adapter_config.hpp) for an adapter.
void refuse_activated_lora(const Adapter& adapter, const std::string& job);

}  // namespace peft
