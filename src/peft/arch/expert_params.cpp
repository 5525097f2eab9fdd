#include "peft/arch/expert_params.hpp"

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {
namespace {

[[noreturn]] void bad_experts(const ArchTable& table, const std::string& what) {
  fail(PEFT_ERR_INVALID_CONFIG, "architecture table " + peft::quoted(table.source()) + ": experts" + what);
}

std::string text_field(const ArchTable& table, const nlohmann::json& obj, const char* field, const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end() || !it->is_string()) bad_experts(table, where + ": \"" + field + "\" must be a string");
  return it->get<std::string>();
}

}  // namespace

std::vector<ExpertsRule> expert_rules(const ArchTable& table) {
  const nlohmann::json& data = table.experts_data();
  std::vector<ExpertsRule> rules;
  if (data.is_null()) return rules;
  if (!data.is_array()) bad_experts(table, " must be a list of {\"module\", \"params\"}");
  for (size_t i = 0; i < data.size(); ++i) {
    const std::string where = "[" + std::to_string(i) + "]";
    const nlohmann::json& entry = data[i];
    if (!entry.is_object()) bad_experts(table, where + " must be an object");
    ExpertsRule rule{NameTemplate::parse(text_field(table, entry, "module", where), table.source() + " experts" + where),
                     std::nullopt,
                     {}};
    if (entry.contains("checkpoint"))
      rule.checkpoint =
          NameTemplate::parse(text_field(table, entry, "checkpoint", where), table.source() + " experts" + where);
    auto params = entry.find("params");
    if (params == entry.end() || !params->is_array() || params->empty())
      bad_experts(table, where + ": \"params\" must be a non-empty list");
    for (const nlohmann::json& p : *params) {
      if (!p.is_object()) bad_experts(table, where + ": each of \"params\" must be an object");
      ExpertParamRule param{text_field(table, p, "name", where), false, {}, false};
      if (auto t = p.find("transposed"); t != p.end()) {
        if (!t->is_boolean()) bad_experts(table, where + ": \"transposed\" must be true or false");
        param.transposed = t->get<bool>();
      }
      if (auto s = p.find("per_expert"); s != p.end()) {
        if (!s->is_array() || s->empty()) bad_experts(table, where + ": \"per_expert\" must be a non-empty list");
        for (const nlohmann::json& name : *s) {
          if (!name.is_string()) bad_experts(table, where + ": \"per_expert\" must hold strings");
          param.per_expert.push_back(name.get<std::string>());
        }
      }
      if (auto s = p.find("split"); s != p.end()) {
        if (!s->is_string() || (*s != "interleaved" && *s != "consecutive"))
          bad_experts(table, where + ": \"split\" must be \"consecutive\" or \"interleaved\"");
        param.interleaved = *s == "interleaved";
      }
      rule.params.push_back(std::move(param));
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

ExpertsModule match_experts_module(const std::vector<ExpertsRule>& rules, const std::string& module) {
  for (const ExpertsRule& rule : rules) {
    NameTemplate::Captures captures;
    if (rule.module.match(module, captures))
      return {&rule, rule.checkpoint ? rule.checkpoint->fill(captures) : module};
  }
  return {};
}

}  // namespace peft
