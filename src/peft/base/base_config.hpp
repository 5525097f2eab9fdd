// A base model's config.json: the one reader of it, and the built-in architecture family that a
// base model folder or a model name points to.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace peft {

class ArchTable;

// The parsed config.json of the base model folder `dir`; null when the folder has none (or `dir`
// is no folder). A link is followed only where the weight files' links may lead (resolve_in_folder,
// checkpoint/checkpoint_layout.hpp); a file above 16 MiB is PEFT_ERR_INVALID_ARGUMENT and text that is
// not JSON PEFT_ERR_INVALID_CONFIG.
nlohmann::json read_base_config(const std::string& dir);

// Whether `config` ties the table's output embedding to its input embedding: the table's
// tie_embeddings_config key (tie_word_embeddings) is true at the top level, or, in a composite config
// without it (Gemma3ForConditionalGeneration's), in its text_config.
bool config_ties_embeddings(const nlohmann::json& config, const ArchTable& table);

// The built-in family of a base model: from the config.json in `base_dir`, failing that from
// `model_name` (detect_family, peft/arch/arch_registry.hpp). Either may be absent. PEFT_ERR_NOT_FOUND naming
// both when no built-in table matches.
std::string detect_base_family(const std::optional<std::string>& base_dir,
                               const std::optional<std::string>& model_name);

}  // namespace peft
