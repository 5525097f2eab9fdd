// The adapter doctor (adapter_doctor.hpp): reads an adapter folder as it is, resolves every key to
// a module of the base (with the renames of key_renames.hpp), checks each module as the loader and
// the base validation would, and reports or fixes everything it found.
#include "peft/doctor/adapter_doctor.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/adapter_module.hpp"
#include "peft/base/base_model.hpp"
#include "peft/base/base_validation.hpp"
#include "peft/adapter/module_matcher.hpp"
#include "peft/arch/arch_registry.hpp"
#include "peft/arch/key_grammar.hpp"
#include "peft/doctor/key_renames.hpp"
#include "peft/export/adapter_export.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hub_cache.hpp"
#include "safetensors/writer.hpp"

namespace peft {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<uint64_t>;
using Json = nlohmann::json;

// One tensor of the adapter file and what the doctor made of it.
struct Entry {
  size_t index = 0;
  std::string key;
  bool understood = false;  // module and suffix are known
  bool had_prefix = false;
  bool kohya = false;
  KeyRewrite::Role kohya_role = KeyRewrite::Role::lora_tensor;
  bool suffix_variant = false;
  std::string module;  // as written (without "base_model.model.")
  std::string suffix;  // PEFT's role suffix (after an embedding-role fix)
  TensorRole role = TensorRole::full;
  std::string final_key;  // the key --fix writes; "" when the tensor is dropped into the config
  bool kohya_alpha_or_scale() const { return kohya && kohya_role != KeyRewrite::Role::lora_tensor; }
};

// One module as the fix will name it.
struct Group {
  std::string written;       // the module path as written
  std::string name;          // after the rename (== written when none)
  bool resolved = true;      // name is known (with a base: found in the base)
  std::vector<size_t> entries;
  std::optional<size_t> base_index;  // the base tensor the module applies to
};

struct Problem {
  std::string kind;
  std::vector<std::string> keys;
  std::vector<std::string> modules;
  std::string message;
  bool fixable = false;
};

// A method parameter saved with a key tail (OFT's oft_R: <module>.oft_R[.default].weight), or null.
const char* key_tail_of(const std::string& suffix) {
  const MethodRow* row = method_row_for_param(suffix);
  return row != nullptr ? row->key_tail : nullptr;
}

std::optional<TensorRole> role_of_suffix(const std::string& suffix) {
  if (key_tail_of(suffix) != nullptr) return TensorRole::method_param;
  auto parsed = parse_adapter_key("m." + suffix);
  if (!parsed) return std::nullopt;
  return parsed->role;
}

// The suffix as PEFT saves it: OFT's rotation is the weight of its oft_R submodule.
std::string saved_suffix(const std::string& suffix) {
  const char* tail = key_tail_of(suffix);
  return tail != nullptr ? suffix + "." + tail : suffix;
}

std::string param_of(const Entry& e) {
  if (e.role != TensorRole::full) return e.role == TensorRole::lora_b_bias ? "bias" : "weight";
  return suffix_parameter(e.suffix);
}

// A rank is a dimension PEFT can hold: a positive integer below 2^63.
bool valid_rank(uint64_t dim) { return dim > 0 && dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()); }

// The report never holds NaN or Infinity (not JSON): an unknown value is null.
Json finite_or_null(std::optional<double> value) {
  return value && std::isfinite(*value) ? Json(*value) : Json(nullptr);
}

Json shape_json(const Shape& shape) {
  Json out = Json::array();
  for (uint64_t d : shape) out.push_back(d);
  return out;
}

class Doctor {
 public:
  Doctor(const std::string& adapter_dir, const std::string& base_dir) : dir_(adapter_dir), base_dir_(base_dir) {}

  void run() {
    open();
    read_keys();
    resolve_modules();
    for (Group& g : groups_) check_group(g);
    check_duplicates();
    check_unused_targets();
  }

  DoctorResult result() const { return {python_json_dumps(report()), problems_.empty()}; }

  // --fix never writes over what it reads: the adapter folder, the base folder, or any folder of a
  // hub cache snapshot (its files are links into blobs/). Compared as weakly canonical paths (links
  // resolved, the folder may not exist yet).
  void check_out_dir(const std::string& out_dir) const {
    std::error_code ec;
    const fs::path out = fs::weakly_canonical(fs::absolute(out_dir, ec), ec);
    auto same = [&](const std::string& dir) {
      std::error_code ec2;
      const fs::path p = fs::weakly_canonical(fs::absolute(dir, ec2), ec2);
      return !ec2 && p == out;
    };
    if (same(dir_))
      fail(PEFT_ERR_INVALID_ARGUMENT, "the fixed copy's folder " + peft::quoted(out_dir) +
                                          " is the adapter folder itself; --fix writes a copy, give another folder");
    if (base_ && same(base_->dir))
      fail(PEFT_ERR_INVALID_ARGUMENT, "the fixed copy's folder " + peft::quoted(out_dir) +
                                          " is the base model folder; give another folder");
    for (fs::path p = out; !p.empty() && p != p.root_path(); p = p.parent_path())
      if (auto repository = hub_repository_of_snapshot(p.string()))
        fail(PEFT_ERR_INVALID_ARGUMENT, "the fixed copy's folder " + peft::quoted(out_dir) +
                                            " is inside a hub cache snapshot of " + peft::quoted(*repository) +
                                            " (its files are links into the cache); give another folder");
    refuse_output_over_inputs(out_dir, {dir_, base_ ? base_->dir : std::string()});  // links, bind mounts
  }

