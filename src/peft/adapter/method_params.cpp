#include "core/no_fp_contract.hpp"  // first: ia3_vector's product rounds as torch's

#include "peft/adapter/method_params.hpp"

#include "core/error.hpp"
#include "core/python_json.hpp"
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
  const LoraConfig& c = adapter.config();
  if (module.method == PeftMethod::vera || module.method == PeftMethod::randlora) {
    const std::string prefix = module.method == PeftMethod::vera ? "vera_" : "randlora_";
    for (const std::string& name : {prefix + "A", prefix + "B"}) {
      const size_t* index = adapter.shared_param(name);
      if (index == nullptr || p.tensors.count(name) != 0) continue;
      merge::MethodTensor m;
      for (uint64_t d : adapter.checkpoint().tensor(*index).shape) m.shape.push_back(static_cast<int64_t>(d));
      m.values = adapter.checkpoint().read_f32(*index);
      p.tensors.emplace(name, std::move(m));
    }
    p.projections_not_saved = !c.save_projection;
  }
  if (module.method == PeftMethod::vblora) {
    if (const size_t* index = adapter.shared_param("vblora_vector_bank"); index && !p.tensors.count("vblora_vector_bank")) {
      merge::MethodTensor m;
      for (uint64_t d : adapter.checkpoint().tensor(*index).shape) m.shape.push_back(static_cast<int64_t>(d));
      m.values = adapter.checkpoint().read_f32(*index);
      p.tensors.emplace("vblora_vector_bank", std::move(m));
    }
    p.vblora_topk = c.vblora_topk;
  }
  p.random_loc_seed = c.random_loc_seed;
  return p;
}

