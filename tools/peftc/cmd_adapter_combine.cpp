// peftc adapter combine --adapter DIR:WEIGHT ... --method METHOD --out DIR [--density D]
//   [--majority-sign total|frequency] [--seed N] [--svd-rank R] [--svd-clamp Q] [--dtype f32|bf16|f16]
//   [--peft-version X.Y]
// Combines adapters as PEFT's add_weighted_adapter does ("cat" exact; "linear", "ties",
// "dare_linear", "dare_ties", "magnitude_prune" on the factors; "svd" and the "*_svd" types on the
// deltas, by truncated SVD) into a new adapter folder.
// With --deltas: the weighted sum of the modules' true deltas (any mergeable method), by "linear" or
// a pruning type, written exactly (LoRA inputs, "linear") or with [--rank R | --energy F]
// [--svd exact|randomized] [--threads N], and its per-module report [--json].
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "adapter_open.hpp"
#include "arguments.hpp"
#include "combine_cli.hpp"
#include "command.hpp"
#include "lowrank_cli.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "adapter combine --adapter DIR:WEIGHT [--adapter DIR:WEIGHT ...] "
    "--method cat|linear|ties|dare_linear|dare_ties|magnitude_prune|svd|ties_svd|dare_linear_svd|dare_ties_svd|"
    "magnitude_prune_svd --out DIR [--density D] [--majority-sign total|frequency] [--seed N] [--svd-rank R] "
    "[--svd-clamp Q] [--dtype f32|bf16|f16] [--peft-version X.Y] [--base DIR] [--lenient] "
    "| adapter combine --deltas --adapter DIR:WEIGHT ... --method linear|ties|dare_linear|dare_ties|magnitude_prune "
    "--out DIR [--density D] [--majority-sign total|frequency] [--seed N] [--rank R | --energy F] "
    "[--svd exact|randomized] [--threads N] [--dtype f32|bf16|f16] [--base DIR] [--lenient] [--json]";

constexpr const char* kMethodList =
    "cat, linear, ties, dare_linear, dare_ties, magnitude_prune, svd, ties_svd, dare_linear_svd, dare_ties_svd or "
    "magnitude_prune_svd";

struct Handles {
  std::vector<peft_adapter*> adapters;
  peft_export_options* options = nullptr;
  ~Handles() {
    for (peft_adapter* a : adapters) peft_adapter_free(a);
    peft_export_options_free(options);
  }
};

