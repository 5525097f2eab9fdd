#include "peft/lowrank/adapter_delta.hpp"

#include <memory>
#include <optional>
#include <span>

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/adapter/method_params.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {
namespace {

std::string module_text(const AdapterModule& m) {
  return std::string(peft_method_name(m.method)) + " module " + peft::quoted(m.name);
}

ModuleDelta lora_delta(const Adapter& adapter, const AdapterModule& m) {
  const AdapterTensor* a = m.find(TensorRole::lora_a);
  const AdapterTensor* b = m.find(TensorRole::lora_b);
  if (!a || !b) fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(m.name) + " lacks lora_A or lora_B");
  const Checkpoint& ckpt = adapter.checkpoint();
  const auto& a_shape = ckpt.tensor(a->index).shape;
  const auto& b_shape = ckpt.tensor(b->index).shape;
  if (a_shape.size() != 2 || b_shape.size() != 2 || a_shape[0] != b_shape[1])
    fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": lora_A " + shape_text(a_shape) +
                                      " and lora_B " + shape_text(b_shape) + " do not form a product");
  const auto rank = static_cast<int64_t>(a_shape[0]);
  const auto in = static_cast<int64_t>(a_shape[1]), out = static_cast<int64_t>(b_shape[0]);
  const bool conv1d = m.kind == LayerKind::conv1d;
  const merge::DeltaLayout layout =
      merge::layout_for(conv1d ? merge::ModuleKind::conv1d_gpt2 : merge::ModuleKind::linear, out, in);
  const std::vector<float> fa = ckpt.read_f32(a->index), fb = ckpt.read_f32(b->index);
  const merge::LoraFactors term{fa.data(), fb.data(), rank, m.scaling};
  ModuleDelta d;
  d.rows = layout.rows();
  d.cols = layout.cols();
  d.transposed = layout.transposed;
  d.values = merge::compute_delta(layout, std::span<const merge::LoraFactors>(&term, 1), merge::ExecOptions{1});
  return d;
}

// out x in of an additive module's layer from its parameters' shapes (no base): the row's
// derivation (0 where the parameters do not fix it).
MethodFeatures features_from_params(const AdapterModule& m, const MethodParams& p) {
  const MethodRow& row = method_row(m.method);
  if (row.features == nullptr) return {};
  return row.features(
      [&](std::string_view name) {
        const merge::MethodTensor* t = p.get(std::string(name));
        return t != nullptr ? t->shape : std::vector<int64_t>{};
      },
      p.settings);
}

// Stored [rows, cols] from PyTorch's [out, in] order (transposed for a GPT-2 Conv1D layout).
ModuleDelta stored(std::vector<float> delta, const merge::DeltaLayout& layout) {
  ModuleDelta d;
  d.rows = layout.rows();
  d.cols = layout.cols();
  d.transposed = layout.transposed;
  if (!layout.transposed) {
    d.values = std::move(delta);
    return d;
  }
  d.values.resize(delta.size());
  for (int64_t o = 0; o < layout.out; ++o)
    for (int64_t i = 0; i < layout.in; ++i)
      d.values[static_cast<size_t>(i * layout.out + o)] = delta[static_cast<size_t>(o * layout.in + i)];
  return d;
}

// The module laid out against its base weight (found by name; NOT_FOUND if the base lacks it), whose
// index goes to `weight_index`.
BufferMergeModule module_against_base(const Adapter& adapter, const AdapterModule& m, const BaseModel& base,
                                      size_t& weight_index) {
  const std::optional<size_t> wi = base.find(m.name, "weight", adapter.table().get());
  if (!wi) fail(PEFT_ERR_NOT_FOUND, "base model " + peft::quoted(base.dir) + " has no weight for " + module_text(m));
  weight_index = *wi;
  std::vector<int64_t> shape;
  for (uint64_t d : base.weight_shape(*wi)) shape.push_back(static_cast<int64_t>(d));
  // A non-owning pointer: the module (and its parameters) live only during this call.
  const std::shared_ptr<const Adapter> view(std::shared_ptr<const Adapter>(), &adapter);
  return buffer_merge_module(view, m, shape);
}

}  // namespace

bool is_multiplicative(const AdapterModule& m) {
  const MethodEffect effect = method_row(m.method).effect;
  return effect == MethodEffect::scale || effect == MethodEffect::rotation || method_reads_weight(m);
}

