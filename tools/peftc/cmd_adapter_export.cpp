// peftc adapter export IN_DIR OUT_DIR [--dtype f32|bf16|f16] [--peft-version X.Y] [--base DIR] [--lenient]:
// writes an adapter as PEFT's save_pretrained does (canonical keys, {"format":"pt"}, sorted config),
// optionally converting its float tensors and restricting its config to what an older PEFT release
// knows. With --lenient it writes what PEFT loads (without the keys PEFT ignores; warnings on stderr).
// With --format gguf, OUT is a GGUF LoRA file for llama.cpp (peft_adapter_export_gguf): BASE is then
// a model folder, hub id or GGUF file (default: the adapter's base), --dtype also takes q8_0; with
// --split-into BASE_OUT, what a GGUF LoRA cannot hold is merged into a copy of the base written to
// BASE_OUT (a GGUF file or a model folder, like the base) and the rest exported
// (peft_adapter_export_gguf_split).
// With IN a GGUF LoRA file and --format peft, OUT is a PEFT adapter folder (peft_adapter_import_gguf);
// --base is then required.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "adapter_open.hpp"
#include "arguments.hpp"
#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "adapter export IN_DIR OUT [--format peft|gguf] [--dtype f32|bf16|f16|q8_0] [--peft-version X.Y] [--base BASE] "
    "[--lenient] [--split-into BASE_OUT]";

// The ggml type of a --dtype value for GGUF output.
std::optional<int32_t> gguf_factor_type(const std::string& name) {
  if (name == "q8_0") return peft_ggml_type_from_name("Q8_0");
  const std::optional<int32_t> dtype = parse_float_dtype(name);
  if (!dtype) return std::nullopt;
  return peft_ggml_type_from_name(peft_dtype_name(*dtype));
}

int export_command(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  int32_t dtype = PEFT_DTYPE_KEEP;
  std::optional<std::string> version;
  std::string base;
  std::string format = "peft";
  std::string dtype_name;
  bool lenient = false;
  std::string split_into;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    if (arg == kLenientOption && !a.has_inline_value()) {
      lenient = true;
    } else if (arg == "--base") {
      const auto v = a.value();
      if (!v || v->empty()) return usage_error("--base needs a model folder", kUsage);
      base = *v;
    } else if (arg == "--split-into") {
      const auto v = a.value();
      if (!v || v->empty()) return usage_error("--split-into needs a path for the merged base", kUsage);
      split_into = *v;
    } else if (arg == "--format") {
      const auto v = a.value();
      if (!v || (*v != "peft" && *v != "gguf")) return usage_error("--format must be peft or gguf", kUsage);
      format = *v;
    } else if (arg == "--dtype") {
      const auto v = a.value();
      if (!v) return usage_error("--dtype needs a value", kUsage);
      dtype_name = *v;
    } else if (arg == "--peft-version") {
      version = a.value();
      if (!version || version->empty()) return usage_error("--peft-version needs a value such as 0.13", kUsage);
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    } else if (is_option(arg)) {
      return usage_error("unknown option '" + arg + "'", kUsage);
    } else {
      positional.push_back(a.raw());
    }
  }
  if (positional.size() != 2) return usage_error("adapter export needs IN_DIR and OUT", kUsage);
  if (!split_into.empty() && format != "gguf") return usage_error("--split-into applies to --format gguf only", kUsage);
  if (format == "gguf") {
    if (version) return usage_error("--peft-version applies to --format peft only", kUsage);
    int32_t type = 0;
    if (!dtype_name.empty()) {
      const std::optional<int32_t> parsed = gguf_factor_type(dtype_name);
      if (!parsed) return usage_error("--dtype must be f32, bf16, f16 or q8_0, not '" + dtype_name + "'", kUsage);
      type = *parsed;
    }
    Owned<peft_adapter, peft_adapter_free> adapter;
    // The base is GGUF's business here (a GGUF file is no base folder to validate against).
    if (peft_error* err = open_adapter(positional[0], "", lenient, &adapter.p)) return report(err);
    if (!split_into.empty()) {
      if (peft_error* err = peft_adapter_export_gguf_split(adapter.p, positional[1].c_str(), base.c_str(), type,
                                                           split_into.c_str()))
        return report(err);
      std::printf("exported %s and merged the modules a GGUF LoRA cannot hold into %s\n", positional[1].c_str(),
                  split_into.c_str());
      return kExitOk;
    }
    if (peft_error* err = peft_adapter_export_gguf(adapter.p, positional[1].c_str(), base.c_str(), type))
      return report(err);
    std::printf("exported %zu module(s) to %s\n", peft_adapter_module_count(adapter.p), positional[1].c_str());
    return kExitOk;
  }
  if (is_gguf_file(positional[0])) {
    // A GGUF LoRA adapter to a PEFT folder (peft_adapter_import_gguf): factors are written F32.
    if (base.empty()) return usage_error("importing a GGUF adapter needs --base BASE", kUsage);
    if (version || !dtype_name.empty() || lenient)
      return usage_error("--dtype, --peft-version and --lenient do not apply to a GGUF adapter", kUsage);
    if (peft_error* err = peft_adapter_import_gguf(positional[0].c_str(), positional[1].c_str(), base.c_str()))
      return report(err);
    std::printf("imported %s to %s\n", positional[0].c_str(), positional[1].c_str());
    return kExitOk;
  }
  if (!dtype_name.empty()) {
    const std::optional<int32_t> parsed = parse_float_dtype(dtype_name);
    if (!parsed) return usage_error("--dtype must be f32, bf16 or f16, not '" + dtype_name + "'", kUsage);
    dtype = *parsed;
  }

  Owned<peft_export_options, peft_export_options_free> options;
  if (peft_error* err = peft_export_options_new(&options.p)) return report(err);
  if (peft_error* err = peft_export_options_set_dtype(options.p, dtype)) return report(err);
  if (version) {
    if (peft_error* err = peft_export_options_set_peft_version(options.p, version->c_str())) return report(err);
  }
  Owned<peft_adapter, peft_adapter_free> adapter;
  if (peft_error* err = open_adapter(positional[0], base, lenient, &adapter.p)) return report(err);
  if (peft_error* err = peft_adapter_export(adapter.p, positional[1].c_str(), options.p)) return report(err);
  std::printf("exported %zu module(s) to %s\n", peft_adapter_module_count(adapter.p), positional[1].c_str());
  return kExitOk;
}

const bool registered = register_command({"adapter export", kUsage, &export_command});

}  // namespace
}  // namespace peftc
