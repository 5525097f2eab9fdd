// The doctor's report (doctor_report.hpp): the findings as schema-1 JSON.
#include "peft/doctor/doctor_report.hpp"

#include <cmath>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/python_json.hpp"

namespace peft::doctor {
namespace {

using Json = nlohmann::json;

// The report never holds NaN or Infinity (not JSON): an unknown value is null.
Json finite_or_null(std::optional<double> value) {
  return value && std::isfinite(*value) ? Json(*value) : Json(nullptr);
}

Json shape_json(const Shape& shape) {
  Json out = Json::array();
  for (uint64_t d : shape) out.push_back(d);
  return out;
}

Json report(const DoctorState& d) {
  Json modules = Json::array();
  size_t matched = 0;
  for (const ModuleReport& r : d.reports) {
    const Group& g = *r.group;
    Json m;
    m["module"] = g.name;
    Json keys = Json::array();
    for (size_t i : g.entries) keys.push_back(d.entries[i].key);
    m["keys"] = keys;
    m["kind"] = layer_kind_name(r.kind);
    m["dtype"] = r.dtype.empty() ? Json(nullptr) : Json(r.dtype);
    m["base_tensor"] = nullptr;
    m["base_shape"] = nullptr;
    m["base_dtype"] = nullptr;
    if (g.base_index) {
      ++matched;
      const TensorInfo& t = d.base->weights->tensor(*g.base_index);
      m["base_tensor"] = t.name;
      m["base_shape"] = shape_json(t.shape);
      m["base_dtype"] = std::string(dtype_name(t.dtype));
    }
    std::optional<std::string> host;
    if (d.table && g.resolved) {
      host = d.table->module_to_native(g.name);
      if (!host && !d.table->base_model_prefix().empty())
        host = d.table->module_to_native(d.table->base_model_prefix() + "." + g.name);
    }
    m["host_name"] = host ? Json(*host) : Json(nullptr);
    m["rank"] = r.rank ? Json(*r.rank) : Json(nullptr);
    m["alpha"] = finite_or_null(r.alpha);
    m["scaling"] = finite_or_null(r.scaling);
    m["use_rslora"] = d.config.use_rslora;
    m["dora"] = r.dora ? Json(*r.dora) : Json(nullptr);
    m["method"] = r.method ? Json(*r.method) : Json(nullptr);
    modules.push_back(std::move(m));
  }
  Json renames = Json::array();
  std::map<std::string, std::string> rename_of;
  for (const Entry& e : d.entries) {
    if (e.final_key == e.key) continue;
    renames.push_back({{"from", e.key}, {"to", e.final_key.empty() ? Json(nullptr) : Json(e.final_key)}});
    rename_of[e.key] = e.final_key;
  }
  Json problems = Json::array();
  size_t fixable = 0;
  for (const Problem& p : d.problems) {
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
  for (const auto& [field, key, value] : d.config_changes) {
    Json v = field == "rank_pattern" ? Json(static_cast<int64_t>(value)) : Json(value);
    changes.push_back({{"field", field}, {"key", key}, {"value", v}});
  }
  Json out;
  out["schema"] = 1;
  out["adapter"] = d.dir;
  out["base"] = d.base_dir.empty() ? Json(nullptr) : Json(d.base_dir);
  out["family"] = d.family.empty() ? Json(nullptr) : Json(d.family);
  out["summary"] = {{"ok", d.problems.empty()},
                    {"keys", d.entries.size()},
                    {"modules", d.reports.size()},
                    {"matched_modules", matched},
                    {"problems", d.problems.size()},
                    {"fixable_problems", fixable},
                    {"renames", renames.size()}};
  out["modules"] = std::move(modules);
  out["problems"] = std::move(problems);
  out["renames"] = std::move(renames);
  out["config_changes"] = std::move(changes);
  out["tied_embeddings"] = nullptr;
  if (d.tied)
    out["tied_embeddings"] = {{"input", d.tied->input},           {"output", d.tied->output},
                              {"output_stored", d.tied->output_stored}, {"config_key", d.tied->config_key},
                              {"case", d.tied->kind},             {"trainable_tokens", d.tied->tokens},
                              {"modules", d.tied->modules},       {"untie", d.tied->untie},
                              {"shared", d.tied->shared}};
  return out;
}

}  // namespace

std::string report_json(const DoctorState& d) { return python_json_dumps(report(d)); }

}  // namespace peft::doctor
