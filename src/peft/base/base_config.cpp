// A base model's config.json: reading it and the family detected from it (base_config.hpp).
#include "peft/base/base_config.hpp"

#include <cstdint>
#include <filesystem>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"
#include "peft/arch/arch_registry.hpp"
#include "checkpoint/checkpoint_layout.hpp"
#include "checkpoint/hub_cache.hpp"

namespace peft {
namespace {

constexpr uint64_t kMaxBaseConfigBytes = 16ull << 20;

}  // namespace

nlohmann::json read_base_config(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path = fs::path(dir) / "config.json";
  // A link may lead where the weight files' links may (resolve_in_folder), not to any file.
  if (fs::is_symlink(path, ec)) path = resolve_in_folder(dir, "config.json", "the file");
  if (!fs::is_regular_file(path, ec)) return nullptr;
  return parse_json(read_text_file(path.string(), kMaxBaseConfigBytes), PEFT_ERR_INVALID_CONFIG, path.string());
}

std::string detect_base_family(const std::optional<std::string>& base_dir,
                               const std::optional<std::string>& model_name) {
  const nlohmann::json config = base_dir ? read_base_config(resolve_model_location(*base_dir)) : nlohmann::json();
  const auto guess = detect_family(config.is_object() ? &config : nullptr, model_name);
  if (!guess)
    fail(PEFT_ERR_NOT_FOUND, "no built-in architecture table matches " +
                                 (base_dir ? "base model " + peft::quoted(*base_dir) : "") +
                                 (base_dir && model_name ? " or " : "") +
                                 (model_name ? "model name " + peft::quoted(*model_name) : "nothing"));
  return guess->family;
}

bool config_ties_embeddings(const nlohmann::json& config, const ArchTable& table) {
  if (!table.tie_embeddings_config() || !config.is_object()) return false;
  const std::string& key = *table.tie_embeddings_config();
  const nlohmann::json* tie = config.contains(key) ? &config[key] : nullptr;
  if (!tie && config.contains("text_config") && config["text_config"].is_object() && config["text_config"].contains(key))
    tie = &config["text_config"][key];
  return tie && tie->is_boolean() && tie->get<bool>();
}

}  // namespace peft
