// peftc control combine OUT INPUT[:STRENGTH]... [--model-hint TEXT] [--layers FIRST-LAST]:
// control vectors (llama.cpp's GGUF or safetensors) added at their strengths, as llama.cpp's
// --control-vector-scaled loads several, and written as OUT (.gguf or .safetensors). One input is a
// conversion. --layers keeps the directions of layers FIRST..LAST (llama.cpp's
// --control-vector-layer-range).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "combine_cli.hpp"
#include "command.hpp"

namespace peftc {
namespace {

constexpr const char* kUsage =
    "control combine OUT.gguf|OUT.safetensors INPUT[:STRENGTH]... [--model-hint TEXT] [--layers FIRST-LAST]";

using Vector = Owned<peft_control_vector, peft_control_vector_free>;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool parse_layers(const std::string& text, int64_t& first, int64_t& last) {
  const size_t dash = text.find('-');
  if (dash == std::string::npos) return false;
  const auto a = parse_number(text.substr(0, dash)), b = parse_number(text.substr(dash + 1));
  if (!a || !b || *a < 0 || *b < *a || *a != static_cast<int64_t>(*a) || *b != static_cast<int64_t>(*b)) return false;
  first = static_cast<int64_t>(*a);
  last = static_cast<int64_t>(*b);
  return true;
}

int run_control_combine(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  std::string model_hint;
  bool has_hint = false;
  int64_t first = 0, last = INT64_MAX;
  for (Arguments a(args); a.next();) {
    if (a.name() == "--model-hint") {
      const auto value = a.value();
      if (!value) return usage_error("--model-hint needs a value", kUsage);
      model_hint = *value;
      has_hint = true;
    } else if (a.name() == "--layers") {
      const auto value = a.value();
      if (!value || !parse_layers(*value, first, last))
        return usage_error("--layers needs FIRST-LAST, two layer numbers with FIRST <= LAST", kUsage);
    } else if (is_option(a.raw())) {
      return usage_error("unknown option " + a.raw(), kUsage);
    } else {
      positional.push_back(a.raw());
    }
  }
  if (positional.size() < 2) return usage_error("OUT and at least one INPUT are needed", kUsage);
  const std::string& out = positional[0];
  int32_t format = -1;
  if (ends_with(out, ".gguf")) format = PEFT_FORMAT_GGUF;
  if (ends_with(out, ".safetensors")) format = PEFT_FORMAT_SAFETENSORS;
  if (format < 0) return usage_error("OUT must end in .gguf or .safetensors", kUsage);

  Vector sum;
  for (size_t i = 1; i < positional.size(); ++i) {
    // "path:0.5" as a weighted input; a path without a numeric ":STRENGTH" has strength 1.
    std::string path;
    double strength = 1.0;
    if (!parse_weighted(positional[i], path, strength)) path = positional[i];
    Vector input;
    if (peft_error* err = peft_control_vector_open(path.c_str(), &input.p)) return report(err);
    if (sum.p == nullptr) {
      const char* hint = has_hint ? model_hint.c_str() : peft_control_vector_model_hint(input.p);
      if (peft_error* err = peft_control_vector_new(peft_control_vector_n_embd(input.p), hint, &sum.p)) return report(err);
    }
    if (peft_error* err = peft_control_vector_add(sum.p, input.p, strength)) return report(err);
  }

  Vector kept;
  if (peft_error* err = peft_control_vector_new(peft_control_vector_n_embd(sum.p), peft_control_vector_model_hint(sum.p),
                                                &kept.p))
    return report(err);
  for (size_t i = 0; i < peft_control_vector_layer_count(sum.p); ++i) {
    const int64_t layer = peft_control_vector_layer(sum.p, i);
    if (layer < first || layer > last) continue;
    if (peft_error* err = peft_control_vector_set_direction(kept.p, layer, PEFT_DTYPE_F32,
                                                            peft_control_vector_direction(sum.p, layer)))
      return report(err);
  }
  if (peft_error* err = peft_control_vector_save(kept.p, out.c_str(), format)) return report(err);
  std::printf("wrote %s: %zu layer(s) of %llu values\n", out.c_str(), peft_control_vector_layer_count(kept.p),
              static_cast<unsigned long long>(peft_control_vector_n_embd(kept.p)));
  return kExitOk;
}

const bool registered = register_command({"control combine", kUsage, run_control_combine});

}  // namespace
}  // namespace peftc
