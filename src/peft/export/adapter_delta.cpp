#include "peft/export/adapter_delta.hpp"

#include "core/error.hpp"
#include "core/text.hpp"
#include "peft/methods/lora_math.hpp"

namespace peft {

bool has_module_delta(const Adapter& adapter, const AdapterModule& m, std::string& why) {
  if (adapter.config().use_dora) {
    why = "a DoRA module (its change depends on the base weight's norm)";
    return false;
  }
  if (m.kind != LayerKind::linear && m.kind != LayerKind::conv1d) {
    why = std::string("a module of kind ") + layer_kind_name(m.kind) + " (only Linear and Conv1D layers convert, as in PEFT)";
    return false;
  }
  for (const AdapterTensor& t : m.tensors)
    if (t.role != TensorRole::lora_a && t.role != TensorRole::lora_b) {
      why = "a module with tensor " + peft::quoted(t.key) + " (lora_B.bias and other tensors do not convert)";
      return false;
    }
  return true;
}

ModuleDelta module_delta(const Adapter& adapter, const AdapterModule& m) {
  std::string why;
  if (!has_module_delta(adapter, m, why)) fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + " is " + why);
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

}  // namespace peft
