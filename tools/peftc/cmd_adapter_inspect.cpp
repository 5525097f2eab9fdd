// peftc adapter inspect DIR [--base MODEL_DIR] [--json | --config] [--lenient]: a PEFT LoRA adapter's
// config, modules (rank, alpha, scaling, layer kind, tensors) and, with --base, its validation against
// a base model. --config prints only the config, as PEFT writes it (sorted keys, indent 2). --lenient
// loads it as PEFT does and prints what was ignored to stderr.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "adapter_open.hpp"
#include "command.hpp"
#include "json_text.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage = "adapter inspect DIR [--base MODEL_DIR] [--json | --config] [--lenient]";

const char* kind_name(int32_t kind) {
  switch (kind) {
    case PEFT_LAYER_LINEAR: return "linear";
    case PEFT_LAYER_CONV1D: return "conv1d";
    case PEFT_LAYER_EMBEDDING: return "embedding";
    case PEFT_LAYER_CONV2D: return "conv2d";
    case PEFT_LAYER_FULL: return "full";
    case PEFT_LAYER_TRAINABLE_TOKENS: return "trainable_tokens";
    default: return "unknown";
  }
}

bool is_lora_kind(int32_t kind) { return kind >= PEFT_LAYER_LINEAR && kind <= PEFT_LAYER_CONV2D; }

std::string json_or_null(const char* text) { return text ? json_string(text) : "null"; }
std::string json_bool(int32_t value) { return value ? "true" : "false"; }

std::string shape_json(const peft_adapter* a, size_t m, size_t t) {
  std::vector<uint64_t> shape;
  const uint64_t* dims = peft_adapter_module_tensor_shape(a, m, t);
  size_t ndim = peft_adapter_module_tensor_ndim(a, m, t);
  return json_uint_array(dims, dims ? ndim : 0);
}

std::string shape_text(const peft_adapter* a, size_t m, size_t t) {
  std::string out = "[";
  const uint64_t* dims = peft_adapter_module_tensor_shape(a, m, t);
  size_t ndim = peft_adapter_module_tensor_ndim(a, m, t);
  for (size_t d = 0; dims && d < ndim; ++d) out += (d ? ", " : "") + std::to_string(dims[d]);
  return out + "]";
}

struct Validation {
  std::string base;
  int32_t code = PEFT_OK;
  std::string message;
};

void print_json(const peft_adapter* a, const std::string& dir, const Validation* validation) {
  std::string out = "{\"dir\":" + json_string(dir);
  out += ",\"peft_type\":" + json_or_null(peft_adapter_peft_type(a));
  out += ",\"r\":" + std::to_string(peft_adapter_r(a));
  out += ",\"lora_alpha\":" + json_number(peft_adapter_lora_alpha(a));
  out += ",\"use_rslora\":" + json_bool(peft_adapter_use_rslora(a));
  out += ",\"use_dora\":" + json_bool(peft_adapter_use_dora(a));
  out += ",\"lora_bias\":" + json_bool(peft_adapter_lora_bias(a));
  out += ",\"bias\":" + json_or_null(peft_adapter_bias(a));
  out += ",\"task_type\":" + json_or_null(peft_adapter_task_type(a));
  out += ",\"base_model_name_or_path\":" + json_or_null(peft_adapter_base_model_name_or_path(a));
  const char* targets = peft_adapter_config_field(a, "target_modules");
  out += ",\"target_modules\":" + std::string(targets ? targets : "null");
  out += ",\"family\":" + json_or_null(peft_adapter_family(a));
  out += ",\"modules\":[";
  size_t count = peft_adapter_module_count(a);
  for (size_t m = 0; m < count; ++m) {
    int32_t kind = peft_adapter_module_kind(a, m);
    out += (m ? ",{" : "{");
    out += "\"module\":" + json_string(peft_adapter_module_name(a, m));
    out += ",\"kind\":" + json_string(kind_name(kind));
    if (is_lora_kind(kind)) {
      out += ",\"rank\":" + std::to_string(peft_adapter_module_rank(a, m));
      out += ",\"alpha\":" + json_number(peft_adapter_module_alpha(a, m));
      out += ",\"scaling\":" + json_number(peft_adapter_module_scaling(a, m));
    } else {
      out += ",\"rank\":null,\"alpha\":null,\"scaling\":null";
    }
    out += ",\"tensors\":{";
    size_t tensors = peft_adapter_module_tensor_count(a, m);
    for (size_t t = 0; t < tensors; ++t) {
      out += (t ? "," : "") + json_string(peft_adapter_module_tensor_role(a, m, t)) + ":{";
      out += "\"dtype\":" + json_string(peft_dtype_name(peft_adapter_module_tensor_dtype(a, m, t)));
      out += ",\"shape\":" + shape_json(a, m, t);
      out += ",\"key\":" + json_string(peft_adapter_module_tensor_key(a, m, t));
      out += ",\"base\":" + json_string(peft_adapter_module_tensor_base_name(a, m, t));
      out += "}";
    }
    out += "}";
    size_t n_tokens = 0;
    const int64_t* tokens = peft_adapter_module_token_indices(a, m, &n_tokens);
    if (n_tokens) {
      out += ",\"token_indices\":[";
      for (size_t i = 0; i < n_tokens; ++i) out += (i ? "," : "") + std::to_string(tokens[i]);
      out += "]";
    }
    out += "}";
  }
  out += "],\"notes\":[";
  for (size_t i = 0; i < peft_adapter_note_count(a); ++i) out += (i ? "," : "") + json_string(peft_adapter_note(a, i));
  out += "]";
  if (validation) {
    out += ",\"validation\":{\"base\":" + json_string(validation->base) +
           ",\"ok\":" + json_bool(validation->code == PEFT_OK);
    if (validation->code != PEFT_OK)
      out += ",\"code\":" + json_string(peft_error_code_name(validation->code)) +
             ",\"message\":" + json_string(validation->message);
    out += "}";
  }
  out += "}\n";
  std::fputs(out.c_str(), stdout);
}

