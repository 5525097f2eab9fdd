// The renames the adapter doctor knows (key_renames.hpp).
#include "peft/doctor/key_renames.hpp"

#include <algorithm>
#include <array>

#include "peft/arch/conversions.hpp"
#include "peft/arch/key_grammar.hpp"

namespace peft {
namespace {

std::string_view without_peft_prefix(std::string_view key) {
  return key.starts_with(kPeftPrefix) ? key.substr(kPeftPrefix.size()) : key;
}

// "<module>.<tail>" with a non-empty module: the module, else nullopt.
std::optional<std::string> module_before(std::string_view key, std::string_view tail) {
  std::string dotted = "." + std::string(tail);
  if (key.size() <= dotted.size() || !key.ends_with(dotted)) return std::nullopt;
  return std::string(key.substr(0, key.size() - dotted.size()));
}

struct SuffixVariant {
  const char* written;  // the tail as found
  const char* peft;     // PEFT's role suffix
};
constexpr std::array<SuffixVariant, 4> kSuffixVariants{{
    {"lora_A", "lora_A.weight"},
    {"lora_B", "lora_B.weight"},
    {"lora_embedding_A.weight", "lora_embedding_A"},
    {"lora_embedding_B.weight", "lora_embedding_B"},
}};

constexpr std::array<const char*, 5> kKohyaPrefixes{"lora_unet_", "lora_te1_", "lora_te2_", "lora_te_",
                                                    "lora_transformer_"};

}  // namespace

std::optional<std::string> kohya_down_module(std::string_view key) {
  return module_before(without_peft_prefix(key), "lora_down.weight");
}

std::optional<KeyRewrite> rewrite_key(std::string_view key, const std::vector<std::string>& kohya_modules) {
  std::string_view k = without_peft_prefix(key);
  KeyRewrite out;
  auto kohya = [&](const char* tail, KeyRewrite::Role role, const char* suffix) {
    auto module = module_before(k, tail);
    if (!module) return false;
    if (role != KeyRewrite::Role::lora_tensor &&
        std::find(kohya_modules.begin(), kohya_modules.end(), *module) == kohya_modules.end())
      return false;
    out.family = KeyRewrite::Family::kohya;
    out.role = role;
    out.module = *module;
    out.suffix = suffix;
    return true;
  };
  if (kohya("lora_down.weight", KeyRewrite::Role::lora_tensor, "lora_A.weight") ||
      kohya("lora_up.weight", KeyRewrite::Role::lora_tensor, "lora_B.weight") ||
      kohya("alpha", KeyRewrite::Role::kohya_alpha, "") ||
      kohya("dora_scale", KeyRewrite::Role::kohya_dora_scale, ""))
    return out;
  for (const SuffixVariant& v : kSuffixVariants) {
    auto module = module_before(k, v.written);
    if (!module) continue;
    // The rewritten key must be one the grammar reads (no empty segments, no other lora_ segment).
    auto parsed = parse_adapter_key(*module + "." + v.peft);
    if (!parsed || parsed->module != *module) continue;
    out.family = KeyRewrite::Family::weight_suffix;
    out.module = *module;
    out.suffix = v.peft;
    return out;
  }
  return std::nullopt;
}

bool kohya_underscore_path(std::string_view module, std::string& rest) {
  for (const char* prefix : kKohyaPrefixes) {
    std::string_view p(prefix);
    if (module.size() > p.size() && module.starts_with(p) && module.find('.') == std::string_view::npos) {
      rest = std::string(module.substr(p.size()));
      return true;
    }
  }
  return false;
}

std::string underscore_path(std::string_view dotted) {
  std::string out(dotted);
  std::replace(out.begin(), out.end(), '.', '_');
  return out;
}

std::vector<RenameCandidate> rename_candidates(std::string_view module, std::string_view param) {
  std::vector<RenameCandidate> out;
  const std::string suffix = "." + std::string(param);
  for (const ConversionRename& r : conversion_renames(std::string(module) + suffix))
    if (r.key.size() > suffix.size() && r.key.ends_with(suffix))
      out.push_back({r.key.substr(0, r.key.size() - suffix.size()), r.origin});
  if (module.size() > kPeftPrefix.size() && module.starts_with(kPeftPrefix))
    out.push_back({std::string(module.substr(kPeftPrefix.size())), "PEFT's \"base_model.model.\" prefix written twice"});
  return out;
}

}  // namespace peft
