#include "peft/adapter/expert_modules.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/arch/expert_params.hpp"

namespace peft {
namespace {

constexpr std::string_view kWrapper = ".base_layer";

// PEFT's match of "<module>.<param>" against the target_parameters entries.
bool targeted(const LoraConfig& config, const std::string& key) {
  for (const std::string& entry : config.target_parameters)
    if (key == entry || key.ends_with("." + entry)) return true;
  return false;
}

// The parameters of `module` that some entry names (an entry's last segment as the parameter).
std::vector<std::string> named_parameters_of(const LoraConfig& config, const std::string& module) {
  std::vector<std::string> names;
  for (const std::string& entry : config.target_parameters) {
    const size_t dot = entry.rfind('.');
    std::string param = dot == std::string::npos ? entry : entry.substr(dot + 1);
    if (targeted(config, module + "." + param)) names.push_back(std::move(param));
  }
  return names;
}

}  // namespace

void resolve_expert_modules(std::vector<AdapterModule>& modules, const LoraConfig& config, const ArchTable* table,
                            const std::string& dir) {
  if (config.target_parameters.empty()) return;
  const std::vector<ExpertsRule> rules = table ? expert_rules(*table) : std::vector<ExpertsRule>{};
  std::vector<std::string> unresolved;
  for (AdapterModule& m : modules) {
    if (!m.is_lora()) continue;
    std::string owner = m.name;
    size_t depth = 0;
    while (owner.ends_with(kWrapper)) {
      owner.resize(owner.size() - kWrapper.size());
      ++depth;
    }
    const std::vector<std::string> named = named_parameters_of(config, owner);
    if (named.empty()) continue;
    const ExpertsModule found = match_experts_module(rules, owner);
    std::vector<const ExpertParamRule*> params;  // targeted, in declaration order
    std::string unknown;                         // a named parameter the table does not list
    if (found.rule) {
      for (const ExpertParamRule& p : found.rule->params)
        if (targeted(config, owner + "." + p.name)) params.push_back(&p);
      for (const std::string& name : named)
        if (std::none_of(params.begin(), params.end(), [&](const ExpertParamRule* p) { return p->name == name; }))
          unknown = name;
    }
    if (depth >= params.size() || !unknown.empty() || m.kind != LayerKind::linear) {
      std::string why = !table ? "no architecture table is known for the adapter"
                        : !found.rule
                            ? "architecture table " + peft::quoted(table->family()) + " knows no stacked experts at " +
                                  peft::quoted(owner)
                        : !unknown.empty()
                            ? "architecture table " + peft::quoted(table->family()) + " knows no stacked parameter " +
                                  peft::quoted(owner + "." + unknown) + ", so the nesting of the wrappers is unknown"
                            : "target_parameters selects " + std::to_string(params.size()) +
                                  " parameter(s) of the experts that the table knows, fewer than its " +
                                  std::to_string(depth + 1) + " nested wrapper(s)";
      for (const AdapterTensor& t : m.tensors) unresolved.push_back(peft::quoted(t.key) + " (" + why + ")");
      continue;
    }
    const ExpertParamRule& param = *params[params.size() - 1 - depth];
    m.expert =
        ExpertTarget{owner, param.name, found.checkpoint_module, param.transposed, param.per_expert, 0, param.interleaved};
    for (AdapterTensor& t : m.tensors)
      if (is_lora_role(t.role)) t.base_tensor = owner + "." + param.name;
  }
  if (!unresolved.empty())
    fail(PEFT_ERR_UNRESOLVED_KEY, dir + ": " + std::to_string(unresolved.size()) +
                                      " tensor key(s) of target_parameters do not resolve to a stacked expert "
                                      "parameter: " + join_text(unresolved, ", "));
}

void refuse_expert_modules(const std::vector<AdapterModule>& modules, const std::string& job) {
  for (const AdapterModule& m : modules)
    if (m.expert)
      fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + " adapts the stacked expert parameter " +
                                     peft::quoted(m.expert->module + "." + m.expert->param) +
                                     " (target_parameters), which " + job +
                                     " does not support; merge it into a safetensors checkpoint instead");
}

}  // namespace peft
