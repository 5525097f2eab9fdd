// The built-in architecture tables (data/arch/<family>.json) and family detection.
//
// Tables are read at run time, not compiled in, so that the files users copy and edit are the very
// files the library uses, and a fix to a table needs no rebuild. They are looked up in this order;
// the first directory that holds `arch/<family>.json` wins:
//   1. $PEFT_C_DATA_DIR                          (explicit override, e.g. for bindings and tests)
//   2. <directory of libpeft_c>/../share/peft_c  (a relocated install: prefix/lib + prefix/share)
//   3. PEFT_DATA_DIR                             (the configured install prefix, share/peft_c)
//   4. PEFT_SOURCE_DATA_DIR                      (the source tree's data/, for builds that are not installed)
// Loaded tables are cached for the life of the process; all functions are thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peft/arch/arch_table.hpp"

namespace peft {

// The table of a built-in family ("llama"); PEFT_ERR_NOT_FOUND listing the directories searched.
std::shared_ptr<const ArchTable> builtin_arch_table(const std::string& family);

// The names of the built-in families, sorted (from the first directory that has any table).
std::vector<std::string> builtin_families();

// The first built-in table (in family order) that reads files of a GGUF architecture
// (general.architecture); PEFT_ERR_UNSUPPORTED naming it when none does.
std::shared_ptr<const ArchTable> builtin_table_for_gguf(const std::string& architecture);
// The same among the tables for which `fits` holds: several tables read one GGUF architecture
// (llama, mistral and mixtral all read "llama"), and the names an input needs pick the one that
// knows them all (a Mixtral expert); the first that reads it when none fits.
std::shared_ptr<const ArchTable> builtin_table_for_gguf(const std::string& architecture,
                                                        const std::function<bool(const ArchTable&)>& fits);

// The directories searched, in order (for messages and docs).
std::vector<std::string> arch_table_search_dirs();

struct FamilyGuess {
  std::string family;
  std::string reason;  // "model_type \"llama\" in config.json", "name \"TinyLLama-v0\" matches /llama/"
};

// Detects the family from a base model's config.json (model_type, then architectures) and, failing
// that, from base_model_name_or_path (the table whose name pattern gives the longest match in the
// part after the last '/'). nullopt when nothing matches.
std::optional<FamilyGuess> detect_family(const nlohmann::json* base_config,
                                         const std::optional<std::string>& base_model_name_or_path);

}  // namespace peft
