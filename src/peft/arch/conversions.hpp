// transformers' checkpoint conversions (data/conversions/transformers.json, written from
// transformers/conversion_mapping.py by scripts/gen_conversions.py; docs/architecture.md, "Data").
//
// transformers >= 5 renames some modules when it loads a checkpoint and back when it saves one:
// a Llava-family model holds "model.language_model.layers.0..." in memory and saves
// "language_model.model.layers.0...". PEFT names an adapter's modules after the model in memory, so
// such an adapter's keys are not the base checkpoint's. The file holds, per model class and
// model_type, the renames transformers applies on save (and on load), as Python regular expressions
// evaluated with core/python_regex.hpp exactly as transformers applies them (WeightTransform's
// rename_source_key and _scoped_match), and the expert fusions as data only.
//
// The file is read from the data directories of arch_registry.hpp (arch_table_search_dirs(),
// "conversions/transformers.json") on first use, and cached; all functions are thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace peft {

// The names a parameter held in memory as `key` ("model.language_model.layers.0.self_attn.q_proj.weight")
// may have in a checkpoint transformers saved, for a base with config.json `config`: the renames of
// its class (config.json "architectures"[0], composed over its sub-models as transformers does), else
// of its model_type, applied in save order; then the same without the PrefixChange steps, which
// transformers drops when it saves a model it did not load. Empty when no renames apply, the chain
// holds a step the data cannot express, or the data file is not installed; a data file that does not
// parse is PEFT_ERR_INVALID_CONFIG.
std::vector<std::string> saved_names(const nlohmann::json& config, std::string_view key);

// A name `key` takes under one of transformers' conversions, and which ("transformers 5.24.0's
// checkpoint renames on load of LlavaForConditionalGeneration (and 12 more)").
struct ConversionRename {
  std::string key;
  std::string origin;
};
// Every distinct name `key` takes under the save or the load chain of any model in the data whose
// steps all rename a leading path (anchored regexes: a VLM's "model.language_model." <->
// "language_model.model."; the others rewrite inner names of their own models' keys and would
// misread other models'), each with and without its PrefixChange steps; the first chain in file
// order names a name's origin. The layouts an adapter may have been written for. Empty when the
// data is not installed. The chains are compiled on the first call, once per process.
std::vector<ConversionRename> conversion_renames(std::string_view key);

// The transformers version the data was generated from ("" when the file is not installed).
std::string conversions_transformers_version();

// Applies the "save" chain of `entry` (one object of the file's "models" or "composed") to `key`;
// `with_prefix_changes` false skips the PrefixChange steps. nullopt when the chain holds an
// unsupported step. `what` names the entry in errors (PEFT_ERR_INVALID_CONFIG on a malformed step).
// Exposed for tests; regexes are compiled on each call.
std::optional<std::string> apply_save_chain(const nlohmann::json& entry, std::string_view key, bool with_prefix_changes,
                                            const std::string& what);

}  // namespace peft
