#include "peft/adapter/adapter.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "core/error.hpp"
#include "core/python_regex.hpp"
#include "core/text.hpp"
#include "peft/base/base_config.hpp"
#include "peft/base/base_model.hpp"
#include "peft/base/base_validation.hpp"
#include "peft/adapter/expert_modules.hpp"
#include "peft/adapter/module_matcher.hpp"
#include "peft/arch/arch_registry.hpp"
#include "checkpoint/hub_cache.hpp"

namespace peft {

void refuse_activated_lora(const Adapter& adapter, const std::string& job) {
  refuse_activated_lora(peft::quoted(adapter.dir()), adapter.config().alora_invocation_tokens, job);
}

bool is_modules_to_save_copy(const Adapter& adapter, const AdapterModule& m, const AdapterTensor& t) {
  const auto& saved = adapter.config().modules_to_save;
  if (t.suffix.starts_with("base_layer.") || !saved) return false;
  for (const std::string& entry : *saved)
    if (!entry.empty() && m.name.ends_with(entry)) return true;
  return false;
}

const AdapterModule* Adapter::find_module(std::string_view name) const {
  for (const AdapterModule& m : modules_)
    if (m.name == name) return &m;
  return nullptr;
}

namespace fs = std::filesystem;

// Builds an Adapter step by step; every step collects all problems of its kind before failing.
struct AdapterBuilder {
  Adapter& a;
  const Adapter::Options& options;
  std::optional<BaseModel> base;
  std::vector<std::string> broken_structure;  // PEFT_ERR_INVALID_CHECKPOINT
  std::vector<std::string> bad_config;        // PEFT_ERR_INVALID_CONFIG, each naming its field
  std::optional<ModuleMatcher> matcher;       // set by resolve_modules
  struct Inert {                              // lenient: a module left out by inert()
    std::string module;
    AdapterTensor present;  // the factor the file holds
    TensorRole absent;      // the zero-initialised factor it lacks
  };
  std::vector<Inert> inert_modules;           // reported by report_inert()
  std::vector<std::string> without_bias;      // lenient: modules lacking the lora_B.bias lora_bias announces

  void config_problem(const std::string& field, const std::string& what) {
    bad_config.push_back("field " + peft::quoted(field) + ": " + what);
  }

  // Lenient mode's two kinds of warning, named as PEFT's load result names keys (adapter name removed).
  void unexpected(const std::string& key, const std::string& why) {
    a.warnings_.push_back("unexpected key " + peft::quoted(key) + ": " + why + "; PEFT ignores it");
  }
  void missing(const std::string& module, const std::string& suffix, const std::string& why) {
    a.warnings_.push_back("missing key " + peft::quoted(std::string(kPeftPrefix) + module + "." + suffix) + ": " +
                          why);
  }
  void drop_empty_modules() {
    std::erase_if(a.modules_, [](const AdapterModule& m) { return m.tensors.empty(); });
  }

  // The trainable_token_indices entry that applies to a module, or null.
  const std::vector<int64_t>* token_indices_for(const std::string& module) const {
    return a.config_.trainable_token_indices.for_module(module);
  }

  const TensorInfo& info(const AdapterTensor& t) const { return a.checkpoint_->tensor(t.index); }

  void choose_table() {
    a.table_ = options.table;
    if (a.table_) {
      a.family_reason_ = "table given by the caller";
      return;
    }
    const nlohmann::json* base_config = base && base->config.is_object() ? &base->config : nullptr;
    // Without a base: the config.json of the folder base_model_name_or_path names, when that is a
    // local folder (PEFT loads the base from it; adapters trained on a local copy name it so). Only a
    // hint: a folder without a readable config falls back to the name.
    nlohmann::json named_config;
    std::error_code ec;
    if (!base_config && a.config_.base_model_name_or_path &&
        std::filesystem::is_directory(*a.config_.base_model_name_or_path, ec)) {
      try {
        named_config = read_base_config(*a.config_.base_model_name_or_path);
      } catch (const Error&) {
        named_config = nullptr;
      }
      if (named_config.is_object()) base_config = &named_config;
    }
    auto guess = detect_family(base_config, a.config_.base_model_name_or_path);
    if (!guess) return;
    a.table_ = builtin_arch_table(guess->family);
    a.family_reason_ = guess->reason;
  }

  // Whether a parsed key's role belongs to the adapter's method: LoRA roles to LoRA, method
  // parameters to their own method (AdaLoRA's lora_A/lora_B/lora_E, LoHa's hada_*, ...); full
  // replacement tensors and trainable tokens to every method.
  bool role_fits_method(const ParsedKey& key) const {
    const PeftMethod method = a.config_.method;
    if (key.role == TensorRole::full || key.role == TensorRole::trainable_tokens_delta) return true;
    if (key.role != TensorRole::method_param) return method_row(method).effect == MethodEffect::lora;
    return row_has_param(method_row(method), key.role_suffix);
  }

