#include "peft/lowrank/lora_extract.hpp"

#include <cstring>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/text.hpp"
#include "peft/base/base_model.hpp"
#include "peft/arch/arch_registry.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;

// The modules to consider: target_modules as given, or "all-linear" expanded on the base.
std::vector<TargetedBaseModule> selected_modules(const BaseModel& base, const ArchTable* table,
                                                 const std::vector<std::string>& names) {
  Json doc = Json::object();
  doc["peft_type"] = "LORA";
  doc["r"] = 1;
  doc["lora_alpha"] = 1;
  if (names.empty()) {
    doc["target_modules"] = "all-linear";
  } else {
    doc["target_modules"] = names;
  }
  const LoraConfig config = LoraConfig::parse(doc.dump(), "the extraction's module selection");
  ModuleMatcher matcher(config);
  if (matcher.needs_expansion()) {
    if (!table)
      fail(PEFT_ERR_INVALID_ARGUMENT, "no architecture table knows base model " + peft::quoted(base.dir) +
                                          " (model_type " + peft::quoted(base.model_type().value_or("(none)")) +
                                          "): name the modules to extract");
    matcher.expand_targets(*implicit_targets(base, *table, config));
  }
  std::vector<TargetedBaseModule> modules = targeted_base_modules(base, matcher, table);
  if (modules.empty())
    fail(PEFT_ERR_INVALID_ARGUMENT, "the modules to extract select no Linear or Conv1D layer of base model " +
                                        peft::quoted(base.dir));
  for (const TargetedBaseModule& m : modules)
    if (m.kind != ModuleKind::linear && m.kind != ModuleKind::conv1d)
      fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.module) + " is a layer of kind " +
                                     module_kind_name(m.kind) + "; LoRA extraction handles Linear and Conv1D layers");
  return modules;
}

}  // namespace

std::vector<LowRankModule> extract_lora(const std::string& base_location, const std::string& tuned_location,
                                        const std::string& out_dir, const LowRankOptions& options) {
  check_lowrank_options(options);
  const BaseModel base = BaseModel::open(base_location, {});
  const BaseModel tuned = BaseModel::open(tuned_location, {});
  refuse_output_over_inputs(out_dir, {{"the base model folder", base.dir}, {"the fine-tuned model folder", tuned.dir}});
  const nlohmann::json* base_config = base.config.is_object() ? &base.config : nullptr;
  std::shared_ptr<const ArchTable> table;
  if (auto guess = detect_family(base_config, std::nullopt)) table = builtin_arch_table(guess->family);
  const std::vector<TargetedBaseModule> modules = selected_modules(base, table.get(), options.modules);

  std::vector<DeltaSource> sources;
  std::vector<std::string> missing;
  for (const TargetedBaseModule& m : modules) {
    const TensorInfo& b = base.weights->tensor(m.weight);
    const std::optional<size_t> t = tuned.weights->find(b.name);
    if (!t) {
      missing.push_back(peft::quoted(b.name));
      continue;
    }
    const TensorInfo& ti = tuned.weights->tensor(*t);
    if (ti.shape != b.shape)
      fail(PEFT_ERR_SHAPE_MISMATCH, "weight " + peft::quoted(b.name) + " is " + shape_text(b.shape) +
                                        " in the base but " + shape_text(ti.shape) + " in the fine-tuned checkpoint");
    const size_t bi = m.weight, tj = *t;
    const Checkpoint* bw = base.weights.get();
    const Checkpoint* tw = tuned.weights.get();
    const auto rows = static_cast<int64_t>(b.shape[0]), cols = static_cast<int64_t>(b.shape[1]);
    sources.push_back({m.module, m.kind == ModuleKind::conv1d,
                       [bw, tw, bi, tj, rows, cols](int64_t& r, int64_t& c) -> std::optional<std::vector<float>> {
                         std::vector<float> delta = tw->read_f32(tj);
                         const std::vector<float> w = bw->read_f32(bi);
                         bool changed = false;
                         for (size_t k = 0; k < delta.size(); ++k) {
                           delta[k] -= w[k];
                           changed = changed || delta[k] != 0.0f;
                         }
                         if (!changed) return std::nullopt;
                         r = rows;
                         c = cols;
                         return delta;
                       },
                       nullptr, nullptr});
  }
  if (!missing.empty())
    fail(PEFT_ERR_UNRESOLVED_KEY, "the fine-tuned checkpoint " + peft::quoted(tuned.dir) + " lacks " +
                                      std::to_string(missing.size()) + " weight(s) of the base: " +
                                      join_text(missing, ", "));
  Json config = Json::object();
  config["base_model_name_or_path"] = base_location;
  config["bias"] = "none";
  config["inference_mode"] = true;
  config["init_lora_weights"] = true;
  config["lora_dropout"] = 0.0;
  config["peft_type"] = "LORA";
  config["target_modules"] = Json::array();
  config["task_type"] = nullptr;
  config["use_dora"] = false;
  config["use_rslora"] = false;
  return write_lowrank_adapter(sources, config, out_dir, options);
}

}  // namespace peft
