#include "peft/base/gguf_base.hpp"

#include <filesystem>
#include <optional>
#include <system_error>
#include <variant>

#include "core/error.hpp"
#include "core/text.hpp"
#include "gguf/gguf_file.hpp"
#include "peft/base/base_config.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/gguf_experts.hpp"
#include "checkpoint/hub_cache.hpp"

namespace peft {

void require_gguf_model(const GgufHeader& header, const std::string& name) {
  const std::optional<std::string> type = metadata_string(header, "general.type");
  const bool has_adapter_type = find_metadata(header, "adapter.type") != nullptr;
  if (type != "adapter" && !has_adapter_type) return;
  const std::string why = type == "adapter" ? "general.type is \"adapter\"" : "it has an adapter.type key";
  fail(PEFT_ERR_INVALID_ARGUMENT, peft::quoted(name) + " is a GGUF adapter (" + why +
                                      "), not a model: the base must be the model the adapter was made for");
}

std::optional<GgufTiedEmbeddings> gguf_tied_embeddings(const Checkpoint& gguf, const ArchTable& table) {
  const std::optional<std::string>& output = table.output_embedding();
  if (!output) return std::nullopt;
  const std::optional<GgufSlot> output_slot = gguf_slot(table, *output);
  if (!output_slot || output_slot->slice || gguf.find(output_slot->tensor)) return std::nullopt;  // stored: untied
  for (const std::string& input : table.input_embeddings()) {
    const std::optional<GgufSlot> slot = gguf_slot(table, input);
    if (!slot || slot->slice) continue;
    if (const auto index = gguf.find(slot->tensor)) return GgufTiedEmbeddings{*index, *output, output_slot->tensor};
  }
  return std::nullopt;
}

namespace {

// The config llama.cpp's converter makes a GGUF model from: the model's own, or for a
// vision-language wrapper that no table knows (Llava: model_type "llava") the config of its
// language model ("text_config"), whose type, head counts and experts the GGUF model has
// (language_model_path in gguf_experts.hpp).
const nlohmann::json& gguf_model_config(const nlohmann::json& config) {
  if (!config.is_object() || detect_family(&config, std::nullopt)) return config;
  const auto text = config.find("text_config");
  return text != config.end() && text->is_object() && detect_family(&*text, std::nullopt) ? *text : config;
}

}  // namespace

GgufBase open_gguf_base(const std::string& name, const std::function<bool(const ArchTable&)>& fits) {
  GgufBase base;
  base.name = name;
  if (base.name.empty()) fail(PEFT_ERR_INVALID_ARGUMENT, "no base model given");
  if (is_gguf_path(base.name)) {
    base.gguf = Checkpoint::open(base.name);
    const GgufHeader& header = *base.gguf->gguf_header(0);
    require_gguf_model(header, base.name);
    const auto arch = metadata_string(header, "general.architecture");
    if (!arch) fail(PEFT_ERR_INVALID_CHECKPOINT, base.name + ": the GGUF file has no string general.architecture");
    base.architecture = *arch;
    base.table = fits ? builtin_table_for_gguf(base.architecture, fits) : builtin_table_for_gguf(base.architecture);
    base.heads = gguf_heads_from_metadata(header, base.architecture);
    base.experts = gguf_experts_from_metadata(header, base.architecture);
    base.tied_embeddings = gguf_tied_embeddings(*base.gguf, *base.table).has_value();
  } else {
    const std::string dir = resolve_model_location(base.name);
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      fail(PEFT_ERR_NOT_FOUND, "base model " + peft::quoted(base.name) +
                                   " is neither a GGUF file nor a model folder (nor a model id in the hub cache)");
    const nlohmann::json config = read_base_config(dir);
    const nlohmann::json& model = gguf_model_config(config);
    const auto model_type = model.is_object() && model.contains("model_type") && model["model_type"].is_string()
                                ? std::optional<std::string>(model["model_type"].get<std::string>())
                                : std::nullopt;
    if (!model_type) fail(PEFT_ERR_INVALID_CONFIG, dir + ": config.json has no model_type");
    const std::optional<FamilyGuess> family = detect_family(&model, std::nullopt);
    base.table = builtin_arch_table(family ? family->family : detect_base_family(dir, std::nullopt));
    const auto architecture = base.table->gguf_architecture_of(*model_type);
    if (!architecture)
      fail(PEFT_ERR_UNSUPPORTED, "no GGUF architecture is known for model_type " + peft::quoted(*model_type) +
                                     " (docs/gguf.md lists those that are)");
    base.architecture = *architecture;
    base.heads = gguf_heads_from_config(model);
    base.experts = gguf_experts_from_config(model);
    base.tied_embeddings = config_ties_embeddings(config, *base.table);
  }
  return base;
}

}  // namespace peft