  // The projections VeRA and RandLoRA share among layers, saved once as "base_model.<name>", and
  // VB-LoRA's vector bank ("base_model.vblora_vector_bank").
  bool shared_projection(const ParsedKey& key) const {
    if (key.role != TensorRole::method_param || key.had_prefix || key.had_adapter_name || key.module != "base_model")
      return false;
    for (const MethodRow& row : method_table())
      for (std::string_view shared : row.shared)
        if (shared == key.role_suffix) return true;
    return false;
  }

  void group_keys() {
    std::vector<std::string> unresolved;
    std::map<std::string, size_t> by_name;
    std::map<std::pair<std::string, std::string>, std::string> seen;  // (module, suffix) -> key
    bool stripped_name = false, unprefixed = false;
    for (size_t i = 0; i < a.checkpoint_->tensor_count(); ++i) {
      const TensorInfo& t = a.checkpoint_->tensor(i);
      auto parsed = parse_adapter_key(t.name);
      if (parsed && !role_fits_method(*parsed)) parsed.reset();
      if (parsed && shared_projection(*parsed)) {  // VeRA / RandLoRA: "base_model.vera_A"
        a.shared_params_[parsed->role_suffix] = i;
        continue;
      }
      if (!parsed && options.lenient) {
        unexpected(t.name, "it is not a PEFT LoRA adapter key");
        continue;
      }
      if (!parsed) {
        unresolved.push_back(t.name);
        continue;
      }
      stripped_name = stripped_name || parsed->had_adapter_name;
      unprefixed = unprefixed || !parsed->had_prefix;
      auto [it, inserted] = seen.emplace(std::make_pair(parsed->module, parsed->role_suffix), t.name);
      if (!inserted) {
        broken_structure.push_back("keys " + peft::quoted(it->second) + " and " + peft::quoted(t.name) +
                                   " are the same tensor");
        continue;
      }
      auto [pos, added] = by_name.emplace(parsed->module, a.modules_.size());
      if (added) {
        a.modules_.emplace_back();
        a.modules_.back().name = parsed->module;
      }
      AdapterTensor tensor;
      tensor.role = parsed->role;
      tensor.suffix = parsed->role_suffix;
      tensor.key = t.name;
      tensor.index = i;
      tensor.base_tensor = parsed->role == TensorRole::full ? parsed->base_tensor
                           : parsed->role == TensorRole::lora_b_bias ? parsed->module + ".bias"
                                                                     : parsed->module + ".weight";
      a.modules_[pos->second].tensors.push_back(std::move(tensor));
    }
    if (!unresolved.empty()) {
      std::string message = a.dir_ + ": " + std::to_string(unresolved.size()) +
                            (unresolved.size() == 1 ? " tensor key is" : " tensor keys are") +
                            " not PEFT " + std::string(peft_method_name(a.config_.method)) + " adapter keys: ";
      for (size_t i = 0; i < unresolved.size(); ++i) message += (i ? ", " : "") + peft::quoted(unresolved[i]);
      fail(PEFT_ERR_UNRESOLVED_KEY, message);
    }
    if (stripped_name)
      a.notes_.push_back("some keys carry the adapter name \"default\" (e.g. lora_A.default.weight); it was removed, "
                         "as PEFT 0.21 does when loading under the default name");
    if (unprefixed)
      a.notes_.push_back("some keys lack the \"base_model.model.\" prefix; they were read as module paths of the base "
                         "model, as transformers' load_adapter reads them (PeftModel.from_pretrained in PEFT 0.21 does not "
                         "load them: they are unexpected keys there, and its LoRA layers stay at zero)");
  }

  // Decides each module's kind from its roles and checks that its LoRA tensors are complete.
  void classify(AdapterModule& m) {
    const auto [lora, embedding, tokens, method_params] = module_roles(m);
    std::string who = "module " + peft::quoted(m.name);
    if (method_params) {
      m.kind = LayerKind::linear;  // GPT-2 Conv1D is told apart with the base or the table
      m.method = a.config_.method;
      return;
    }
    if (embedding && (m.find(TensorRole::lora_a) || m.find(TensorRole::lora_b) || m.find(TensorRole::lora_b_bias))) {
      broken_structure.push_back(who + " has both lora_embedding_* and lora_A/lora_B tensors");
      return;
    }
    if (embedding) {
      m.kind = LayerKind::embedding;
      if (inert(m, TensorRole::lora_embedding_b, TensorRole::lora_embedding_a)) return;
      require(m, TensorRole::lora_embedding_a, TensorRole::lora_embedding_b);
      return;
    }
    if (lora) {
      m.kind = LayerKind::linear;
      if (inert(m, TensorRole::lora_a, TensorRole::lora_b)) return;
      if (!require(m, TensorRole::lora_a, TensorRole::lora_b)) return;
      size_t ndim = info(*m.find(TensorRole::lora_a)).shape.size();
      if (ndim == 4) {
        m.kind = LayerKind::conv2d;
      } else if (ndim == 3 || ndim == 5) {
        fail(PEFT_ERR_UNSUPPORTED, who + ": LoRA on " + (ndim == 3 ? "Conv1d" : "Conv3d") +
                                       " layers is not supported (lora_A is " +
                                       shape_text(info(*m.find(TensorRole::lora_a)).shape) + ")");
      }
      return;
    }
    m.kind = tokens ? LayerKind::trainable_tokens : LayerKind::full;
  }

