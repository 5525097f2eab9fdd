// peftc merge [--base DIR|FILE.gguf] --adapter A[:WEIGHT] ... --out DIR|FILE.gguf [--dtype keep|f32|bf16|f16]
//              [--max-shard-size SIZE] [--threads N] [--no-config] [--allow-nonfinite] [--lenient]
//              [--quant TYPE] [--report] [--arithmetic peft|ggml] [--tied-embeddings untie|shared] [--join-split]
//              [--combine linear|ties|dare_linear|dare_ties|magnitude_prune [--density D] [--majority-sign total|frequency] [--seed N]]
// Merges LoRA adapters into a base model folder and writes a model folder transformers loads as it
// is. An adapter A is a PEFT folder or, with a GGUF base, a GGUF LoRA file too. A progress bar goes to stderr when it is a terminal; a summary goes to stdout. Folders may be
// model ids of the local hub cache (org/name[@revision]); without --base, the base is the first
// adapter's base_model_name_or_path, as a path or an id. Which folder an id resolved to goes to
// stderr ("base: org/name -> /path"). --lenient loads the adapters as PEFT does, printing what it
// ignored to stderr ("warning: ..."). A GGUF file as --base makes --out a GGUF file (docs/gguf.md);
// its adapters are then opened without a base (the merge checks them against the GGUF's tensors), and
// GGUF LoRA files, which have nothing lenient loading would change, are passed on as they are.
// With a GGUF base, merged tensors keep their type (block-quantized ones re-quantized as ggml does);
// --quant TYPE (a ggml type name: Q8_0, Q4_K, ...) or --dtype f32|bf16|f16 writes them in another, and
// --report prints, per merged tensor, the RMS and largest error of the stored merge against the exact
// f32 merge next to the same figures for the unmerged base stored in that type. --arithmetic ggml adds
// plain LoRA deltas in llama-export-lora's order on ggml's scalar build (peft_merge_options_set_arithmetic();
// docs/quantized-bases.md) instead of PEFT's. --tied-embeddings shared merges an adapter on one of a
// tied base's embeddings into the shared tensor as PEFT's merge_and_unload does, instead of untying
// them so that the merge equals the adapter's forward (peft_merge_options_set_tied_embeddings()).
// A GGUF base split into parts (NAME-00001-of-00003.gguf; any part names it) is merged into the same
// parts, named from --out (OUT-00001-of-00003.gguf; docs/gguf.md), or with --join-split into the one
// file --out (peft_merge_options_set_join_split()). --combine ties (or dare_linear, dare_ties,
// magnitude_prune) combines the adapters' deltas of each weight as PEFT's merge_utils does before
// adding them (peft_merge_options_set_combine()), instead of adding the adapters one after the other.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "adapter_open.hpp"
#include "arguments.hpp"
#include "combine_cli.hpp"
#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "merge [--base DIR|FILE.gguf] --adapter DIR|LORA.gguf[:WEIGHT] [--adapter ...] --out DIR|FILE.gguf "
    "[--dtype keep|f32|bf16|f16] [--max-shard-size SIZE] [--threads N] [--no-config] [--allow-nonfinite] "
    "[--lenient] [--quant TYPE] [--report] [--arithmetic peft|ggml] [--tied-embeddings untie|shared] [--join-split] "
    "[--combine linear|ties|dare_linear|dare_ties|magnitude_prune [--density D] [--majority-sign total|frequency] [--seed N]]";

struct AdapterArg {
  std::string dir;
  double weight = 1.0;
};

