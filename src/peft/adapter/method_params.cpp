#include "core/no_fp_contract.hpp"  // first: ia3_vector's product rounds as torch's

#include "peft/adapter/method_params.hpp"

#include "core/error.hpp"
#include "core/python_json.hpp"
#include "core/text.hpp"

#include <string>

namespace peft {

MethodParams load_method_params(const Adapter& adapter, const AdapterModule& module) {
  MethodParams p;
  p.module = module.name;
  auto read = [&](const std::string& name, size_t index) {
    merge::MethodTensor m;
    for (uint64_t d : adapter.checkpoint().tensor(index).shape) m.shape.push_back(static_cast<int64_t>(d));
    m.values = adapter.checkpoint().read_f32(index);
    p.tensors.emplace(name, std::move(m));
  };
  for (const AdapterTensor& t : module.tensors)
    if (t.role == TensorRole::method_param) read(t.suffix, t.index);
  // The parameters saved once for every layer (VeRA's projections, VB-LoRA's vector bank), where
  // the module has none of its own.
  for (std::string_view shared : method_row(module.method).shared) {
    const std::string name(shared);
    if (const size_t* index = adapter.shared_param(name); index != nullptr && p.tensors.count(name) == 0)
      read(name, *index);
  }
  p.settings = module.settings;
  return p;
}

merge::DeltaLayout method_layer_layout(const AdapterModule& m, LayerKind kind, std::span<const int64_t> shape) {
  const bool conv2d = method_row(m.method).conv2d;
  const bool conv = shape.size() == 4 && conv2d;
  if (shape.size() != 2 && !conv)
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": " + peft_method_name(m.method) +
                                   " is merged into 2-D Linear or Conv1D weights" +
                                   (conv2d ? std::string(" and 4-D Conv2d weights") : std::string()) +
                                   " only, not " + shape_text(shape));
  if (conv) {
    int64_t in = 1;
    for (size_t d = 1; d < 4; ++d)
      if (shape[d] < 1 || __builtin_mul_overflow(in, shape[d], &in))
        fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": bad Conv2d weight " + shape_text(shape));
    return merge::layout_for(merge::ModuleKind::conv, shape[0], in);
  }
  const bool gpt2 = kind == LayerKind::conv1d;
  return merge::layout_for(gpt2 ? merge::ModuleKind::conv1d_gpt2 : merge::ModuleKind::linear,
                           gpt2 ? shape[1] : shape[0], gpt2 ? shape[0] : shape[1]);
}

void check_conv_kernel(const AdapterModule& m, const MethodParams& p, std::span<const int64_t> shape) {
  for (const char* name : {"hada_t1", "hada_t2", "lokr_t2", "lokr_w2"}) {
    const merge::MethodTensor* t = p.get(name);
    if (t == nullptr || t->shape.size() != 4) continue;
    if (shape.size() != 4 || t->shape[2] != shape[2] || t->shape[3] != shape[3])
      fail(PEFT_ERR_SHAPE_MISMATCH, "module " + peft::quoted(m.name) + ": " + name + " " + shape_text(t->shape) +
                                        " is a Conv2d factor of kernel " + std::to_string(t->shape[2]) + "x" +
                                        std::to_string(t->shape[3]) + ", which does not fit the weight " +
                                        shape_text(shape));
  }
}

bool method_reads_weight(const AdapterModule& m) {
  const MethodRow& row = method_row(m.method);
  return row.reads_weight != nullptr && row.reads_weight(m.settings);
}

std::vector<float> method_delta(const AdapterModule& m, const MethodParams& p, double coefficient,
                                const merge::DeltaLayout& layout, const float* weight) {
  const MethodRow& row = method_row(m.method);
  if (row.delta == nullptr) fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " has no additive delta");
  return row.delta(p, coefficient, layout, weight);
}

std::vector<float> ia3_vector(const MethodParams& p, double weight) {
  const merge::MethodTensor* l = p.get("ia3_l");
  if (l == nullptr) fail(PEFT_ERR_INTERNAL, "IA3 module lost its ia3_l");
  std::vector<float> v = l->values;
  if (weight != 1.0) {
    const float w = static_cast<float>(weight);
    for (float& x : v) x = x * w;
  }
  return v;
}

bool is_rotation(PeftMethod method) { return method_row(method).effect == MethodEffect::rotation; }

void check_rotation_weight(const AdapterModule& m, double weight) {
  if (weight != 1.0)
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": " + peft_method_name(m.method) +
                                   " cannot be merged with weight " + python_float_repr(weight) +
                                   ": PEFT has no merge weight for rotations (set_scale keeps 1); use 1");
}

merge::InputTransform method_transform(const AdapterModule& m, const MethodParams& p, double weight,
                                       const merge::DeltaLayout& layout, bool inverse) {
  check_rotation_weight(m, weight);
  if (layout.transposed)
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": " + peft_method_name(m.method) +
                                   " merges into Linear layers only (PEFT has no GPT-2 Conv1D form)");
  const MethodRow& row = method_row(m.method);
  if (row.transform != nullptr) return row.transform(p, layout, inverse);
  fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " has no rotation");
}

}  // namespace peft

namespace peft {

void check_replacement_weight(const Adapter& adapter, double weight) {
  const PeftMethod method = adapter.config().method;
  if (weight == 1.0 || method_row(method).effect != MethodEffect::replacement) return;
  fail(PEFT_ERR_UNSUPPORTED, "adapter " + peft::quoted(adapter.dir()) + " is " + peft_method_name(method) +
                                 ", which replaces tensors; PEFT defines no merge weight for it (weight " +
                                 std::to_string(weight) + " given, only 1 is supported)");
}

}  // namespace peft
