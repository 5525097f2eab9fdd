// The modules of a loaded adapter and their tensors: what loading an adapter (adapter.hpp) produces
// and checking it against a base model (base_validation.hpp) completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "peft/adapter/adapter_config.hpp"
#include "peft/arch/key_grammar.hpp"

namespace peft {

// The public PEFT_LAYER_* values.
enum class LayerKind : int32_t {
  linear = 0,            // nn.Linear: base weight [out, in]; delta = s * B @ A
  conv1d = 1,            // transformers Conv1D (GPT-2): base weight [in, out]; delta = s * (B @ A)^T
  embedding = 2,         // nn.Embedding: base [num, dim]; delta = s * (B @ A)^T
  conv2d = 3,            // nn.Conv2d: base [out, in, kh, kw]
  full = 4,              // whole tensors that replace the base's (modules_to_save, bias="all", ...)
  trainable_tokens = 5,  // rows that replace base embedding rows (trainable_token_indices)
};
const char* layer_kind_name(LayerKind kind);

struct AdapterTensor {
  TensorRole role = TensorRole::full;
  std::string suffix;       // canonical role suffix: "lora_A.weight", "weight", "base_layer.bias", ...
  std::string key;          // the key as stored in the file
  size_t index = 0;         // index in Adapter::checkpoint()
  // The base tensor this tensor replaces (full) or applies to (LoRA roles: the module's weight;
  // lora_B.bias: the module's bias). Resolved against the base model when one was given (its
  // base_model_prefix taken into account); otherwise "<module>.<param>".
  std::string base_tensor;
};

// A LoRA module on a parameter of stacked experts (LoraConfig.target_parameters, PEFT's
// ParamWrapper; adapter/expert_modules.hpp): lora_A is [r * E, in], lora_B [out, r * E], and expert
// e's delta is scaling * B[:, k * E + e] @ A[e * r + k, :] (k < r) in the parameter's [out, in]
// (transposed: its transpose, [in, out]).
struct ExpertTarget {
  std::string module;             // the experts module in memory, "model.layers.0.mlp.experts"
  std::string param;              // "gate_up_proj"
  std::string checkpoint_module;  // the module's name in checkpoint files (Mixtral: block_sparse_moe.experts)
  bool transposed = false;        // the parameter is [E, in, out]
  std::vector<std::string> per_expert;  // saved names per expert (arch/expert_params.hpp), maybe none
  int64_t num_experts = 0;        // E: lora_A's rows / rank
  bool interleaved = false;       // per_expert parts take every n-th row (arch/expert_params.hpp)
};

struct AdapterModule {
  std::string name;  // module path without "base_model.model.", e.g. "model.layers.0.self_attn.q_proj"
  LayerKind kind = LayerKind::full;
  // LoRA modules only (0 otherwise):
  int64_t rank = 0;
  double alpha = 0;
  double scaling = 0;
  std::optional<std::string> rank_key;   // the rank_pattern key that applied, if any
  std::optional<std::string> alpha_key;  // the alpha_pattern key that applied, if any
  std::vector<AdapterTensor> tensors;    // file order
  std::vector<int64_t> token_indices;    // trainable_tokens only
  // The PEFT method of the module's adapter layer (LoRA, or the adapter's peft_type for
  // method_param tensors). For LoHa/LoKr rank/alpha/scaling are PEFT's r, alpha, alpha / r; for
  // AdaLoRA rank is the saved rank, scaling lora_alpha (or the rank when lora_alpha <= 0) and
  // settings.ranknum init_r; IA3 has none of them, and settings.ia3_feedforward says whether feedforward_modules
  // selects the module (ia3_l then scales the input features, otherwise the output features).
  PeftMethod method = PeftMethod::lora;
  MethodSettings settings;  // what the method's row reads besides the parameters (AdaLoRA's ranknum, ...)
  std::string ia3_bias;     // IA3, not feed-forward: the base bias ia3_l also scales ("" when none)
  std::optional<ExpertTarget> expert;  // LoRA on a stacked expert parameter (target_parameters)

  bool is_lora() const { return kind != LayerKind::full && kind != LayerKind::trainable_tokens; }
  const AdapterTensor* find(TensorRole role) const;
  const AdapterTensor* find_suffix(const std::string& suffix) const;
  // The method_param tensor named `param` ("hada_w1_a"), or null.
  const AdapterTensor* find_param(std::string_view param) const;
  // The tensor whose base_tensor is the module's weight: lora_A, lora_embedding_A or the first
  // method parameter.
  const AdapterTensor* weight_factor() const;
};

// Which kinds of tensor roles a module holds: what its kind is decided from.
struct ModuleRoles {
  bool lora = false;       // lora_A, lora_B, lora_B.bias or lora_magnitude_vector
  bool embedding = false;  // lora_embedding_A or lora_embedding_B
  bool tokens = false;     // trainable_tokens_delta
  bool method = false;     // parameters of another method (method_param)
};
ModuleRoles module_roles(const AdapterModule& m);

}  // namespace peft
