// The doctor's scan (doctor_scan.hpp): the adapter's keys read and their modules placed in the base.
#include "peft/doctor/doctor_scan.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/arch/arch_registry.hpp"

namespace peft::doctor {
namespace {

using Json = nlohmann::json;

std::optional<TensorRole> role_of_suffix(const std::string& suffix) {
  if (key_tail_of(suffix) != nullptr) return TensorRole::method_param;
  auto parsed = parse_adapter_key("m." + suffix);
  if (!parsed) return std::nullopt;
  return parsed->role;
}

std::string param_of(const Entry& e) {
  if (e.role != TensorRole::full) return e.role == TensorRole::lora_b_bias ? "bias" : "weight";
  return suffix_parameter(e.suffix);
}

// A method parameter read as such: LoHa / LoKr names anywhere (LyCORIS files included), AdaLoRA's
// lora_A / lora_B / lora_E and IA3's ia3_l only in an adapter of that method (in a LoRA adapter,
// "lora_A" is a weight_suffix variant of lora_A.weight).
bool method_key(const DoctorState& d, const std::string& param) {
  const MethodRow* row = method_row_for_param(param);
  return row != nullptr && (row->lycoris || row->method == d.config.method);
}

const std::vector<std::pair<std::string, std::string>>& base_modules_underscored(DoctorState& d) {
  if (!d.underscored.empty() || !d.base) return d.underscored;
  const std::string prefix = d.table && !d.table->base_model_prefix().empty() ? d.table->base_model_prefix() + "." : "";
  for (size_t i = 0; i < d.base->weights->tensor_count(); ++i) {
    const std::string& name = d.base->weights->tensor(i).name;
    if (!name.ends_with(".weight")) continue;
    std::string module = name.substr(0, name.size() - 7);
    d.underscored.emplace_back(module, underscore_path(module));
    if (!prefix.empty() && module.starts_with(prefix))
      d.underscored.emplace_back(module.substr(prefix.size()), underscore_path(module.substr(prefix.size())));
  }
  return d.underscored;
}

// The module path (as PEFT names it) for `written`, found in the base when there is one.
void resolve(DoctorState& d, Group& g) {
  std::string param = "weight";
  bool all_full = true;
  for (size_t i : g.entries) all_full = all_full && d.entries[i].role == TensorRole::full && !d.entries[i].kohya;
  if (all_full) param = param_of(d.entries[g.entries.front()]);
  std::string rest;
  const bool underscore = kohya_underscore_path(g.written, rest);
  if (!d.base) {
    if (underscore) {
      g.resolved = false;
      d.problem("kohya_name", d.keys_of(g), {g.written},
              "module " + peft::quoted(g.written) + " is a kohya underscore path; its PEFT module path can only be "
              "found in a base model (give one)", false);
    }
    return;
  }
  if (!underscore) {
    if (auto i = d.base->find(g.written, param, d.table.get())) {
      g.base_index = i;
      return;
    }
  }
  // Candidates, each checked against the base; a rename is known when exactly one base tensor fits.
  std::map<size_t, std::vector<std::pair<std::string, std::string>>> found;  // base index -> (name, origin)
  auto consider = [&](const std::string& name, const std::string& origin) {
    if (auto i = d.base->find(name, param, d.table.get())) found[*i].emplace_back(name, origin);
  };
  if (underscore) {
    for (const auto& [module, joined] : base_modules_underscored(d))
      if (joined == rest) consider(module, "kohya underscore path");
  } else {
    for (const RenameCandidate& c : rename_candidates(g.written, param)) consider(c.module, c.origin);
  }
  if (found.size() == 1 && found.begin()->second.size() >= 1) {
    g.base_index = found.begin()->first;
    // Several names may reach the one tensor (with and without the table's base_model_prefix): the
    // tensor's own name first.
    const auto& names = found.begin()->second;
    const std::string stored = d.base->weights->tensor(*g.base_index).name;
    auto best = std::find_if(names.begin(), names.end(), [&](const auto& n) { return n.first + "." + param == stored; });
    if (best == names.end()) best = names.begin();
    g.name = best->first;
    d.renamed_origin[g.written] = best->second;
    d.module_renamed[g.written] = g.name;
    return;
  }
  g.resolved = false;
  if (found.size() > 1) {
    std::vector<std::string> names;
    for (const auto& [index, list] : found) names.push_back(peft::quoted(list.front().first));
    d.problem("ambiguous_rename", d.keys_of(g), {g.written},
            "module " + peft::quoted(g.written) + " is not in the base; several renames fit: " + join_text(names, ", "),
            false);
    return;
  }
  d.problem(underscore ? "kohya_name" : "unmatched_key", d.keys_of(g), {g.written},
          "module " + peft::quoted(g.written) + ": the base has no tensor " +
              peft::quoted(underscore ? rest : g.written + "." + param) + " and no known rename finds one",
          false);
}

}  // namespace

void open_adapter(DoctorState& d) {
  // kohya / LyCORIS files come without a config: one is made from the tensors (synthesize_config).
  const AdapterFiles files = adapter_folder_files(d.dir, false);
  d.dir = files.dir;  // a hub model id names a snapshot
  d.missing_config = !files.has_config;
  d.config = d.missing_config ? LoraConfig::parse(R"({"peft_type": "LORA"})", files.config)
                            : LoraConfig::from_file(files.config);
  d.weights = Checkpoint::open(files.weights);
  if (!d.base_dir.empty()) d.base = BaseModel::open(d.base_dir, {});
  const Json* base_config = d.base && d.base->config.is_object() ? &d.base->config : nullptr;
  if (auto guess = detect_family(base_config, d.config.base_model_name_or_path)) {
    d.family = guess->family;
    d.table = builtin_arch_table(guess->family);
  }
}

void scan_keys(DoctorState& d) {
  std::vector<std::string> kohya_modules;
  for (size_t i = 0; i < d.weights->tensor_count(); ++i) {
    if (auto m = kohya_down_module(d.weights->tensor(i).name)) kohya_modules.push_back(*m);
    // LyCORIS LoHa / LoKr modules carry a per-module alpha (and dora_scale) as kohya's LoRA ones do.
    auto parsed = parse_adapter_key(d.weights->tensor(i).name);
    if (parsed && parsed->role == TensorRole::method_param &&
        (parsed->role_suffix.starts_with("hada_") || parsed->role_suffix.starts_with("lokr_")))
      kohya_modules.push_back(parsed->module);
  }
  std::vector<std::string> unprefixed, unmatched;
  for (size_t i = 0; i < d.weights->tensor_count(); ++i) {
    Entry e;
    e.index = i;
    e.key = d.weights->tensor(i).name;
    e.had_prefix = e.key.starts_with(kPeftPrefix);
    // A tensor PEFT saves once for the whole model (VB-LoRA's vector bank, VeRA's / RandLoRA's
    // projections): no module of its own, written as found (no prefix to add).
    if (e.key == "base_model.vblora_vector_bank" || e.key == "base_model.vera_A" || e.key == "base_model.vera_B" ||
        e.key == "base_model.randlora_A" || e.key == "base_model.randlora_B") {
      e.final_key = e.key;
      d.entries.push_back(std::move(e));
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
               parsed && (parsed->role != TensorRole::method_param || method_key(d, parsed->role_suffix))) {
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
    d.entries.push_back(std::move(e));
  }
  if (!unprefixed.empty())
    d.problem("missing_peft_prefix", unprefixed, {},
            std::to_string(unprefixed.size()) + " keys lack PEFT's \"base_model.model.\" prefix "
            "(PeftModel.from_pretrained in PEFT 0.21 does not load them); the fix adds it",
            true);
  for (const std::string& key : unmatched)
    d.problem("unmatched_key", {key}, {}, "key " + peft::quoted(key) + " is not a PEFT LoRA key and no known "
            "rename explains it", false);
}

void resolve_modules(DoctorState& d) {
  std::map<std::string, size_t> by_written;
  for (size_t i = 0; i < d.entries.size(); ++i) {
    if (!d.entries[i].understood) continue;
    auto [it, added] = by_written.emplace(d.entries[i].module, d.groups.size());
    if (added) d.groups.push_back({d.entries[i].module, d.entries[i].module, true, {}, std::nullopt});
    d.groups[it->second].entries.push_back(i);
  }
  for (Group& g : d.groups) resolve(d, g);
}

}  // namespace peft::doctor