  // Lenient mode: a module holding `present` whose `absent` factor PEFT initialises to zero
  // (lora_B, or lora_embedding_A of an embedding) changes nothing in PEFT; its tensors are dropped
  // (and the module with them) and its missing keys reported. False, and the module fails as in
  // strict mode, when PEFT would keep a random or nonzero value, or fail on the rank.
  bool inert(AdapterModule& m, TensorRole present, TensorRole absent) {
    const LoraConfig& c = a.config_;
    if (!options.lenient || !m.find(present) || m.find(absent) || !c.zero_initialised() ||
        m.find(TensorRole::lora_magnitude) || m.find(TensorRole::lora_b_bias))
      return false;
    const auto& shape = info(*m.find(present)).shape;
    const size_t rank_axis = present == TensorRole::lora_a ? 0 : 1;  // lora_A [r, ...], lora_embedding_B [dim, r]
    if (shape.size() < 2 || static_cast<int64_t>(shape[rank_axis]) != matcher->rank_for(m.name)) return false;
    inert_modules.push_back({m.name, *m.find(present), absent});
    m.tensors.clear();
    return true;
  }

  // Lenient mode: the keys of the modules inert() left out. With a base, a module the base lacks
  // is an unexpected key instead (PEFT creates no layer for it), and a factor that does not fit
  // the base weight is PEFT_ERR_SHAPE_MISMATCH (PEFT's load_state_dict fails on it).
  void report_inert() {
    const LoraConfig& c = a.config_;
    std::vector<std::string> mismatched;
    for (const Inert& x : inert_modules) {
      const auto& p = info(x.present).shape;
      if (base) {
        auto index = base->find(x.module, "weight", a.table_.get());
        if (!index) {
          unexpected(x.present.key, "the base model has no weight " + peft::quoted(x.module + ".weight") +
                                        ", so PEFT creates no LoRA layer for module " + peft::quoted(x.module));
          continue;
        }
        const TensorInfo& w = base->weights->tensor(*index);
        const auto& ws = w.shape;
        const bool fits = x.present.role == TensorRole::lora_embedding_b
                              ? ws.size() == 2 && p.size() == 2 && ws[1] == p[0]
                          : p.size() == 4 ? ws.size() == 4 && ws[1] == p[1] && ws[2] == p[2] && ws[3] == p[3]
                                          : ws.size() == 2 && p.size() == 2 && (ws[1] == p[1] || ws[0] == p[1]);
        if (!fits) {
          mismatched.push_back("module " + peft::quoted(x.module) + ": " + x.present.suffix + " " + shape_text(p) +
                               " does not fit the base weight " + peft::quoted(w.name) + " " + shape_text(ws));
          continue;
        }
      }
      const std::string why = "module " + peft::quoted(x.module) + " has " + x.present.suffix + " but no " +
                              role_suffix(x.absent) +
                              ", which PEFT initialises to zero: the module changes nothing and is left out";
      missing(x.module, role_suffix(x.absent), why);
      if (x.absent == TensorRole::lora_b && c.lora_bias) missing(x.module, role_suffix(TensorRole::lora_b_bias), why);
      if (c.use_dora) missing(x.module, role_suffix(TensorRole::lora_magnitude), why);
    }
    if (!mismatched.empty())
      fail(PEFT_ERR_SHAPE_MISMATCH, "adapter " + peft::quoted(a.dir_) + " does not fit base model " +
                                        peft::quoted(base->dir) + ": " + join_text(mismatched, "; "));
  }

  bool require(const AdapterModule& m, TensorRole first, TensorRole second) {
    bool ok = true;
    for (TensorRole role : {first, second}) {
      if (!m.find(role)) {
        broken_structure.push_back("module " + peft::quoted(m.name) + " has no " + role_suffix(role) +
                                   " (PEFT would leave it at its random or zero initialisation)");
        ok = false;
      }
    }
    return ok;
  }

