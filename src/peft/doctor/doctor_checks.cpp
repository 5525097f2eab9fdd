// The doctor's checks (doctor_checks.hpp): each module, then the adapter as a whole.
#include "peft/doctor/doctor_checks.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"
#include "peft/base/base_validation.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/export/adapter_export.hpp"

namespace peft::doctor {
namespace {

// LyCORIS's dora_scale against PEFT's lora_magnitude_vector, told apart by name and shape.
std::string dora_scale_message(const std::string& module, const Shape& s) {
  std::string what;
  if (s.size() == 2 && s[0] == 1)
    what = " is " + shape_text(s) + ": LyCORIS's weight norm over the input dimension (wd_on_out=False), one "
           "value per input feature";
  else if (s.size() >= 2 && s[1] == 1)
    what = " is " + shape_text(s) + ": LyCORIS's weight norm per output feature (wd_on_out=True)";
  else
    what = " is " + shape_text(s) + ", neither of LyCORIS's [1, in] (wd_on_out=False) nor [out, 1] (wd_on_out=True)";
  return "module " + peft::quoted(module) + ": dora_scale" + what +
         "; PEFT's DoRA magnitude is lora_magnitude_vector [out], and a dora_scale is not renamed into it";
}

// The PEFT method whose parameter `param` is (the method table's row that saves it).
PeftMethod method_of_param(const std::string& param) {
  const MethodRow* row = method_row_for_param(param);
  return row != nullptr ? row->method : PeftMethod::adalora;
}

bool has_method_params(const DoctorState& d, const Group& g) {
  for (size_t i : g.entries)
    if (d.entries[i].role == TensorRole::method_param) return true;
  return false;
}

const ModuleRule* rule_of(const DoctorState& d, const std::string& module) {
  return d.table ? d.table->rule_for_module(module) : nullptr;
}

bool is_embedding_module(const DoctorState& d, const std::string& module) {
  if (const ModuleRule* rule = rule_of(d, module)) return rule->kind == ModuleKind::embedding;
  std::string last = module.substr(module.rfind('.') == std::string::npos ? 0 : module.rfind('.') + 1);
  return last.find("embed") != std::string::npos || last == "wte" || last == "shared";
}

bool is_output_embedding(const DoctorState& d, const std::string& module) {
  if (d.table && d.table->output_embedding() && *d.table->output_embedding() == module) return true;
  return module == "lm_head" || module.ends_with(".lm_head");
}

Entry* find_role(DoctorState& d, const Group& g, TensorRole role) {
  for (size_t i : g.entries)
    if (d.entries[i].role == role && !(d.entries[i].kohya && d.entries[i].kohya_role != KeyRewrite::Role::lora_tensor))
      return &d.entries[i];
  return nullptr;
}

// lora_A / lora_B on an embedding, or lora_embedding_A / B on a Linear / Conv1D: renames the roles
// when the base's shapes confirm it.
void fix_embedding_roles(DoctorState& d, Group& g) {
  if (!g.base_index) return;
  const Shape& w = d.base->weights->tensor(*g.base_index).shape;
  if (w.size() != 2) return;
  Entry* a = find_role(d, g, TensorRole::lora_a);
  Entry* b = find_role(d, g, TensorRole::lora_b);
  bool to_embedding = true;
  if (!a || !b) {
    a = find_role(d, g, TensorRole::lora_embedding_a);
    b = find_role(d, g, TensorRole::lora_embedding_b);
    to_embedding = false;
  }
  if (!a || !b || d.shape_of(*a).size() != 2 || d.shape_of(*b).size() != 2) return;
  const Shape &sa = d.shape_of(*a), &sb = d.shape_of(*b);
  const bool fits_embedding = sa[1] == w[0] && sb[0] == w[1];  // A [r, num], B [dim, r]
  const bool fits_linear = sa[1] == w[1] && sb[0] == w[0];     // A [r, in], B [out, r]
  const bool embedding = is_embedding_module(d, g.name);
  if (to_embedding ? !(embedding && fits_embedding) : !(!embedding && (fits_linear || fits_embedding))) return;
  a->suffix = to_embedding ? "lora_embedding_A" : "lora_A.weight";
  b->suffix = to_embedding ? "lora_embedding_B" : "lora_B.weight";
  a->role = to_embedding ? TensorRole::lora_embedding_a : TensorRole::lora_a;
  b->role = to_embedding ? TensorRole::lora_embedding_b : TensorRole::lora_b;
  d.problem("embedding_role", {a->key, b->key}, {g.name},
          "module " + peft::quoted(g.name) + (to_embedding ? " is an embedding; PEFT names its factors "
                                                             "lora_embedding_A / lora_embedding_B"
                                                           : " is not an embedding; PEFT names its factors "
                                                             "lora_A.weight / lora_B.weight"),
          true);
}

void classify(DoctorState& d, AdapterModule& m, const Group&) {
  const auto [lora, embedding, tokens, method_params] = module_roles(m);
  if (embedding) {
    m.kind = LayerKind::embedding;
  } else if (lora) {
    const AdapterTensor* a = m.find(TensorRole::lora_a);
    m.kind = a && d.weights->tensor(a->index).shape.size() == 4 ? LayerKind::conv2d : LayerKind::linear;
  } else {
    m.kind = tokens ? LayerKind::trainable_tokens : LayerKind::full;
  }
  if (m.kind == LayerKind::trainable_tokens)
    if (const std::vector<int64_t>* indices = d.config.trainable_token_indices.for_module(m.name))
      m.token_indices = *indices;
}

// lora_A [in, r] and lora_B [r, out] where PEFT saves [r, in] and [out, r]: the shared dimension
// is the rank, and the base (or else the configured rank) says which reading is right.
bool transposed(const DoctorState& d, const AdapterModule& m, const Group& g, const Shape& sa, const Shape& sb) {
  if (m.kind == LayerKind::embedding || sa.size() != 2 || sb.size() != 2 || sa[1] != sb[0]) return false;
  if (sa[0] != sb[1]) return true;
  if (d.base && g.base_index) {
    const Shape& w = d.base->weights->tensor(*g.base_index).shape;
    const bool as_saved = w == Shape{sb[0], sa[1]} || w == Shape{sa[1], sb[0]};
    const bool swapped = w == Shape{sb[1], sa[0]} || w == Shape{sa[0], sb[1]};
    return swapped && !as_saved;
  }
  const auto rank = static_cast<uint64_t>(d.matcher->rank_for(m.name));
  return sa[1] == rank && sa[0] != rank;
}

void lora_checks(DoctorState& d, AdapterModule& m, Group& g, ModuleReport& report, std::optional<double> kohya_alpha,
                 bool alpha_invalid, bool dora_scale) {
  const bool emb = m.kind == LayerKind::embedding;
  const AdapterTensor* a = m.find(emb ? TensorRole::lora_embedding_a : TensorRole::lora_a);
  const AdapterTensor* b = m.find(emb ? TensorRole::lora_embedding_b : TensorRole::lora_b);
  std::vector<std::string> keys = d.keys_of(g);
  if (!a || !b) {
    report.complete = false;
    d.problem("incomplete_module", keys, {m.name},
            "module " + peft::quoted(m.name) + " has no " + (a ? "lora_B" : "lora_A") +
                " (PEFT would leave it at its initialisation)",
            false);
    return;
  }
  const Shape &sa = d.weights->tensor(a->index).shape, &sb = d.weights->tensor(b->index).shape;
  const size_t want = m.kind == LayerKind::conv2d ? 4 : 2;
  if (sa.size() != want || sb.size() != want || sa[0] != sb[1] || sa[0] == 0 || transposed(d, m, g, sa, sb)) {
    report.complete = false;
    if (sa.size() == 2 && sb.size() == 2 && sa[1] == sb[0])
      d.problem("shape_transposed", keys, {m.name},
              "module " + peft::quoted(m.name) + ": lora_A " + shape_text(sa) + " and lora_B " + shape_text(sb) +
                  " are stored transposed ([in, r] and [r, out]); PEFT saves lora_A [r, in] and lora_B [out, r]",
              false);
    else
      d.problem("shape_mismatch", keys, {m.name},
              "module " + peft::quoted(m.name) + ": lora_A " + shape_text(sa) + " and lora_B " + shape_text(sb) +
                  " do not agree on a rank",
              false);
    return;
  }
  if (!valid_rank(sa[0])) {
    report.complete = false;
    d.problem("invalid_value", keys, {m.name},
            "module " + peft::quoted(m.name) + ": lora_A " + shape_text(sa) + " gives a rank of " +
                std::to_string(sa[0]) + ", not a positive integer below 2^63",
            false);
    return;
  }
  m.rank = static_cast<int64_t>(sa[0]);
  const int64_t configured_rank = d.matcher->rank_for(m.name);
  report.rank = m.rank;
  m.alpha = kohya_alpha.value_or(d.matcher->alpha_for(m.name));
  if (!alpha_invalid && !std::isfinite(m.alpha))
    d.problem("invalid_value", keys, {m.name},
            "module " + peft::quoted(m.name) + ": the config gives alpha " + python_float_repr(m.alpha) +
                ", not a finite number (the module's scaling is unknown)",
            false);
  if (!alpha_invalid && std::isfinite(m.alpha)) {
    m.scaling = d.config.scaling(m.rank, m.alpha);
    report.alpha = m.alpha;
    if (std::isfinite(m.scaling)) report.scaling = m.scaling;
  }
  if (kohya_alpha && g.resolved && *kohya_alpha != d.matcher->alpha_for(m.name))
    d.config_changes.emplace_back("alpha_pattern", g.name, *kohya_alpha);
  if (m.rank != configured_rank) {
    const bool kohya = std::any_of(g.entries.begin(), g.entries.end(), [&](size_t i) { return d.entries[i].kohya; });
    if (kohya && g.resolved) {
      d.config_changes.emplace_back("rank_pattern", g.name, static_cast<double>(m.rank));
    } else {
      d.problem("rank_mismatch", keys, {m.name},
              "module " + peft::quoted(m.name) + " has rank " + std::to_string(m.rank) + " but the config gives " +
                  std::to_string(configured_rank) + " (PEFT fails with a size mismatch)",
              false);
    }
  }
  auto verdict = d.matcher->check(m.name);
  // ensure_weight_tying: PEFT gives the tied output embedding a LoRA layer of its own without
  // target_modules naming it (as Adapter::open reads it).
  const bool tied_target = d.config.ensure_weight_tying && d.table && d.table->output_embedding() &&
                           m.name == *d.table->output_embedding();
  if (g.resolved && !(verdict == ModuleMatcher::Verdict::not_targeted && tied_target) &&
      (verdict == ModuleMatcher::Verdict::not_targeted || verdict == ModuleMatcher::Verdict::excluded))
    d.problem("untargeted_module", keys, {m.name},
            "module " + peft::quoted(m.name) + " has LoRA tensors but target_modules does not select it (" +
                verdict_name(verdict) + "); PEFT ignores them",
            false);
  const bool magnitude = m.find(TensorRole::lora_magnitude) != nullptr;
  if (magnitude) report.dora = "lora_magnitude_vector";
  if (dora_scale) {
    report.dora = "dora_scale";
    for (size_t i : g.entries)
      if (d.entries[i].kohya && d.entries[i].kohya_role == KeyRewrite::Role::kohya_dora_scale)
        d.problem("dora_convention", keys, {m.name}, dora_scale_message(m.name, d.shape_of(d.entries[i])), false);
  }
  if (magnitude && !d.config.use_dora)
    d.problem("dora_mismatch", keys, {m.name},
            "module " + peft::quoted(m.name) + " has a DoRA lora_magnitude_vector but use_dora is false", false);
  if (!magnitude && !dora_scale && d.config.use_dora)
    d.problem("dora_mismatch", keys, {m.name},
            "module " + peft::quoted(m.name) + " has no lora_magnitude_vector but use_dora is true", false);
  const bool bias = m.find(TensorRole::lora_b_bias) != nullptr;
  if (bias != d.config.lora_bias && !(emb && !bias))
    d.problem("lora_bias_mismatch", keys, {m.name},
            "module " + peft::quoted(m.name) + (bias ? " has lora_B.bias but lora_bias is false"
                                                     : " has no lora_B.bias but lora_bias is true"),
            false);
}

// A module of another method's parameters. A PEFT adapter of that method reports its method, rank,
// alpha and scaling (LoHa / LoKr: alpha / r); parameters of a method the config does not name, or
// with LyCORIS's per-module alpha / dora_scale or kohya underscore paths, are a LyCORIS / kohya
// file: reported as such (lycoris_method), not read as PEFT's.
void method_checks(DoctorState& d, AdapterModule& m, const Group& g, ModuleReport& report,
                   std::optional<double> kohya_alpha,
                   bool dora_scale) {
  PeftMethod method = d.config.method;
  std::vector<std::string> params;
  for (size_t i : g.entries)
    if (d.entries[i].role == TensorRole::method_param) {
      params.push_back(d.entries[i].suffix);
      method = method_of_param(d.entries[i].suffix);
    }
  m.kind = LayerKind::linear;
  report.kind = LayerKind::linear;
  std::string rest;
  const bool lycoris = d.missing_config || method != d.config.method || kohya_alpha || dora_scale ||
                       kohya_underscore_path(g.written, rest);
  auto shape = [&](const char* p) -> Shape {
    for (size_t i : g.entries)
      if (d.entries[i].role == TensorRole::method_param && d.entries[i].suffix == p) return d.shape_of(d.entries[i]);
    return {};
  };
  const Shape conv = shape(method == PeftMethod::loha ? "hada_w1_b" : "lokr_w2");
  if (conv.size() == 4 || !shape("hada_t1").empty() || !shape("lokr_t2").empty())
    report.kind = m.kind = LayerKind::conv2d;
  if (lycoris && method_row(method).lycoris) {
    const char* name = method == PeftMethod::loha ? "LoHa" : "LoKr";
    report.method = method == PeftMethod::loha ? "LYCORIS_LOHA" : "LYCORIS_LOKR";
    if (kohya_alpha) report.alpha = *kohya_alpha;
    d.problem("lycoris_method", d.keys_of(g), {g.name},
            "module " + peft::quoted(g.name) + " holds LyCORIS/kohya " + name + " tensors (" +
                join_text(params, ", ") + (kohya_alpha ? ", a per-module alpha" : "") +
                (dora_scale ? ", a dora_scale" : "") + "): LyCORIS/kohya " + name +
                ", not a PEFT adapter folder (PEFT saves " + name + " with adapter_config.json, peft_type " +
                peft_method_name(method) + ", and its alpha in the config)",
            false);
  } else {
    report.method = peft_method_name(method);
    if (method != d.config.method)
      d.problem("unmatched_key", d.keys_of(g), {g.name},
              "module " + peft::quoted(g.name) + " holds " + peft_method_name(method) + " parameters but peft_type is " +
                  peft::quoted(d.config.peft_type),
              false);
  }
  if (method == PeftMethod::loha || method == PeftMethod::lokr) {
    const Shape r = method == PeftMethod::loha ? shape("hada_w1_a") : shape("lokr_w1_a").empty() ? shape("lokr_w2_a")
                                                                                                   : shape("lokr_w1_a");
    // The CP form keeps the rank first: hada_w1_a [r, out], lokr_w2_a [r, b] beside hada_t1 / lokr_t2.
    const bool rank_first = method == PeftMethod::loha ? !shape("hada_t1").empty()
                                                       : shape("lokr_w1_a").empty() && !shape("lokr_t2").empty();
    if (r.size() >= 2) report.rank = static_cast<int64_t>(r[rank_first ? 0 : 1]);
    if (!lycoris && d.matcher) {
      report.alpha = d.matcher->alpha_for(m.name);
      const double rank = static_cast<double>(d.matcher->rank_for(m.name));
      if (rank > 0) report.scaling = *report.alpha / rank;
    }
  }
  if (dora_scale) report.dora = "dora_scale";
  for (size_t i : g.entries)
    if (d.entries[i].kohya && d.entries[i].kohya_role == KeyRewrite::Role::kohya_dora_scale)
      d.problem("dora_convention", {d.entries[i].key}, {g.name}, dora_scale_message(g.name, d.shape_of(d.entries[i])),
                false);
}

// The base validation on this one module; its findings named by what they most likely mean.
void shape_checks(DoctorState& d, AdapterModule& m, const Group& g) {
  if (m.kind == LayerKind::trainable_tokens && !m.find(TensorRole::trainable_tokens_delta)) return;
  std::vector<AdapterModule> one{m};
  ValidationResult result = check_against_base(one, *d.weights, d.config, *d.base, d.table.get());
  m = one.front();
  std::vector<std::string> keys = d.keys_of(g);
  for (const std::string& p : result.unresolved) d.problem("missing_base_tensor", keys, {m.name}, p, false);
  if (result.mismatched.empty()) return;
  std::string kind = "shape_mismatch";
  std::string meaning = "the adapter was trained on a base of another size";
  if (m.is_lora() && g.base_index) {
    const Shape& w = d.base->weights->tensor(*g.base_index).shape;
    const bool emb = m.kind == LayerKind::embedding;
    const Shape& sa = d.weights->tensor(m.find(emb ? TensorRole::lora_embedding_a : TensorRole::lora_a)->index).shape;
    const Shape& sb = d.weights->tensor(m.find(emb ? TensorRole::lora_embedding_b : TensorRole::lora_b)->index).shape;
    if (w.size() == 2 && sa.size() == 2 && sb.size() == 2) {
      uint64_t vocab = 0, base_vocab = 0;
      if (emb && sb[0] == w[1] && sa[1] != w[0]) {
        vocab = sa[1];
        base_vocab = w[0];
      } else if (!emb && is_output_embedding(d, m.name) && sa[1] == w[1] && sb[0] != w[0]) {
        vocab = sb[0];
        base_vocab = w[0];
      }
      if (vocab) {
        kind = "vocabulary_resized";
        meaning = "the adapter was trained on a vocabulary of " + std::to_string(vocab) + " tokens and the base has " +
                  std::to_string(base_vocab) + "; the resized embedding must come with the adapter " +
                  "(modules_to_save / save_embedding_layers) or the base must be resized the same way";
      }
    }
  }
  for (const std::string& p : result.mismatched) d.problem(kind, keys, {m.name}, p + " (" + meaning + ")", false);
}

void check_group(DoctorState& d, Group& g) {
  // Names first: the problems whose fix is a rename.
  std::string kohya_rest;
  if (g.resolved && g.name != g.written && !kohya_underscore_path(g.written, kohya_rest))  // else kohya_name says it
    d.problem("renamed_module", d.keys_of(g), {g.written, g.name},
            "module " + peft::quoted(g.written) + " is " + peft::quoted(g.name) + " in the base (" +
                d.renamed_origin[g.written] + ")",
            true);
  std::vector<std::string> suffix_keys, kohya_keys;
  for (size_t i : g.entries) {
    if (d.entries[i].suffix_variant) suffix_keys.push_back(d.entries[i].key);
    if (d.entries[i].kohya && d.entries[i].kohya_role != KeyRewrite::Role::kohya_dora_scale)
      kohya_keys.push_back(d.entries[i].key);
  }
  if (has_method_params(d, g)) kohya_keys.clear();  // a LyCORIS alpha: method_checks reports the module
  if (!suffix_keys.empty())
    d.problem("weight_suffix", suffix_keys, {g.name},
            "module " + peft::quoted(g.name) + ": keys with or without \".weight\" where PEFT writes the other", true);
  if (!kohya_keys.empty() && g.resolved)
    d.problem("kohya_name", kohya_keys, {g.name},
            "module " + peft::quoted(g.name) + " is written with kohya / LyCORIS names (lora_down, lora_up, alpha)",
            true);
  if (d.base && g.resolved) fix_embedding_roles(d, g);

  // The module as the loader would see it.
  AdapterModule m;
  m.name = g.name;
  std::optional<double> kohya_alpha;
  bool alpha_invalid = false;
  bool dora_scale = false;
  for (size_t i : g.entries) {
    const Entry& e = d.entries[i];
    const TensorInfo& info = d.weights->tensor(e.index);
    // SHiRA's and VB-LoRA's top-k indices are integer tensors by design.
    const bool integer_param = e.role == TensorRole::method_param && e.suffix.ends_with("_indices");
    if (!is_float(info.dtype) && e.role != TensorRole::full && !integer_param) {
      d.problem("unsupported_dtype", {e.key}, {g.name},
              "tensor " + peft::quoted(e.key) + " is " + std::string(dtype_name(info.dtype)) +
                  "; LoRA factors, magnitudes and alphas are floating-point tensors",
              false);
      if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_alpha) continue;
    }
    if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_alpha) {
      std::vector<float> value = d.weights->read_f32(e.index);
      if (value.size() == 1 && std::isfinite(value[0])) {
        kohya_alpha = static_cast<double>(value[0]);
      } else if (value.size() == 1) {
        alpha_invalid = true;
        d.problem("invalid_value", {e.key}, {g.name},
                "kohya alpha " + peft::quoted(e.key) + " is " + python_float_repr(value[0]) +
                    ", not a finite number (the module's alpha and scaling are unknown)",
                false);
      } else
        d.problem("shape_mismatch", {e.key}, {g.name},
                "kohya alpha " + peft::quoted(e.key) + " is " + shape_text(info.shape) + ", not one value", false);
      continue;
    }
    if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_dora_scale) {
      dora_scale = true;
      continue;
    }
    AdapterTensor t;
    t.role = e.role;
    t.suffix = e.suffix;
    t.key = e.key;
    t.index = e.index;
    m.tensors.push_back(std::move(t));
  }
  ModuleReport report;
  report.group = &g;
  classify(d, m, g);
  report.kind = m.kind;
  if (has_method_params(d, g))
    method_checks(d, m, g, report, kohya_alpha, dora_scale);
  else if (m.is_lora())
    lora_checks(d, m, g, report, kohya_alpha, alpha_invalid, dora_scale);
  if (m.is_lora()) report.method = report.method.value_or(peft_method_name(m.method));
  if (d.base && g.resolved && report.complete && !has_method_params(d, g)) shape_checks(d, m, g);
  if (g.resolved)
    for (size_t i : g.entries) {
      Entry& e = d.entries[i];
      if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_alpha) {  // becomes alpha_pattern when it can
        if (!kohya_alpha) e.final_key = e.key;                          // else kept as found
        continue;
      }
      if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_dora_scale) {
        e.final_key = e.key;
        continue;
      }
      e.final_key = peft_saved_key(g.name, saved_suffix(e.suffix));
    }
  else
    for (size_t i : g.entries) d.entries[i].final_key = d.entries[i].key;
  if (!m.tensors.empty()) report.dtype = std::string(dtype_name(d.weights->tensor(m.tensors.front().index).dtype));
  d.reports.push_back(std::move(report));
}