  void write_fix(const std::string& out_dir) const {
    std::vector<OutputTensor> tensors;
    std::set<std::string> written;
    for (const Entry& e : entries_) {
      if (e.final_key.empty()) continue;
      if (!written.insert(e.final_key).second)  // check_duplicates keeps keys apart
        fail(PEFT_ERR_INTERNAL, "the fix would write key " + peft::quoted(e.final_key) + " twice");
      const TensorInfo& info = weights_->tensor(e.index);
      OutputTensor out;
      out.key = e.final_key;
      out.dtype = info.dtype;
      out.shape = info.shape;
      const Checkpoint& checkpoint = *weights_;
      const size_t index = e.index;
      out.write = [&checkpoint, index](TensorWriter& writer, const std::string& key) {
        writer.write_from_checkpoint(key, checkpoint, index);
      };
      tensors.push_back(std::move(out));
    }
    nlohmann::ordered_json config = config_.document;
    for (const auto& [field, key, value] : config_changes_) {
      if (!config.contains(field) || !config[field].is_object()) config[field] = nlohmann::ordered_json::object();
      if (field == "rank_pattern")
        config[field][key] = static_cast<int64_t>(value);
      else
        config[field][key] = value;
    }
    for (const char* field : {"target_modules", "modules_to_save"}) {
      if (!config.contains(field) || !config[field].is_array()) continue;
      for (auto& item : config[field])
        if (item.is_string())
          if (auto it = module_renamed_.find(item.get<std::string>()); it != module_renamed_.end()) item = it->second;
    }
    write_adapter_folder(out_dir, config, tensors, std::nullopt);
  }

 private:
  void open() {
    // kohya / LyCORIS files come without a config: one is made from the tensors (synthesize_config).
    const AdapterFiles files = adapter_folder_files(dir_, false);
    dir_ = files.dir;  // a hub model id names a snapshot
    missing_config_ = !files.has_config;
    config_ = missing_config_ ? LoraConfig::parse(R"({"peft_type": "LORA"})", files.config)
                              : LoraConfig::from_file(files.config);
    weights_ = Checkpoint::open(files.weights);
    if (!base_dir_.empty()) base_ = BaseModel::open(base_dir_, {});
    const Json* base_config = base_ && base_->config.is_object() ? &base_->config : nullptr;
    if (auto guess = detect_family(base_config, config_.base_model_name_or_path)) {
      family_ = guess->family;
      table_ = builtin_arch_table(guess->family);
    }
  }

  void problem(std::string kind, std::vector<std::string> keys, std::vector<std::string> modules,
               std::string message, bool fixable) {
    problems_.push_back({std::move(kind), std::move(keys), std::move(modules), std::move(message), fixable});
  }

  std::vector<std::string> keys_of(const Group& g) const {
    std::vector<std::string> keys;
    for (size_t i : g.entries) keys.push_back(entries_[i].key);
    return keys;
  }

  void read_keys() {
    std::vector<std::string> kohya_modules;
    for (size_t i = 0; i < weights_->tensor_count(); ++i) {
      if (auto m = kohya_down_module(weights_->tensor(i).name)) kohya_modules.push_back(*m);
      // LyCORIS LoHa / LoKr modules carry a per-module alpha (and dora_scale) as kohya's LoRA ones do.
      auto parsed = parse_adapter_key(weights_->tensor(i).name);
      if (parsed && parsed->role == TensorRole::method_param &&
          (parsed->role_suffix.starts_with("hada_") || parsed->role_suffix.starts_with("lokr_")))
        kohya_modules.push_back(parsed->module);
    }
    std::vector<std::string> unprefixed, unmatched;
    for (size_t i = 0; i < weights_->tensor_count(); ++i) {
      Entry e;
      e.index = i;
      e.key = weights_->tensor(i).name;
      e.had_prefix = e.key.starts_with(kPeftPrefix);
      // A tensor PEFT saves once for the whole model (VB-LoRA's vector bank, VeRA's / RandLoRA's
      // projections): no module of its own, written as found (no prefix to add).
      if (e.key == "base_model.vblora_vector_bank" || e.key == "base_model.vera_A" || e.key == "base_model.vera_B" ||
          e.key == "base_model.randlora_A" || e.key == "base_model.randlora_B") {
        e.final_key = e.key;
        entries_.push_back(std::move(e));
        continue;
      }
      auto rewrite = rewrite_key(e.key, kohya_modules);
      if (rewrite && rewrite->family == KeyRewrite::Family::kohya) {
        e.kohya = true;
        e.kohya_role = rewrite->role;
        e.module = rewrite->module;
        e.suffix = rewrite->suffix;
        e.understood = true;
      } else if (auto parsed = parse_adapter_key(e.key);
                 parsed && (parsed->role != TensorRole::method_param || method_key(parsed->role_suffix))) {
        // (other methods' parameters: role method_param, their suffix the parameter's name)
        e.module = parsed->module;
        e.suffix = parsed->role_suffix;
        e.understood = true;
        if (!parsed->had_prefix) unprefixed.push_back(e.key);
      } else if (rewrite) {
        e.suffix_variant = true;
        e.module = rewrite->module;
        e.suffix = rewrite->suffix;
        e.understood = true;
      } else {
        unmatched.push_back(e.key);
        e.final_key = e.key;  // written as found
      }
      if (e.understood && !e.suffix.empty()) e.role = role_of_suffix(e.suffix).value_or(TensorRole::full);
      entries_.push_back(std::move(e));
    }
    if (!unprefixed.empty())
      problem("missing_peft_prefix", unprefixed, {},
              std::to_string(unprefixed.size()) + " keys lack PEFT's \"base_model.model.\" prefix "
              "(PeftModel.from_pretrained in PEFT 0.21 does not load them); the fix adds it",
              true);
    for (const std::string& key : unmatched)
      problem("unmatched_key", {key}, {}, "key " + peft::quoted(key) + " is not a PEFT LoRA key and no known "
              "rename explains it", false);
  }