  // Rank from the tensors, checked for consistency; 0 when they do not agree.
  int64_t tensor_rank(const AdapterModule& m) {
    bool emb = m.kind == LayerKind::embedding;
    const auto& A = info(*m.find(emb ? TensorRole::lora_embedding_a : TensorRole::lora_a)).shape;
    const auto& B = info(*m.find(emb ? TensorRole::lora_embedding_b : TensorRole::lora_b)).shape;
    size_t want = m.kind == LayerKind::conv2d ? 4 : 2;
    std::string who = "module " + peft::quoted(m.name);
    if (A.size() != want || B.size() != want) {
      broken_structure.push_back(who + ": lora A " + shape_text(A) + " and B " + shape_text(B) + " must be " +
                                 std::to_string(want) + "-D");
      return 0;
    }
    if (A[0] != B[1] || A[0] == 0) {
      broken_structure.push_back(who + ": lora A " + shape_text(A) + " and B " + shape_text(B) +
                                 " disagree on the rank");
      return 0;
    }
    return static_cast<int64_t>(A[0]);
  }

  // ensure_weight_tying with an embedding among the targets: PEFT gives the tied output embedding
  // (lm_head) a LoRA layer of its own, tied to the input embedding's (LoraModel._add_targets_to_tie),
  // without target_modules naming it, and saves its factors.
  bool is_tied_lora_target(const AdapterModule& m) const {
    return a.config_.ensure_weight_tying && a.table_ && a.table_->output_embedding() &&
           m.name == *a.table_->output_embedding();
  }

  void resolve_lora(AdapterModule& m, const ModuleMatcher& matcher, std::vector<std::string>& untargeted) {
    // A stacked expert parameter is targeted by target_parameters, its patterns keyed "<module>.<param>".
    const std::string key = m.expert ? m.expert->module + "." + m.expert->param : m.name;
    auto verdict = m.expert ? ModuleMatcher::Verdict::targeted : matcher.check(m.name);
    if (verdict == ModuleMatcher::Verdict::not_targeted && is_tied_lora_target(m)) {
      // targeted through the tie
    } else if (verdict == ModuleMatcher::Verdict::not_targeted || verdict == ModuleMatcher::Verdict::excluded)
      untargeted.push_back(peft::quoted(m.name) + " (" + verdict_name(verdict) + ")");
    m.rank_key = matcher.rank_key(key);
    m.alpha_key = matcher.alpha_key(key);
    m.rank = matcher.rank_for(key);
    m.alpha = matcher.alpha_for(key);
    m.scaling = a.config_.scaling(m.rank, m.alpha);
    int64_t actual = tensor_rank(m);
    if (m.expert && actual != 0 && m.rank > 0) {  // lora_A holds r rows per expert
      if (actual % m.rank == 0) {
        m.expert->num_experts = actual / m.rank;
        actual = m.rank;
      }
    }
    if (actual != 0 && actual != m.rank) {
      std::string who = "module " + peft::quoted(m.name) + " has rank " + std::to_string(actual) + " but ";
      if (m.rank_key)
        config_problem("rank_pattern", who + "key " + peft::quoted(*m.rank_key) + " gives " + std::to_string(m.rank));
      else if (a.config_.r_given)
        config_problem("r", who + "r is " + std::to_string(m.rank));
      else
        config_problem("r", who + "r is absent, and PEFT then uses its default " + std::to_string(m.rank));
    }
    const LoraConfig& c = a.config_;
    std::string who = "module " + peft::quoted(m.name);
    if (!c.alora_invocation_tokens.empty() && (m.kind == LayerKind::embedding || m.kind == LayerKind::conv2d))
      config_problem("alora_invocation_tokens", who + " is a" + (m.kind == LayerKind::embedding ? "n embedding" : " convolution") +
                                                    " layer: activated LoRA adapts Linear layers only, as in PEFT");
    if (m.find(TensorRole::lora_magnitude) && !c.use_dora)
      config_problem("use_dora", who + " has a DoRA lora_magnitude_vector but use_dora is false");
    if (!m.find(TensorRole::lora_magnitude) && c.use_dora)
      config_problem("use_dora", who + " has no lora_magnitude_vector but use_dora is true");
    if (m.find(TensorRole::lora_b_bias) && !c.lora_bias)
      config_problem("lora_bias", who + " has lora_B.bias but lora_bias is false");
    if (!m.find(TensorRole::lora_b_bias) && c.lora_bias && m.kind != LayerKind::embedding) {
      if (options.lenient && c.zero_initialised())
        without_bias.push_back(m.name);  // reported once the base has had its say (report_missing_biases)
      else
        config_problem("lora_bias", who + " has no lora_B.bias but lora_bias is true");
    }
  }