void print_text(const peft_adapter* a, const std::string& dir, const Validation* validation) {
  std::printf("adapter %s\n", dir.c_str());
  std::printf("peft_type %s, r %lld, lora_alpha %g, use_rslora %s, use_dora %s, bias %s\n",
              peft_adapter_peft_type(a), static_cast<long long>(peft_adapter_r(a)), peft_adapter_lora_alpha(a),
              peft_adapter_use_rslora(a) ? "yes" : "no", peft_adapter_use_dora(a) ? "yes" : "no",
              peft_adapter_bias(a));
  const char* base = peft_adapter_base_model_name_or_path(a);
  const char* family = peft_adapter_family(a);
  std::printf("base model %s, architecture %s\n", base ? base : "(none)", family ? family : "(unknown)");
  size_t count = peft_adapter_module_count(a);
  std::printf("%zu module(s)\n", count);
  for (size_t m = 0; m < count; ++m) {
    int32_t kind = peft_adapter_module_kind(a, m);
    std::printf("  %s  %s", peft_adapter_module_name(a, m), kind_name(kind));
    if (is_lora_kind(kind))
      std::printf("  r=%lld alpha=%g scaling=%g", static_cast<long long>(peft_adapter_module_rank(a, m)),
                  peft_adapter_module_alpha(a, m), peft_adapter_module_scaling(a, m));
    std::printf("\n");
    for (size_t t = 0; t < peft_adapter_module_tensor_count(a, m); ++t)
      std::printf("      %-40s %-5s %s\n", peft_adapter_module_tensor_role(a, m, t),
                  peft_dtype_name(peft_adapter_module_tensor_dtype(a, m, t)), shape_text(a, m, t).c_str());
  }
  for (size_t i = 0; i < peft_adapter_note_count(a); ++i) std::printf("note: %s\n", peft_adapter_note(a, i));
  if (validation) {
    if (validation->code == PEFT_OK)
      std::printf("validation against %s: ok\n", validation->base.c_str());
    else
      std::printf("validation against %s: %s: %s\n", validation->base.c_str(),
                  peft_error_code_name(validation->code), validation->message.c_str());
  }
}

int run_adapter_inspect(const std::vector<std::string>& args) {
  std::string dir, base;
  bool json = false, config = false, lenient = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == kLenientOption) {
      lenient = true;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--config") {
      config = true;
    } else if (arg == "--base") {
      if (i + 1 >= args.size()) return usage_error("--base needs a MODEL_DIR", kUsage);
      base = args[++i];
    } else if (!arg.empty() && arg[0] == '-') {
      return usage_error("unknown option " + arg, kUsage);
    } else if (dir.empty()) {
      dir = arg;
    } else {
      return usage_error("more than one DIR given", kUsage);
    }
  }
  if (dir.empty()) return usage_error("DIR is missing", kUsage);
  if (json && config) return usage_error("give --json or --config, not both", kUsage);

  peft_adapter* adapter = nullptr;
  Validation validation;
  validation.base = base;
  peft_error* err = open_adapter(dir, base, lenient, &adapter);
  if (err && !base.empty()) {
    int32_t code = peft_error_code(err);
    if (code != PEFT_ERR_SHAPE_MISMATCH && code != PEFT_ERR_UNRESOLVED_KEY) return report(err);
    // The adapter itself is fine but does not fit the base: show it, and what does not fit.
    peft_adapter* plain = nullptr;
    if (peft_error* again = open_adapter(dir, "", lenient, &plain)) {
      peft_error_free(again);
      return report(err);
    }
    validation.code = code;
    validation.message = peft_error_message(err);
    peft_error_free(err);
    adapter = plain;
  } else if (err) {
    return report(err);
  }
  const Validation* shown = base.empty() ? nullptr : &validation;
  if (config) {
    std::printf("%s\n", peft_adapter_config_json(adapter));
  } else if (json) {
    print_json(adapter, dir, shown);
  } else {
    print_text(adapter, dir, shown);
  }
  peft_adapter_free(adapter);
  if (validation.code != PEFT_OK) {
    std::fflush(stdout);
    std::fprintf(stderr, "peftc: error: %s: %s\n", peft_error_code_name(validation.code), validation.message.c_str());
    return kExitFailure;
  }
  return kExitOk;
}

const bool registered = register_command({"adapter inspect", kUsage, run_adapter_inspect});

}  // namespace
}  // namespace peftc
