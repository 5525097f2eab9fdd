#include "peft/merge/gguf_lora_input.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "core/error.hpp"
#include "core/python_json.hpp"
#include "core/shape.hpp"
#include "core/text.hpp"
#include "gguf/ggml_type.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {
namespace {

// Problems in the order of their codes' precedence (gguf_lora_input.hpp).
constexpr std::array<int32_t, 5> kCodes = {PEFT_ERR_INVALID_ARGUMENT, PEFT_ERR_INVALID_CHECKPOINT,
                                           PEFT_ERR_UNRESOLVED_KEY, PEFT_ERR_SHAPE_MISMATCH, PEFT_ERR_UNSUPPORTED};

struct Problems {
  std::array<std::vector<std::string>, kCodes.size()> lines;

  void add(int32_t code, const std::string& line) {
    for (size_t k = 0; k < kCodes.size(); ++k)
      if (kCodes[k] == code) lines[k].push_back(line);
  }

  void raise(const std::string& path) const {
    size_t count = 0;
    int32_t code = 0;
    for (size_t k = 0; k < kCodes.size(); ++k) {
      if (code == 0 && !lines[k].empty()) code = kCodes[k];
      count += lines[k].size();
    }
    if (count == 0) return;
    std::string message = peft::quoted(path) + ": the GGUF LoRA adapter does not fit the base (" +
                          std::to_string(count) + " problem" + (count == 1 ? "" : "s") + "):";
    for (size_t k = 0; k < kCodes.size(); ++k)
      for (const std::string& line : lines[k]) message += "\n  " + std::string(code_name(kCodes[k])) + ": " + line;
    fail(code, message);
  }
};

std::string type_name(const TensorInfo& info) {
  const auto type = ggml_type(static_cast<uint32_t>(info.ggml_type));
  return type ? std::string(type->name) : "an unknown type";
}

// The factors of one term, owned by its module's keep_alive.
struct Factors {
  std::vector<float> a, b;
};

// A checked pair: the base tensor and the factors' shapes (PyTorch order, as TensorInfo holds them).
struct CheckedPair {
  size_t tensor = 0;
  size_t a = 0, b = 0;
  bool embedding = false;
  uint64_t rank = 0, out = 0, in = 0;
  uint64_t slices = 1;  // a stacked pair's slices (the base tensor's outermost dimension), else 1
};

}  // namespace