  // A module of another method: its row checks that its parameters are complete and sets its rank,
  // alpha and scale as PEFT computes them (MethodRow::resolve), on this builder's lookups.
  struct MethodResolution final : ModuleResolution {
    AdapterBuilder& builder;
    const AdapterModule& m;
    const ModuleMatcher& matcher;
    MethodResolution(AdapterBuilder& builder, const AdapterModule& m, const ModuleMatcher& matcher)
        : ModuleResolution(m.name, peft_method_name(m.method), builder.a.config_.r, builder.a.config_.lora_alpha,
                           builder.a.config_.method_fields),
          builder(builder), m(m), matcher(matcher) {}
    bool has(std::string_view param) const override { return m.find_param(param) != nullptr; }
    std::vector<uint64_t> shape(std::string_view param) const override {
      const AdapterTensor* t = m.find_param(param);
      return t ? builder.info(*t).shape : std::vector<uint64_t>{};
    }
    void rank_from_patterns() override {
      rank_key = matcher.rank_key(module);
      rank = matcher.rank_for(module);
    }
    void alpha_from_patterns() override {
      alpha_key = matcher.alpha_key(module);
      alpha = matcher.alpha_for(module);
    }
    bool is_this_module(std::string_view path) const override {
      if (path.starts_with(kPeftPrefix)) path.remove_prefix(kPeftPrefix.size());
      return path == module;
    }
    void broken(const std::string& what) override { builder.broken_structure.push_back(what); }
    void config_problem(const std::string& field, const std::string& what) override {
      builder.config_problem(field, what);
    }
  };

  void resolve_method(AdapterModule& m, const ModuleMatcher& matcher, std::vector<std::string>& untargeted) {
    auto verdict = matcher.check(m.name);
    if (verdict == ModuleMatcher::Verdict::not_targeted || verdict == ModuleMatcher::Verdict::excluded)
      untargeted.push_back(peft::quoted(m.name) + " (" + verdict_name(verdict) + ")");
    const auto resolve = method_row(m.method).resolve;
    if (resolve == nullptr) return;  // no method_param modules (role_fits_method)
    MethodResolution r(*this, m, matcher);
    resolve(r);
    m.rank = r.rank;
    m.alpha = r.alpha;
    m.scaling = r.scaling;
    m.rank_key = r.rank_key;
    m.alpha_key = r.alpha_key;
    m.settings = r.settings;
  }

  void resolve_tokens(AdapterModule& m) {
    const TrainableTokenIndices& tti = a.config_.trainable_token_indices;
    const AdapterTensor* delta = m.find(TensorRole::trainable_tokens_delta);
    if (!tti.given) {
      config_problem("trainable_token_indices", "tensor " + peft::quoted(delta->key) +
                                                    " holds trainable-token rows but the field is not set");
      return;
    }
    const std::vector<int64_t>* indices = token_indices_for(m.name);
    if (!indices) {
      config_problem("trainable_token_indices",
                     "module " + peft::quoted(m.name) + " has trainable-token rows but no entry names it");
      return;
    }
    m.token_indices = *indices;
    const auto& shape = info(*delta).shape;
    if (shape.size() != 2 || shape[0] != indices->size())
      config_problem("trainable_token_indices", "tensor " + peft::quoted(delta->key) + " is " + shape_text(shape) +
                                                    " but " + std::to_string(indices->size()) +
                                                    " token indices are configured");
  }

  // TRAINABLE_TOKENS on a model with tied embeddings: PEFT wraps the output embedding in a layer tied
  // to the input embedding's (TrainableTokensModel.inject_adapter), which shares its delta and its
  // token_indices, and save_pretrained writes that delta a second time under the output embedding
  // ("lm_head.trainable_tokens_delta"). Its merge writes the same rows into the same shared weight,
  // so the copy is left out (with a note) when no target names it.
  void drop_tied_token_copies() {
    if (a.config_.method != PeftMethod::trainable_tokens) return;
    std::erase_if(a.modules_, [&](const AdapterModule& m) {
      const bool copy = m.kind == LayerKind::trainable_tokens && !token_indices_for(m.name) &&
                        (m.name == "lm_head" || m.name.ends_with(".lm_head"));
      if (copy)
        a.notes_.push_back("module " + peft::quoted(m.name) + " holds the tied output embedding's copy of the "
                           "trainable-token rows (PEFT's tied adapter shares the input embedding's); it is left out");
      return copy;
    });
  }

  // LN_TUNING: PEFT loads ln_tuning_layers only into the modules target_modules selects.
  void check_ln_target(const AdapterModule& m, std::vector<std::string>& untargeted) {
    bool tuned = false;
    for (const AdapterTensor& t : m.tensors) tuned = tuned || t.key.find(".ln_tuning_layers.") != std::string::npos;
    if (!tuned) return;
    auto verdict = matcher->check(m.name);
    if (verdict == ModuleMatcher::Verdict::not_targeted || verdict == ModuleMatcher::Verdict::excluded)
      untargeted.push_back(peft::quoted(m.name) + " (" + verdict_name(verdict) + ")");
  }

