#include "peft/buffer_merge/layer_module.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/arch/key_grammar.hpp"

namespace peft {
namespace {

std::string strip_prefix(std::string_view name) {
  if (name.starts_with(kPeftPrefix)) name.remove_prefix(kPeftPrefix.size());
  return std::string(name);
}

}  // namespace

std::vector<std::string> module_candidates(std::string_view name, const Translator* translator) {
  std::vector<std::string> out;
  if (translator == nullptr) {
    const std::string plain = strip_prefix(name);
    out.push_back(plain);
    for (const char* param : {".weight", ".base_layer.weight"})
      if (plain.ends_with(param)) out.push_back(plain.substr(0, plain.size() - std::string_view(param).size()));
    return out;
  }
  const ArchTable& table = translator->table();
  if (translator->gguf()) {
    if (auto module = translator->gguf_module(name)) return {module->module};
    fail(PEFT_ERR_UNRESOLVED_KEY, "the " + table.family() + " translation table does not resolve GGUF name " +
                                      peft::quoted(std::string(name)) + " to a module");
  }
  if (auto module = table.module_to_hf(name)) out.push_back(*module);
  if (auto key = table.key_to_hf(name, false)) {
    if (auto parsed = parse_adapter_key(*key)) out.push_back(parsed->module);
  }
  if (out.empty())
    fail(PEFT_ERR_UNRESOLVED_KEY, "the " + translator->table().family() + " translation table does not resolve " +
                                      peft::quoted(std::string(name)) + " to a module");
  return out;
}

namespace {

const AdapterTensor* factor_a(const AdapterModule& m) {
  return m.find(m.kind == LayerKind::embedding ? TensorRole::lora_embedding_a : TensorRole::lora_a);
}

const AdapterTensor* factor_b(const AdapterModule& m) {
  return m.find(m.kind == LayerKind::embedding ? TensorRole::lora_embedding_b : TensorRole::lora_b);
}

struct OwnedFactors {
  std::shared_ptr<const Adapter> adapter;
  std::vector<float> a, b, magnitude, bias;
};

std::vector<int64_t> signed_shape(const std::vector<uint64_t>& shape) {
  std::vector<int64_t> out;
  for (uint64_t d : shape) out.push_back(static_cast<int64_t>(d));  // adapter shapes are small
  return out;
}

// The buffer names of a LoRA on a stacked expert parameter, as transformers names them: the fused
// parameter (in memory, and under the checkpoint's module name), and each saved per-expert tensor.
bool names_expert_buffer(const Adapter& adapter, const AdapterModule& m, const std::string& name) {
  const ExpertTarget& x = *m.expert;
  if (name == x.module + "." + x.param || name == x.checkpoint_module + "." + x.param) return true;
  for (const ExpertPart& part : per_expert_parts(m, expert_factor_shape(m, adapter.checkpoint())))
    if (name == part.tensor || name == part.module()) return true;
  return false;
}

}  // namespace

const AdapterModule& find_lora_module(const Adapter& adapter, std::string_view name, const Translator* translator) {
  refuse_activated_lora(adapter, "a merge into host buffers");
  const std::vector<std::string> names = module_candidates(name, translator);
  const AdapterModule* found = nullptr;
  for (const std::string& c : names) {
    found = adapter.find_module(c);
    if (found) break;
  }
  if (!found) {  // the base tensor a module was resolved to (a headless base, an alias)
    for (const std::string& c : names) {
      for (const AdapterModule& m : adapter.modules()) {
        const AdapterTensor* a = m.is_lora() ? factor_a(m) : nullptr;
        if (m.expert ? names_expert_buffer(adapter, m, c) : a && (a->base_tensor == c || a->base_tensor == c + ".weight"))
          found = &m;
      }
      if (found) break;
    }
  }
  if (!found)
    fail(PEFT_ERR_NOT_FOUND, "adapter " + peft::quoted(adapter.dir()) + " has no module " + peft::quoted(std::string(name)) +
                                 (names.front() != name ? " (" + peft::quoted(names.front()) + ")" : ""));
  return *found;
}

merge::DeltaLayout lora_layout(LayerKind kind, std::span<const int64_t> weight_shape, std::span<const int64_t> a_shape,
                               std::span<const int64_t> b_shape, const std::string& module) {
  merge::ModuleKind merge_kind = merge::ModuleKind::linear;
  switch (kind) {
    case LayerKind::embedding: merge_kind = merge::ModuleKind::embedding; break;
    case LayerKind::conv2d: merge_kind = merge::ModuleKind::conv; break;
    case LayerKind::linear:
    case LayerKind::conv1d: {
      merge_kind = kind == LayerKind::conv1d ? merge::ModuleKind::conv1d_gpt2 : merge::ModuleKind::linear;
      if (weight_shape.size() == 2 && a_shape.size() == 2 && b_shape.size() == 2) {
        const int64_t out = b_shape[0], in = a_shape[1];
        const bool fits_linear = weight_shape[0] == out && weight_shape[1] == in;
        const bool fits_conv1d = weight_shape[0] == in && weight_shape[1] == out;
        if (fits_linear != fits_conv1d)
          merge_kind = fits_linear ? merge::ModuleKind::linear : merge::ModuleKind::conv1d_gpt2;
      }
      break;
    }
    default:
      fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(module) + " is not a LoRA layer");
  }
  return merge::layout_for(merge_kind, weight_shape, a_shape, b_shape, 1, module);
}

