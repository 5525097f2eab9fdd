// Which product a module kind merges, checked against the shapes PEFT creates for it
// (peft/tuners/lora/layer.py: Linear, Embedding, _ConvNd update_layer and get_delta_weight).
#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft::merge {

namespace {

std::string subject(std::string_view name) {
  return name.empty() ? std::string("LoRA module") : "LoRA module " + peft::quoted(std::string(name));
}

[[noreturn]] void mismatch(std::string_view name, const std::string& detail, std::span<const int64_t> weight,
                           std::span<const int64_t> a, std::span<const int64_t> b) {
  fail(PEFT_ERR_SHAPE_MISMATCH, subject(name) + ": " + detail + " (weight " + shape_text(weight) + ", lora_A " +
                                    shape_text(a) + ", lora_B " + shape_text(b) + ")");
}

void check_positive(std::span<const int64_t> shape, std::string_view name, const char* what) {
  for (int64_t d : shape)
    if (d < 1) fail(PEFT_ERR_INVALID_ARGUMENT, subject(name) + ": " + what + " " + shape_text(shape) + " has an empty dimension");
}

}  // namespace

double lora_scaling(double lora_alpha, int64_t rank, bool use_rslora) {
  if (rank < 1) fail(PEFT_ERR_INVALID_ARGUMENT, "LoRA rank " + std::to_string(rank) + " is not positive");
  const double r = static_cast<double>(rank);
  return use_rslora ? lora_alpha / std::sqrt(r) : lora_alpha / r;
}

double lora_coefficient(double weight, double scaling, const std::string& who) {
  const double product = weight * scaling;
  if (!(std::fabs(product) <= static_cast<double>(std::numeric_limits<float>::max())))
    fail(PEFT_ERR_NON_FINITE, who + ": merge weight " + python_float_repr(weight) + " times LoRA scale " +
                                  python_float_repr(scaling) + " (lora_alpha / r) is not a finite float");
  return product;
}

void require_merge_weight(double weight) {
  if (!(std::fabs(weight) <= static_cast<double>(std::numeric_limits<float>::max())))
    fail(PEFT_ERR_INVALID_ARGUMENT, "the merge weight " + python_float_repr(weight) +
                                        " is not a finite 32-bit float (at most 3.4028234663852886e+38 in magnitude)");
}

double ggml_lora_coefficient(double weight, double alpha, int64_t rank, double scaling, const std::string& who) {
  lora_coefficient(weight, scaling, who);  // the same range check as PEFT's order
  if (alpha == 0.0 || rank < 1 || scaling != alpha / static_cast<double>(rank)) return weight * scaling;
  // llama-export-lora: `scale * alpha / rank` with float operands (alpha read as a float from the GGUF).
  const float scale = static_cast<float>(weight) * static_cast<float>(alpha) / static_cast<float>(rank);
  if (!std::isfinite(scale))
    fail(PEFT_ERR_NON_FINITE, who + ": merge weight " + python_float_repr(weight) + " times lora_alpha " +
                                  python_float_repr(alpha) + " overflows a float");
  return scale;
}

DeltaLayout layout_for(ModuleKind kind, int64_t out, int64_t in) {
  if (out < 1 || in < 1)
    fail(PEFT_ERR_INVALID_ARGUMENT, "LoRA layout needs positive sizes, got out " + std::to_string(out) + ", in " +
                                        std::to_string(in));
  DeltaLayout layout;
  layout.out = out;
  layout.in = in;
  layout.transposed = kind == ModuleKind::conv1d_gpt2 || kind == ModuleKind::embedding;
  return layout;
}

DeltaLayout layout_for(ModuleKind kind, std::span<const int64_t> w, std::span<const int64_t> a,
                       std::span<const int64_t> b, int64_t groups, std::string_view name) {
  check_positive(w, name, "weight");
  check_positive(a, name, "lora_A");
  check_positive(b, name, "lora_B");
  switch (kind) {
    case ModuleKind::linear:
    case ModuleKind::conv1d_gpt2: {
      if (w.size() != 2 || a.size() != 2 || b.size() != 2) mismatch(name, "expected 2-D weight and factors", w, a, b);
      // Linear stores [out, in]; transformers Conv1D stores [in, out] (fan_in_fan_out).
      const bool gpt2 = kind == ModuleKind::conv1d_gpt2;
      const int64_t out = gpt2 ? w[1] : w[0], in = gpt2 ? w[0] : w[1];
      if (a[1] != in || b[0] != out || a[0] != b[1])
        mismatch(name, "lora_A must be [r, in] and lora_B [out, r]", w, a, b);
      return layout_for(kind, out, in);
    }
    case ModuleKind::embedding: {
      if (w.size() != 2 || a.size() != 2 || b.size() != 2) mismatch(name, "expected 2-D weight and factors", w, a, b);
      // lora_embedding_A [r, num_embeddings], lora_embedding_B [embedding_dim, r].
      if (a[1] != w[0] || b[0] != w[1] || a[0] != b[1])
        mismatch(name, "lora_embedding_A must be [r, num_embeddings] and lora_embedding_B [embedding_dim, r]", w, a, b);
      return layout_for(kind, w[1], w[0]);
    }
    case ModuleKind::conv: {
      if (groups != 1)
        fail(PEFT_ERR_UNSUPPORTED, subject(name) + ": merging a conv layer with groups=" + std::to_string(groups) +
                                       " is not supported (PEFT cannot merge _ConvNd with groups > 1 either)");
      if (w.size() < 3 || w.size() > 5 || a.size() != w.size() || b.size() != w.size())
        mismatch(name, "expected conv weight and factors of equal rank 3 to 5", w, a, b);
      // PEFT takes its 1x1 shortcut whenever dims 2:4 are (1, 1); for a 5-D (Conv3d) weight that
      // squeezes the wrong dims and the merge fails, so refuse it rather than invent a result.
      if (w.size() == 5 && w[2] == 1 && w[3] == 1)
        fail(PEFT_ERR_UNSUPPORTED, subject(name) + ": Conv3d weight " + shape_text(w) +
                                       " has kernel (1, 1, k), which PEFT's merge (get_delta_weight 1x1 path) "
                                       "cannot handle");
      // lora_A [r, in, k...] (same kernel as the base), lora_B [out, r, 1...].
      int64_t in_flat = a[1];
      for (size_t d = 2; d < w.size(); ++d) {
        if (a[d] != w[d]) mismatch(name, "lora_A must have the base kernel size", w, a, b);
        if (b[d] != 1) mismatch(name, "lora_B must have a 1x1 kernel", w, a, b);
        if (__builtin_mul_overflow(in_flat, a[d], &in_flat))
          fail(PEFT_ERR_VALIDATION_OVERFLOW, subject(name) + ": conv weight " + shape_text(w) + " is too large");
      }
      if (a[1] != w[1] || b[0] != w[0] || a[0] != b[1])
        mismatch(name, "lora_A must be [r, in, k...] and lora_B [out, r, 1...]", w, a, b);
      return layout_for(kind, w[0], in_flat);
    }
  }
  fail(PEFT_ERR_INVALID_ARGUMENT, subject(name) + ": unknown module kind");
}

}  // namespace peft::merge