bool has_module_delta(const Adapter& adapter, const AdapterModule& m, bool with_base, std::string& why,
                      bool bias_apart) {
  if (m.expert) {
    why = "LoRA on a stacked expert parameter (target_parameters), whose delta is not one matrix";
    return false;
  }
  if (adapter.config().use_dora) {
    why = "a DoRA module (its change depends on the base weight's norm)";
    return false;
  }
  if (m.kind != LayerKind::linear && m.kind != LayerKind::conv1d) {
    why = std::string("a module of kind ") + layer_kind_name(m.kind) + " (only Linear and Conv1D layers convert, as in PEFT)";
    return false;
  }
  // Without a base a Conv2d LoHa/LoKr still shows in its 4-D parameters (the CP cores, a whole
  // lokr_w2 [b, d, kh, kw]); PEFT's LoHa/LoKr Conv2d layers do not support LoRA conversion either.
  for (const AdapterTensor& t : m.tensors)
    if (t.role == TensorRole::method_param && adapter.checkpoint().tensor(t.index).shape.size() == 4) {
      why = std::string("a ") + peft_method_name(m.method) + " module on a Conv2d layer (its " + t.suffix +
            " is 4-D; only Linear and Conv1D layers convert, as in PEFT)";
      return false;
    }
  const MethodRow& row = method_row(m.method);
  const bool lora = row.effect == MethodEffect::lora;
  for (const AdapterTensor& t : m.tensors)
    if (lora ? t.role != TensorRole::lora_a && t.role != TensorRole::lora_b &&
                   !(bias_apart && t.role == TensorRole::lora_b_bias)
             : t.role != TensorRole::method_param) {
      why = "a module with tensor " + peft::quoted(t.key) + " (lora_B.bias and other tensors do not convert)";
      return false;
    }
  if (lora || with_base) return true;
  if (is_multiplicative(m)) {
    why = std::string("of method ") + peft_method_name(m.method) +
          ", whose change multiplies the base weight: converting it needs the base model (dW = W' - W; "
          "peftc --base, peft_lowrank_options_set_base())";
    return false;
  }
  if (!row.converts_without_base) {
    why = std::string("of method ") + peft_method_name(m.method) +
          ", whose layer shape comes from the base model: give one (peftc --base, peft_lowrank_options_set_base())";
    return false;
  }
  return true;
}

ModuleDelta module_delta(const Adapter& adapter, const AdapterModule& m, const BaseModel* base, bool bias_apart) {
  std::string why;
  if (!has_module_delta(adapter, m, base != nullptr, why, bias_apart))
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + " is " + why);
  if (method_row(m.method).effect == MethodEffect::lora) return lora_delta(adapter, m);
  if (base == nullptr) {
    const MethodParams params = load_method_params(adapter, m);
    const auto [out, in] = features_from_params(m, params);
    if (out < 1 || in < 1)
      fail(PEFT_ERR_SHAPE_MISMATCH, module_text(m) + ": its parameters do not give the layer's features");
    const merge::DeltaLayout layout = merge::layout_for(
        m.kind == LayerKind::conv1d ? merge::ModuleKind::conv1d_gpt2 : merge::ModuleKind::linear, out, in);
    return stored(method_delta(m, params, m.scaling, layout), layout);
  }
  size_t wi = 0;
  const BufferMergeModule module = module_against_base(adapter, m, *base, wi);
  if (!is_multiplicative(m))
    return stored(method_delta(m, *module.method_params, m.scaling, module.layout), module.layout);

  if (method_row(m.method).effect == MethodEffect::scale && !m.settings.ia3_feedforward && base->find(m.name, "bias", adapter.table().get()))
    fail(PEFT_ERR_UNSUPPORTED, module_text(m) + " also scales the layer's bias, which a plain LoRA cannot hold");
  const std::vector<float> w = base->weights->read_f32(wi);
  std::vector<float> changed = w;
  const merge::WeightView view_f32{changed.data(), DType::F32, module.layout.rows(), module.layout.cols()};
  BufferMergeOptions options;
  options.threads = 1;  // module_delta runs on a worker thread already
  BufferMerge::apply(view_f32, nullptr, module, options);
  for (size_t k = 0; k < changed.size(); ++k) changed[k] -= w[k];
  ModuleDelta d;
  d.rows = module.layout.rows();
  d.cols = module.layout.cols();
  d.transposed = module.layout.transposed;
  d.values = std::move(changed);
  return d;
}

bool has_exact_lora(const AdapterModule& m) { return m.method == PeftMethod::miss && !m.settings.miss_bat; }

ExactLora exact_lora(const Adapter& adapter, const AdapterModule& m, const BaseModel* base) {
  std::string why;
  if (!has_exact_lora(m)) fail(PEFT_ERR_INTERNAL, module_text(m) + " has no exact LoRA form");
  if (!has_module_delta(adapter, m, base != nullptr, why))
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + " is " + why);
  size_t wi = 0;
  const BufferMergeModule module = module_against_base(adapter, m, *base, wi);
  // The full delta checks the block against the layer (miss_delta's SHAPE_MISMATCH) before it is used.
  (void)method_delta(m, *module.method_params, m.scaling, module.layout);
  const merge::MethodTensor* block = module.method_params->get("miss_block");
  if (block == nullptr || block->shape.size() != 2)
    fail(PEFT_ERR_INVALID_CHECKPOINT, module_text(m) + " lacks a 2-D miss_block");
  const int64_t r = block->shape[0], cols = block->shape[1];
  const int64_t out = module.layout.out, in = module.layout.in;
  ExactLora f;
  f.rank = r;
  f.a.assign(static_cast<size_t>(r * in), 0.0f);
  for (int64_t j = 0; j < in; ++j) f.a[static_cast<size_t>((j % r) * in + j)] = 1.0f;
  f.b.resize(static_cast<size_t>(out * r));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < r; ++k)
      f.b[static_cast<size_t>(o * r + k)] = block->values[static_cast<size_t>(k * cols + o % cols)];
  return f;
}

}  // namespace peft
