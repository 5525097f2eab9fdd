// peftc model combine --base DIR|FILE.gguf --model DIR|FILE.gguf:WEIGHT [--model ...] --method METHOD --out DIR|FILE.gguf
//   [--density D] [--majority-sign total|frequency] [--seed N] [--dtype keep|f32|bf16|f16]
//   [--max-shard-size SIZE] [--no-config] [--allow-nonfinite]
// Whole-model task arithmetic (peft_model_combine()): fine-tuned checkpoints of one base combined
// as base + combine(weight * (model - base)) per tensor, with "linear" or PEFT's pruning types
// ("ties", "dare_linear", "dare_ties", "magnitude_prune"); a summary goes to stdout. A GGUF base takes
// GGUF models and writes one GGUF file with the base's tensor types.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "combine_cli.hpp"
#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "model combine --base DIR|FILE.gguf --model DIR|FILE.gguf:WEIGHT [--model ...] "
    "--method linear|ties|dare_linear|dare_ties|magnitude_prune --out DIR|FILE.gguf [--density D] "
    "[--majority-sign total|frequency] [--seed N] [--dtype keep|f32|bf16|f16] [--max-shard-size SIZE] "
    "[--no-config] [--allow-nonfinite]";

int model_combine_command(const std::vector<std::string>& args) {
  std::optional<std::string> base, out;
  std::vector<std::string> dirs;
  std::vector<double> weights;
  std::optional<int32_t> method;
  PruningArgs pruning;
  int32_t dtype = PEFT_DTYPE_KEEP;
  uint64_t max_shard = 0;
  bool require_config = true, allow_nonfinite = false;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    const int pruned = apply_pruning_option(a, pruning, kUsage);
    if (pruned < 0) return kExitUsage;
    if (pruned > 0) continue;
    if (arg == "--base" || arg == "--out") {
      const auto v = a.value();
      if (!v || v->empty()) return usage_error(arg + " needs a folder or a .gguf file", kUsage);
      (arg == "--base" ? base : out) = *v;
    } else if (arg == "--model") {
      const auto v = a.value();
      std::string dir;
      double weight = 0;
      if (!v || !parse_weighted(*v, dir, weight))
        return usage_error("--model needs DIR:WEIGHT with a finite number, e.g. out/tuned:0.5", kUsage);
      dirs.push_back(dir);
      weights.push_back(weight);
    } else if (arg == "--method") {
      const auto v = a.value();
      method = v ? combine_method(*v) : std::nullopt;
      if (!method || *method < PEFT_COMBINE_LINEAR || *method > PEFT_COMBINE_MAGNITUDE_PRUNE)
        return usage_error("--method must be linear, ties, dare_linear, dare_ties or magnitude_prune", kUsage);
    } else if (arg == "--dtype") {
      const auto v = a.value();
      if (v && *v == "keep") {
        dtype = PEFT_DTYPE_KEEP;
      } else {
        const std::optional<int32_t> d = v ? parse_float_dtype(*v) : std::nullopt;
        if (!d) return usage_error("--dtype must be keep, f32, bf16 or f16", kUsage);
        dtype = *d;
      }
    } else if (arg == "--max-shard-size") {
      const auto v = a.value();
      const std::optional<uint64_t> size = v ? parse_size(*v) : std::nullopt;
      if (!size) return usage_error("--max-shard-size needs a size such as 5GB or 500MB", kUsage);
      max_shard = *size;
    } else if (arg == "--no-config" && !a.has_inline_value()) {
      require_config = false;
    } else if (arg == "--allow-nonfinite" && !a.has_inline_value()) {
      allow_nonfinite = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    } else {
      return usage_error("unexpected argument '" + a.raw() + "'", kUsage);
    }
  }
  if (!base) return usage_error("model combine needs --base DIR|FILE.gguf", kUsage);
  if (dirs.empty()) return usage_error("model combine needs at least one --model DIR:WEIGHT", kUsage);
  if (!method) return usage_error("model combine needs --method", kUsage);
  if (!out) return usage_error("model combine needs --out DIR|FILE.gguf", kUsage);

  Owned<peft_export_options, peft_export_options_free> combine_opts;
  Owned<peft_merge_options, peft_merge_options_free> opts;
  if (peft_error* err = peft_export_options_new(&combine_opts.p)) return report(err);
  if (peft_error* err = set_pruning(combine_opts.p, pruning)) return report(err);
  if (peft_error* err = peft_merge_options_new(&opts.p)) return report(err);
  if (peft_error* err = peft_merge_options_set_dtype(opts.p, dtype)) return report(err);
  if (max_shard != 0) {
    if (peft_error* err = peft_merge_options_set_max_shard_size(opts.p, max_shard)) return report(err);
  }
  if (peft_error* err = peft_merge_options_set_require_config(opts.p, require_config ? 1 : 0)) return report(err);
  if (peft_error* err = peft_merge_options_set_allow_nonfinite(opts.p, allow_nonfinite ? 1 : 0)) return report(err);
  std::vector<const char*> models;
  for (const std::string& d : dirs) models.push_back(d.c_str());
  Owned<peft_merge_result, peft_merge_result_free> result;
  if (peft_error* err = peft_model_combine(base->c_str(), models.data(), weights.data(), models.size(), *method,
                                           out->c_str(), combine_opts.p, opts.p, &result.p))
    return report(err);
  std::printf("combined %zu model(s) (%s) into %s\n", dirs.size(), kCombineMethods[*method], out->c_str());
  std::printf("tensors: %llu combined, %llu copied\n",
              static_cast<unsigned long long>(peft_merge_result_tensor_count(result.p, PEFT_MERGE_TENSORS_MERGED)),
              static_cast<unsigned long long>(peft_merge_result_tensor_count(result.p, PEFT_MERGE_TENSORS_COPIED)));
  std::printf("files:");
  for (size_t i = 0; i < peft_merge_result_file_count(result.p); ++i)
    std::printf(" %s", peft_merge_result_file_name(result.p, i));
  std::printf("\n");
  return kExitOk;
}

const bool registered = register_command({"model combine", kUsage, &model_combine_command});

}  // namespace
}  // namespace peftc