merge::DeltaLayout method_layer_layout(const AdapterModule& m, LayerKind kind, std::span<const int64_t> shape) {
  const bool conv = shape.size() == 4 && (m.method == PeftMethod::loha || m.method == PeftMethod::lokr);
  if (shape.size() != 2 && !conv)
    fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": " + peft_method_name(m.method) +
                                   " is merged into 2-D Linear or Conv1D weights" +
                                   (m.method == PeftMethod::loha || m.method == PeftMethod::lokr
                                        ? std::string(" and 4-D Conv2d weights")
                                        : std::string()) +
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
      if (p.get("hada_t1") != nullptr || p.get("hada_t2") != nullptr)  // the CP (effective conv2d) form
        return merge::loha_cp_delta(need("hada_t1"), need("hada_w1_a"), need("hada_w1_b"), need("hada_t2"),
                                    need("hada_w2_a"), need("hada_w2_b"), coefficient, layout.out, layout.in, m.name);
      return merge::loha_delta(need("hada_w1_a"), need("hada_w1_b"), need("hada_w2_a"), need("hada_w2_b"), coefficient,
                               layout.out, layout.in, m.name);
    case PeftMethod::lokr: {
      merge::LokrFactors f{p.get("lokr_w1"), p.get("lokr_w1_a"), p.get("lokr_w1_b"),
                           p.get("lokr_w2"), p.get("lokr_w2_a"), p.get("lokr_w2_b"), p.get("lokr_t2")};
      return merge::lokr_delta(f, coefficient, layout.out, layout.in, m.name);
    }
    case PeftMethod::adalora:
      return merge::adalora_delta(need("lora_A"), need("lora_E"), need("lora_B"), coefficient, m.ranknum, layout.out,
                                  layout.in, m.name);
    case PeftMethod::vera:
    case PeftMethod::randlora: {
      const bool vera = m.method == PeftMethod::vera;
      const std::string a = vera ? "vera_A" : "randlora_A", b = vera ? "vera_B" : "randlora_B";
      if (p.get(a) == nullptr || p.get(b) == nullptr) {
        const std::string method = vera ? "VeRA" : "RandLoRA";
        if (p.projections_not_saved)
          fail(PEFT_ERR_UNSUPPORTED,
               "module " + peft::quoted(m.name) + ": the " + method + " adapter was saved without its shared " + a +
                   " and " + b + " (save_projection is false); PEFT regenerates them from projection_prng_key with "
                   "torch's generator, which this library does not reproduce. Re-save it with them: in PEFT, "
                   "get_peft_model(base, its config with save_projection=True), load its tensors with "
                   "load_state_dict({key + \".default\": tensor}, strict=False), then save_pretrained");
        fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(m.name) + ": the adapter has no " +
                                              peft::quoted("base_model." + a) + " / " + peft::quoted("base_model." + b) +
                                              " although save_projection is true");
      }
      if (vera)
        return merge::vera_delta(need("vera_A"), need("vera_B"), need("vera_lambda_d"), need("vera_lambda_b"),
                                 coefficient, layout.out, layout.in, m.name);
      return merge::randlora_delta(need("randlora_A"), need("randlora_B"), need("randlora_lambda"),
                                   need("randlora_gamma"), coefficient, layout.out, layout.in, m.name);
    }
    case PeftMethod::fourierft:
      return merge::fourierft_delta(need("fourierft_spectrum"), p.random_loc_seed, coefficient, layout.out, layout.in,
                                    m.name);
    case PeftMethod::lora:
    case PeftMethod::ia3: break;
    case PeftMethod::miss:
      if (coefficient != 1.0)
        fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": MiSS has no scale (PEFT's set_scale keeps 1), "
                                   "so it merges with weight 1 only, not " + std::to_string(coefficient));
      return merge::miss_delta(need("miss_block"), m.miss_mini_r, m.miss_bat, weight, layout.out, layout.in, m.name);
    case PeftMethod::shira:
      return merge::shira_delta(need("shira_weight"), need("shira_indices"), coefficient, layout.out, layout.in, m.name);
    case PeftMethod::oft:
    case PeftMethod::boft:
    case PeftMethod::hra: break;
    case PeftMethod::ln_tuning:
    case PeftMethod::trainable_tokens: break;
    case PeftMethod::vblora: {
      const merge::MethodTensor* bank = p.get("vblora_vector_bank");
      if (bank == nullptr)
        fail(PEFT_ERR_INVALID_CHECKPOINT, "module " + peft::quoted(m.name) + ": the VB-LoRA adapter has no " +
                                              peft::quoted("base_model.vblora_vector_bank") +
                                              " (the vector bank PEFT saves with every VB-LoRA adapter)");
      const merge::VbloraLogits a{p.get("vblora_logits_A"), p.get("vblora_logits_A_topk_indices"),
                                  p.get("vblora_logits_A_topk_weights")};
      const merge::VbloraLogits b{p.get("vblora_logits_B"), p.get("vblora_logits_B_topk_indices"),
                                  p.get("vblora_logits_B_topk_weights")};
      return merge::vblora_delta(*bank, a, b, p.vblora_topk, coefficient, layout.out, layout.in, m.name);
    }
    case PeftMethod::c3a:
      if (layout.transposed)
        fail(PEFT_ERR_UNSUPPORTED, "module " + peft::quoted(m.name) + ": C3A merges into torch.nn.Linear layers only "
                                   "(PEFT's C3ALayer refuses GPT-2 Conv1D: \"Unsupported layer type\")");
      return merge::c3a_delta(need("c3a_kernel"), coefficient, layout.out, layout.in, m.name);
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

bool is_rotation(PeftMethod method) {
  return method == PeftMethod::oft || method == PeftMethod::boft || method == PeftMethod::hra;
}

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
  auto need = [&](const char* name) -> const merge::MethodTensor& {
    const merge::MethodTensor* t = p.get(name);
    if (t == nullptr) fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " lost its " + name);
    return *t;
  };
  switch (m.method) {
    case PeftMethod::oft: return merge::oft_transform(need("oft_R"), m.oft, layout.in, inverse, m.name);
    case PeftMethod::boft:
      return merge::boft_transform(need("boft_R"), need("boft_s"), layout.out, layout.in, inverse, m.name);
    case PeftMethod::hra: return merge::hra_transform(need("hra_u"), m.hra_apply_gs, layout.in, inverse, m.name);
    default: break;
  }
  fail(PEFT_ERR_INTERNAL, "module " + peft::quoted(m.name) + " has no rotation");
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
