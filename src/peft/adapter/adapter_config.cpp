#include "peft/adapter/adapter_config.hpp"

#include <cmath>
#include <cstdint>

#include "core/error.hpp"
#include "core/json_parse.hpp"
#include "core/text.hpp"
#include "core/text_file.hpp"

namespace peft {
namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxConfigBytes = 64ull << 20;

// The task types PEFT accepts (peft.utils.peft_types.TaskType).
constexpr const char* kTaskTypes[] = {"SEQ_CLS",     "SEQ_2_SEQ_LM",       "CAUSAL_LM", "TOKEN_CLS",
                                      "QUESTION_ANS", "FEATURE_EXTRACTION"};

// PEFT types this library does not merge, with the reason (virtual tokens, routing...) or the
// generic one.
struct OtherType {
  const char* name;
  const char* why;
};
// The generic reason, naming every peft_type the method table holds ("LORA, LOHA, ... and C3A").
std::string not_yet_reason() {
  const std::span<const MethodRow> rows = method_table();
  std::string list;
  for (size_t i = 0; i < rows.size(); ++i)
    list += std::string(i == 0 ? "" : i + 1 == rows.size() ? " and " : ", ") + rows[i].peft_type;
  return "merging this method is not implemented (" + list + " are)";
}
constexpr OtherType kWhyNot[] = {
    {"PROMPT_TUNING", "prompt tuning learns virtual tokens prepended to the input; there is no weight to merge"},
    {"MULTITASK_PROMPT_TUNING", "multitask prompt tuning learns virtual tokens; there is no weight to merge"},
    {"P_TUNING", "p-tuning learns virtual tokens through a prompt encoder; there is no weight to merge"},
    {"PREFIX_TUNING", "prefix tuning learns key/value prefixes for every layer; there is no weight to merge"},
    {"ADAPTION_PROMPT", "adaption prompts add gated attention over learned prompts; there is no weight to merge"},
    {"CPT", "context-aware prompt tuning learns virtual tokens; there is no weight to merge"},
    {"XLORA", "X-LoRA mixes LoRA experts with per-token routing computed at run time; no single weight holds it"},
    {"POLY", "Poly routes each task through a learned mixture of LoRA skills at run time; no single weight "
             "holds it"},
    {"CARTRIDGE", "cartridges are trained key/value caches; there is no weight to merge"},
};

// PEFT types other than LoRA: valid adapters this library does not merge.
constexpr const char* kOtherPeftTypes[] = {
    "PROMPT_TUNING", "MULTITASK_PROMPT_TUNING", "P_TUNING", "PREFIX_TUNING", "ADAMSS",
    "ADAPTION_PROMPT", "BEFT", "LILY", "POLY", "FROD",
    "PVERA", "GLORA", "XLORA", "UNILORA", "CPT", "ROAD",
    "HIRA", "WAVEFT", "OSF", "DELORA", "GRALORA", "CARTRIDGE",
    "TINYLORA", "PSOFT"};

// Fields whose non-null value selects a LoRA variant that this library does not merge.
constexpr const char* kUnsupportedVariantFields[] = {
    "use_bdlora", "arrow_config", "monteclora_config", "velora_config",
    "kasa_config", "megatron_config"};

void read_peft_type(const FieldReader& f, const Json& doc, LoraConfig& c) {
  auto it = doc.find("peft_type");
  if (it == doc.end()) f.invalid("peft_type", "is missing (PEFT requires it)");
  if (!it->is_string()) f.wrong_type("peft_type", "a string such as \"LORA\"");
  c.peft_type = it->get<std::string>();
  if (const MethodRow* row = method_row_for_type(c.peft_type)) {
    c.method = row->method;
    return;
  }
  for (const char* other : kOtherPeftTypes) {
    if (c.peft_type != other) continue;
    std::string why = not_yet_reason();
    for (const OtherType& t : kWhyNot)
      if (c.peft_type == t.name) why = t.why;
    f.unsupported("peft_type", "is " + peft::quoted(c.peft_type) + ": " + why);
  }
  f.invalid("peft_type", "is " + peft::quoted(c.peft_type) + ", which is not a PEFT type");
}

void read_scalars(const FieldReader& f, const Json& doc, LoraConfig& c) {
  c.task_type = f.optional_string("task_type");
  if (c.task_type) {
    bool known = false;
    for (const char* t : kTaskTypes) known = known || *c.task_type == t;
    if (!known) f.invalid("task_type", "is " + peft::quoted(*c.task_type) + ", which is not a PEFT task type");
  }
  c.base_model_name_or_path = f.optional_string("base_model_name_or_path");
  c.revision = f.optional_string("revision");
  c.peft_version = f.optional_string("peft_version");

  if (const Json* v = f.get("r")) {
    if (!v->is_number_integer()) f.wrong_type("r", "a positive integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
      f.invalid("r", "is " + v->dump() + ", more than the largest rank this library handles (2^63 - 1)");
    c.r = v->get<int64_t>();
    c.r_given = true;
  } else if (doc.contains("r")) {
    f.wrong_type("r", "a positive integer");  // an explicit null
  }
  if (c.r <= 0) f.invalid("r", "must be a positive integer, got " + std::to_string(c.r));

  if (const Json* v = f.get("lora_alpha")) {
    if (!v->is_number() || !std::isfinite(v->get<double>())) f.wrong_type("lora_alpha", "a finite number");
    c.lora_alpha = v->get<double>();
    c.lora_alpha_given = true;
  } else if (doc.contains("lora_alpha")) {
    f.wrong_type("lora_alpha", "a number");
  }
  c.lora_dropout = f.number("lora_dropout", 0.0);
  c.fan_in_fan_out = f.boolean("fan_in_fan_out", false);
  c.use_rslora = f.boolean("use_rslora", false);
  c.use_dora = f.boolean("use_dora", false);
  c.lora_bias = f.boolean("lora_bias", false);
  c.inference_mode = f.boolean("inference_mode", false);
  c.ensure_weight_tying = f.boolean("ensure_weight_tying", false);

  if (const Json* v = f.get("bias")) {
    if (!v->is_string()) f.wrong_type("bias", "\"none\", \"all\" or \"lora_only\"");
    c.bias = v->get<std::string>();
  } else if (doc.contains("bias")) {
    f.wrong_type("bias", "\"none\", \"all\" or \"lora_only\"");
  }
  if (c.bias != "none" && c.bias != "all" && c.bias != "lora_only")
    f.invalid("bias", "must be \"none\", \"all\" or \"lora_only\", got " + peft::quoted(c.bias));
}

void read_init(const FieldReader& f, const Json& doc, LoraConfig& c) {
  const Json* v = f.get("init_lora_weights");
  if (!v) {
    if (doc.contains("init_lora_weights")) f.wrong_type("init_lora_weights", "true, false or a method name");
    return;
  }
  if (v->is_boolean()) {
    c.init_lora_weights.flag = v->get<bool>();
    return;
  }
  if (!v->is_string()) f.wrong_type("init_lora_weights", "true, false or a method name");
  std::string m = v->get<std::string>();
  c.init_lora_weights.is_bool = false;
  c.init_lora_weights.method = m;
  // The order of PEFT's LoraLayer.update_layer, which decides what a name means.
  if (m.rfind("pissa", 0) == 0 || m.rfind("corda", 0) == 0 || ascii_lower(m) == "olora" || m == "loftq" ||
      m == "lora_ga")
    f.unsupported("init_lora_weights",
                  "is " + peft::quoted(m) +
                      ": this initialisation rewrites the base weights when PEFT loads the adapter; convert "
                      "the adapter to plain LoRA first (PEFT: save_pretrained(path_initial_model_for_weight_"
                      "conversion=...))");
  if (ascii_lower(m) == "mica" || m == "eva" || m == "orthogonal" || m == "gaussian") return;
  f.invalid("init_lora_weights", "is " + peft::quoted(m) + ", which is not a LoRA initialisation PEFT knows");
}

void read_lists(const FieldReader& f, LoraConfig& c) {
  c.target_modules = f.selector("target_modules");
  c.exclude_modules = f.selector("exclude_modules");
  if (const Json* v = f.get("modules_to_save")) c.modules_to_save = f.string_list("modules_to_save", *v);

  if (const Json* v = f.get("layers_to_transform")) {
    if (v->is_number_integer()) {
      c.layers_to_transform = std::vector<int64_t>{f.integer("layers_to_transform", *v, "an integer or a list")};
      c.layers_to_transform_is_int = true;
    } else {
      c.layers_to_transform = f.int_list("layers_to_transform", *v);
    }
  }
  if (const Json* v = f.get("layers_pattern")) {
    if (v->is_string()) {
      c.layers_pattern.push_back(v->get<std::string>());
    } else {
      c.layers_pattern = f.string_list("layers_pattern", *v);
    }
  }
  if (const Json* v = f.get("rank_pattern")) {
    if (!v->is_object()) f.wrong_type("rank_pattern", "an object {pattern: rank}");
    for (const auto& [key, value] : v->items()) {
      const int64_t rank = value.is_number_integer() ? f.integer("rank_pattern", value, "") : 0;
      if (rank <= 0)
        f.invalid("rank_pattern", "entry " + peft::quoted(key) + " must be a positive integer, got " + value.dump());
      c.rank_pattern.emplace_back(key, rank);
    }
  }
  if (const Json* v = f.get("alpha_pattern")) {
    if (!v->is_object()) f.wrong_type("alpha_pattern", "an object {pattern: alpha}");
    for (const auto& [key, value] : v->items()) {
      if (!value.is_number() || !std::isfinite(value.get<double>()))
        f.invalid("alpha_pattern", "entry " + peft::quoted(key) + " must be a number, got " + value.dump());
      c.alpha_pattern.emplace_back(key, value.get<double>());
    }
  }
  if (const Json* v = f.get("trainable_token_indices")) {
    c.trainable_token_indices.given = true;
    if (v->is_array()) {
      c.trainable_token_indices.is_list = true;
      c.trainable_token_indices.targets.emplace_back("", f.int_list("trainable_token_indices", *v));
    } else if (v->is_object()) {
      for (const auto& [key, value] : v->items())
        c.trainable_token_indices.targets.emplace_back(key, f.int_list("trainable_token_indices", value));
    } else {
      f.wrong_type("trainable_token_indices", "a list of token indices or {module: [indices]}");
    }
  }
}

// The checks of LoraConfig.__post_init__ that make PEFT refuse a config.
void check_like_post_init(const FieldReader& f, LoraConfig& c) {
  bool regex_targets = c.target_modules.kind == ModuleSelector::Kind::regex ||
                       c.target_modules.kind == ModuleSelector::Kind::all_linear;
  if (regex_targets && c.layers_to_transform)
    f.invalid("layers_to_transform", "cannot be used when target_modules is a string");
  if (regex_targets && f.present_non_null("layers_pattern"))
    f.invalid("layers_pattern", "cannot be used when target_modules is a string");
  // Python truthiness: a non-empty string or a non-empty list.
  const auto* layers_pattern = f.get("layers_pattern");
  bool pattern_truthy = layers_pattern && !layers_pattern->empty() &&
                        !(layers_pattern->is_string() && layers_pattern->get<std::string>().empty());
  if (pattern_truthy && !c.layers_to_transform) f.invalid("layers_pattern", "requires layers_to_transform");
  if (c.lora_bias && !c.init_lora_weights.is_bool)
    f.invalid("lora_bias", "is only supported with init_lora_weights true or false");
  if (c.lora_bias && c.use_dora) f.invalid("lora_bias", "is not supported together with use_dora");
  if (const Json* v = f.get("target_parameters"); v && v->is_string())
    f.wrong_type("target_parameters", "a list of strings or null");
}

// Fields this library does not use, checked for the types PEFT expects so that a broken file is
// reported rather than carried along.
void check_other_types(const FieldReader& f, LoraConfig& c) {
  if (f.optional_string("megatron_core")) c.megatron_core = *f.optional_string("megatron_core");
  if (const auto* v = f.get("qalora_group_size"); v && !v->is_number_integer())
    f.wrong_type("qalora_group_size", "an integer");
  for (const char* field : {"loftq_config", "eva_config", "corda_config", "lora_ga_config", "auto_mapping"})
    if (const auto* v = f.get(field); v && !v->is_object()) f.wrong_type(field, "an object or null");
}

void check_supported(const FieldReader& f, LoraConfig& c) {
  for (const char* field : kUnsupportedVariantFields)
    if (f.present_non_null(field))
      f.unsupported(field, "is set: this LoRA variant is not supported (its merge is not plain LoRA)");
  if (f.boolean("use_qalora", false)) f.unsupported("use_qalora", "is true: QALoRA is not supported");
  if (const Json* v = f.get("layer_replication")) {
    if (!v->is_array()) f.wrong_type("layer_replication", "a list of [start, end] pairs or null");
    if (!v->empty()) f.unsupported("layer_replication", "is set: replicated layers are not supported");
  }
  if (const Json* v = f.get("alora_invocation_tokens")) {
    if (!v->is_array() || v->empty()) f.wrong_type("alora_invocation_tokens", "a non-empty list of token ids or null");
    for (const Json& token : *v) {
      if (!token.is_number_integer() || token.get<int64_t>() < 0 || token.get<int64_t>() > INT32_MAX)
        f.wrong_type("alora_invocation_tokens", "a list of token ids (integers from 0 to 2^31-1)");
      c.alora_invocation_tokens.push_back(static_cast<uint32_t>(token.get<int64_t>()));
    }
    // PEFT resolves aLoRA as a variant of LoRA's Linear layer alone (lora/layer.py, lora_variants).
    if (c.method != PeftMethod::lora)
      f.unsupported("alora_invocation_tokens", std::string("is set on a ") + peft_method_name(c.method) +
                                                   " adapter: activated LoRA is a LoRA variant");
    if (c.use_dora)
      f.unsupported("alora_invocation_tokens", "is set with use_dora: PEFT has no variant that is both");
  }
  if (const Json* v = f.get("target_parameters")) {
    c.target_parameters = f.string_list("target_parameters", *v);
    for (const std::string& entry : c.target_parameters)
      if (entry.empty() || entry.front() == '.' || entry.back() == '.')
        f.invalid("target_parameters", "has the entry " + peft::quoted(entry) + ", which names no parameter");
    // PEFT's ParamWrapper refuses these (lora/layer.py); only plain LoRA wraps parameters.
    if (!c.target_parameters.empty()) {
      if (c.method != PeftMethod::lora)
        f.unsupported("target_parameters", std::string("is set on a ") + peft_method_name(c.method) +
                                               " adapter: only LoRA adapts parameters (stacked MoE experts)");
      if (c.use_dora) f.unsupported("use_dora", "is true with target_parameters: DoRA on parameters is not supported");
      if (!c.alora_invocation_tokens.empty())
        f.unsupported("alora_invocation_tokens", "is set with target_parameters: activated LoRA on parameters is not supported");
      if (c.lora_bias) f.unsupported("lora_bias", "is true with target_parameters: lora_B.bias on parameters is not supported");
      if (c.lora_dropout != 0)
        f.unsupported("lora_dropout", "is not 0 with target_parameters: PEFT's ParamWrapper refuses dropout");
    }
  }
}

// The config as LoRA's readers read it: the method's row renames its fields into LoRA's names and
// reads its own (MethodRow::read_config).
Json method_view(const FieldReader& f, const Json& doc, LoraConfig& c) {
  Json view = doc;
  if (const auto read = method_row(c.method).read_config) {
    ConfigView edit{doc, view};
    read(f, edit, c.method_fields);
  }
  return view;
}

}  // namespace

void refuse_activated_lora(const std::string& what, const std::vector<uint32_t>& tokens, const std::string& job) {
  if (tokens.empty()) return;
  std::vector<std::string> ids;
  for (uint32_t token : tokens) ids.push_back(std::to_string(token));
  fail(PEFT_ERR_UNSUPPORTED, what + " is an activated LoRA (invocation tokens [" + join_text(ids, ", ") +
                                 "]): its delta applies only from the invocation tokens on, so " + job +
                                 " cannot hold it (PEFT refuses to merge it too); serve it unmerged "
                                 "(peft_lora_apply on the rows from the invocation on) or export it as a GGUF LoRA");
}

LoraConfig LoraConfig::parse(std::string_view json_text, const std::string& source) {
  LoraConfig c;
  c.document = parse_json_ordered(json_text, PEFT_ERR_INVALID_CONFIG, source);
  if (!c.document.is_object()) fail(PEFT_ERR_INVALID_CONFIG, source + ": must be a JSON object");
  FieldReader original(c.document, source);
  read_peft_type(original, c.document, c);
  const Json view = method_view(original, c.document, c);
  FieldReader f(view, source);
  read_scalars(f, view, c);
  read_init(f, view, c);
  read_lists(f, c);
  check_like_post_init(f, c);
  check_other_types(f, c);
  check_supported(f, c);
  compile_patterns(c);  // a bad regex fails here, naming its field
  return c;
}

ConfigPatterns compile_patterns(const LoraConfig& config) {
  constexpr int32_t kCode = PEFT_ERR_INVALID_CONFIG;
  ConfigPatterns p;
  const ModuleSelector& targets = config.target_modules;
  const ModuleSelector& excludes = config.exclude_modules;
  if (targets.kind == ModuleSelector::Kind::regex) p.target_modules.emplace(targets.pattern, kCode, "field \"target_modules\"");
  // An exclude_modules string is always a regex, even "all-linear".
  if (excludes.kind == ModuleSelector::Kind::regex || excludes.kind == ModuleSelector::Kind::all_linear)
    p.exclude_modules.emplace(excludes.pattern, kCode, "field \"exclude_modules\"");
  if (config.modules_to_save)
    for (const std::string& m : *config.modules_to_save)
      p.modules_to_save.emplace_back("(^|.*\\.)" + m + "($|\\..*)", kCode, "field \"modules_to_save\" entry " + quoted(m));
  if (config.layers_pattern.empty()) {
    p.layer_index.emplace_back(".*?\\.[^.]*\\.(?P<idx>\\d+)\\.", kCode, "field \"layers_to_transform\"");
  } else {
    for (const std::string& pattern : config.layers_pattern)
      p.layer_index.emplace_back("(?:^|.*?\\.)" + pattern + "\\.(?P<idx>\\d+)\\.", kCode,
                                 "field \"layers_pattern\" entry " + quoted(pattern));
  }
  for (const auto& [key, rank] : config.rank_pattern)
    p.rank_keys.emplace_back("(.*\\.)?(" + key + ")$", kCode, "field \"rank_pattern\" key " + quoted(key));
  for (const auto& [key, alpha] : config.alpha_pattern)
    p.alpha_keys.emplace_back("(.*\\.)?(" + key + ")$", kCode, "field \"alpha_pattern\" key " + quoted(key));
  return p;
}

LoraConfig LoraConfig::from_file(const std::string& path) {
  return parse(read_text_file(path, kMaxConfigBytes), path);
}

double LoraConfig::scaling(int64_t rank, double alpha) const {
  double r = static_cast<double>(rank);
  return use_rslora ? alpha / std::sqrt(r) : alpha / r;
}

bool LoraConfig::zero_initialised() const {
  return init_lora_weights.is_bool ? init_lora_weights.flag : ascii_lower(init_lora_weights.method) == "gaussian";
}

std::string LoraConfig::canonical_json() const {
  // nlohmann::json keeps object keys sorted by bytes, which is Python's sort_keys order for UTF-8.
  nlohmann::json sorted = nlohmann::json::parse(document.dump());
  return sorted.dump(2, ' ', /*ensure_ascii=*/true);
}

}  // namespace peft