  void expand_targets(ModuleMatcher& matcher) {
    const LoraConfig& c = a.config_;
    if (!matcher.needs_expansion()) return;
    if (!base || !a.table_) {
      a.notes_.push_back(std::string("target_modules is ") +
                         (c.target_modules.kind == ModuleSelector::Kind::none ? "absent" : "\"all-linear\"") +
                         "; without a base model and a known architecture the adapted modules cannot be checked "
                         "against it");
      return;
    }
    const std::optional<std::vector<std::string>> targets = implicit_targets(*base, *a.table_, c);
    if (!targets)
      fail(PEFT_ERR_INVALID_CONFIG, a.dir_ + ": field \"target_modules\" is absent and PEFT has no default target "
                                             "modules for model_type " +
                                        peft::quoted(base->model_type().value_or("(none)")));
    matcher.expand_targets(*targets);
  }

  // Lenient mode: drops the tensors for which PEFT's load_state_dict(strict=False) finds no
  // parameter, because the config creates none (unexpected keys).
  void drop_unexpected() {
    const LoraConfig& c = a.config_;
    for (AdapterModule& m : a.modules_) {
      const auto verdict = matcher->check(m.name);
      const bool untargeted =
          verdict == ModuleMatcher::Verdict::not_targeted || verdict == ModuleMatcher::Verdict::excluded;
      const std::string who = "module " + peft::quoted(m.name);
      std::erase_if(m.tensors, [&](const AdapterTensor& t) {
        std::string why;
        if (is_lora_role(t.role) && untargeted)
          why = who + " is " + verdict_name(verdict) +
                " (target_modules with exclude_modules, modules_to_save and layers_to_transform), so PEFT creates no "
                "LoRA layer for it";
        else if (t.role == TensorRole::lora_magnitude && !c.use_dora)
          why = "a DoRA magnitude vector, but use_dora is false";
        else if (t.role == TensorRole::lora_b_bias && !c.lora_bias)
          why = "a lora_B.bias, but lora_bias is false";
        else if (t.role == TensorRole::trainable_tokens_delta && !token_indices_for(m.name))
          why = "trainable-token rows, but trainable_token_indices does not configure " + who;
        if (why.empty()) return false;
        unexpected(t.key, why);
        return true;
      });
    }
    drop_empty_modules();
  }

  void resolve_modules() {
    matcher.emplace(a.config_);
    expand_targets(*matcher);
    if (options.lenient) drop_unexpected();
    std::vector<std::string> untargeted;
    for (AdapterModule& m : a.modules_) classify(m);
    drop_empty_modules();  // modules inert() left out
    drop_tied_token_copies();
    resolve_expert_modules(a.modules_, a.config_, a.table_.get(), a.dir_);
    if (!broken_structure.empty())
      fail(PEFT_ERR_INVALID_CHECKPOINT, a.dir_ + ": " + join_text(broken_structure, "; "));
    size_t token_modules = 0;
    for (AdapterModule& m : a.modules_) {
      if (m.is_lora() && m.method != PeftMethod::lora) resolve_method(m, *matcher, untargeted);
      else if (m.is_lora()) resolve_lora(m, *matcher, untargeted);
      if (m.kind == LayerKind::trainable_tokens) {
        resolve_tokens(m);
        ++token_modules;
      }
      if (a.config_.method == PeftMethod::ln_tuning) check_ln_target(m, untargeted);
    }
    if (a.config_.trainable_token_indices.is_list && token_modules > 1)
      config_problem("trainable_token_indices", "a list applies to one embedding, but " +
                                                    std::to_string(token_modules) +
                                                    " modules carry trainable-token rows");
    if (!broken_structure.empty())
      fail(PEFT_ERR_INVALID_CHECKPOINT, a.dir_ + ": " + join_text(broken_structure, "; "));
    if (!untargeted.empty()) {
      std::string message = a.dir_ + "/adapter_config.json: field \"target_modules\" (with exclude_modules, "
                            "modules_to_save and layers_to_transform) does not select " +
                            std::to_string(untargeted.size()) +
                            (untargeted.size() == 1 ? " module that has" : " modules that have") +
                            " LoRA tensors (PEFT would silently ignore them): ";
      for (size_t i = 0; i < untargeted.size(); ++i) message += (i ? ", " : "") + untargeted[i];
      fail(PEFT_ERR_INVALID_CONFIG, message);
    }
    if (!bad_config.empty())
      fail(PEFT_ERR_INVALID_CONFIG,
           a.dir_ + "/adapter_config.json does not match the adapter's tensors: " + join_text(bad_config, "; "));
    note_unused_patterns();
  }

  // Lenient mode: the lora_B.bias keys missing from modules that stay (PEFT: zero, adds nothing).
  void report_missing_biases() {
    for (const std::string& name : without_bias)
      if (a.find_module(name))
        missing(name, role_suffix(TensorRole::lora_b_bias),
                "lora_bias is true but module " + peft::quoted(name) +
                    " has no lora_B.bias, which PEFT initialises to zero: it adds nothing");
  }