// Keys whose renames would meet in one key: none of them is renamed (the fix keeps every tensor
// under its key as found, so the copy shows the same duplicate), and the problem says so. Until
// no key is met twice: a key kept as found may be another rename's target.
void check_duplicates(DoctorState& d) {
  for (bool again = true; again;) {
    again = false;
    std::map<std::string, std::vector<size_t>> by_key;
    for (size_t i = 0; i < d.entries.size(); ++i)
      if (!d.entries[i].final_key.empty()) by_key[d.entries[i].final_key].push_back(i);
    for (const auto& [key, list] : by_key) {
      if (list.size() < 2) continue;
      std::vector<std::string> keys;
      for (size_t i : list) {
        keys.push_back(d.entries[i].key);
        if (d.entries[i].final_key != d.entries[i].key) again = true;
        d.entries[i].final_key = d.entries[i].key;
      }
      d.problem("duplicate_key", keys, {},
              std::to_string(keys.size()) + " keys are the same tensor " + peft::quoted(key) +
                  "; the fix renames none of them",
              false);
    }
  }
}

void check_unused_targets(DoctorState& d) {
  // LN_TUNING targets norms and TRAINABLE_TOKENS an embedding's rows: no LoRA-style target set.
  if (!d.base || method_row(d.config.method).effect == MethodEffect::replacement) return;
  std::set<size_t> covered;
  for (const Group& g : d.groups)
    if (g.base_index) covered.insert(*g.base_index);
  std::vector<std::string> missing;
  for (const TargetedBaseModule& t : targeted_base_modules(*d.base, *d.matcher, d.table.get()))
    if (!covered.contains(t.weight)) missing.push_back(t.module);
  if (!missing.empty())
    d.problem("target_without_tensors", {}, missing,
            "target_modules selects " + std::to_string(missing.size()) +
                " base modules for which the adapter holds no tensors (PEFT reports them as missing keys and "
                "leaves them at their initialisation)",
            false);
}

