#include "peft/adapter/module_matcher.hpp"

#include <charconv>

namespace peft {

const char* verdict_name(ModuleMatcher::Verdict verdict) {
  switch (verdict) {
    case ModuleMatcher::Verdict::targeted: return "targeted";
    case ModuleMatcher::Verdict::not_targeted: return "not targeted";
    case ModuleMatcher::Verdict::excluded: return "excluded";
    case ModuleMatcher::Verdict::unknown: return "unknown";
  }
  return "unknown";
}

ModuleMatcher::ModuleMatcher(const LoraConfig& config)
    : targets_(config.target_modules),
      excludes_(config.exclude_modules),
      layers_to_transform_(config.layers_to_transform),
      default_rank_(config.r),
      default_alpha_(config.lora_alpha) {
  ConfigPatterns patterns = compile_patterns(config);
  target_regex_ = std::move(patterns.target_modules);
  exclude_regex_ = std::move(patterns.exclude_modules);
  modules_to_save_ = std::move(patterns.modules_to_save);
  layer_regexes_ = std::move(patterns.layer_index);
  if (layers_to_transform_ && layers_to_transform_->empty()) layers_to_transform_.reset();  // [] = every layer
  for (size_t k = 0; k < config.rank_pattern.size(); ++k)
    rank_keys_.push_back({config.rank_pattern[k].first, std::move(patterns.rank_keys[k]),
                          static_cast<double>(config.rank_pattern[k].second)});
  for (size_t k = 0; k < config.alpha_pattern.size(); ++k)
    alpha_keys_.push_back({config.alpha_pattern[k].first, std::move(patterns.alpha_keys[k]), config.alpha_pattern[k].second});
}

bool ModuleMatcher::needs_expansion() const {
  return targets_.kind == ModuleSelector::Kind::all_linear || targets_.kind == ModuleSelector::Kind::none;
}

void ModuleMatcher::expand_targets(std::vector<std::string> names) {
  targets_.kind = ModuleSelector::Kind::list;
  targets_.names = std::move(names);
  targets_.pattern.clear();
  target_regex_.reset();
}

bool ModuleMatcher::list_match(const std::vector<std::string>& names, std::string_view module) const {
  for (const std::string& name : names) {
    if (module == name) return true;
    if (module.size() > name.size() && module.ends_with(name) && module[module.size() - name.size() - 1] == '.')
      return true;
  }
  return false;
}

bool ModuleMatcher::layer_allowed(std::string_view module) const {
  if (!layers_to_transform_) return true;
  std::optional<std::string> index;
  for (const PythonRegex& regex : layer_regexes_) {
    auto m = regex.match_groups(module);
    if (m) {
      int group = regex.group_number("idx");
      if (group > 0 && static_cast<size_t>(group) < m->groups.size()) index = m->groups[group];
      break;
    }
  }
  if (!index) return false;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(index->data(), index->data() + index->size(), value);
  if (ec != std::errc() || end != index->data() + index->size()) return false;  // beyond int64: in no list
  for (int64_t wanted : *layers_to_transform_)
    if (wanted == value) return true;
  return false;
}

ModuleMatcher::Verdict ModuleMatcher::check(std::string_view module) const {
  if (exclude_regex_ && exclude_regex_->fullmatch(module)) return Verdict::excluded;
  if (excludes_.kind == ModuleSelector::Kind::list && list_match(excludes_.names, module)) return Verdict::excluded;
  for (const PythonRegex& regex : modules_to_save_)
    if (regex.match(module)) return Verdict::excluded;
  switch (targets_.kind) {
    case ModuleSelector::Kind::none:
    case ModuleSelector::Kind::all_linear:
      return Verdict::unknown;
    case ModuleSelector::Kind::regex:
      return target_regex_->fullmatch(module) ? Verdict::targeted : Verdict::not_targeted;
    case ModuleSelector::Kind::list: {
      // An exact name skips the layer filter; a suffix match goes through it (as in PEFT).
      for (const std::string& name : targets_.names)
        if (module == name) return Verdict::targeted;
      if (!list_match(targets_.names, module)) return Verdict::not_targeted;
      return layer_allowed(module) ? Verdict::targeted : Verdict::not_targeted;
    }
  }
  return Verdict::unknown;
}

std::optional<std::string> ModuleMatcher::rank_key(std::string_view module) const {
  for (const PatternKey& k : rank_keys_)
    if (k.regex.match(module)) return k.key;
  return std::nullopt;
}

std::optional<std::string> ModuleMatcher::alpha_key(std::string_view module) const {
  for (const PatternKey& k : alpha_keys_)
    if (k.regex.match(module)) return k.key;
  return std::nullopt;
}

int64_t ModuleMatcher::rank_for(std::string_view module) const {
  for (const PatternKey& k : rank_keys_)
    if (k.regex.match(module)) return static_cast<int64_t>(k.value);
  return default_rank_;
}

double ModuleMatcher::alpha_for(std::string_view module) const {
  for (const PatternKey& k : alpha_keys_)
    if (k.regex.match(module)) return k.value;
  return default_alpha_;
}

}  // namespace peft