LayerKind host_layer_kind(LayerKind kind, const Translator* translator) {
  return kind == LayerKind::conv1d && translator != nullptr && translator->gguf() ? LayerKind::linear : kind;
}

GgufRows host_row_order(std::string_view name, const Translator* translator) {
  if (translator == nullptr) return GgufRows::same;
  const auto module = translator->gguf_module(name);
  return module ? module->rows : GgufRows::same;
}

namespace {

struct ReorderedFactors {
  std::shared_ptr<const void> parent;  // the module's own keep_alive
  std::vector<float> b, bias, magnitude;
};

// `rows` values of `width` floats from `from`, reordered from PyTorch's order into GGUF's.
std::vector<float> reordered(const float* from, int64_t rows, int64_t width, GgufRows order, const GgufHeads& heads,
                             const std::string& what) {
  std::vector<float> out(from, from + rows * width);
  reorder_gguf_rows(order, heads, out.data(), static_cast<uint64_t>(rows), static_cast<uint64_t>(width) * sizeof(float),
                    false, what);
  return out;
}

}  // namespace

BufferMergeModule in_gguf_row_order(BufferMergeModule module, GgufRows order, const GgufHeads& heads,
                                    const std::string& what) {
  if (order == GgufRows::same) return module;
  if (module.method_params)
    fail(PEFT_ERR_UNSUPPORTED, what + ": " + peft_method_name(module.method_module->method) +
                                   " modules are not merged into GGUF buffers with a permuted row order");
  if (module.layout.transposed)
    fail(PEFT_ERR_UNSUPPORTED, what + ": a GGUF row order applies to [out, in] weights, not to a layer stored transposed");
  const int64_t out = module.layout.out;
  auto owned = std::make_shared<ReorderedFactors>();
  owned->parent = module.keep_alive;
  owned->b = reordered(module.lora_b, out, module.rank, order, heads, what);
  module.lora_b = owned->b.data();
  if (module.lora_bias != nullptr) {
    owned->bias = reordered(module.lora_bias, out, 1, order, heads, what);
    module.lora_bias = owned->bias.data();
  }
  if (module.magnitude != nullptr) {
    owned->magnitude = reordered(module.magnitude, out, 1, order, heads, what);
    module.magnitude = owned->magnitude.data();
  }
  module.keep_alive = std::move(owned);
  return module;
}

namespace {

// Another method's module: its parameters, and the layout of its layer in the weight (Linear
// [out, in], Conv1D [in, out] when `kind` says so, a LoHa/LoKr Conv2d [out, c * kh * kw]; the
// features its parameters fix must fit).
BufferMergeModule method_module(const std::shared_ptr<const Adapter>& adapter, const AdapterModule& m, LayerKind kind,
                                std::span<const int64_t> weight_shape) {
  BufferMergeModule module;
  module.layout = method_layer_layout(m, kind, weight_shape);
  module.scaling = m.scaling;
  module.method_module = std::make_shared<const AdapterModule>(m);
  module.method_params = std::make_shared<const MethodParams>(load_method_params(*adapter, m));
  module.keep_alive = adapter;
  check_conv_kernel(m, *module.method_params, weight_shape);
  // The shapes are checked now, so that a buffer that does not fit fails before any merge.
  if (effect_of(m.method) == MethodEffect::scale) {
    const merge::MethodTensor* l = module.method_params->get("ia3_l");
    const int64_t want = m.settings.ia3_feedforward ? module.layout.in : module.layout.out;
    if (l == nullptr || static_cast<int64_t>(l->values.size()) != want)
      fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": ia3_l does not fit a weight of " +
                                        shape_text(weight_shape));
  } else if (is_rotation(m.method)) {
    method_transform(m, *module.method_params, 1.0, module.layout, false);
  } else {
    method_delta(m, *module.method_params, m.scaling, module.layout);
  }
  return module;
}