// A modules_to_save copy: a full module saved under its own parameter names ("weight"), which
// PEFT swaps in for the base module (saved base_layer weights are loaded into the base's own).
bool is_module_copy(const DoctorState& d, const ModuleReport& r) {
  if (r.kind != LayerKind::full) return false;
  for (size_t i : r.group->entries)
    if (d.entries[i].suffix == "weight") return true;
  return false;
}

// The adapter's changes to a base whose output embedding is tied to its input embedding, and what
// a checkpoint merge makes of them under each tied embeddings policy (docs/peft-semantics.md,
// "Tied embeddings"; merge_plan.cpp decides the same from the loaded adapter).
void check_tied_embeddings(DoctorState& d) {
  if (!d.base || !d.table) return;
  const std::optional<TiedEmbeddings> tied = d.base->tied_embeddings(d.table.get());
  if (!tied) return;
  TiedReport t;
  t.input = d.base->weights->tensor(tied->input).name;
  t.output = tied->output_module;
  t.output_stored = tied->output.has_value();
  t.config_key = tied->config_key;
  bool in_lora = false, out_lora = false, in_copy = false, out_copy = false, out_full = false;
  for (const ModuleReport& r : d.reports) {
    const Group& g = *r.group;
    if (!g.resolved || !g.base_index) continue;
    const bool output = g.name == tied->output_module;
    if (!output && *g.base_index != tied->input) continue;
    t.modules.push_back(g.name);
    if (r.kind == LayerKind::trainable_tokens) t.tokens = true;
    else if (is_module_copy(d, r)) (output ? out_copy : in_copy) = true;
    else if (r.kind == LayerKind::full) out_full = out_full || output;  // a saved base_layer: the input's is shared
    else (output ? out_lora : in_lora) = true;
  }
  if (t.modules.empty()) return;
  const bool tied_lora = d.config.ensure_weight_tying && in_lora && out_lora;
  const std::string in = peft::quoted(t.input), out = peft::quoted(t.output);
  const std::string weight = peft::quoted(tied->output_weight) + (t.output_stored ? " is written" : " is added");
  const std::string untied = t.config_key + " is set to false and " + weight;
  const std::string tokens = t.tokens ? " (both sides with the token rows)" : "";
  const std::string differs = "; the pair stays tied and the merged model differs from the adapter's forward (as "
                              "PEFT's merge_and_unload)";
  if (in_copy || out_copy) {
    t.kind = "modules_to_save";
    t.untie = t.shared = "a modules_to_save copy replaces " + std::string(out_copy ? out : in) + " alone: " + untied +
                         ", each side holding its own values" + tokens;
  } else if (tied_lora) {
    t.kind = "ensure_weight_tying";
    t.untie = "PEFT gives " + out + " the input embedding's LoRA (ensure_weight_tying): the one change lands once in " +
              in + ", which stays tied" + (t.tokens ? " (with the token rows)" : "");
    t.shared = "the tied LoRA's change is added twice to " + in + differs;
  } else if ((out_lora || out_full) && in_lora) {
    t.kind = "both";
    t.untie = untied + " holding the original embedding plus the output's own changes; " + in +
              " gets the input's own" + tokens;
    t.shared = "the changes of both sides land in " + in + differs;
  } else if (out_lora || out_full) {
    t.kind = "output_only";
    t.untie = untied + " holding the original embedding plus the changes of " + out + "; " + in +
              " keeps the original" + (t.tokens ? " plus the token rows (so does the output)" : "");
    t.shared = "the changes of " + out + " land in " + in + ", so the input embedding changes too" + differs;
  } else if (in_lora) {
    t.kind = "input_only";
    t.untie = untied + " holding the original embedding" + (t.tokens ? " plus the token rows" : "") +
              "; the changes of " + in + " stay on the input side";
    t.shared = "the changes of " + in + " land in the shared tensor, so " + out + " changes too" + differs;
  } else {
    t.kind = "trainable_tokens";
    t.untie = t.shared = "PEFT sets the token rows on both sides alike: they land once in " + in + ", which stays tied";
  }
  d.tied = std::move(t);
}

}  // namespace

void check_modules(DoctorState& d) {
  for (Group& g : d.groups) check_group(d, g);
  check_duplicates(d);
  check_unused_targets(d);
  check_tied_embeddings(d);
}

}  // namespace peft::doctor
