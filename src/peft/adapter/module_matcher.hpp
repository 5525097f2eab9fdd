// Which modules a LoRA config targets, and with which rank and alpha: PEFT 0.21's
// `check_target_module_exists` (peft/tuners/tuners_utils.py) and `get_pattern_key`
// (peft/utils/other.py), reproduced on module names such as "model.layers.0.self_attn.q_proj"
// (transformers names, without "base_model.model.").
//
// * exclude_modules: a list (exact name or suffix after a "."), or a regex (re.fullmatch).
// * a module matching a modules_to_save entry m (re.match(rf"(^|.*\.){m}($|\..*)")) is excluded.
// * target_modules: a list (exact name, or suffix after a "."), a regex (re.fullmatch), "all-linear"
//   (needs the base model's linear layers: see expand_targets), or absent (PEFT's per-architecture
//   default list: see expand_targets).
// * layers_to_transform (list targets only): the layer index is the FIRST numbered segment
//   (re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.")), or the one after a layers_pattern p
//   (re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.")), as in PEFT >= 0.20.
// * rank_pattern / alpha_pattern: the first key k, in file order, with re.match(rf"(.*\.)?({k})$").
//
// A ModuleMatcher is immutable after construction (expand_targets aside); const methods are
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/python_regex.hpp"
#include "peft/adapter/adapter_config.hpp"

namespace peft {

class ModuleMatcher {
 public:
  enum class Verdict {
    targeted,      // PEFT puts a LoRA layer on this module
    not_targeted,  // it does not
    excluded,      // exclude_modules or modules_to_save rule it out
    unknown,       // target_modules is "all-linear" or absent and no base model told us more
  };

  // Compiles every pattern of the config: PEFT_ERR_INVALID_CONFIG naming the field on a bad one.
  explicit ModuleMatcher(const LoraConfig& config);

  Verdict check(std::string_view module) const;

  // Replaces "all-linear" or an absent target_modules by an explicit list of module names (the
  // base model's linear layers, or PEFT's default targets for the architecture), as PEFT does
  // before matching. Exact names and suffixes both work, as for a list in the file.
  void expand_targets(std::vector<std::string> names);
  bool needs_expansion() const;

  // get_pattern_key: the rank_pattern / alpha_pattern key that applies, or nullopt.
  std::optional<std::string> rank_key(std::string_view module) const;
  std::optional<std::string> alpha_key(std::string_view module) const;
  int64_t rank_for(std::string_view module) const;
  double alpha_for(std::string_view module) const;

 private:
  struct PatternKey {
    std::string key;
    PythonRegex regex;
    double value;  // the rank or alpha the key gives
  };
  bool list_match(const std::vector<std::string>& names, std::string_view module) const;
  bool layer_allowed(std::string_view module) const;

  ModuleSelector targets_;
  ModuleSelector excludes_;
  std::optional<std::vector<int64_t>> layers_to_transform_;
  int64_t default_rank_;
  double default_alpha_;
  std::optional<PythonRegex> target_regex_;
  std::optional<PythonRegex> exclude_regex_;
  std::vector<PythonRegex> modules_to_save_;
  std::vector<PythonRegex> layer_regexes_;  // one per layers_pattern, or the default one
  std::vector<PatternKey> rank_keys_;
  std::vector<PatternKey> alpha_keys_;
};

const char* verdict_name(ModuleMatcher::Verdict verdict);

}  // namespace peft
