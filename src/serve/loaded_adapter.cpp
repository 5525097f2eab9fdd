#include "serve/loaded_adapter.hpp"

#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/base/expert_base.hpp"
#include "safetensors/safetensors_file.hpp"

namespace peft::serve {
namespace {

// One tensor to load: where it is in the checkpoint and how many elements it has.
struct TensorPlan {
  size_t index = 0;
  uint64_t elements = 0;
};

// One LoRA layer to load: the layer without its offsets, and its tensors (A, B, then the optional
// bias and magnitude, in the order they are laid out in the storage).
struct LayerPlan {
  LoadedLayer layer;
  TensorPlan a, b;
  std::optional<TensorPlan> bias, magnitude;
};

void require_storage(DType storage) {
  if (storage != DType::F32 && storage != DType::BF16 && storage != DType::F16)
    fail(PEFT_ERR_INVALID_ARGUMENT, "the storage dtype of loaded adapters must be F32, BF16 or F16, not " +
                                        std::string(dtype_name(storage)));
}

std::vector<int64_t> signed_shape(const std::vector<uint64_t>& shape) {
  std::vector<int64_t> out;
  for (uint64_t d : shape) out.push_back(static_cast<int64_t>(d));  // header dimensions fit 63 bits
  return out;
}

// The tensor of `role`, checked to be a dtype the storage can be converted from.
TensorPlan tensor_plan(const Adapter& adapter, const AdapterModule& m, const AdapterTensor& t, DType storage) {
  const TensorInfo& info = adapter.checkpoint().tensor(t.index);
  if (!is_float(info.dtype) || dtype_bits(info.dtype) < 16 || !can_convert(info.dtype, storage))
    fail(PEFT_ERR_UNSUPPORTED, "adapter " + quoted(adapter.dir()) + ": tensor " + quoted(t.key) + " of module " +
                                   quoted(m.name) + " is " + std::string(dtype_name(info.dtype)) +
                                   "; served LoRA layers need F64, F32, F16 or BF16 tensors");
  return {t.index, element_count(info)};
}

// Checks that an optional per-output-channel tensor (lora_B.bias, DoRA magnitude) has b_rows values.
std::optional<TensorPlan> channel_plan(const Adapter& adapter, const AdapterModule& m, TensorRole role,
                                       int64_t b_rows, DType storage) {
  const AdapterTensor* t = m.find(role);
  if (!t) return std::nullopt;
  TensorPlan plan = tensor_plan(adapter, m, *t, storage);
  if (plan.elements != static_cast<uint64_t>(b_rows))
    fail(PEFT_ERR_SHAPE_MISMATCH, "adapter " + quoted(adapter.dir()) + ": module " + quoted(m.name) + ": " +
                                      role_suffix(role) + " has " + std::to_string(plan.elements) + " values for " +
                                      std::to_string(b_rows) + " output channels");
  return plan;
}

LayerPlan layer_plan(const Adapter& adapter, const AdapterModule& m, DType storage) {
  const bool embedding = m.kind == LayerKind::embedding;
  const AdapterTensor* a = m.find(embedding ? TensorRole::lora_embedding_a : TensorRole::lora_a);
  const AdapterTensor* b = m.find(embedding ? TensorRole::lora_embedding_b : TensorRole::lora_b);
  if (!a || !b) fail(PEFT_ERR_INTERNAL, "LoRA module " + quoted(m.name) + " has no factors");

  LayerPlan plan;
  LoadedLayer& layer = plan.layer;
  layer.module = m.name;
  layer.kind = m.kind;
  layer.scaling = m.scaling;
  layer.a_shape = signed_shape(adapter.checkpoint().tensor(a->index).shape);
  layer.b_shape = signed_shape(adapter.checkpoint().tensor(b->index).shape);
  plan.a = tensor_plan(adapter, m, *a, storage);
  plan.b = tensor_plan(adapter, m, *b, storage);
  // Adapter::open checked that A and B are 2-D (4-D for Conv2d) and agree on a nonzero rank.
  layer.rank = layer.a_shape.at(0);
  layer.a_cols = static_cast<int64_t>(plan.a.elements) / layer.rank;
  layer.b_rows = layer.b_shape.at(0);
  // A Conv2d lora_B is [out, r, 1, 1]; another kernel would not be the [out, r] matrix consumers read.
  if (plan.b.elements != static_cast<uint64_t>(layer.b_rows) * static_cast<uint64_t>(layer.rank))
    fail(PEFT_ERR_SHAPE_MISMATCH, "adapter " + quoted(adapter.dir()) + ": module " + quoted(m.name) + ": lora_B " +
                                      shape_text(layer.b_shape) + " must be [out, r] (a 1x1 kernel for Conv2d)");
  plan.bias = channel_plan(adapter, m, TensorRole::lora_b_bias, layer.b_rows, storage);
  plan.magnitude = channel_plan(adapter, m, TensorRole::lora_magnitude, layer.b_rows, storage);
  return plan;
}

std::vector<LayerPlan> adapter_plan(const Adapter& adapter, DType storage) {
  require_storage(storage);
  std::vector<LayerPlan> plans;
  for (const AdapterModule& m : adapter.modules()) {
    if (m.is_lora() && effect_of(m.method) == MethodEffect::lora && !m.expert) plans.push_back(layer_plan(adapter, m, storage));
  }
  return plans;
}

// Total storage elements of the plans, with overflow checks.
uint64_t total_elements(const std::vector<LayerPlan>& plans, const Adapter& adapter) {
  uint64_t total = 0;
  auto add = [&](const std::optional<TensorPlan>& t) {
    if (t && __builtin_add_overflow(total, t->elements, &total))
      fail(PEFT_ERR_VALIDATION_OVERFLOW, "adapter " + quoted(adapter.dir()) + " has too many LoRA elements");
  };
  for (const LayerPlan& p : plans) {
    add(p.a);
    add(p.b);
    add(p.bias);
    add(p.magnitude);
  }
  return total;
}

}  // namespace

uint64_t LoadedAdapter::bytes_needed(const Adapter& adapter, DType storage) {
  return converted_byte_size(storage, total_elements(adapter_plan(adapter, storage), adapter));
}

std::shared_ptr<const LoadedAdapter> LoadedAdapter::load(std::shared_ptr<const Adapter> adapter, DType storage) {
  if (!adapter) fail(PEFT_ERR_INVALID_ARGUMENT, "LoadedAdapter::load needs an adapter");
  std::vector<LayerPlan> plans = adapter_plan(*adapter, storage);
  const uint64_t elements = total_elements(plans, *adapter);
  const uint64_t bytes = converted_byte_size(storage, elements);
  const uint64_t element_size = dtype_bits(storage) / 8;
  if (bytes > static_cast<uint64_t>(PTRDIFF_MAX))
    fail(PEFT_ERR_OUT_OF_MEMORY, "adapter " + quoted(adapter->dir()) + " needs " + std::to_string(bytes) + " bytes");

  auto loaded = std::make_shared<LoadedAdapter>();
  loaded->dtype_ = storage;
  loaded->bytes_ = bytes;
  loaded->storage_ = allocate_huge(static_cast<size_t>(bytes));  // huge pages: fewer TLB misses in a cold apply

  // Each tensor is read from the checkpoint and converted straight into its place in the storage.
  const Checkpoint& ckpt = adapter->checkpoint();
  size_t next = 0;
  auto place = [&](const std::optional<TensorPlan>& t) -> size_t {
    if (!t) return LoadedLayer::npos;
    const size_t offset = next;
    ckpt.read(t->index, storage, loaded->storage_.get() + offset * element_size, t->elements * element_size);
    next += static_cast<size_t>(t->elements);
    return offset;
  };
  loaded->layers_.reserve(plans.size());
  for (LayerPlan& p : plans) {
    LoadedLayer layer = std::move(p.layer);
    layer.a = place(p.a);
    layer.b = place(p.b);
    layer.bias = place(p.bias);
    layer.magnitude = place(p.magnitude);
    loaded->by_module_.emplace(layer.module, loaded->layers_.size());
    loaded->layers_.push_back(std::move(layer));
  }
  // Whole tensors replace base tensors: modules_to_save copies, trainable tokens, and tensors saved
  // beside a LoRA layer's factors (its base_layer weight or bias with bias="all", ...).
  for (const AdapterModule& m : adapter->modules())
    for (const AdapterTensor& t : m.tensors)
      if (!m.is_lora() || !is_lora_role(t.role)) loaded->has_replacements_ = true;
  for (const AdapterModule& m : adapter->modules())
    if (m.expert) {
      loaded->expert_modules_.push_back(&m);
      const ExpertTarget& x = *m.expert;
      for (const std::string& name : {m.name, x.module + "." + x.param, x.checkpoint_module + "." + x.param})
        loaded->expert_by_name_.emplace(name, &m);
      for (const ExpertPart& part : per_expert_parts(m, expert_factor_shape(m, ckpt))) {
        loaded->expert_by_name_.emplace(part.tensor, &m);
        loaded->expert_by_name_.emplace(part.module(), &m);
      }
    } else if (m.is_lora() && effect_of(m.method) != MethodEffect::lora)
      loaded->method_modules_.push_back(&m);
  loaded->adapter_ = std::move(adapter);
  return loaded;
}

const AdapterModule* LoadedAdapter::find_method_module(std::string_view module) const {
  for (const AdapterModule* m : method_modules_)
    if (m->name == module) return m;
  return nullptr;
}

const AdapterModule* LoadedAdapter::find_expert_module(std::string_view name) const {
  auto it = expert_by_name_.find(name);
  return it == expert_by_name_.end() ? nullptr : it->second;
}

const LoadedLayer* LoadedAdapter::find(std::string_view module) const {
  auto it = by_module_.find(module);
  return it == by_module_.end() ? nullptr : &layers_[it->second];
}

const void* LoadedAdapter::data(size_t offset) const {
  const uint64_t element_size = dtype_bits(dtype_) / 8;
  if (offset == LoadedLayer::npos || offset > bytes_ / element_size)
    fail(PEFT_ERR_INVALID_ARGUMENT, "element offset " + std::to_string(offset) + " is outside the loaded adapter (" +
                                        std::to_string(bytes_ / element_size) + " elements)");
  return storage_.get() + offset * element_size;
}

void LoadedAdapter::read_f32(size_t offset, size_t count, float* out) const {
  const uint64_t elements = bytes_ / (dtype_bits(dtype_) / 8);
  if (offset == LoadedLayer::npos || offset > elements || count > elements - offset)
    fail(PEFT_ERR_INVALID_ARGUMENT, "elements [" + std::to_string(offset) + ", +" + std::to_string(count) +
                                        ") are outside the loaded adapter (" + std::to_string(elements) + " elements)");
  convert(dtype_, data(offset), DType::F32, out, count);
}

}  // namespace peft::serve
