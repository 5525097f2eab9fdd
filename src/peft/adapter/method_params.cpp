#include "core/no_fp_contract.hpp"  // first: ia3_vector's product rounds as torch's

#include "peft/adapter/method_params.hpp"

#include "core/error.hpp"
#include "core/text.hpp"

#include <string>

namespace peft {

const merge::MethodTensor* MethodParams::get(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

MethodParams load_method_params(const Adapter& adapter, const AdapterModule& module) {
  MethodParams p;
  for (const AdapterTensor& t : module.tensors) {
    if (t.role != TensorRole::method_param) continue;
    merge::MethodTensor m;
    for (uint64_t d : adapter.checkpoint().tensor(t.index).shape) m.shape.push_back(static_cast<int64_t>(d));
    m.values = adapter.checkpoint().read_f32(t.index);
    p.tensors.emplace(t.suffix, std::move(m));
  }
  return p;
}

std::vector<float> method_delta(const AdapterModule& m, const MethodParams& p, double coefficient,
                                const merge::DeltaLayout& layout) {
  auto need = [&](const char* name) -> const merge::MethodTensor& {
    const merge::MethodTensor* t = p.get(name);
    if (t == nullptr) fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " lost its " + name);
    return *t;
  };
  switch (m.method) {
    case PeftMethod::loha:
      return merge::loha_delta(need("hada_w1_a"), need("hada_w1_b"), need("hada_w2_a"), need("hada_w2_b"), coefficient,
                               layout.out, layout.in, m.name);
    case PeftMethod::lokr: {
      merge::LokrFactors f{p.get("lokr_w1"), p.get("lokr_w1_a"), p.get("lokr_w1_b"),
                           p.get("lokr_w2"), p.get("lokr_w2_a"), p.get("lokr_w2_b")};
      return merge::lokr_delta(f, coefficient, layout.out, layout.in, m.name);
    }
    case PeftMethod::adalora:
      return merge::adalora_delta(need("lora_A"), need("lora_E"), need("lora_B"), coefficient, m.ranknum, layout.out,
                                  layout.in, m.name);
    case PeftMethod::lora:
    case PeftMethod::ia3: break;
    case PeftMethod::ln_tuning:
    case PeftMethod::trainable_tokens: break;
  }
  fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " has no additive delta");
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

}  // namespace peft

namespace peft {

void check_replacement_weight(const Adapter& adapter, double weight) {
  const PeftMethod method = adapter.config().method;
  if (weight == 1.0 || (method != PeftMethod::ln_tuning && method != PeftMethod::trainable_tokens)) return;
  fail(PEFT_ERR_UNSUPPORTED, "adapter " + peft::quoted(adapter.dir()) + " is " + peft_method_name(method) +
                                 ", which replaces tensors; PEFT defines no merge weight for it (weight " +
                                 std::to_string(weight) + " given, only 1 is supported)");
}

}  // namespace peft
