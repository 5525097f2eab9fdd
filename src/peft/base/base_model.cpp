// Opening a base model folder and finding its weights by module name (base_model.hpp).
#include "peft/base/base_model.hpp"

#include <filesystem>
#include <set>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/arch/conversions.hpp"
#include "peft/base/base_config.hpp"
#include "peft/base/bnb_base.hpp"
#include "checkpoint/hub_cache.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;

}  // namespace

BaseModel BaseModel::open(const std::string& dir_or_id, const OpenOptions& options) {
  BaseModel base;
  base.dir = resolve_model_location(dir_or_id);
  const std::string& dir = base.dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(PEFT_ERR_NOT_FOUND, "base model folder " + peft::quoted(dir) + " does not exist or is not a folder");
  base.config = read_base_config(dir);
  base.weights = Checkpoint::open(dir, options);
  // bitsandbytes' packed 4-bit weights: the modules' shapes, for validating adapters against them.
  const nlohmann::json* q = base.config.is_object() && base.config.contains("quantization_config")
                                ? &base.config["quantization_config"] : nullptr;
  if (q && q->is_object() && q->value("quant_method", std::string()) == "bitsandbytes")
    if (auto bnb = recognise_bnb_base(base.config, *base.weights, dir))
      for (const auto& [index, weight] : bnb->weights) base.weight_shapes[index] = weight.shape;
  return base;
}

std::optional<std::string> BaseModel::model_type() const {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find("model_type");
  if (it == config.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

const std::vector<uint64_t>& BaseModel::weight_shape(size_t i) const {
  auto it = weight_shapes.find(i);
  return it != weight_shapes.end() ? it->second : weights->tensor(i).shape;
}

namespace {

// "<module>.<param>" as stored: the name as is, then without and with the table's base_model_prefix.
std::optional<size_t> find_stored(const Checkpoint& weights, std::string_view module, std::string_view param,
                                  const ArchTable* table) {
  std::string name = std::string(module) + "." + std::string(param);
  if (auto i = weights.find(name)) return i;
  if (table && !table->base_model_prefix().empty()) {
    // transformers loads a headless checkpoint into a model with a head, and the reverse.
    std::string prefix = table->base_model_prefix() + ".";
    if (name.starts_with(prefix)) {
      if (auto i = weights.find(std::string_view(name).substr(prefix.size()))) return i;
    } else if (auto i = weights.find(prefix + name)) {
      return i;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<size_t> BaseModel::find(std::string_view module, std::string_view param, const ArchTable* table) const {
  if (auto i = find_stored(*weights, module, param, table)) return i;
  if (table)
    for (const std::string& alias : table->aliases_of(module))
      if (auto i = find_stored(*weights, alias, param, table)) return i;
  // An adapter written against transformers' in-memory names of a model it renames on load.
  for (const std::string& saved : saved_names(config, std::string(module) + "." + std::string(param)))
    if (auto i = weights->find(saved)) return i;
  if (param == "weight" && is_tied_output(module, table)) return tied_embeddings(table)->input;
  return std::nullopt;
}

bool BaseModel::is_tied_output(std::string_view module, const ArchTable* table) const {
  if (!table || !table->output_embedding() || module != *table->output_embedding()) return false;
  auto tied = tied_embeddings(table);
  return tied && !tied->output;
}

std::optional<TiedEmbeddings> BaseModel::tied_embeddings(const ArchTable* table) const {
  if (!table || !table->output_embedding() || !config_ties_embeddings(config, *table)) return std::nullopt;
  for (const std::string& input : table->input_embeddings()) {
    auto index = find_stored(*weights, input, "weight", table);
    if (!index) continue;
    TiedEmbeddings t;
    t.input = *index;
    t.output_module = *table->output_embedding();
    t.output_weight = t.output_module + ".weight";
    t.output = find_stored(*weights, t.output_module, "weight", table);
    t.config_key = *table->tie_embeddings_config();
    return t;
  }
  return std::nullopt;
}

std::vector<std::string> all_linear_modules(const BaseModel& base, const ArchTable& table, const LoraConfig& config) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (size_t i = 0; i < base.weights->tensor_count(); ++i) {
    const TensorInfo& t = base.weights->tensor(i);
    if (!t.name.ends_with(".weight") || t.shape.size() != 2) continue;
    std::string module = t.name.substr(0, t.name.size() - 7);
    const ModuleRule* rule = table.rule_for_hf(module);
    if (!rule || (rule->kind != ModuleKind::linear && rule->kind != ModuleKind::conv1d)) continue;
    if (seen.insert(module).second) names.push_back(module);
    for (const std::string& alias : table.aliases_of(module))  // adapters may use the other name
      if (seen.insert(alias).second) names.push_back(alias);
  }
  // The output embedding is never targeted; a SEQ_CLS model without one loses its head instead.
  std::string excluded;
  if (table.output_embedding() && seen.contains(*table.output_embedding())) {
    excluded = *table.output_embedding();
  } else if (config.task_type == "SEQ_CLS") {
    for (const char* head : {"score", "classifier"})
      if (seen.contains(head)) {
        excluded = head;
        break;
      }
  }
  std::erase(names, excluded);
  return names;
}

std::optional<std::vector<std::string>> implicit_targets(const BaseModel& base, const ArchTable& table,
                                                         const LoraConfig& config) {
  if (config.target_modules.kind == ModuleSelector::Kind::all_linear) return all_linear_modules(base, table, config);
  const std::optional<std::string> model_type = base.model_type();
  const std::vector<std::string>* defaults = model_type ? table.default_targets(*model_type) : nullptr;
  if (!defaults) return std::nullopt;
  return *defaults;
}

std::vector<TargetedBaseModule> targeted_base_modules(const BaseModel& base, const ModuleMatcher& matcher,
                                                      const ArchTable* table) {
  std::vector<TargetedBaseModule> modules;
  for (size_t i = 0; i < base.weights->tensor_count(); ++i) {
    const TensorInfo& t = base.weights->tensor(i);
    if (!t.name.ends_with(".weight") || (t.shape.size() != 2 && t.shape.size() != 4)) continue;
    std::string module = t.name.substr(0, t.name.size() - 7);
    if (matcher.check(module) != ModuleMatcher::Verdict::targeted) continue;
    const ModuleRule* rule = table ? table->rule_for_module(module) : nullptr;
    const ModuleKind kind = rule ? rule->kind : t.shape.size() == 2 ? ModuleKind::linear : ModuleKind::conv2d;
    if (kind == ModuleKind::norm || kind == ModuleKind::other) continue;  // PEFT has no LoRA layer for those
    modules.push_back({std::move(module), i, kind});
  }
  return modules;
}

}  // namespace peft