int combine_command(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  std::vector<double> weights;
  std::optional<int32_t> method;
  std::optional<std::string> out;
  std::optional<std::string> version;
  int32_t dtype = PEFT_DTYPE_KEEP;
  std::string base;
  bool lenient = false;
  PruningArgs pruning;
  std::optional<int64_t> svd_rank;
  std::optional<double> svd_clamp;
  Owned<peft_lowrank_options, peft_lowrank_options_free> lowrank;
  if (peft_error* err = peft_lowrank_options_new(&lowrank.p)) return report(err);
  bool deltas = false, json = false, rank_given = false, lowrank_option = false;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    // --dtype is this command's own (both forms); the SVD options go with --deltas.
    const int applied = arg == "--dtype" ? 0 : apply_lowrank_option(a, lowrank.p, rank_given, kUsage);
    if (applied < 0) return kExitUsage;
    if (applied > 0) {
      lowrank_option = true;
      continue;
    }
    const int pruned = apply_pruning_option(a, pruning, kUsage);
    if (pruned < 0) return kExitUsage;
    if (pruned > 0) continue;
    if (arg == kLenientOption && !a.has_inline_value()) {
      lenient = true;
    } else if (arg == "--deltas" && !a.has_inline_value()) {
      deltas = true;
    } else if (arg == "--json" && !a.has_inline_value()) {
      json = true;
    } else if (arg == "--base") {
      const auto v = a.value();
      if (!v || v->empty()) return usage_error("--base needs a model folder", kUsage);
      base = *v;
    } else if (arg == "--adapter") {
      const auto v = a.value();
      std::string dir;
      double weight = 0;
      if (!v || !parse_weighted(*v, dir, weight))
        return usage_error("--adapter needs DIR:WEIGHT with a finite number, e.g. out/a:0.5", kUsage);
      dirs.push_back(dir);
      weights.push_back(weight);
    } else if (arg == "--method") {
      const auto v = a.value();
      method = v ? combine_method(*v) : std::nullopt;
      if (!method) return usage_error(std::string("--method must be ") + kMethodList, kUsage);
    } else if (arg == "--svd-rank") {
      const auto v = a.value();
      char* end = nullptr;
      errno = 0;
      const long long parsed = v && !v->empty() ? std::strtoll(v->c_str(), &end, 10) : 0;
      if (!v || v->empty() || errno != 0 || end != v->c_str() + v->size() || parsed < 1)
        return usage_error("--svd-rank needs a whole number of at least 1", kUsage);
      svd_rank = parsed;
    } else if (arg == "--svd-clamp") {
      const auto v = a.value();
      svd_clamp = v ? parse_number(*v) : std::nullopt;
      if (!svd_clamp || *svd_clamp < 0 || *svd_clamp > 1)
        return usage_error("--svd-clamp needs a quantile from 0 to 1", kUsage);
    } else if (arg == "--out") {
      out = a.value();
      if (!out || out->empty()) return usage_error("--out needs a folder", kUsage);
    } else if (arg == "--dtype") {
      const auto v = a.value();
      if (!v) return usage_error("--dtype needs a value", kUsage);
      const std::optional<int32_t> parsed = parse_float_dtype(*v);
      if (!parsed) return usage_error("--dtype must be f32, bf16 or f16, not '" + *v + "'", kUsage);
      dtype = *parsed;
    } else if (arg == "--peft-version") {
      version = a.value();
      if (!version || version->empty()) return usage_error("--peft-version needs a value such as 0.13", kUsage);
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    } else {
      return usage_error("unexpected argument '" + a.raw() + "'", kUsage);
    }
  }
  if (dirs.empty()) return usage_error("adapter combine needs at least one --adapter DIR:WEIGHT", kUsage);
  if (!method) return usage_error(std::string("adapter combine needs --method (") + kMethodList + ")", kUsage);
  if (!out) return usage_error("adapter combine needs --out DIR", kUsage);
  if (!deltas && (lowrank_option || json))
    return usage_error("--rank, --energy, --svd, --threads and --json go with --deltas", kUsage);
  if (deltas && (svd_rank || svd_clamp || version))
    return usage_error("--deltas takes --rank or --energy, not --svd-rank, --svd-clamp or --peft-version", kUsage);

  Handles h;
  if (peft_error* err = peft_export_options_new(&h.options)) return report(err);
  if (peft_error* err = peft_export_options_set_dtype(h.options, dtype)) return report(err);
  if (version) {
    if (peft_error* err = peft_export_options_set_peft_version(h.options, version->c_str())) return report(err);
  }
  if (peft_error* err = set_pruning(h.options, pruning)) return report(err);
  if (svd_rank) {
    if (peft_error* err = peft_export_options_set_combine_svd_rank(h.options, *svd_rank)) return report(err);
  }
  if (svd_clamp) {
    if (peft_error* err = peft_export_options_set_combine_svd_clamp(h.options, *svd_clamp)) return report(err);
  }
  for (const std::string& dir : dirs) {
    peft_adapter* adapter = nullptr;
    if (peft_error* err = open_adapter(dir, base, lenient, &adapter)) return report(err);
    h.adapters.push_back(adapter);
  }
  std::vector<const peft_adapter*> list(h.adapters.begin(), h.adapters.end());
  if (deltas) {
    if (dtype != PEFT_DTYPE_KEEP) {
      if (peft_error* err = peft_lowrank_options_set_dtype(lowrank.p, dtype)) return report(err);
    }
    if (peft_error* err = peft_lowrank_options_set_base(lowrank.p, base.c_str())) return report(err);
    Owned<peft_lowrank_report, peft_lowrank_report_free> result;
    if (peft_error* err = peft_adapter_combine_deltas(list.data(), weights.data(), list.size(), *method, out->c_str(),
                                                      h.options, lowrank.p, &result.p))
      return report(err);
    print_lowrank_report(result.p, json);
    if (!json) std::printf("combined %zu adapter(s) (%s of the deltas) into %s\n", list.size(), kCombineMethods[*method], out->c_str());
    return kExitOk;
  }
  if (peft_error* err = peft_adapter_combine(list.data(), weights.data(), list.size(), *method, out->c_str(), h.options))
    return report(err);
  std::printf("combined %zu adapter(s) (%s) into %s\n", list.size(), kCombineMethods[*method], out->c_str());
  return kExitOk;
}

const bool registered = register_command({"adapter combine", kUsage, &combine_command});

}  // namespace
}  // namespace peftc
