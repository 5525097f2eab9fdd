// peftc adapter convert IN OUT --to lora (--rank R | --energy F) [--base DIR] [--svd ...]
//   [--threads N] [--dtype ...] [--json]
// peftc adapter convert IN OUT --to lora --initial INIT [--dtype ...]
// Converts an adapter to plain LoRA: by truncated SVD of each module's change (PEFT's
// convert_to_lora, with the per-module error; multiplicative methods such as IA3 as W' - W against
// --base), or, given the adapter saved at initialisation, a
// PiSSA / CorDA / OLoRA / LoftQ adapter exactly as PEFT's path_initial_model_for_weight_conversion.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "adapter_open.hpp"
#include "arguments.hpp"
#include "command.hpp"
#include "lowrank_cli.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "adapter convert IN OUT --to lora ((--rank R | --energy F) [--svd exact|randomized] [--threads N] [--json] | "
    "--initial INIT_DIR) [--dtype f32|bf16|f16] [--base DIR] [--lenient]";

int convert_command(const std::vector<std::string>& args) {
  Owned<peft_lowrank_options, peft_lowrank_options_free> opts;
  if (peft_error* err = peft_lowrank_options_new(&opts.p)) return report(err);
  std::vector<std::string> positional;
  std::optional<std::string> to, initial;
  std::string base;
  int32_t dtype = PEFT_DTYPE_KEEP;
  bool rank_given = false, json = false, lenient = false, svd_option = false;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    if (arg == "--dtype") {
      const auto v = a.value();
      const std::optional<int32_t> d = v ? parse_float_dtype(*v) : std::nullopt;
      if (!d) return usage_error("--dtype must be f32, bf16 or f16", kUsage);
      dtype = *d;
      continue;
    }
    const int applied = apply_lowrank_option(a, opts.p, rank_given, kUsage);
    if (applied < 0) return kExitUsage;
    if (applied > 0) {
      svd_option = svd_option || arg != "--rank";
      continue;
    }
    if (arg == "--to" || arg == "--initial" || arg == "--base") {
      const auto v = a.value();
      if (!v || v->empty()) return usage_error(arg + " needs a value", kUsage);
      if (arg == "--to") to = *v;
      else if (arg == "--initial") initial = *v;
      else base = *v;
    } else if (arg == kLenientOption && !a.has_inline_value()) {
      lenient = true;
    } else if (arg == "--json" && !a.has_inline_value()) {
      json = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    } else if (!is_option(arg)) {
      positional.push_back(a.raw());
    } else {
      return usage_error("unexpected argument '" + a.raw() + "'", kUsage);
    }
  }
  if (positional.size() != 2) return usage_error("adapter convert needs IN and OUT folders", kUsage);
  if (!to || *to != "lora") return usage_error("adapter convert needs --to lora (the one target today)", kUsage);
  if (initial && (rank_given || svd_option || json))
    return usage_error("--initial converts exactly: it takes no --rank, --energy, --svd, --threads or --json", kUsage);
  if (!initial && !rank_given) return usage_error("adapter convert needs --rank, --energy or --initial", kUsage);

  if (initial) {
    Owned<peft_export_options, peft_export_options_free> export_opts;
    if (peft_error* err = peft_export_options_new(&export_opts.p)) return report(err);
    if (peft_error* err = peft_export_options_set_dtype(export_opts.p, dtype)) return report(err);
    if (peft_error* err = peft_adapter_convert_initial(positional[0].c_str(), initial->c_str(), positional[1].c_str(),
                                                       export_opts.p))
      return report(err);
    std::printf("converted %s (initial adapter %s) to plain LoRA in %s\n", positional[0].c_str(), initial->c_str(),
                positional[1].c_str());
    return kExitOk;
  }
  Owned<peft_adapter, peft_adapter_free> adapter;
  if (peft_error* err = open_adapter(positional[0], base, lenient, &adapter.p)) return report(err);
  if (dtype != PEFT_DTYPE_KEEP) {
    if (peft_error* err = peft_lowrank_options_set_dtype(opts.p, dtype)) return report(err);
  }
  if (peft_error* err = peft_lowrank_options_set_base(opts.p, base.c_str())) return report(err);
  Owned<peft_lowrank_report, peft_lowrank_report_free> result;
  if (peft_error* err = peft_adapter_convert_to_lora(adapter.p, positional[1].c_str(), opts.p, &result.p))
    return report(err);
  print_lowrank_report(result.p, json);
  if (!json) std::printf("wrote %s\n", positional[1].c_str());
  return kExitOk;
}

const bool registered = register_command({"adapter convert", kUsage, &convert_command});

}  // namespace
}  // namespace peftc