  // The module path (as PEFT names it) for `written`, found in the base when there is one.
  void resolve(Group& g) {
    std::string param = "weight";
    bool all_full = true;
    for (size_t i : g.entries) all_full = all_full && entries_[i].role == TensorRole::full && !entries_[i].kohya;
    if (all_full) param = param_of(entries_[g.entries.front()]);
    std::string rest;
    const bool underscore = kohya_underscore_path(g.written, rest);
    if (!base_) {
      if (underscore) {
        g.resolved = false;
        problem("kohya_name", keys_of(g), {g.written},
                "module " + peft::quoted(g.written) + " is a kohya underscore path; its PEFT module path can only be "
                "found in a base model (give one)", false);
      }
      return;
    }
    if (!underscore) {
      if (auto i = base_->find(g.written, param, table_.get())) {
        g.base_index = i;
        return;
      }
    }
    // Candidates, each checked against the base; a rename is known when exactly one base tensor fits.
    std::map<size_t, std::vector<std::pair<std::string, std::string>>> found;  // base index -> (name, origin)
    auto consider = [&](const std::string& name, const std::string& origin) {
      if (auto i = base_->find(name, param, table_.get())) found[*i].emplace_back(name, origin);
    };
    if (underscore) {
      for (const auto& [module, joined] : base_modules_underscored())
        if (joined == rest) consider(module, "kohya underscore path");
    } else {
      for (const RenameCandidate& c : rename_candidates(g.written)) consider(c.module, module_renames()[c.rule].origin);
    }
    if (found.size() == 1 && found.begin()->second.size() >= 1) {
      g.base_index = found.begin()->first;
      g.name = found.begin()->second.front().first;
      renamed_origin_[g.written] = found.begin()->second.front().second;
      module_renamed_[g.written] = g.name;
      return;
    }
    g.resolved = false;
    if (found.size() > 1) {
      std::vector<std::string> names;
      for (const auto& [index, list] : found) names.push_back(peft::quoted(list.front().first));
      problem("ambiguous_rename", keys_of(g), {g.written},
              "module " + peft::quoted(g.written) + " is not in the base; several renames fit: " + join_text(names, ", "),
              false);
      return;
    }
    problem(underscore ? "kohya_name" : "unmatched_key", keys_of(g), {g.written},
            "module " + peft::quoted(g.written) + ": the base has no tensor " +
                peft::quoted(underscore ? rest : g.written + "." + param) + " and no known rename finds one",
            false);
  }

  const std::vector<std::pair<std::string, std::string>>& base_modules_underscored() {
    if (!underscored_.empty() || !base_) return underscored_;
    const std::string prefix = table_ && !table_->base_model_prefix().empty() ? table_->base_model_prefix() + "." : "";
    for (size_t i = 0; i < base_->weights->tensor_count(); ++i) {
      const std::string& name = base_->weights->tensor(i).name;
      if (!name.ends_with(".weight")) continue;
      std::string module = name.substr(0, name.size() - 7);
      underscored_.emplace_back(module, underscore_path(module));
      if (!prefix.empty() && module.starts_with(prefix))
        underscored_.emplace_back(module.substr(prefix.size()), underscore_path(module.substr(prefix.size())));
    }
    return underscored_;
  }

