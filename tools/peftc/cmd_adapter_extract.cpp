// peftc adapter extract --base B --tuned T --out DIR (--rank R | --energy F) [--modules a,b,...]
//   [--svd exact|randomized] [--threads N] [--dtype f32|bf16|f16] [--json]
// A LoRA adapter from a fully fine-tuned checkpoint: dW = W_tuned - W_base per module, truncated
// SVD; prints each module's rank and relative error.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "command.hpp"
#include "lowrank_cli.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "adapter extract --base DIR|ID --tuned DIR|ID --out DIR (--rank R | --energy F) [--modules NAME,...] "
    "[--svd exact|randomized] [--threads N] [--dtype f32|bf16|f16] [--json]";

int extract_command(const std::vector<std::string>& args) {
  Owned<peft_lowrank_options, peft_lowrank_options_free> opts;
  if (peft_error* err = peft_lowrank_options_new(&opts.p)) return report(err);
  std::optional<std::string> base, tuned, out;
  std::vector<std::string> modules;
  bool rank_given = false, json = false;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    const int applied = apply_lowrank_option(a, opts.p, rank_given, kUsage);
    if (applied < 0) return kExitUsage;
    if (applied > 0) continue;
    if (arg == "--base" || arg == "--tuned" || arg == "--out") {
      const auto v = a.value();
      if (!v || v->empty()) return usage_error(arg + " needs a value", kUsage);
      (arg == "--base" ? base : arg == "--tuned" ? tuned : out) = *v;
    } else if (arg == "--modules") {
      const auto v = a.value();
      if (!v || v->empty()) return usage_error("--modules needs comma-separated names", kUsage);
      size_t start = 0;
      while (start <= v->size()) {
        const size_t comma = v->find(',', start);
        const std::string name = v->substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (name.empty()) return usage_error("--modules has an empty name", kUsage);
        modules.push_back(name);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (arg == "--json" && !a.has_inline_value()) {
      json = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    } else {
      return usage_error("unexpected argument '" + a.raw() + "'", kUsage);
    }
  }
  if (!base || !tuned || !out) return usage_error("adapter extract needs --base, --tuned and --out", kUsage);
  if (!rank_given) return usage_error("adapter extract needs --rank or --energy", kUsage);
  std::vector<const char*> names;
  for (const std::string& m : modules) names.push_back(m.c_str());
  if (peft_error* err = peft_lowrank_options_set_modules(opts.p, names.data(), names.size())) return report(err);
  Owned<peft_lowrank_report, peft_lowrank_report_free> result;
  if (peft_error* err = peft_adapter_extract(base->c_str(), tuned->c_str(), out->c_str(), opts.p, &result.p))
    return report(err);
  print_lowrank_report(result.p, json);
  if (!json) std::printf("wrote %s\n", out->c_str());
  return kExitOk;
}

const bool registered = register_command({"adapter extract", kUsage, &extract_command});

}  // namespace
}  // namespace peftc
