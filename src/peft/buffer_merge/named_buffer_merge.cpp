// Merging the module a host's weight name addresses into the host's buffers, and taking it out
// again (named_buffer_merge.hpp).
#include "peft/buffer_merge/named_buffer_merge.hpp"

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/buffer_merge/layer_module.hpp"

namespace peft {

void require_buffer_dtype(DType dtype, const char* what) {
  if (dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16) return;
  const int32_t value = static_cast<int32_t>(dtype);
  const std::string name = is_valid_dtype(value) ? std::string(dtype_name(dtype)) : std::to_string(value);
  fail(PEFT_ERR_UNSUPPORTED, std::string(what) + " dtype " + name + " is not supported (F32, BF16 and F16 are)");
}

NamedBufferMerge NamedBufferMerge::apply(const std::shared_ptr<const Adapter>& adapter, std::string_view name,
                                         void* weight, DType weight_dtype, std::span<const int64_t> shape,
                                         void* bias, DType bias_dtype, const NamedBufferMergeOptions& options) {
  const Translator* translator = options.translator ? &*options.translator : nullptr;
  // A stacked GGUF expert tensor holds one slice per expert; any other name addresses one module.
  std::optional<StackedBufferModule> stacked = gguf_stacked_buffer_module(adapter, name, shape, translator);
  const AdapterModule& module = stacked ? *stacked->module : find_lora_module(*adapter, name, translator);
  const BufferMergeModule factors =
      stacked ? std::move(stacked->merge) : host_buffer_module(adapter, module, name, shape, translator);
  NamedBufferMerge merge;
  merge.module_ = module.name;
  merge.weight_dtype_ = weight_dtype;
  merge.rows_ = factors.layout.rows();
  merge.cols_ = factors.layout.cols();
  // The layer's bias buffer, when the module changes the bias: `needed` says why a missing one is refused.
  std::optional<merge::WeightView> bias_view;
  auto take_bias = [&](const char* needed) {
    if (bias == nullptr)
      fail(PEFT_ERR_INVALID_ARGUMENT, "module " + peft::quoted(module.name) + " " + needed +
                                          ": pass the layer's bias buffer");
    require_buffer_dtype(bias_dtype, "bias");
    merge.bias_dtype_ = bias_dtype;
    merge.bias_elements_ = factors.layout.out;
    bias_view = merge::WeightView{bias, bias_dtype, 1, merge.bias_elements_};
  };
  if (factors.lora_bias != nullptr) {
    take_bias("has a lora_B.bias");
  } else if (!module.is_lora() && factors.method_params->get("bias") != nullptr) {
    take_bias("replaces the bias too");  // a LayerNorm's LN_TUNING copy, a modules_to_save Linear
  } else if (effect_of(module.method) == MethodEffect::scale && !module.settings.ia3_feedforward && bias != nullptr) {
    take_bias("scales the bias");  // IA3 scales the bias of a layer that is not feed-forward, when given
  }
  const merge::WeightView weight_view{weight, weight_dtype, merge.rows_, merge.cols_};
  BufferMergeOptions merge_options;
  merge_options.weight = options.weight;
  merge_options.keep_original_rows = options.keep_original_rows;
  merge_options.threads = options.threads;
  merge_options.refuse_non_finite = true;
  merge_options.layer = std::string(name);
  merge.record_ = BufferMerge::apply(weight_view, bias_view ? &*bias_view : nullptr, factors, merge_options);
  return merge;
}

void NamedBufferMerge::remove(void* weight, void* bias) {
  if (!record_.active())
    fail(PEFT_ERR_INVALID_ARGUMENT, "the merge of " + peft::quoted(module_) + " was already removed");
  std::optional<merge::WeightView> bias_view;
  if (bias_elements_ > 0) {
    if (bias == nullptr)
      fail(PEFT_ERR_INVALID_ARGUMENT, "the merge of " + peft::quoted(module_) + " changed a bias: pass the bias buffer");
    bias_view = merge::WeightView{bias, bias_dtype_, 1, bias_elements_};
  }
  record_.remove(merge::WeightView{weight, weight_dtype_, rows_, cols_}, bias_view ? &*bias_view : nullptr);
}

}  // namespace peft