struct Options {
  std::string base, out;
  std::vector<AdapterArg> adapters;
  int32_t dtype = PEFT_DTYPE_KEEP;
  uint64_t max_shard = 0;
  uint32_t threads = 0;
  bool require_config = true;    // --no-config: a base without config.json is merged anyway
  bool allow_nonfinite = false;  // --allow-nonfinite: merged weights may be infinite or NaN
  bool lenient = false;          // --lenient: adapters loaded as PEFT loads them, warnings on stderr
  int32_t quant = PEFT_DTYPE_KEEP;  // --quant TYPE: GGUF bases' merged tensors in this ggml type
  bool report = false;           // --report: what storing each merged GGUF tensor costs
  int32_t arithmetic = PEFT_MERGE_ARITHMETIC_PEFT;  // --arithmetic peft|ggml
  int32_t tied_embeddings = PEFT_MERGE_TIED_UNTIE;   // --tied-embeddings untie|shared
  bool join_split = false;       // --join-split: a split GGUF base merged into one file
  int32_t combine = PEFT_COMBINE_LINEAR;  // --combine METHOD: the adapters' deltas combined
  PruningArgs pruning;                    // --density, --majority-sign, --seed
};

// A figure of the report: a number, or null for one that is not finite (printed "nan").
double figure(const nlohmann::json& t, const char* key) {
  const nlohmann::json& v = t[key];
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// The --report table: one line per merged tensor.
void print_report(const char* json) {
  const nlohmann::json report = nlohmann::json::parse(json);
  if (report.empty()) return;
  size_t width = std::string_view("tensor").size();
  for (const auto& t : report) width = std::max(width, t["tensor"].get<std::string>().size());
  std::printf("store report (stored merge vs exact f32 merge; base stored in the same type vs base):\n");
  std::printf("  %-*s %-6s %-6s %12s %12s %12s %12s\n", static_cast<int>(width), "tensor", "base", "type", "rms", "max",
              "base rms", "base max");
  for (const auto& t : report)
    std::printf("  %-*s %-6s %-6s %12.4e %12.4e %12.4e %12.4e\n", static_cast<int>(width),
                t["tensor"].get<std::string>().c_str(), t["base_type"].get<std::string>().c_str(),
                t["type"].get<std::string>().c_str(), figure(t, "rms"), figure(t, "max"), figure(t, "base_rms"),
                figure(t, "base_max"));
}

// DIR or DIR:WEIGHT. A suffix after the last ':' that is not a number belongs to the folder name.
AdapterArg parse_adapter(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos && colon > 0) {
    if (auto weight = parse_number(text.substr(colon + 1))) return {text.substr(0, colon), *weight};
  }
  return {text, 1.0};
}