  // Lenient mode: drops the tensors whose module or weight the base does not have (PEFT finds no
  // parameter for them). Shapes are checked afterwards, as in strict mode.
  void drop_absent_from_base() {
    const ArchTable* table = a.table_.get();
    for (AdapterModule& m : a.modules_) {
      const bool has_weight = !m.is_lora() || m.expert || base->find(m.name, "weight", table).has_value();
      std::erase_if(m.tensors, [&](const AdapterTensor& t) {
        if (is_lora_role(t.role) && !has_weight) {
          unexpected(t.key, "the base model has no weight " + peft::quoted(m.name + ".weight") + ", so PEFT creates no "
                            "LoRA layer for module " + peft::quoted(m.name));
          return true;
        }
        if (t.role != TensorRole::full) return false;
        const std::string param = suffix_parameter(t.suffix);
        if (base->find(m.name, param, table)) return false;
        unexpected(t.key, "the base model has no tensor " + peft::quoted(m.name + "." + param) + " for it to replace");
        return true;
      });
      if (m.is_lora() && !has_weight)
        m.kind = m.find(TensorRole::trainable_tokens_delta) ? LayerKind::trainable_tokens : LayerKind::full;
    }
    drop_empty_modules();
  }

  // Lenient mode: the base modules target_modules selects that the file holds no tensors for. PEFT
  // creates their layers with lora_B = 0 (lora_embedding_A = 0), reports their keys as missing, and
  // they change nothing; with another initialisation they would hold random weights (an error).
  // A config that selects no module of the base is refused, as PEFT refuses it.
  void report_untouched_targets() {
    const LoraConfig& c = a.config_;
    std::set<std::string> covered;
    size_t targeted = 0;
    for (const AdapterModule& m : a.modules_) {
      if (!m.is_lora()) continue;
      ++targeted;
      for (const AdapterTensor& t : m.tensors)
        if (is_lora_role(t.role)) covered.insert(t.base_tensor);
    }
    for (const Inert& x : inert_modules)  // reported by report_inert()
      if (auto index = base->find(x.module, "weight", a.table_.get()))
        covered.insert(base->weights->tensor(*index).name);
    std::vector<std::string> random;
    for (const auto& [module, weight, kind] : targeted_base_modules(*base, *matcher, a.table_.get())) {
      if (covered.contains(base->weights->tensor(weight).name)) continue;
      ++targeted;
      if (!c.zero_initialised()) {
        random.push_back(peft::quoted(module));
        continue;
      }
      const bool emb = kind == ModuleKind::embedding;
      const std::string why = "target_modules selects module " + peft::quoted(module) +
                              ", for which the file has no tensors; PEFT initialises its " +
                              (emb ? "lora_embedding_A" : "lora_B") + " to zero, so it changes nothing";
      missing(module, emb ? "lora_embedding_A" : "lora_A.weight", why);
      missing(module, emb ? "lora_embedding_B" : "lora_B.weight", why);
      if (!emb && c.lora_bias) missing(module, role_suffix(TensorRole::lora_b_bias), why);
      if (c.use_dora) missing(module, role_suffix(TensorRole::lora_magnitude), why);
    }
    if (!random.empty())
      fail(PEFT_ERR_INVALID_CONFIG, a.dir_ + "/adapter_config.json: field \"init_lora_weights\" is not true or "
                                             "\"gaussian\", and target_modules selects modules the file has no "
                                             "tensors for, which PEFT would leave at random weights: " +
                                        join_text(random, ", "));
    const auto kind = c.target_modules.kind;
    if (targeted == 0 && (kind == ModuleSelector::Kind::list || kind == ModuleSelector::Kind::regex))
      fail(PEFT_ERR_INVALID_CONFIG, a.dir_ + "/adapter_config.json: field \"target_modules\" selects no module of "
                                             "base model " + peft::quoted(base->dir) +
                                        " that PEFT can adapt; PEFT refuses to load such an adapter");
  }