  void resolve_modules() {
    std::map<std::string, size_t> by_written;
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!entries_[i].understood) continue;
      auto [it, added] = by_written.emplace(entries_[i].module, groups_.size());
      if (added) groups_.push_back({entries_[i].module, entries_[i].module, true, {}, std::nullopt});
      groups_[it->second].entries.push_back(i);
    }
    for (Group& g : groups_) resolve(g);
    if (missing_config_) synthesize_config();
    matcher_.emplace(config_);
    if (matcher_->needs_expansion() && base_ && table_)
      if (auto targets = implicit_targets(*base_, *table_, config_)) matcher_->expand_targets(*targets);
  }

  // The config of an adapter that has none: LoRA with the most common rank and alpha (per-module
  // differences then become rank_pattern / alpha_pattern entries) and every resolved module as a target.
  void synthesize_config() {
    std::map<int64_t, size_t> ranks;
    std::map<double, size_t> alphas;
    std::vector<std::string> targets;
    for (const Group& g : groups_) {
      bool lora = false;
      for (size_t i : g.entries) {
        const Entry& e = entries_[i];
        const TensorInfo& info = weights_->tensor(e.index);
        if ((e.role == TensorRole::lora_a || e.role == TensorRole::lora_embedding_a) && !e.kohya_alpha_or_scale() &&
            !info.shape.empty() && valid_rank(info.shape[0])) {
          ++ranks[static_cast<int64_t>(info.shape[0])];
          lora = true;
        }
        if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_alpha && is_float(info.dtype)) {
          std::vector<float> value = weights_->read_f32(e.index);
          if (value.size() == 1 && std::isfinite(value[0])) ++alphas[static_cast<double>(value[0])];
        }
      }
      if (lora && g.resolved) targets.push_back(g.name);
    }
    auto most = [](const auto& counts) {
      auto best = counts.begin();
      for (auto it = counts.begin(); it != counts.end(); ++it)
        if (it->second > best->second) best = it;
      return best->first;
    };
    nlohmann::ordered_json doc = {{"peft_type", "LORA"}};
    const int64_t r = ranks.empty() ? 8 : most(ranks);
    doc["r"] = r;
    doc["lora_alpha"] = alphas.empty() ? static_cast<double>(r) : most(alphas);
    std::sort(targets.begin(), targets.end());
    doc["target_modules"] = targets;
    doc["inference_mode"] = true;
    config_ = LoraConfig::parse(doc.dump(), dir_ + "/" + kAdapterConfigName);
    problem("missing_config", {}, {},
            "the adapter folder has no adapter_config.json (as kohya / LyCORIS files); the fix writes one with r = " +
                std::to_string(r) + ", lora_alpha = " + python_float_repr(doc["lora_alpha"].get<double>()) + " and " +
                std::to_string(targets.size()) + " target modules",
            true);
  }

  const ModuleRule* rule_of(const std::string& module) const {
    return table_ ? table_->rule_for_module(module) : nullptr;
  }

  bool is_embedding_module(const std::string& module) const {
    if (const ModuleRule* rule = rule_of(module)) return rule->kind == ModuleKind::embedding;
    std::string last = module.substr(module.rfind('.') == std::string::npos ? 0 : module.rfind('.') + 1);
    return last.find("embed") != std::string::npos || last == "wte" || last == "shared";
  }

  bool is_output_embedding(const std::string& module) const {
    if (table_ && table_->output_embedding() && *table_->output_embedding() == module) return true;
    return module == "lm_head" || module.ends_with(".lm_head");
  }

  Entry* find_role(const Group& g, TensorRole role) {
    for (size_t i : g.entries)
      if (entries_[i].role == role && !(entries_[i].kohya && entries_[i].kohya_role != KeyRewrite::Role::lora_tensor))
        return &entries_[i];
    return nullptr;
  }

  const Shape& shape_of(const Entry& e) const { return weights_->tensor(e.index).shape; }

  // lora_A / lora_B on an embedding, or lora_embedding_A / B on a Linear / Conv1D: renames the roles
  // when the base's shapes confirm it.
  void fix_embedding_roles(Group& g) {
    if (!g.base_index) return;
    const Shape& w = base_->weights->tensor(*g.base_index).shape;
    if (w.size() != 2) return;
    Entry* a = find_role(g, TensorRole::lora_a);
    Entry* b = find_role(g, TensorRole::lora_b);
    bool to_embedding = true;
    if (!a || !b) {
      a = find_role(g, TensorRole::lora_embedding_a);
      b = find_role(g, TensorRole::lora_embedding_b);
      to_embedding = false;
    }
    if (!a || !b || shape_of(*a).size() != 2 || shape_of(*b).size() != 2) return;
    const Shape &sa = shape_of(*a), &sb = shape_of(*b);
    const bool fits_embedding = sa[1] == w[0] && sb[0] == w[1];  // A [r, num], B [dim, r]
    const bool fits_linear = sa[1] == w[1] && sb[0] == w[0];     // A [r, in], B [out, r]
    const bool embedding = is_embedding_module(g.name);
    if (to_embedding ? !(embedding && fits_embedding) : !(!embedding && (fits_linear || fits_embedding))) return;
    a->suffix = to_embedding ? "lora_embedding_A" : "lora_A.weight";
    b->suffix = to_embedding ? "lora_embedding_B" : "lora_B.weight";
    a->role = to_embedding ? TensorRole::lora_embedding_a : TensorRole::lora_a;
    b->role = to_embedding ? TensorRole::lora_embedding_b : TensorRole::lora_b;
    problem("embedding_role", {a->key, b->key}, {g.name},
            "module " + peft::quoted(g.name) + (to_embedding ? " is an embedding; PEFT names its factors "
                                                               "lora_embedding_A / lora_embedding_B"
                                                             : " is not an embedding; PEFT names its factors "
                                                               "lora_A.weight / lora_B.weight"),
            true);
  }

  void check_group(Group& g) {
    // Names first: the problems whose fix is a rename.
    std::string kohya_rest;
    if (g.resolved && g.name != g.written && !kohya_underscore_path(g.written, kohya_rest))  // else kohya_name says it
      problem("renamed_module", keys_of(g), {g.written, g.name},
              "module " + peft::quoted(g.written) + " is " + peft::quoted(g.name) + " in the base (" +
                  renamed_origin_[g.written] + ")",
              true);
    std::vector<std::string> suffix_keys, kohya_keys;
    for (size_t i : g.entries) {
      if (entries_[i].suffix_variant) suffix_keys.push_back(entries_[i].key);
      if (entries_[i].kohya && entries_[i].kohya_role != KeyRewrite::Role::kohya_dora_scale)
        kohya_keys.push_back(entries_[i].key);
    }
    if (has_method_params(g)) kohya_keys.clear();  // a LyCORIS alpha: method_checks reports the module
    if (!suffix_keys.empty())
      problem("weight_suffix", suffix_keys, {g.name},
              "module " + peft::quoted(g.name) + ": keys with or without \".weight\" where PEFT writes the other", true);
    if (!kohya_keys.empty() && g.resolved)
      problem("kohya_name", kohya_keys, {g.name},
              "module " + peft::quoted(g.name) + " is written with kohya / LyCORIS names (lora_down, lora_up, alpha)",
              true);
    if (base_ && g.resolved) fix_embedding_roles(g);

    // The module as the loader would see it.
    AdapterModule m;
    m.name = g.name;
    std::optional<double> kohya_alpha;
    bool alpha_invalid = false;
    bool dora_scale = false;
    for (size_t i : g.entries) {
      const Entry& e = entries_[i];
      const TensorInfo& info = weights_->tensor(e.index);
      // SHiRA's and VB-LoRA's top-k indices are integer tensors by design.
      const bool integer_param = e.role == TensorRole::method_param && e.suffix.ends_with("_indices");
      if (!is_float(info.dtype) && e.role != TensorRole::full && !integer_param) {
        problem("unsupported_dtype", {e.key}, {g.name},
                "tensor " + peft::quoted(e.key) + " is " + std::string(dtype_name(info.dtype)) +
                    "; LoRA factors, magnitudes and alphas are floating-point tensors",
                false);
        if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_alpha) continue;
      }
      if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_alpha) {
        std::vector<float> value = weights_->read_f32(e.index);
        if (value.size() == 1 && std::isfinite(value[0])) {
          kohya_alpha = static_cast<double>(value[0]);
        } else if (value.size() == 1) {
          alpha_invalid = true;
          problem("invalid_value", {e.key}, {g.name},
                  "kohya alpha " + peft::quoted(e.key) + " is " + python_float_repr(value[0]) +
                      ", not a finite number (the module's alpha and scaling are unknown)",
                  false);
        } else
          problem("shape_mismatch", {e.key}, {g.name},
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
    classify(m, g);
    report.kind = m.kind;
    if (has_method_params(g))
      method_checks(m, g, report, kohya_alpha, dora_scale);
    else if (m.is_lora())
      lora_checks(m, g, report, kohya_alpha, alpha_invalid, dora_scale);
    if (m.is_lora()) report.method = report.method.value_or(peft_method_name(m.method));
    if (base_ && g.resolved && report.complete && !has_method_params(g)) shape_checks(m, g);
    if (g.resolved)
      for (size_t i : g.entries) {
        Entry& e = entries_[i];
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
      for (size_t i : g.entries) entries_[i].final_key = entries_[i].key;
    if (!m.tensors.empty()) report.dtype = std::string(dtype_name(weights_->tensor(m.tensors.front().index).dtype));
    reports_.push_back(std::move(report));
  }

  struct ModuleReport {
    const Group* group = nullptr;
    LayerKind kind = LayerKind::full;
    std::string dtype;
    bool complete = true;
    std::optional<int64_t> rank;
    std::optional<double> alpha, scaling;
    std::optional<std::string> dora;
    std::optional<std::string> method;  // "LORA", "LOHA", ..., or "LYCORIS_LOHA" / "LYCORIS_LOKR"
  };

  // A method parameter read as such: LoHa / LoKr names anywhere (LyCORIS files included), AdaLoRA's
  // lora_A / lora_B / lora_E and IA3's ia3_l only in an adapter of that method (in a LoRA adapter,
  // "lora_A" is a weight_suffix variant of lora_A.weight).
  bool method_key(const std::string& param) const {
    const MethodRow* row = method_row_for_param(param);
    return row != nullptr && (row->lycoris || row->method == config_.method);
  }

  bool has_method_params(const Group& g) const {
    for (size_t i : g.entries)
      if (entries_[i].role == TensorRole::method_param) return true;
    return false;
  }

  // The PEFT method whose parameter `param` is (the method table's row that saves it).
  static PeftMethod method_of_param(const std::string& param) {
    const MethodRow* row = method_row_for_param(param);
    return row != nullptr ? row->method : PeftMethod::adalora;
  }

  // A module of another method's parameters. A PEFT adapter of that method reports its method, rank,
  // alpha and scaling (LoHa / LoKr: alpha / r); parameters of a method the config does not name, or
  // with LyCORIS's per-module alpha / dora_scale or kohya underscore paths, are a LyCORIS / kohya
  // file: reported as such (lycoris_method), not read as PEFT's.
  void method_checks(AdapterModule& m, const Group& g, ModuleReport& report, std::optional<double> kohya_alpha,
                     bool dora_scale) {
    PeftMethod method = config_.method;
    std::vector<std::string> params;
    for (size_t i : g.entries)
      if (entries_[i].role == TensorRole::method_param) {
        params.push_back(entries_[i].suffix);
        method = method_of_param(entries_[i].suffix);
      }
    m.kind = LayerKind::linear;
    report.kind = LayerKind::linear;
    std::string rest;
    const bool lycoris = missing_config_ || method != config_.method || kohya_alpha || dora_scale ||
                         kohya_underscore_path(g.written, rest);
    auto shape = [&](const char* p) -> Shape {
      for (size_t i : g.entries)
        if (entries_[i].role == TensorRole::method_param && entries_[i].suffix == p) return shape_of(entries_[i]);
      return {};
    };
    const Shape conv = shape(method == PeftMethod::loha ? "hada_w1_b" : "lokr_w2");
    if (conv.size() == 4 || !shape("hada_t1").empty() || !shape("lokr_t2").empty())
      report.kind = m.kind = LayerKind::conv2d;
    if (lycoris && method_row(method).lycoris) {
      const char* name = method == PeftMethod::loha ? "LoHa" : "LoKr";
      report.method = method == PeftMethod::loha ? "LYCORIS_LOHA" : "LYCORIS_LOKR";
      if (kohya_alpha) report.alpha = *kohya_alpha;
      problem("lycoris_method", keys_of(g), {g.name},
              "module " + peft::quoted(g.name) + " holds LyCORIS/kohya " + name + " tensors (" +
                  join_text(params, ", ") + (kohya_alpha ? ", a per-module alpha" : "") +
                  (dora_scale ? ", a dora_scale" : "") + "): LyCORIS/kohya " + name +
                  ", not a PEFT adapter folder (PEFT saves " + name + " with adapter_config.json, peft_type " +
                  peft_method_name(method) + ", and its alpha in the config)",
              false);
    } else {
      report.method = peft_method_name(method);
      if (method != config_.method)
        problem("unmatched_key", keys_of(g), {g.name},
                "module " + peft::quoted(g.name) + " holds " + peft_method_name(method) + " parameters but peft_type is " +
                    peft::quoted(config_.peft_type),
                false);
    }
    if (method == PeftMethod::loha || method == PeftMethod::lokr) {
      const Shape r = method == PeftMethod::loha ? shape("hada_w1_a") : shape("lokr_w1_a").empty() ? shape("lokr_w2_a")
                                                                                                     : shape("lokr_w1_a");
      // The CP form keeps the rank first: hada_w1_a [r, out], lokr_w2_a [r, b] beside hada_t1 / lokr_t2.
      const bool rank_first = method == PeftMethod::loha ? !shape("hada_t1").empty()
                                                         : shape("lokr_w1_a").empty() && !shape("lokr_t2").empty();
      if (r.size() >= 2) report.rank = static_cast<int64_t>(r[rank_first ? 0 : 1]);
      if (!lycoris && matcher_) {
        report.alpha = matcher_->alpha_for(m.name);
        const double rank = static_cast<double>(matcher_->rank_for(m.name));
        if (rank > 0) report.scaling = *report.alpha / rank;
      }
    }
    if (dora_scale) report.dora = "dora_scale";
    for (size_t i : g.entries)
      if (entries_[i].kohya && entries_[i].kohya_role == KeyRewrite::Role::kohya_dora_scale)
        problem("dora_convention", {entries_[i].key}, {g.name}, dora_scale_message(g.name, shape_of(entries_[i])), false);
  }

  // LyCORIS's dora_scale against PEFT's lora_magnitude_vector, told apart by name and shape.
  static std::string dora_scale_message(const std::string& module, const Shape& s) {
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

  void classify(AdapterModule& m, const Group&) {
    const auto [lora, embedding, tokens, method_params] = module_roles(m);
    if (embedding) {
      m.kind = LayerKind::embedding;
    } else if (lora) {
      const AdapterTensor* a = m.find(TensorRole::lora_a);
      m.kind = a && weights_->tensor(a->index).shape.size() == 4 ? LayerKind::conv2d : LayerKind::linear;
    } else {
      m.kind = tokens ? LayerKind::trainable_tokens : LayerKind::full;
    }
    if (m.kind == LayerKind::trainable_tokens)
      if (const std::vector<int64_t>* indices = config_.trainable_token_indices.for_module(m.name))
        m.token_indices = *indices;
  }

  void lora_checks(AdapterModule& m, Group& g, ModuleReport& report, std::optional<double> kohya_alpha,
                   bool alpha_invalid, bool dora_scale) {
    const bool emb = m.kind == LayerKind::embedding;
    const AdapterTensor* a = m.find(emb ? TensorRole::lora_embedding_a : TensorRole::lora_a);
    const AdapterTensor* b = m.find(emb ? TensorRole::lora_embedding_b : TensorRole::lora_b);
    std::vector<std::string> keys = keys_of(g);
    if (!a || !b) {
      report.complete = false;
      problem("incomplete_module", keys, {m.name},
              "module " + peft::quoted(m.name) + " has no " + (a ? "lora_B" : "lora_A") +
                  " (PEFT would leave it at its initialisation)",
              false);
      return;
    }
    const Shape &sa = weights_->tensor(a->index).shape, &sb = weights_->tensor(b->index).shape;
    const size_t want = m.kind == LayerKind::conv2d ? 4 : 2;
    if (sa.size() != want || sb.size() != want || sa[0] != sb[1] || sa[0] == 0 || transposed(m, g, sa, sb)) {
      report.complete = false;
      if (sa.size() == 2 && sb.size() == 2 && sa[1] == sb[0])
        problem("shape_transposed", keys, {m.name},
                "module " + peft::quoted(m.name) + ": lora_A " + shape_text(sa) + " and lora_B " + shape_text(sb) +
                    " are stored transposed ([in, r] and [r, out]); PEFT saves lora_A [r, in] and lora_B [out, r]",
                false);
      else
        problem("shape_mismatch", keys, {m.name},
                "module " + peft::quoted(m.name) + ": lora_A " + shape_text(sa) + " and lora_B " + shape_text(sb) +
                    " do not agree on a rank",
                false);
      return;
    }
    if (!valid_rank(sa[0])) {
      report.complete = false;
      problem("invalid_value", keys, {m.name},
              "module " + peft::quoted(m.name) + ": lora_A " + shape_text(sa) + " gives a rank of " +
                  std::to_string(sa[0]) + ", not a positive integer below 2^63",
              false);
      return;
    }
    m.rank = static_cast<int64_t>(sa[0]);
    const int64_t configured_rank = matcher_->rank_for(m.name);
    report.rank = m.rank;
    m.alpha = kohya_alpha.value_or(matcher_->alpha_for(m.name));
    if (!alpha_invalid && !std::isfinite(m.alpha))
      problem("invalid_value", keys, {m.name},
              "module " + peft::quoted(m.name) + ": the config gives alpha " + python_float_repr(m.alpha) +
                  ", not a finite number (the module's scaling is unknown)",
              false);
    if (!alpha_invalid && std::isfinite(m.alpha)) {
      m.scaling = config_.scaling(m.rank, m.alpha);
      report.alpha = m.alpha;
      if (std::isfinite(m.scaling)) report.scaling = m.scaling;
    }
    if (kohya_alpha && g.resolved && *kohya_alpha != matcher_->alpha_for(m.name))
      config_changes_.emplace_back("alpha_pattern", g.name, *kohya_alpha);
    if (m.rank != configured_rank) {
      const bool kohya = std::any_of(g.entries.begin(), g.entries.end(), [&](size_t i) { return entries_[i].kohya; });
      if (kohya && g.resolved) {
        config_changes_.emplace_back("rank_pattern", g.name, static_cast<double>(m.rank));
      } else {
        problem("rank_mismatch", keys, {m.name},
                "module " + peft::quoted(m.name) + " has rank " + std::to_string(m.rank) + " but the config gives " +
                    std::to_string(configured_rank) + " (PEFT fails with a size mismatch)",
                false);
      }
    }
    auto verdict = matcher_->check(m.name);
    if (g.resolved && (verdict == ModuleMatcher::Verdict::not_targeted || verdict == ModuleMatcher::Verdict::excluded))
      problem("untargeted_module", keys, {m.name},
              "module " + peft::quoted(m.name) + " has LoRA tensors but target_modules does not select it (" +
                  verdict_name(verdict) + "); PEFT ignores them",
              false);
    const bool magnitude = m.find(TensorRole::lora_magnitude) != nullptr;
    if (magnitude) report.dora = "lora_magnitude_vector";
    if (dora_scale) {
      report.dora = "dora_scale";
      for (size_t i : g.entries)
        if (entries_[i].kohya && entries_[i].kohya_role == KeyRewrite::Role::kohya_dora_scale)
          problem("dora_convention", keys, {m.name}, dora_scale_message(m.name, shape_of(entries_[i])), false);
    }
    if (magnitude && !config_.use_dora)
      problem("dora_mismatch", keys, {m.name},
              "module " + peft::quoted(m.name) + " has a DoRA lora_magnitude_vector but use_dora is false", false);
    if (!magnitude && !dora_scale && config_.use_dora)
      problem("dora_mismatch", keys, {m.name},
              "module " + peft::quoted(m.name) + " has no lora_magnitude_vector but use_dora is true", false);
    const bool bias = m.find(TensorRole::lora_b_bias) != nullptr;
    if (bias != config_.lora_bias && !(emb && !bias))
      problem("lora_bias_mismatch", keys, {m.name},
              "module " + peft::quoted(m.name) + (bias ? " has lora_B.bias but lora_bias is false"
                                                       : " has no lora_B.bias but lora_bias is true"),
              false);
  }

  // lora_A [in, r] and lora_B [r, out] where PEFT saves [r, in] and [out, r]: the shared dimension
  // is the rank, and the base (or else the configured rank) says which reading is right.
  bool transposed(const AdapterModule& m, const Group& g, const Shape& sa, const Shape& sb) const {
    if (m.kind == LayerKind::embedding || sa.size() != 2 || sb.size() != 2 || sa[1] != sb[0]) return false;
    if (sa[0] != sb[1]) return true;
    if (base_ && g.base_index) {
      const Shape& w = base_->weights->tensor(*g.base_index).shape;
      const bool as_saved = w == Shape{sb[0], sa[1]} || w == Shape{sa[1], sb[0]};
      const bool swapped = w == Shape{sb[1], sa[0]} || w == Shape{sa[0], sb[1]};
      return swapped && !as_saved;
    }
    const auto rank = static_cast<uint64_t>(matcher_->rank_for(m.name));
    return sa[1] == rank && sa[0] != rank;
  }

  // The base validation on this one module; its findings named by what they most likely mean.
  void shape_checks(AdapterModule& m, const Group& g) {
    if (m.kind == LayerKind::trainable_tokens && !m.find(TensorRole::trainable_tokens_delta)) return;
    std::vector<AdapterModule> one{m};
    ValidationResult result = check_against_base(one, *weights_, config_, *base_, table_.get());
    m = one.front();
    std::vector<std::string> keys = keys_of(g);
    for (const std::string& p : result.unresolved) problem("missing_base_tensor", keys, {m.name}, p, false);
    if (result.mismatched.empty()) return;
    std::string kind = "shape_mismatch";
    std::string meaning = "the adapter was trained on a base of another size";
    if (m.is_lora() && g.base_index) {
      const Shape& w = base_->weights->tensor(*g.base_index).shape;
      const bool emb = m.kind == LayerKind::embedding;
      const Shape& sa = weights_->tensor(m.find(emb ? TensorRole::lora_embedding_a : TensorRole::lora_a)->index).shape;
      const Shape& sb = weights_->tensor(m.find(emb ? TensorRole::lora_embedding_b : TensorRole::lora_b)->index).shape;
      if (w.size() == 2 && sa.size() == 2 && sb.size() == 2) {
        uint64_t vocab = 0, base_vocab = 0;
        if (emb && sb[0] == w[1] && sa[1] != w[0]) {
          vocab = sa[1];
          base_vocab = w[0];
        } else if (!emb && is_output_embedding(m.name) && sa[1] == w[1] && sb[0] != w[0]) {
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
    for (const std::string& p : result.mismatched) problem(kind, keys, {m.name}, p + " (" + meaning + ")", false);
  }

  // Keys whose renames would meet in one key: none of them is renamed (the fix keeps every tensor
  // under its key as found, so the copy shows the same duplicate), and the problem says so. Until
  // no key is met twice: a key kept as found may be another rename's target.
  void check_duplicates() {
    for (bool again = true; again;) {
      again = false;
      std::map<std::string, std::vector<size_t>> by_key;
      for (size_t i = 0; i < entries_.size(); ++i)
        if (!entries_[i].final_key.empty()) by_key[entries_[i].final_key].push_back(i);
      for (const auto& [key, list] : by_key) {
        if (list.size() < 2) continue;
        std::vector<std::string> keys;
        for (size_t i : list) {
          keys.push_back(entries_[i].key);
          if (entries_[i].final_key != entries_[i].key) again = true;
          entries_[i].final_key = entries_[i].key;
        }
        problem("duplicate_key", keys, {},
                std::to_string(keys.size()) + " keys are the same tensor " + peft::quoted(key) +
                    "; the fix renames none of them",
                false);
      }
    }
  }

  void check_unused_targets() {
    // LN_TUNING targets norms and TRAINABLE_TOKENS an embedding's rows: no LoRA-style target set.
    if (!base_ || method_row(config_.method).effect == MethodEffect::replacement) return;
    std::set<size_t> covered;
    for (const Group& g : groups_)
      if (g.base_index) covered.insert(*g.base_index);
    std::vector<std::string> missing;
    for (const TargetedBaseModule& t : targeted_base_modules(*base_, *matcher_, table_.get()))
      if (!covered.contains(t.weight)) missing.push_back(t.module);
    if (!missing.empty())
      problem("target_without_tensors", {}, missing,
              "target_modules selects " + std::to_string(missing.size()) +
                  " base modules for which the adapter holds no tensors (PEFT reports them as missing keys and "
                  "leaves them at their initialisation)",
              false);
  }

  Json report() const {
    Json modules = Json::array();
    size_t matched = 0;
    for (const ModuleReport& r : reports_) {
      const Group& g = *r.group;
      Json m;
      m["module"] = g.name;
      Json keys = Json::array();
      for (size_t i : g.entries) keys.push_back(entries_[i].key);
      m["keys"] = keys;
      m["kind"] = layer_kind_name(r.kind);
      m["dtype"] = r.dtype.empty() ? Json(nullptr) : Json(r.dtype);
      m["base_tensor"] = nullptr;
      m["base_shape"] = nullptr;
      m["base_dtype"] = nullptr;
      if (g.base_index) {
        ++matched;
        const TensorInfo& t = base_->weights->tensor(*g.base_index);
        m["base_tensor"] = t.name;
        m["base_shape"] = shape_json(t.shape);
        m["base_dtype"] = std::string(dtype_name(t.dtype));
      }
      std::optional<std::string> host;
      if (table_ && g.resolved) {
        host = table_->module_to_native(g.name);
        if (!host && !table_->base_model_prefix().empty())
          host = table_->module_to_native(table_->base_model_prefix() + "." + g.name);
      }
      m["host_name"] = host ? Json(*host) : Json(nullptr);
      m["rank"] = r.rank ? Json(*r.rank) : Json(nullptr);
      m["alpha"] = finite_or_null(r.alpha);
      m["scaling"] = finite_or_null(r.scaling);
      m["use_rslora"] = config_.use_rslora;
      m["dora"] = r.dora ? Json(*r.dora) : Json(nullptr);
      m["method"] = r.method ? Json(*r.method) : Json(nullptr);
      modules.push_back(std::move(m));
    }
    Json renames = Json::array();
    std::map<std::string, std::string> rename_of;
    for (const Entry& e : entries_) {
      if (e.final_key == e.key) continue;
      renames.push_back({{"from", e.key}, {"to", e.final_key.empty() ? Json(nullptr) : Json(e.final_key)}});
      rename_of[e.key] = e.final_key;
    }
    Json problems = Json::array();
    size_t fixable = 0;
    for (const Problem& p : problems_) {
      Json item;
      item["kind"] = p.kind;
      item["keys"] = p.keys;
      item["modules"] = p.modules;
      item["message"] = p.message;
      item["fix"] = nullptr;
      if (p.fixable) {
        ++fixable;
        Json list = Json::array();
        for (const std::string& key : p.keys)
          if (auto it = rename_of.find(key); it != rename_of.end())
            list.push_back({{"from", key}, {"to", it->second.empty() ? Json(nullptr) : Json(it->second)}});
        item["fix"] = {{"renames", list}};
      }
      problems.push_back(std::move(item));
    }
    Json changes = Json::array();
    for (const auto& [field, key, value] : config_changes_) {
      Json v = field == "rank_pattern" ? Json(static_cast<int64_t>(value)) : Json(value);
      changes.push_back({{"field", field}, {"key", key}, {"value", v}});
    }
    Json out;
    out["schema"] = 1;
    out["adapter"] = dir_;
    out["base"] = base_dir_.empty() ? Json(nullptr) : Json(base_dir_);
    out["family"] = family_.empty() ? Json(nullptr) : Json(family_);
    out["summary"] = {{"ok", problems_.empty()},
                      {"keys", entries_.size()},
                      {"modules", reports_.size()},
                      {"matched_modules", matched},
                      {"problems", problems_.size()},
                      {"fixable_problems", fixable},
                      {"renames", renames.size()}};
    out["modules"] = std::move(modules);
    out["problems"] = std::move(problems);
    out["renames"] = std::move(renames);
    out["config_changes"] = std::move(changes);
    return out;
  }

  std::string dir_, base_dir_;
  bool missing_config_ = false;
  LoraConfig config_;
  std::shared_ptr<const Checkpoint> weights_;
  std::optional<BaseModel> base_;
  std::shared_ptr<const ArchTable> table_;
  std::string family_;
  std::vector<Entry> entries_;
  std::vector<Group> groups_;
  std::optional<ModuleMatcher> matcher_;
  std::vector<Problem> problems_;
  std::vector<ModuleReport> reports_;
  std::vector<std::tuple<std::string, std::string, double>> config_changes_;  // field, key, value
  std::map<std::string, std::string> module_renamed_;                          // written -> name
  std::map<std::string, std::string> renamed_origin_;
  std::vector<std::pair<std::string, std::string>> underscored_;  // base module, underscore-joined
};

}  // namespace

DoctorResult diagnose_adapter(const std::string& adapter_dir, const std::string& base_dir) {
  Doctor doctor(adapter_dir, base_dir);
  doctor.run();
  return doctor.result();
}

DoctorResult fix_adapter(const std::string& adapter_dir, const std::string& base_dir, const std::string& out_dir) {
  Doctor doctor(adapter_dir, base_dir);
  doctor.run();
  doctor.check_out_dir(out_dir);
  DoctorResult result = doctor.result();
  doctor.write_fix(out_dir);
  return result;
}

}  // namespace peft