// "keep" or a float dtype.
std::optional<int32_t> parse_dtype(const std::string& name) {
  if (name == "keep") return PEFT_DTYPE_KEEP;
  return parse_float_dtype(name);
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  size_t u = 0;
  while (value >= 1000.0 && u + 1 < sizeof units / sizeof units[0]) {
    value /= 1000.0;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", value, units[u]);
  return text;
}

// A one-line progress bar on stderr, redrawn at most ten times a second.
struct ProgressBar {
  std::chrono::steady_clock::time_point last{};
  bool drawn = false;

  static int32_t callback(void* user, uint64_t done, uint64_t total) {
    auto* bar = static_cast<ProgressBar*>(user);
    const auto now = std::chrono::steady_clock::now();
    if (done != total && bar->drawn && now - bar->last < std::chrono::milliseconds(100)) return 0;
    bar->last = now;
    bar->drawn = true;
    const int width = 30;
    const double fraction = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
    const int filled = static_cast<int>(fraction * width);
    std::string line(static_cast<size_t>(filled), '#');
    line.append(static_cast<size_t>(width - filled), ' ');
    std::fprintf(stderr, "\rmerging [%s] %3d%% %s / %s ", line.c_str(), static_cast<int>(fraction * 100),
                 human_bytes(done).c_str(), human_bytes(total).c_str());
    std::fflush(stderr);
    return 0;
  }

  void finish() {
    if (drawn) std::fprintf(stderr, "\n");
  }
};

// The folder `text` names: itself when it exists, else the snapshot of the hub model id it is
// (peft_hub_resolve, which takes ids with and without a namespace, as the base from
// base_model_name_or_path does), printed to stderr as "what: text -> folder" for the user to see
// which snapshot is merged. When it is neither, `text` unchanged: the merge reports its error.
std::string resolve_folder(const char* what, const std::string& text) {
  char* folder = nullptr;
  if (peft_error* err = peft_hub_resolve(text.c_str(), &folder)) {
    peft_error_free(err);
    return text;
  }
  const std::string resolved = folder;
  peft_string_free(folder);
  if (text != resolved) std::fprintf(stderr, "%s: %s -> %s\n", what, text.c_str(), resolved.c_str());
  return resolved;
}

// Without --base: the first adapter's base_model_name_or_path, as a path or else a model id in the
// hub cache. Returns an exit status when it cannot be used.
std::optional<int> base_from_adapter(Options& o) {
  const std::string& dir = o.adapters.front().dir;
  if (is_gguf_file(dir))
    return usage_error("merge needs --base: adapter '" + dir + "' is a GGUF file, which names no base model",
                       kUsage);
  // Opened without a base (lenient when asked, its warnings printed once the base is known).
  Owned<peft_adapter_options, peft_adapter_options_free> options;
  if (peft_error* err = peft_adapter_options_new(&options.p)) return report(err);
  if (peft_error* err = peft_adapter_options_set_lenient(options.p, o.lenient ? 1 : 0)) return report(err);
  Owned<peft_adapter, peft_adapter_free> adapter;
  if (peft_error* err = peft_adapter_open(dir.c_str(), options.p, &adapter.p)) return report(err);
  const char* name = peft_adapter_base_model_name_or_path(adapter.p);
  if (name == nullptr || *name == '\0')
    return usage_error("merge needs --base: adapter '" + dir + "' names no base model (base_model_name_or_path)",
                       kUsage);
  char* folder = nullptr;
  if (peft_error* err = peft_hub_resolve(name, &folder)) {
    const std::string why = std::string(peft_error_code_name(peft_error_code(err))) + ": " + peft_error_message(err);
    peft_error_free(err);
    return usage_error("merge needs --base: the base model adapter '" + dir + "' names (base_model_name_or_path '" +
                           name + "') is neither a folder nor in the hub cache (" + why + ")",
                       kUsage);
  }
  std::fprintf(stderr, "base: %s -> %s\n", name, folder);
  o.base = folder;
  peft_string_free(folder);
  return std::nullopt;
}

int run_merge(const Options& o) {
  Owned<peft_merge_options, peft_merge_options_free> opts;
  if (peft_error* err = peft_merge_options_new(&opts.p)) return report(err);
  const bool gguf_base = is_gguf_file(o.base);
  for (const AdapterArg& a : o.adapters) {
    if (!o.lenient || is_gguf_file(a.dir)) {
      if (peft_error* err = peft_merge_options_add_adapter_dir(opts.p, a.dir.c_str(), a.weight)) return report(err);
      continue;
    }
    // Lenient: each adapter opened here, so that its warnings can be printed; against the base when it
    // is a model folder (a GGUF base is no folder: the merge checks the adapter against its tensors).
    Owned<peft_adapter, peft_adapter_free> adapter;
    if (peft_error* err = open_adapter(a.dir, gguf_base ? "" : o.base, true, &adapter.p)) return report(err);
    if (peft_error* err = peft_merge_options_add_adapter(opts.p, adapter.p, a.weight)) return report(err);
  }
  if (peft_error* err = peft_merge_options_set_dtype(opts.p, o.dtype)) return report(err);
  if (peft_error* err = peft_merge_options_set_max_shard_size(opts.p, o.max_shard)) return report(err);
  if (peft_error* err = peft_merge_options_set_threads(opts.p, o.threads)) return report(err);
  if (peft_error* err = peft_merge_options_set_require_config(opts.p, o.require_config ? 1 : 0)) return report(err);
  if (peft_error* err = peft_merge_options_set_allow_nonfinite(opts.p, o.allow_nonfinite ? 1 : 0)) return report(err);
  if (peft_error* err = peft_merge_options_set_quant(opts.p, o.quant)) return report(err);
  if (peft_error* err = peft_merge_options_set_report(opts.p, o.report ? 1 : 0)) return report(err);
  if (peft_error* err = peft_merge_options_set_arithmetic(opts.p, o.arithmetic)) return report(err);
  if (peft_error* err = peft_merge_options_set_tied_embeddings(opts.p, o.tied_embeddings)) return report(err);
  if (peft_error* err = peft_merge_options_set_join_split(opts.p, o.join_split ? 1 : 0)) return report(err);
  {
    Owned<peft_export_options, peft_export_options_free> combine_opts;
    if (peft_error* err = peft_export_options_new(&combine_opts.p)) return report(err);
    if (peft_error* err = set_pruning(combine_opts.p, o.pruning)) return report(err);
    if (peft_error* err = peft_merge_options_set_combine(opts.p, o.combine, combine_opts.p)) return report(err);
  }
  ProgressBar bar;
  if (::isatty(STDERR_FILENO)) {
    if (peft_error* err = peft_merge_options_set_progress(opts.p, &ProgressBar::callback, &bar)) return report(err);
  }
  const auto start = std::chrono::steady_clock::now();
  Owned<peft_merge_result, peft_merge_result_free> result;
  peft_error* err = peft_merge_checkpoint(o.base.c_str(), o.out.c_str(), opts.p, &result.p);
  bar.finish();
  if (err) return report(err);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const peft_merge_result* r = result.p;
  const uint64_t merged = peft_merge_result_tensor_count(r, PEFT_MERGE_TENSORS_MERGED);
  const uint64_t replaced = peft_merge_result_tensor_count(r, PEFT_MERGE_TENSORS_REPLACED);
  const uint64_t copied = peft_merge_result_tensor_count(r, PEFT_MERGE_TENSORS_COPIED);
  const uint64_t added = peft_merge_result_tensor_count(r, PEFT_MERGE_TENSORS_ADDED);
  std::printf("merged %zu adapter(s) into %s in %.2f s\n", o.adapters.size(), o.out.c_str(), seconds);
  for (const AdapterArg& a : o.adapters) std::printf("  adapter %s (weight %g)\n", a.dir.c_str(), a.weight);
  std::printf("tensors: %llu merged, %llu replaced, %llu copied", static_cast<unsigned long long>(merged),
              static_cast<unsigned long long>(replaced), static_cast<unsigned long long>(copied));
  if (added) std::printf(", %llu added", static_cast<unsigned long long>(added));
  std::printf(" (%llu in all, %s)\n", static_cast<unsigned long long>(merged + replaced + copied + added),
              human_bytes(peft_merge_result_bytes(r)).c_str());
  std::printf("files:");
  for (size_t i = 0; i < peft_merge_result_file_count(r); ++i) std::printf(" %s", peft_merge_result_file_name(r, i));
  std::printf("\n");
  for (size_t i = 0; i < peft_merge_result_note_count(r); ++i) std::printf("note: %s\n", peft_merge_result_note(r, i));
  if (o.report) print_report(peft_merge_result_report_json(r));
  return kExitOk;
}

int merge_command(const std::vector<std::string>& args) {
  Options o;
  for (Arguments a(args); a.next();) {
    const std::string& arg = a.name();
    if (arg == "-h" || arg == "--help") {
      std::printf("usage: peftc %s\n", kUsage);
      return kExitOk;
    }
    if (arg == "--no-config" && !a.has_inline_value()) {
      o.require_config = false;
      continue;
    }
    if (arg == kLenientOption && !a.has_inline_value()) {
      o.lenient = true;
      continue;
    }
    if (arg == "--report" && !a.has_inline_value()) {
      o.report = true;
      continue;
    }
    if (arg == "--join-split" && !a.has_inline_value()) {
      o.join_split = true;
      continue;
    }
    if (arg == "--allow-nonfinite" && !a.has_inline_value()) {
      o.allow_nonfinite = true;
      continue;
    }
    if (const int pruning = apply_pruning_option(a, o.pruning, kUsage); pruning != 0) {
      if (pruning < 0) return kExitUsage;
      continue;
    }
    const bool known = arg == "--combine" || arg == "--base" || arg == "--adapter" || arg == "--out" || arg == "--dtype" ||
                       arg == "--max-shard-size" || arg == "--threads" || arg == "--quant" || arg == "--arithmetic" ||
                       arg == "--tied-embeddings";
    if (!known) {
      if (arg.rfind("-", 0) == 0) return usage_error("unknown option '" + arg + "'", kUsage);
      return usage_error("unexpected argument '" + arg + "' (options come as --name VALUE)", kUsage);
    }
    const auto v = a.value();
    if (!v || v->empty()) return usage_error(arg + " needs a value", kUsage);
    if (arg == "--combine") {
      const std::optional<int32_t> method = combine_method(*v);
      if (!method || (*method != PEFT_COMBINE_LINEAR && *method != PEFT_COMBINE_TIES &&
                      *method != PEFT_COMBINE_DARE_LINEAR && *method != PEFT_COMBINE_DARE_TIES &&
                      *method != PEFT_COMBINE_MAGNITUDE_PRUNE))
        return usage_error("--combine must be linear, ties, dare_linear, dare_ties or magnitude_prune, not '" + *v + "'",
                           kUsage);
      o.combine = *method;
    } else if (arg == "--base") {
      o.base = *v;
    } else if (arg == "--out") {
      o.out = *v;
    } else if (arg == "--adapter") {
      o.adapters.push_back(parse_adapter(*v));
    } else if (arg == "--dtype") {
      const std::optional<int32_t> dtype = parse_dtype(*v);
      if (!dtype) return usage_error("--dtype must be keep, f32, bf16 or f16, not '" + *v + "'", kUsage);
      o.dtype = *dtype;
    } else if (arg == "--quant") {
      std::string name = *v;
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
      o.quant = peft_ggml_type_from_name(name.c_str());
      if (o.quant < 0) return usage_error("--quant must be a ggml type name such as Q8_0, Q4_K or F16, not '" + *v + "'", kUsage);
    } else if (arg == "--arithmetic") {
      if (*v == "peft")
        o.arithmetic = PEFT_MERGE_ARITHMETIC_PEFT;
      else if (*v == "ggml")
        o.arithmetic = PEFT_MERGE_ARITHMETIC_GGML;
      else
        return usage_error("--arithmetic must be peft (PEFT's order, the default) or ggml (llama-export-lora's "
                           "order on ggml's scalar build), not '" + *v + "'", kUsage);
    } else if (arg == "--tied-embeddings") {
      if (*v == "untie")
        o.tied_embeddings = PEFT_MERGE_TIED_UNTIE;
      else if (*v == "shared")
        o.tied_embeddings = PEFT_MERGE_TIED_SHARED;
      else
        return usage_error("--tied-embeddings must be untie (the merge equals the adapter's forward, the default) "
                           "or shared (PEFT's merge_and_unload), not '" + *v + "'", kUsage);
    } else if (arg == "--max-shard-size") {
      const auto size = parse_size(*v);
      if (!size)
        return usage_error("--max-shard-size must be a positive size such as 500MB, 4.5GB, 100KB or a number of "
                           "bytes, not '" + *v + "'", kUsage);
      o.max_shard = *size;
    } else if (arg == "--threads") {
      const auto n = parse_number(*v);
      if (!n || *n < 0 || *n != std::floor(*n) || *n > 4096)
        return usage_error("--threads must be a whole number from 0 (all cores) to 4096, not '" + *v + "'", kUsage);
      o.threads = static_cast<uint32_t>(*n);
    }
  }
  if (o.adapters.empty()) return usage_error("merge needs at least one --adapter", kUsage);
  if (o.out.empty()) return usage_error("merge needs --out", kUsage);
  for (AdapterArg& a : o.adapters) a.dir = resolve_folder("adapter", a.dir);
  if (o.base.empty()) {
    if (auto status = base_from_adapter(o)) return *status;
  } else {
    o.base = resolve_folder("base", o.base);
  }
  return run_merge(o);
}

const bool registered = register_command({"merge", kUsage, &merge_command});

}  // namespace
}  // namespace peftc