// A replacement module (full tensors: LN_TUNING norms, modules_to_save copies; trainable tokens):
// its weight replacement (or token rows) and bias replacement as f32 under "weight" and "bias".
// The weight buffer is [out, in] with out = its first dimension (1 for a 1-D norm weight, stored
// as one row of `out` features: transposed, so that a bias of `out` values fits).
BufferMergeModule replacement_module(const std::shared_ptr<const Adapter>& adapter, const AdapterModule& m,
                                     std::span<const int64_t> weight_shape) {
  const Checkpoint& ckpt = adapter->checkpoint();
  const std::string who = "module " + peft::quoted(m.name);
  if (weight_shape.empty()) fail(PEFT_ERR_SHAPE_MISMATCH, who + ": the weight buffer has no shape");
  int64_t inner = 1;
  for (size_t i = 1; i < weight_shape.size(); ++i) inner *= weight_shape[i];
  BufferMergeModule module;
  module.layout = weight_shape.size() == 1 ? merge::DeltaLayout{weight_shape[0], 1, true}
                                           : merge::DeltaLayout{weight_shape[0], inner, false};
  auto params = std::make_shared<MethodParams>();
  for (const AdapterTensor& t : m.tensors) {
    const std::string param = t.role == TensorRole::trainable_tokens_delta ? "weight" : suffix_parameter(t.suffix);
    if (param != "weight" && param != "bias") continue;
    merge::MethodTensor value;
    value.shape = signed_shape(ckpt.tensor(t.index).shape);
    value.values = ckpt.read_f32(t.index);
    const int64_t rows = m.kind == LayerKind::trainable_tokens ? static_cast<int64_t>(m.token_indices.size())
                         : param == "bias"                     ? 1
                                                               : module.layout.rows();
    const int64_t cols = param == "bias" ? module.layout.out : module.layout.cols();
    if (static_cast<int64_t>(value.values.size()) != rows * cols ||
        (param == "weight" && m.kind == LayerKind::full && value.shape != std::vector<int64_t>(weight_shape.begin(), weight_shape.end())))
      fail(PEFT_ERR_SHAPE_MISMATCH, who + ": " + t.key + " is " + shape_text(value.shape) +
                                        ", which does not fit a weight of " + shape_text(weight_shape));
    params->tensors.emplace(param, std::move(value));
  }
  if (params->get("weight") == nullptr)
    fail(PEFT_ERR_UNSUPPORTED, who + " replaces no weight (only its bias); pass it by its weight's module instead");
  module.method_module = std::make_shared<const AdapterModule>(m);
  module.method_params = std::move(params);
  module.keep_alive = adapter;
  return module;
}

BufferMergeModule module_factors(const std::shared_ptr<const Adapter>& adapter, const AdapterModule& m, LayerKind kind,
                                 std::span<const int64_t> weight_shape) {
  if (!m.is_lora()) return replacement_module(adapter, m, weight_shape);
  if (effect_of(m.method) != MethodEffect::lora) return method_module(adapter, m, kind, weight_shape);
  const Checkpoint& ckpt = adapter->checkpoint();
  const AdapterTensor* a = factor_a(m);
  const AdapterTensor* b = factor_b(m);
  if (!a || !b) fail(PEFT_ERR_INTERNAL, "LoRA module " + peft::quoted(m.name) + " has no factors");
  const auto a_shape = signed_shape(ckpt.tensor(a->index).shape);
  const auto b_shape = signed_shape(ckpt.tensor(b->index).shape);

  auto owned = std::make_shared<OwnedFactors>();
  owned->adapter = adapter;
  BufferMergeModule module;
  module.layout = lora_layout(kind, weight_shape, a_shape, b_shape, m.name);
  owned->a = ckpt.read_f32(a->index);
  owned->b = ckpt.read_f32(b->index);
  // DoRA's magnitude and lora_B's bias: one value per output channel, when the module has them.
  auto read_per_output = [&](TensorRole role, const char* what, std::vector<float>& into) {
    const AdapterTensor* t = m.find(role);
    if (t == nullptr) return;
    into = ckpt.read_f32(t->index);
    if (static_cast<int64_t>(into.size()) != module.layout.out)
      fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": " + what + " has " +
                                        std::to_string(into.size()) + " values for " +
                                        std::to_string(module.layout.out) + " output channels");
  };
  read_per_output(TensorRole::lora_magnitude, "lora_magnitude_vector", owned->magnitude);
  read_per_output(TensorRole::lora_b_bias, "lora_B.bias", owned->bias);
  module.lora_a = owned->a.data();
  module.lora_b = owned->b.data();
  module.rank = a_shape.at(0);
  module.scaling = m.scaling;
  module.magnitude = owned->magnitude.empty() ? nullptr : owned->magnitude.data();
  module.lora_bias = owned->bias.empty() ? nullptr : owned->bias.data();
  module.keep_alive = std::move(owned);
  return module;
}

}  // namespace

