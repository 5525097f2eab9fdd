#include "core/no_fp_contract.hpp"  // first: ia3_vector's product rounds as torch's

#include "peft/adapter/method_params.hpp"

#include "core/error.hpp"
#include "core/text.hpp"

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

bool method_reads_weight(const AdapterModule& m) { return m.method == PeftMethod::miss && m.miss_bat; }

std::vector<float> method_delta(const AdapterModule& m, const MethodParams& p, double coefficient,
                                const merge::DeltaLayout& layout, const float* weight) {
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
    case PeftMethod::miss:
      if (coefficient != 1.0)
        fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": MiSS has no scale (PEFT's set_scale keeps 1), "
                                   "so it merges with weight 1 only, not " + std::to_string(coefficient));
      return merge::miss_delta(need("miss_block"), m.miss_mini_r, m.miss_bat, weight, layout.out, layout.in, m.name);
    case PeftMethod::shira:
      return merge::shira_delta(need("shira_weight"), need("shira_indices"), coefficient, layout.out, layout.in, m.name);
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
