// The config the doctor reads (doctor_config.hpp): the folder's own, or one made from the tensors.
#include "peft/doctor/doctor_config.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/python_json.hpp"
#include "core/text.hpp"
#include "peft/base/base_model.hpp"
#include "peft/export/adapter_export.hpp"

namespace peft::doctor {
namespace {

// The config of an adapter that has none: LoRA with the most common rank and alpha (per-module
// differences then become rank_pattern / alpha_pattern entries) and every resolved module as a target.
void synthesize_config(DoctorState& d) {
  std::map<int64_t, size_t> ranks;
  std::map<double, size_t> alphas;
  std::vector<std::string> targets;
  for (const Group& g : d.groups) {
    bool lora = false;
    for (size_t i : g.entries) {
      const Entry& e = d.entries[i];
      const TensorInfo& info = d.weights->tensor(e.index);
      if ((e.role == TensorRole::lora_a || e.role == TensorRole::lora_embedding_a) && !e.kohya_alpha_or_scale() &&
          !info.shape.empty() && valid_rank(info.shape[0])) {
        ++ranks[static_cast<int64_t>(info.shape[0])];
        lora = true;
      }
      if (e.kohya && e.kohya_role == KeyRewrite::Role::kohya_alpha && is_float(info.dtype)) {
        std::vector<float> value = d.weights->read_f32(e.index);
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
  d.config = LoraConfig::parse(doc.dump(), d.dir + "/" + kAdapterConfigName);
  d.problem("missing_config", {}, {},
          "the adapter folder has no adapter_config.json (as kohya / LyCORIS files); the fix writes one with r = " +
              std::to_string(r) + ", lora_alpha = " + python_float_repr(doc["lora_alpha"].get<double>()) + " and " +
              std::to_string(targets.size()) + " target modules",
          true);
}

}  // namespace

void settle_config(DoctorState& d) {
  if (d.missing_config) synthesize_config(d);
  d.matcher.emplace(d.config);
  if (d.matcher->needs_expansion() && d.base && d.table)
    if (auto targets = implicit_targets(*d.base, *d.table, d.config)) d.matcher->expand_targets(*targets);
}

}  // namespace peft::doctor