BufferMergeModule expert_pair_module(const std::shared_ptr<const ExpertFactors>& factors, const ExpertPart& part,
                                     double scaling) {
  return expert_pair_module(factors, part.expert, part.row_begin, part.rows, false, scaling, part.row_stride);
}

BufferMergeModule expert_pair_module(const std::shared_ptr<const ExpertFactors>& factors, int64_t e, int64_t row_begin,
                                     int64_t rows, bool transposed, double scaling, int64_t row_stride) {
  struct Owned {
    std::shared_ptr<const ExpertFactors> factors;
    std::vector<float> b;
  };
  auto owned = std::make_shared<Owned>(Owned{factors, factors->b(e, row_begin, rows, row_stride)});
  BufferMergeModule module;
  module.layout = merge::DeltaLayout{rows, factors->shape().in, transposed};
  module.lora_a = factors->a(e);
  module.lora_b = owned->b.data();
  module.rank = factors->shape().rank;
  module.scaling = scaling;
  module.keep_alive = std::move(owned);
  return module;
}

BufferMergeModule expert_buffer_module(const std::shared_ptr<const ExpertFactors>& factors, const AdapterModule& m,
                                       std::string_view name, std::span<const int64_t> weight_shape) {
  const ExpertTarget& x = *m.expert;
  const ExpertFactorShape& f = factors->shape();
  const std::vector<int64_t> shape(weight_shape.begin(), weight_shape.end());
  auto mismatch = [&](const std::vector<int64_t>& want) {
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + " (parameter " +
                                      peft::quoted(x.module + "." + x.param) + "): buffer " +
                                      peft::quoted(std::string(name)) + " is " + shape_text(shape) +
                                      ", the adapter's factors make " + shape_text(want));
  };
  const std::string plain = module_candidates(name, nullptr).front();
  if (plain == x.module + "." + x.param || plain == x.checkpoint_module + "." + x.param) {
    const std::vector<int64_t> want = x.transposed ? std::vector<int64_t>{f.experts, f.in, f.out}
                                                   : std::vector<int64_t>{f.experts, f.out, f.in};
    if (shape != want) mismatch(want);
    BufferMergeModule fused;
    fused.layout = x.transposed ? merge::DeltaLayout{f.out, f.experts * f.in, true}
                                : merge::DeltaLayout{f.experts * f.out, f.in, false};
    for (int64_t e = 0; e < f.experts; ++e) {
      auto slice =
          std::make_shared<const BufferMergeModule>(expert_pair_module(factors, e, 0, f.out, x.transposed, m.scaling));
      fused.slices.push_back({e * slice->layout.rows(), std::move(slice)});
    }
    return fused;
  }
  for (const ExpertPart& part : per_expert_parts(m, f)) {
    if (plain != part.tensor && plain != part.module()) continue;
    const std::vector<int64_t> want{part.rows, f.in};
    if (shape != want) mismatch(want);
    return expert_pair_module(factors, part, m.scaling);
  }
  fail(PEFT_ERR_NOT_FOUND, "module " + peft::quoted(m.name) + " adapts " + peft::quoted(x.module + "." + x.param) +
                               ", which has no buffer named " + peft::quoted(std::string(name)));
}

