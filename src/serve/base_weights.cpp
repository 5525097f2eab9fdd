// Base weights and DoRA scales for unmerged apply (base_weights.hpp).
#include "serve/base_weights.hpp"

#include <string>

#include "core/convert.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/buffer_merge/layer_module.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft::serve {
namespace {

void check_dtype(DType dtype, const std::string& what) {
  if (dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16) return;
  const std::string name = is_valid_dtype(static_cast<int32_t>(dtype)) ? std::string(dtype_name(dtype))
                                                                       : std::to_string(static_cast<int32_t>(dtype));
  fail(PEFT_ERR_UNSUPPORTED, what + " is " + name + "; base weights must be F32, BF16 or F16");
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace

void BaseWeights::set(std::string_view name, const void* data, DType dtype, std::span<const int64_t> shape,
                      const void* bias, DType bias_dtype, int64_t bias_elements, const Translator* translator) {
  const std::string what = "base weight " + peft::quoted(std::string(name));
  if (data == nullptr) fail(PEFT_ERR_INVALID_ARGUMENT, what + ": data must not be NULL");
  check_dtype(dtype, what);
  if (shape.size() != 2)
    fail(PEFT_ERR_SHAPE_MISMATCH, what + " has " + std::to_string(shape.size()) +
                                      " dimensions; DoRA in unmerged apply takes Linear and Conv1D weights (2)");
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 1)
      fail(PEFT_ERR_SHAPE_MISMATCH, what + ": dimension " + std::to_string(i) + " is " + std::to_string(shape[i]));
  if (bias != nullptr) {
    check_dtype(bias_dtype, what + ": the bias");
    if (bias_elements < 1)
      fail(PEFT_ERR_SHAPE_MISMATCH, what + ": the bias has " + std::to_string(bias_elements) + " elements");
  }
  const std::vector<std::string> modules = module_candidates(name, translator);
  auto weight = std::make_shared<const Weight>(Weight{std::string(name), data, dtype, {shape.begin(), shape.end()},
                                                      bias, bias_dtype, bias != nullptr ? bias_elements : 0});
  std::lock_guard lock(mutex_);
  for (const std::string& module : modules) by_module_.insert_or_assign(module, weight);
  cache_.clear();
}

void BaseWeights::changed() {
  std::lock_guard lock(mutex_);
  cache_.clear();
}

std::shared_ptr<const DoraScale> BaseWeights::scale(const std::shared_ptr<const LoadedAdapter>& loaded,
                                                    const LoadedLayer& layer, const std::string& adapter) {
  const auto where = [&] { return "DoRA layer " + peft::quoted(layer.module) + " of adapter " + peft::quoted(adapter); };
  std::lock_guard lock(mutex_);
  const auto key = std::make_pair(loaded.get(), &layer);
  if (auto it = cache_.find(key); it != cache_.end() && it->second.owner.lock() == loaded) return it->second.scale;

  const auto found = by_module_.find(layer.module);
  if (found == by_module_.end())
    fail(PEFT_ERR_NOT_FOUND, where() + " needs its base weight for the weight norm; give it with "
                                       "peft_registry_set_base_weight()");
  const Weight& w = *found->second;
  if (layer.bias != LoadedLayer::npos)
    fail(PEFT_ERR_UNSUPPORTED, where() + " has a lora_B.bias; PEFT refuses DoRA with lora_bias");
  const bool transposed = layer.kind == LayerKind::conv1d;
  const merge::DeltaLayout layout =
      merge::layout_for(transposed ? merge::ModuleKind::conv1d_gpt2 : merge::ModuleKind::linear, layer.b_rows,
                        layer.a_cols);
  if (w.shape[0] != layout.rows() || w.shape[1] != layout.cols())
    fail(PEFT_ERR_SHAPE_MISMATCH, where() + " needs a base weight of shape " +
                                      shape_text(std::vector<int64_t>{layout.rows(), layout.cols()}) + "; " +
                                      peft::quoted(w.name) + " has " + shape_text(w.shape));
  if (w.bias != nullptr && w.bias_elements != layer.b_rows)
    fail(PEFT_ERR_SHAPE_MISMATCH, where() + " has " + std::to_string(layer.b_rows) + " output features; the bias of " +
                                      peft::quoted(w.name) + " has " + std::to_string(w.bias_elements) + " elements");

  const size_t out = static_cast<size_t>(layer.b_rows);
  const size_t a_count = static_cast<size_t>(layer.rank * layer.a_cols), b_count = out * static_cast<size_t>(layer.rank);
  std::vector<float> a(a_count), b(b_count), magnitude(out);
  loaded->read_f32(layer.a, a_count, a.data());
  loaded->read_f32(layer.b, b_count, b.data());
  loaded->read_f32(layer.magnitude, out, magnitude.data());
  const merge::LoraFactors term{a.data(), b.data(), layer.rank, layer.scaling};
  const std::vector<float> norms = merge::dora_weight_norm(
      merge::ConstWeightView(w.data, w.dtype, w.shape[0], w.shape[1]), layout, std::span(&term, 1));

  auto result = std::make_shared<DoraScale>();
  result->scale.resize(out);
  for (size_t i = 0; i < out; ++i) result->scale[i] = magnitude[i] / norms[i];  // PEFT: magnitude / weight_norm
  if (w.bias != nullptr) {
    result->bias.resize(out);
    convert(w.bias_dtype, w.bias, DType::F32, result->bias.data(), out);
  }
  // Versions evicted since are dropped here, so the cache holds live versions only.
  std::erase_if(cache_, [](const auto& entry) { return entry.second.owner.expired(); });
  cache_.insert_or_assign(key, Cached{loaded, result});
  return result;
}

}  // namespace peft::serve