  // open_checkpoint() opens the weights once the config is read and the table chosen.
  template <class OpenCheckpoint>
  static std::shared_ptr<const Adapter> build(const std::string& dir, LoraConfig config,
                                              OpenCheckpoint open_checkpoint, const Adapter::Options& options) {
    auto adapter = std::make_shared<Adapter>();
    Adapter& a = *adapter;
    a.dir_ = dir;
    a.config_ = std::move(config);
    AdapterBuilder b{a, options, std::nullopt, {}, {}, std::nullopt, {}, {}};
    if (!options.base_dir.empty()) {
      b.base = BaseModel::open(options.base_dir, options.open);
      a.base_dir_ = b.base->dir;
    }
    b.choose_table();
    a.checkpoint_ = open_checkpoint();
    b.group_keys();
    b.resolve_modules();
    if (b.base) {
      if (options.lenient) b.drop_absent_from_base();
      ValidationResult result = check_against_base(a.modules_, *a.checkpoint_, a.config_, *b.base, a.table_.get());
      throw_if_failed(result, a.dir_, options.base_dir);
      for (std::string& note : result.notes) a.notes_.push_back(std::move(note));
    } else if (a.table_) {
      // Without a base, the architecture table says which layers are GPT-2 Conv1D.
      for (AdapterModule& m : a.modules_) {
        if (m.kind != LayerKind::linear) continue;
        const ModuleRule* rule = a.table_->rule_for_hf(m.name);
        if (rule && rule->kind == ModuleKind::conv1d) m.kind = LayerKind::conv1d;
      }
    }
    b.report_inert();
    b.report_missing_biases();
    const bool replacements_only = method_row(a.config_.method).effect == MethodEffect::replacement;
    if (b.base && options.lenient && !replacements_only) b.report_untouched_targets();
    return adapter;
  }

  // PEFT silently ignores rank_pattern / alpha_pattern keys that match nothing (issue #3582).
  void note_unused_patterns() {
    auto check = [&](const auto& patterns, const char* field, auto key_of) {
      for (const auto& [key, value] : patterns) {
        bool used = false;
        for (const AdapterModule& m : a.modules_) used = used || (m.is_lora() && key_of(m) == key);
        if (!used)
          a.notes_.push_back(std::string(field) + " key " + peft::quoted(key) + " matches no adapted module");
      }
    };
    check(a.config_.rank_pattern, "rank_pattern", [](const AdapterModule& m) { return m.rank_key.value_or(""); });
    check(a.config_.alpha_pattern, "alpha_pattern", [](const AdapterModule& m) { return m.alpha_key.value_or(""); });
  }
};

AdapterFiles adapter_folder_files(const std::string& dir_or_id, bool config_required) {
  AdapterFiles files;
  files.dir = resolve_model_location(dir_or_id, {"adapter_config.json", "adapter_model.safetensors"});
  const std::string& dir = files.dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(PEFT_ERR_NOT_FOUND, "adapter folder " + peft::quoted(dir) + " does not exist or is not a folder");
  files.config = (fs::path(dir) / "adapter_config.json").string();
  files.weights = (fs::path(dir) / "adapter_model.safetensors").string();
  files.has_config = fs::exists(files.config, ec);
  if (!files.has_config && config_required)
    fail(PEFT_ERR_NOT_FOUND, "adapter folder " + peft::quoted(dir) + " has no adapter_config.json");
  if (!fs::exists(files.weights, ec)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin", ec))
      fail(PEFT_ERR_UNSUPPORTED, "adapter folder " + peft::quoted(dir) +
                                     " holds adapter_model.bin (a pickle), which peft_c does not read; convert it "
                                     "to adapter_model.safetensors (e.g. PeftModel.from_pretrained(...)"
                                     ".save_pretrained(dir, safe_serialization=True))");
    fail(PEFT_ERR_NOT_FOUND, "adapter folder " + peft::quoted(dir) + " has no adapter_model.safetensors");
  }
  return files;
}

std::shared_ptr<const Adapter> Adapter::open(const std::string& dir_or_id, const Options& options) {
  const AdapterFiles files = adapter_folder_files(dir_or_id, true);
  return open_files(files.config, files.weights, options);
}

std::shared_ptr<const Adapter> Adapter::open_files(const std::string& config_path, const std::string& weights_path,
                                                   const Options& options) {
  return AdapterBuilder::build(
      fs::path(config_path).parent_path().string(), LoraConfig::from_file(config_path),
      [&] { return Checkpoint::open(weights_path, options.open); }, options);
}

std::shared_ptr<const Adapter> Adapter::open_memory(std::string_view config_json, const void* weights,
                                                    size_t weights_size, const Options& options) {
  return AdapterBuilder::build(
      std::string(kMemoryAdapterDir),
      LoraConfig::parse(config_json, std::string(kMemoryAdapterDir) + "/adapter_config.json"),
      [&] { return Checkpoint::open_memory(weights, weights_size, options.open); }, options);
}

void Adapter::validate(const std::string& base_dir, const OpenOptions& open) const {
  BaseModel base = BaseModel::open(base_dir, open);
  std::shared_ptr<const ArchTable> table = table_;
  if (!table) {
    const nlohmann::json* config = base.config.is_object() ? &base.config : nullptr;
    if (auto guess = detect_family(config, config_.base_model_name_or_path)) table = builtin_arch_table(guess->family);
  }
  std::vector<AdapterModule> copy = modules_;
  for (AdapterModule& m : copy)
    if (m.kind == LayerKind::conv1d) m.kind = LayerKind::linear;  // decided again from the base
  throw_if_failed(check_against_base(copy, *checkpoint_, config_, base, table.get()), dir_, base_dir);
}

}  // namespace peft