std::vector<GgufLoraTerm> gguf_lora_terms(const GgufLoraFile& lora, double weight, const Checkpoint& base,
                                          const std::string& base_architecture) {
  const Checkpoint& file = *lora.file;
  Problems problems;
  if (lora.architecture != base_architecture)
    problems.add(PEFT_ERR_INVALID_ARGUMENT, "the adapter is for GGUF architecture " + peft::quoted(lora.architecture) +
                                                ", the base is " + peft::quoted(base_architecture));
  for (const std::string& name : lora.others)
    problems.add(PEFT_ERR_UNSUPPORTED, "tensor " + peft::quoted(name) +
                                           " is not a LoRA factor (\"<base tensor>.lora_a\" or \".lora_b\")");
  if (lora.pairs.empty()) problems.add(PEFT_ERR_INVALID_CHECKPOINT, "the file holds no LoRA pair");

  std::vector<CheckedPair> checked;
  for (const GgufLoraPair& pair : lora.pairs) {
    const std::string what = "tensor " + peft::quoted(pair.target);
    if (!pair.a || !pair.b) {
      problems.add(PEFT_ERR_INVALID_CHECKPOINT,
                   what + ": " + peft::quoted(pair.target + (pair.a ? ".lora_b" : ".lora_a")) + " is missing");
      continue;
    }
    const TensorInfo& a = file.tensor(*pair.a);
    const TensorInfo& b = file.tensor(*pair.b);
    bool readable = true;
    for (const TensorInfo* factor : {&a, &b}) {
      if (!gguf_lora_factor_readable(*factor)) {
        problems.add(PEFT_ERR_UNSUPPORTED, "factor " + peft::quoted(factor->name) + " is " + type_name(*factor) +
                                               "; factors are read from F32, F16, BF16 and Q8_0");
        readable = false;
      }
    }
    // 2-D pairs, or 3-D pairs on a stacked tensor (Mixtral's experts: one pair per slice, outermost).
    const bool stacked = a.shape.size() == 3 && b.shape.size() == 3;
    if (!stacked && (a.shape.size() != 2 || b.shape.size() != 2)) {
      problems.add(PEFT_ERR_INVALID_CHECKPOINT, what + ": LoRA factors must be 2-D (or 3-D for stacked tensors), lora_a is " +
                                                    shape_text(a.shape) + " and lora_b " + shape_text(b.shape));
      continue;
    }
    const auto index = base.find(pair.target);
    if (!index) {
      problems.add(PEFT_ERR_UNRESOLVED_KEY, what + " is not in the base");
      continue;
    }
    const TensorInfo& w = base.tensor(*index);
    // The shapes of one slice: the stacked dimension dropped.
    const auto slice_shape = [stacked](const std::vector<uint64_t>& shape) {
      return stacked && !shape.empty() ? std::vector<uint64_t>(shape.begin() + 1, shape.end()) : shape;
    };
    const std::vector<uint64_t> as = slice_shape(a.shape), bs = slice_shape(b.shape), ws = slice_shape(w.shape);
    CheckedPair c;
    c.tensor = *index;
    c.a = *pair.a;
    c.b = *pair.b;
    c.slices = stacked ? a.shape[0] : 1;
    c.embedding = pair.target.starts_with("token_embd");  // as llama-export-lora tells them apart
    // Linear: lora_a [r, in], lora_b [out, r], the base [out, in]. Embedding: lora_a = A^T [num, r],
    // lora_b [dim, r], the base [num, dim]. r is lora_b's last dimension (ggml's ne[0]).
    c.rank = bs[1];
    const bool same_stack = !stacked || (w.shape.size() == 3 && b.shape[0] == c.slices && w.shape[0] == c.slices);
    const bool fits = same_stack && ws.size() == 2 && c.rank > 0 && !(stacked && c.embedding) &&
                      (c.embedding ? as[1] == c.rank && as[0] == ws[0] && bs[0] == ws[1]
                                   : as[0] == c.rank && as[1] == ws[1] && bs[0] == ws[0]);
    if (!fits) {
      problems.add(PEFT_ERR_SHAPE_MISMATCH,
                   what + " " + shape_text(w.shape) + " does not fit lora_a " + shape_text(a.shape) + " and lora_b " +
                       shape_text(b.shape) + (c.embedding ? " (token_embd: lora_a [num, r], lora_b [dim, r])"
                                                        : " (lora_a [r, in], lora_b [out, r], each with the base's "
                                                          "stacked dimension first when it has one)"));
      continue;
    }
    if (!readable) continue;
    c.out = c.embedding ? ws[1] : ws[0];
    c.in = c.embedding ? ws[0] : ws[1];
    checked.push_back(c);
  }
  problems.raise(lora.path);

  std::vector<GgufLoraTerm> terms;
  for (const CheckedPair& c : checked) {
    auto factors = std::make_shared<Factors>();
    factors->a = read_gguf_lora_factor(file, c.a);
    factors->b = read_gguf_lora_factor(file, c.b);
    if (c.embedding) factors->a = transposed(factors->a, c.in, c.rank);  // A^T [num, r] -> A [r, num]
    // llama-export-lora's scale, in its f32 arithmetic: weight * alpha / rank, or weight for alpha 0.
    const float user = static_cast<float>(weight);
    const float scale = lora.alpha != 0.0f ? user * lora.alpha / static_cast<float>(c.rank) : user;
    if (!std::isfinite(scale))
      fail(PEFT_ERR_NON_FINITE, lora.path + ": merge weight " + python_float_repr(weight) + " times adapter.lora.alpha " +
                                    python_float_repr(lora.alpha) + " / rank " + std::to_string(c.rank) +
                                    " overflows a 32-bit float");
    for (uint64_t slice = 0; slice < c.slices; ++slice) {
      GgufLoraTerm term;
      term.tensor = c.tensor;
      term.slice = slice;
      term.module.layout = merge::layout_for(c.embedding ? merge::ModuleKind::embedding : merge::ModuleKind::linear,
                                             static_cast<int64_t>(c.out), static_cast<int64_t>(c.in));
      term.module.lora_a = factors->a.data() + slice * c.rank * c.in;
      term.module.lora_b = factors->b.data() + slice * c.out * c.rank;
      term.module.rank = static_cast<int64_t>(c.rank);
      term.module.scaling = scale;
      term.module.keep_alive = factors;
      terms.push_back(std::move(term));
    }
  }
  return terms;
}

}  // namespace peft