namespace {

// Parts of a LoRA on a stacked expert parameter (per_expert_parts of module, `factors` read from it)
// into one stacked GGUF tensor of `weight_shape` [slices, rows, in] (llama.cpp's ffn_*_exps): each
// part, one expert's rows, merged into its slice by its own pair. PEFT_ERR_SHAPE_MISMATCH naming
// `what` when a part does not fit its slice.
struct StackedExpertPart {
  ExpertPart part;
  uint64_t slice = 0;
};

BufferMergeModule stacked_expert_module(const std::shared_ptr<const ExpertFactors>& factors, const AdapterModule& m,
                                        std::span<const StackedExpertPart> parts,
                                        std::span<const int64_t> weight_shape, const std::string& what) {
  const ExpertFactorShape& f = factors->shape();
  if (weight_shape.size() != 3)
    fail(PEFT_ERR_SHAPE_MISMATCH, what + " is " + shape_text(weight_shape) + "; a stacked expert tensor has 3 dimensions");
  const int64_t rows = weight_shape[1];
  BufferMergeModule stacked;
  stacked.layout = merge::DeltaLayout{weight_shape[0] * rows, weight_shape[2], false};
  for (const StackedExpertPart& s : parts) {
    if (s.part.rows != rows || f.in != weight_shape[2] || s.slice >= static_cast<uint64_t>(weight_shape[0]))
      fail(PEFT_ERR_SHAPE_MISMATCH,
           what + ": expert " + std::to_string(s.part.expert) + "'s part " + shape_text(std::vector<int64_t>{s.part.rows, f.in}) +
               " of " + peft::quoted(m.expert->module + "." + m.expert->param) + " has no slice " +
               std::to_string(s.slice) + " in a tensor of shape " + shape_text(weight_shape));
    auto pair = std::make_shared<const BufferMergeModule>(expert_pair_module(factors, s.part, m.scaling));
    stacked.slices.push_back({static_cast<int64_t>(s.slice) * rows, std::move(pair)});
  }
  return stacked;
}

}  // namespace

std::optional<StackedBufferModule> gguf_stacked_buffer_module(const std::shared_ptr<const Adapter>& adapter,
                                                              std::string_view name,
                                                              std::span<const int64_t> weight_shape,
                                                              const Translator* translator) {
  if (translator == nullptr || weight_shape.size() != 3) return std::nullopt;
  const std::vector<std::string> slices =
      translator->gguf_slice_modules(name, static_cast<uint64_t>(weight_shape[0]));
  if (slices.empty()) return std::nullopt;
  refuse_activated_lora(*adapter, "a merge into host buffers");
  for (const AdapterModule& m : adapter->modules()) {
    if (!m.expert) continue;
    std::vector<StackedExpertPart> parts;
    for (const ExpertPart& part : per_expert_parts(m, expert_factor_shape(m, adapter->checkpoint()))) {
      const auto slice = std::find(slices.begin(), slices.end(), part.module());
      if (slice != slices.end()) parts.push_back({part, static_cast<uint64_t>(slice - slices.begin())});
    }
    if (parts.empty()) continue;
    auto factors = std::make_shared<const ExpertFactors>(m, adapter->checkpoint());
    return StackedBufferModule{&m, stacked_expert_module(factors, m, parts, weight_shape,
                                                         "GGUF weight " + peft::quoted(std::string(name)))};
  }
  fail(PEFT_ERR_NOT_FOUND, "adapter " + peft::quoted(adapter->dir()) + " adapts no expert of the stacked GGUF tensor " +
                               peft::quoted(std::string(name)) + " (" + peft::quoted(slices.front()) + " ...)");
}

BufferMergeModule buffer_merge_module(const std::shared_ptr<const Adapter>& adapter, const AdapterModule& m,
                                      std::span<const int64_t> weight_shape) {
  return module_factors(adapter, m, m.kind, weight_shape);
}

BufferMergeModule host_buffer_module(const std::shared_ptr<const Adapter>& adapter, const AdapterModule& m,
                                     std::string_view name, std::span<const int64_t> weight_shape,
                                     const Translator* translator) {
  if (m.expert)  // by the HuggingFace name a translator gives the host's
    return expert_buffer_module(std::make_shared<const ExpertFactors>(m, adapter->checkpoint()), m,
                                translator ? module_candidates(name, translator).front() : std::string(name),
                                weight_shape);
  BufferMergeModule module = module_factors(adapter, m, host_layer_kind(m.kind, translator), weight_shape);
  const GgufRows order = host_row_order(name, translator);
  if (order == GgufRows::same) return module;
  if (!m.is_lora())
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + " replaces a tensor whose GGUF rows are reordered; "
                                   "replacements are merged in HuggingFace row order only");
  return in_gguf_row_order(std::move(module), order, translator->gguf()->heads,
                           "GGUF weight " + peft::quoted(std::string(name)));
}

}  // namespace peft
