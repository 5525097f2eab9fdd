#include "peft/module_matcher.hpp"

#include <charconv>

#include "core/error.hpp"
#include "core/text.hpp"

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
  constexpr int32_t kCode = PEFT_ERR_INVALID_CONFIG;
  if (targets_.kind == ModuleSelector::Kind::regex) target_regex_.emplace(targets_.pattern, kCode, "field \"target_modules\"");
  // An exclude_modules string is always a regex, even "all-linear".
  if (excludes_.kind == ModuleSelector::Kind::regex || excludes_.kind == ModuleSelector::Kind::all_linear)
    exclude_regex_.emplace(excludes_.pattern, kCode, "field \"exclude_modules\"");
  if (config.modules_to_save)
    for (const std::string& m : *config.modules_to_save)
      modules_to_save_.emplace_back("(^|.*\\.)" + m + "($|\\..*)", kCode, "field \"modules_to_save\" entry " + peft::quoted(m));
  if (layers_to_transform_ && layers_to_transform_->empty()) layers_to_transform_.reset();  // [] = every layer
  if (config.layers_pattern.empty()) {
    layer_regexes_.emplace_back(".*?\\.[^.]*\\.(?P<idx>\\d+)\\.", kCode, "field \"layers_to_transform\"");
  } else {
    for (const std::string& p : config.layers_pattern)
      layer_regexes_.emplace_back("(?:^|.*?\\.)" + p + "\\.(?P<idx>\\d+)\\.", kCode,
                                  "field \"layers_pattern\" entry " + peft::quoted(p));
  }
  for (const auto& [key, rank] : config.rank_pattern)
    rank_keys_.push_back({key, PythonRegex("(.*\\.)?(" + key + ")$", kCode, "field \"rank_pattern\" key " + peft::quoted(key)),
                          static_cast<double>(rank)});
  for (const auto& [key, alpha] : config.alpha_pattern)
    alpha_keys_.push_back({key, PythonRegex("(.*\\.)?(" + key + ")$", kCode, "field \"alpha_pattern\" key " + peft::quoted(key)),
                           alpha});
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
