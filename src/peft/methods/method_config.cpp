#include "peft/methods/method_config.hpp"

#include <climits>

#include "core/error.hpp"
#include "core/text.hpp"

namespace peft {

using Json = nlohmann::ordered_json;

// ---- FieldReader ---------------------------------------------------------------------------------

void FieldReader::invalid(const std::string& field, const std::string& what) const {
  fail(PEFT_ERR_INVALID_CONFIG, source_ + ": field " + peft::quoted(field) + " " + what);
}

void FieldReader::wrong_type(const std::string& field, const std::string& expected) const {
  invalid(field, "must be " + expected + ", got " + doc_.at(field).dump());
}

void FieldReader::unsupported(const std::string& field, const std::string& what) const {
  fail(PEFT_ERR_UNSUPPORTED, source_ + ": field " + peft::quoted(field) + " " + what);
}

const Json* FieldReader::get(const char* field) const {
  auto it = doc_.find(field);
  if (it == doc_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> FieldReader::optional_string(const char* field) const {
  const Json* v = get(field);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(field, "a string or null");
  return v->get<std::string>();
}

bool FieldReader::boolean(const char* field, bool fallback) const {
  const Json* v = get(field);
  if (!v) return fallback;
  if (!v->is_boolean()) wrong_type(field, "true or false");
  return v->get<bool>();
}

double FieldReader::number(const char* field, double fallback) const {
  const Json* v = get(field);
  if (!v) return fallback;
  if (!v->is_number()) wrong_type(field, "a number");
  return v->get<double>();
}

std::vector<std::string> FieldReader::string_list(const char* field, const Json& v) const {
  if (!v.is_array()) wrong_type(field, "a list of strings");
  std::vector<std::string> out;
  for (const Json& item : v) {
    if (!item.is_string()) wrong_type(field, "a list of strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

int64_t FieldReader::integer(const std::string& field, const Json& item, const char* expected) const {
  if (!item.is_number_integer()) wrong_type(field, expected);
  if (item.is_number_unsigned() && item.get<uint64_t>() > uint64_t(INT64_MAX))
    invalid(field, "holds " + item.dump() + ", more than the largest integer this library handles (2^63 - 1)");
  return item.get<int64_t>();
}

std::vector<int64_t> FieldReader::int_list(const std::string& field, const Json& v) const {
  if (!v.is_array()) wrong_type(field, "a list of integers");
  std::vector<int64_t> out;
  for (const Json& item : v) out.push_back(integer(field, item, "a list of integers"));
  return out;
}

ModuleSelector FieldReader::selector(const char* field) const {
  ModuleSelector s;
  const Json* v = get(field);
  if (!v) return s;
  if (v->is_string()) {
    s.pattern = v->get<std::string>();
    s.kind = ascii_lower(s.pattern) == "all-linear" ? ModuleSelector::Kind::all_linear : ModuleSelector::Kind::regex;
  } else if (v->is_array()) {
    s.kind = ModuleSelector::Kind::list;
    s.names = string_list(field, *v);
  } else {
    wrong_type(field, "a list of strings, a regular expression string or null");
  }
  return s;
}

// ---- ConfigView ----------------------------------------------------------------------------------

void ConfigView::rename(const char* from, const char* to) {
  view.erase(to);
  if (doc.contains(from)) view[to] = doc.at(from);
}

void ConfigView::default_to(const char* field, const Json& value) {
  if (!view.contains(field)) view[field] = value;
}

void ConfigView::own_bias(const char* peft_type) {
  const std::string own = ascii_lower(peft_type) + "_only";
  if (auto it = doc.find("bias"); it != doc.end() && it->is_string() && it->get<std::string>() == own)
    view["bias"] = "lora_only";
}

// ---- ModuleResolution ----------------------------------------------------------------------------

std::string ModuleResolution::who() const { return "module " + peft::quoted(module); }

bool ModuleResolution::need(std::initializer_list<const char*> params) {
  bool ok = true;
  for (const char* p : params)
    if (!has(p)) {
      broken(who() + " (" + peft_type + ") has no " + p);
      ok = false;
    }
  return ok;
}

int64_t ModuleResolution::dim(std::string_view param, size_t axis) const {
  const std::vector<uint64_t> s = shape(param);
  return axis < s.size() ? static_cast<int64_t>(s[axis]) : 0;
}

void ModuleResolution::check_rank(int64_t actual) {
  if (actual == rank) return;
  const std::string text = who() + " has rank " + std::to_string(actual) + " but ";
  if (rank_key)
    config_problem("rank_pattern", text + "key " + peft::quoted(*rank_key) + " gives " + std::to_string(rank));
  else
    config_problem("r", text + "r is " + std::to_string(rank));
}

}  // namespace peft
