// The renames the adapter doctor knows (key_renames.hpp).
#include "peft/doctor/key_renames.hpp"

#include <algorithm>
#include <array>

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

const std::vector<ModuleRename>& module_renames() {
  static const std::vector<ModuleRename> renames = [] {
    struct Pair {
      const char* a;
      const char* b;
      const char* origin;
    };
    const Pair pairs[] = {
        {"language_model.model.", "model.language_model.", "transformers llava-family checkpoint conversion"},
        {"language_model.lm_head.", "lm_head.", "transformers llava-family checkpoint conversion"},
        {"vision_tower.", "model.vision_tower.", "transformers llava-family checkpoint conversion"},
        {"multi_modal_projector.", "model.multi_modal_projector.", "transformers llava-family checkpoint conversion"},
        {"model.", "model.language_model.", "transformers qwen2_vl-family checkpoint conversion"},
        {"visual.", "model.visual.", "transformers qwen2_vl-family checkpoint conversion"},
    };
    std::vector<ModuleRename> out;
    for (const Pair& p : pairs) {
      out.push_back({p.a, p.b, p.origin});
      out.push_back({p.b, p.a, p.origin});
    }
    out.push_back({std::string(kPeftPrefix), "", "PEFT's \"base_model.model.\" prefix written twice"});
    return out;
  }();
  return renames;
}

std::vector<RenameCandidate> rename_candidates(std::string_view module) {
  std::vector<RenameCandidate> out;
  const std::string dotted = std::string(module) + ".";
  const auto& rules = module_renames();
  for (size_t i = 0; i < rules.size(); ++i) {
    const ModuleRename& r = rules[i];
    if (!dotted.starts_with(r.from_prefix)) continue;
    std::string renamed = r.to_prefix + dotted.substr(r.from_prefix.size());
    renamed.pop_back();  // the "." added above
    if (!renamed.empty() && renamed != module) out.push_back({renamed, i});
  }
  return out;
}

}  // namespace peft
