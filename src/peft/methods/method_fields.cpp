// Each method's fields of adapter_config.json, read as PEFT's config class reads them, and each
// module's rank, alpha and scale, as PEFT's layer computes them (method_fields.hpp).
#include "peft/methods/method_fields.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/python_regex.hpp"
#include "core/text.hpp"

namespace peft::method_fields {

using Json = nlohmann::ordered_json;

// ---- Config readers ------------------------------------------------------------------------------

// LycorisConfig (LoHa, LoKr): alpha is lora_alpha; r, rank_pattern and alpha_pattern are LoRA's.
void read_lycoris(const FieldReader& f, ConfigView& v, MethodConfig&) {
  v.rename("alpha", "lora_alpha");
  v.rename("init_weights", "init_lora_weights");
  if (const Json* e = f.get("use_effective_conv2d"); e && !e->is_boolean())
    f.wrong_type("use_effective_conv2d", "true or false");
}

// AdaLoraConfig: init_r is r; its rank_pattern holds, per module, the mask of the ranks kept.
void read_adalora(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.rename("init_r", "r");
  v.default_to("r", 12);  // AdaLoraConfig's default init_r
  v.erase("rank_pattern");
  if (const Json* pattern = f.get("rank_pattern")) {
    if (!pattern->is_object()) f.wrong_type("rank_pattern", "an object {module: [true/false per rank]}");
    for (const auto& [key, mask] : pattern->items()) {
      if (!mask.is_array()) f.invalid("rank_pattern", "entry " + peft::quoted(key) + " must be a list of booleans");
      std::vector<bool> bits;
      for (const Json& b : mask) {
        if (!b.is_boolean()) f.invalid("rank_pattern", "entry " + peft::quoted(key) + " must be a list of booleans");
        bits.push_back(b.get<bool>());
      }
      out.adalora_rank_masks.emplace_back(key, std::move(bits));
    }
  }
  if (f.boolean("use_dora", false)) f.invalid("use_dora", "is not supported by AdaLoRA (PEFT refuses it)");
}

// IA3Config: no rank, no alpha; feedforward_modules picks the modules whose input features ia3_l scales.
void read_ia3(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.erase("r");
  v.erase("lora_alpha");
  v.erase("init_lora_weights");
  out.feedforward_modules = f.selector("feedforward_modules");
}

// MissConfig: r; init_weights true/false (the standard form), "bat" or "mini" (with mini_r).
void read_miss(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.erase("lora_alpha");
  v.erase("init_lora_weights");
  const Json* init = f.get("init_weights");
  if (init != nullptr && !init->is_boolean() && !(init->is_string() && (*init == "bat" || *init == "mini")))
    f.wrong_type("init_weights", "true, false, \"bat\" or \"mini\"");
  out.settings.miss_bat = init != nullptr && *init == "bat";
  if (init != nullptr && *init == "mini") {
    const Json* mini = f.get("mini_r");
    if (mini == nullptr || !mini->is_number_integer() || mini->get<int64_t>() < 1)
      f.wrong_type("mini_r", "a positive integer (init_weights is \"mini\")");
    out.settings.miss_mini_r = mini->get<int64_t>();
  }
}

// ShiraConfig: r (the number of trainable entries is r (out + in)); no alpha.
void read_shira(const FieldReader& f, ConfigView& v, MethodConfig&) {
  v.erase("lora_alpha");
  v.erase("init_lora_weights");
  if (const Json* mask = f.get("mask_type"); mask && !mask->is_string()) f.wrong_type("mask_type", "a string");
}

// VeraConfig / RandLoraConfig: r, no rank or alpha patterns; the shared projections saved or not.
void read_projections(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.erase("rank_pattern");
  v.erase("alpha_pattern");
  v.rename("init_weights", "init_lora_weights");
  out.settings.projections_not_saved = !f.boolean("save_projection", true);
  if (const Json* key = f.get("projection_prng_key"))
    out.projection_prng_key = f.integer("projection_prng_key", *key, "an integer");
}

void read_vera(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.default_to("r", 256);  // VeraConfig's default r
  v.erase("lora_alpha");   // VeRA has no scale
  read_projections(f, v, out);
}

void read_randlora(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.default_to("r", 32);  // RandLoraConfig's default r
  v.rename("randlora_alpha", "lora_alpha");
  v.default_to("lora_alpha", 640);  // RandLoraConfig's default randlora_alpha
  read_projections(f, v, out);
}

// FourierFTConfig: n_frequency is r and n_frequency_pattern rank_pattern; scaling; random_loc_seed.
void read_fourierft(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.rename("n_frequency", "r");
  v.default_to("r", 1000);  // FourierFTConfig's default n_frequency
  v.rename("n_frequency_pattern", "rank_pattern");
  v.erase("lora_alpha");
  v.erase("alpha_pattern");
  v.rename("init_weights", "init_lora_weights");
  out.fourierft_scaling = f.number("scaling", 150.0);
  if (!std::isfinite(out.fourierft_scaling)) f.wrong_type("scaling", "a finite number");
  out.settings.random_loc_seed = 777;  // FourierFTConfig's default
  if (const Json* seed = f.get("random_loc_seed"))
    out.settings.random_loc_seed = f.integer("random_loc_seed", *seed, "an integer");
}

// The rotations: their sizes come from the tensors (PEFT adjusts r and the block sizes per layer);
// "<method>_only" bias is LoRA's "lora_only".
void read_rotation(ConfigView& v, const char* peft_type) {
  v.erase("lora_alpha");
  v.rename("init_weights", "init_lora_weights");
  v.own_bias(peft_type);
}

// OFTConfig: coft, eps, block_share and the Cayley-Neumann series.
void read_oft(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  v.erase("r");
  read_rotation(v, "OFT");
  merge::OftSettings& oft = out.settings.oft;
  oft.coft = f.boolean("coft", false);
  oft.eps = f.number("eps", 6e-5);
  oft.block_share = f.boolean("block_share", false);
  oft.use_cayley_neumann = f.boolean("use_cayley_neumann", true);
  if (const Json* terms = f.get("num_cayley_neumann_terms")) {
    if (!terms->is_number_integer() || terms->get<int64_t>() < 1)
      f.invalid("num_cayley_neumann_terms", "must be a positive integer");
    oft.num_cayley_neumann_terms = terms->get<int64_t>();
  }
}

void read_boft(const FieldReader&, ConfigView& v, MethodConfig&) {
  v.erase("r");
  read_rotation(v, "BOFT");
}

// HRAConfig: r is the number of reflections; apply_GS.
void read_hra(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  read_rotation(v, "HRA");
  out.settings.hra_apply_gs = f.boolean("apply_GS", false);
}

// LNTuningConfig: target_modules, exclude_modules, modules_to_save.
void read_ln_tuning(const FieldReader&, ConfigView& v, MethodConfig&) {
  v.erase("r");
  v.erase("lora_alpha");
}

// TrainableTokensConfig: token_indices for the target_modules embedding(s) (default: the input
// embedding, "embed_tokens"), read as LoRA's trainable_token_indices {module: indices}.
void read_trainable_tokens(const FieldReader& f, ConfigView& v, MethodConfig&) {
  v.erase("r");
  v.erase("lora_alpha");
  v.erase("trainable_token_indices");
  const Json* indices = f.get("token_indices");
  if (indices == nullptr) f.invalid("token_indices", "is missing (TRAINABLE_TOKENS needs the token indices)");
  f.int_list("token_indices", *indices);  // INVALID_CONFIG naming the field unless a list of integers
  Json targets = Json::object();
  const ModuleSelector selector = f.selector("target_modules");
  if (selector.kind == ModuleSelector::Kind::list)
    for (const std::string& name : selector.names) targets[name] = *indices;
  else if (selector.kind == ModuleSelector::Kind::regex)
    targets[selector.pattern] = *indices;
  else
    targets["embed_tokens"] = *indices;
  v.view["trainable_token_indices"] = targets;
  v.erase("target_modules");
}

// VBLoRAConfig / C3AConfig: no scale and no patterns; "<method>_only" bias is LoRA's "lora_only".
void read_unscaled(ConfigView& v, const char* peft_type) {
  v.erase("lora_alpha");
  v.erase("rank_pattern");
  v.erase("alpha_pattern");
  v.erase("init_lora_weights");
  v.own_bias(peft_type);
}

// VBLoRAConfig: r (default 4), topk (default 2), save_only_topk_weights; num_vectors and
// vector_length are the vector bank's shape, read from the tensors.
void read_vblora(const FieldReader& f, ConfigView& v, MethodConfig& out) {
  read_unscaled(v, "VBLORA");
  v.default_to("r", 4);  // VBLoRAConfig's default r
  if (const Json* topk = f.get("topk")) {
    if (!topk->is_number_integer() || topk->get<int64_t>() < 1)
      f.invalid("topk", "must be a positive integer (PEFT's check)");
    out.settings.vblora_topk = topk->get<int64_t>();
  }
  out.vblora_save_only_topk = f.boolean("save_only_topk_weights", false);
}

// C3AConfig: block_size / block_size_pattern (the kernels' last dimension, read from the tensors); no rank.
void read_c3a(const FieldReader& f, ConfigView& v, MethodConfig&) {
  read_unscaled(v, "C3A");
  v.erase("r");
  if (const Json* block = f.get("block_size"); block && (!block->is_number_integer() || block->get<int64_t>() < 1))
    f.wrong_type("block_size", "a positive integer");
}

// ---- Module resolution ---------------------------------------------------------------------------

// LycorisLayer: r and alpha through rank_pattern / alpha_pattern, scaling alpha / r. The CP
// (effective conv2d) forms of a Conv2d: hada_t1/hada_t2 [r, r, kh, kw] with hada_w*_a [r, out],
// hada_w*_b [r, in]; LoKr's lokr_t2 with lokr_w2_a [r, b], lokr_w2_b [r, d].
void lycoris_rank_and_scale(ModuleResolution& m) {
  m.rank_from_patterns();
  m.alpha_from_patterns();
  m.scaling = m.alpha / static_cast<double>(m.rank);
}

void resolve_loha(ModuleResolution& m) {
  lycoris_rank_and_scale(m);
  const bool cp = m.has("hada_t1") || m.has("hada_t2");
  if (cp && !m.need({"hada_t1", "hada_t2"})) return;
  if (!m.need({"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"})) return;
  m.check_rank(m.dim("hada_w1_a", cp ? 0 : 1));
}

void resolve_lokr(ModuleResolution& m) {
  lycoris_rank_and_scale(m);
  const bool w1 = m.has("lokr_w1"), w2 = m.has("lokr_w2"), cp = m.has("lokr_t2");
  if (cp && w2) {
    m.broken(m.who() + " (" + m.peft_type + ") has both lokr_w2 and the CP form's lokr_t2");
    return;
  }
  if (!w1 && !m.need({"lokr_w1_a", "lokr_w1_b"})) return;
  if (!w2 && !m.need({"lokr_w2_a", "lokr_w2_b"})) return;
  if (!w1) m.check_rank(m.dim("lokr_w1_a", 1));
  if (!w2) m.check_rank(m.dim("lokr_w2_a", cp ? 0 : 1));
}

// SVDLinear.update_layer: scaling = lora_alpha if > 0 else float(r); ranknum = float(init_r), kept
// when rank_pattern resizes the layer (resize_modules_by_rank_pattern).
void resolve_adalora(ModuleResolution& m) {
  if (!m.need({"lora_A", "lora_B", "lora_E"})) return;
  m.rank = m.dim("lora_A", 0);
  m.alpha = m.lora_alpha;
  m.scaling = m.lora_alpha > 0 ? m.lora_alpha : static_cast<double>(m.rank);
  m.settings.ranknum = static_cast<double>(m.r);
  int64_t expected = m.r;
  for (const auto& [key, mask] : m.fields.adalora_rank_masks) {
    std::string module = key;
    for (const char* tail : {".lora_E", ".lora_A", ".lora_B"})
      if (module.ends_with(tail)) module.resize(module.size() - std::string_view(tail).size());
    if (!m.is_this_module(module)) continue;
    m.rank_key = key;
    expected = static_cast<int64_t>(std::count(mask.begin(), mask.end(), true));
  }
  if (m.rank != expected)
    m.config_problem(m.rank_key ? "rank_pattern" : "init_r",
                     m.who() + " has rank " + std::to_string(m.rank) + " but " +
                         (m.rank_key ? "its rank_pattern mask keeps " : "init_r is ") + std::to_string(expected));
}

// IA3: the merge weight multiplies ia3_l (add_weighted_adapter's weighted sum); a module that
// feedforward_modules selects scales its input features.
void resolve_ia3(ModuleResolution& m) {
  m.scaling = 1.0;
  if (!m.need({"ia3_l"})) return;
  const ModuleSelector& ff = m.fields.feedforward_modules;
  if (ff.kind == ModuleSelector::Kind::list) {
    for (const std::string& name : ff.names) m.settings.ia3_feedforward = m.settings.ia3_feedforward || m.module.ends_with(name);
  } else if (ff.kind == ModuleSelector::Kind::regex || ff.kind == ModuleSelector::Kind::all_linear) {
    m.settings.ia3_feedforward =
        PythonRegex(ff.pattern, PEFT_ERR_INVALID_CONFIG, "field \"feedforward_modules\"").fullmatch(m.module);
  }
}

// MiSS has no scale (its set_scale keeps 1); miss_block [r, out], [r, mini_r] or bat's [out / r, r, r].
void resolve_miss(ModuleResolution& m) {
  m.scaling = 1.0;
  m.rank = m.r;
  if (!m.need({"miss_block"})) return;
  m.check_rank(m.dim("miss_block", m.settings.miss_bat ? 1 : 0));
}

// ShiraLayer.update_layer: scaling 1.0.
void resolve_shira(ModuleResolution& m) {
  m.scaling = 1.0;
  m.rank = m.r;
  m.need({"shira_weight", "shira_indices"});
}

// VeRA: vera_lambda_d [r], no scale.
void resolve_vera(ModuleResolution& m) {
  m.rank = m.r;
  m.alpha = 1.0;
  m.scaling = 1.0;
  if (!m.need({"vera_lambda_b", "vera_lambda_d"})) return;
  m.check_rank(m.dim("vera_lambda_d", 0));
}

// RandLoraLayer: randlora_lambda [r, bases], scaling randlora_alpha / r.
void resolve_randlora(ModuleResolution& m) {
  m.rank = m.r;
  m.alpha = m.lora_alpha;
  m.scaling = m.lora_alpha / static_cast<double>(m.r);
  if (!m.need({"randlora_gamma", "randlora_lambda"})) return;
  m.check_rank(m.dim("randlora_lambda", 0));
}

// FourierFT: n_frequency (or n_frequency_pattern's) spectrum values, scaled by `scaling`.
void resolve_fourierft(ModuleResolution& m) {
  m.scaling = m.fields.fourierft_scaling;
  if (!m.need({"fourierft_spectrum"})) return;
  m.rank_from_patterns();
  const std::vector<uint64_t> shape = m.shape("fourierft_spectrum");
  if (shape.size() != 1 || static_cast<int64_t>(shape[0]) != m.rank)
    m.config_problem(m.rank_key ? "n_frequency_pattern" : "n_frequency",
                     m.who() + " has a fourierft_spectrum of " + shape_text(shape) + " but " +
                         (m.rank_key ? "n_frequency_pattern key " + peft::quoted(*m.rank_key) + " gives "
                                     : std::string("n_frequency is ")) +
                         std::to_string(m.rank));
}

// OFT, BOFT, HRA: PEFT has no scale for rotations (set_scale warns and keeps 1).
void resolve_oft(ModuleResolution& m) {
  m.scaling = 1.0;
  m.need({"oft_R"});
}

void resolve_boft(ModuleResolution& m) {
  m.scaling = 1.0;
  m.need({"boft_R", "boft_s"});
}

// HRA: r reflections (hra_u [in, r]), through rank_pattern.
void resolve_hra(ModuleResolution& m) {
  m.scaling = 1.0;
  if (!m.need({"hra_u"})) return;
  m.rank_from_patterns();
  m.check_rank(m.dim("hra_u", 1));
}

// VBLoRAConfig: r, topk; no scale (the merge weight multiplies the delta). The logits whole, or
// (save_only_topk_weights) as _topk_indices [.., topk] + _topk_weights [.., topk - 1].
void resolve_vblora(ModuleResolution& m) {
  m.scaling = 1.0;
  m.rank = m.r;
  if (m.has("vblora_logits_A") || m.has("vblora_logits_B")) {
    if (!m.need({"vblora_logits_A", "vblora_logits_B"})) return;
    m.check_rank(m.dim("vblora_logits_A", 0));
    return;
  }
  if (!m.need({"vblora_logits_A_topk_indices", "vblora_logits_A_topk_weights", "vblora_logits_B_topk_indices",
               "vblora_logits_B_topk_weights"}))
    return;
  m.check_rank(m.dim("vblora_logits_A_topk_indices", 0));
  const int64_t saved = m.dim("vblora_logits_A_topk_indices", 2);
  if (saved != m.settings.vblora_topk)
    m.config_problem("topk", m.who() + " saved the top " + std::to_string(saved) + " logits but topk is " +
                                 std::to_string(m.settings.vblora_topk));
}

// C3AConfig: block_size / block_size_pattern, the kernel's last dimension (reported as the rank); no scale.
void resolve_c3a(ModuleResolution& m) {
  m.scaling = 1.0;
  if (m.need({"c3a_kernel"})) m.rank = m.dim("c3a_kernel", 2);
}

}  // namespace peft::method_fields
