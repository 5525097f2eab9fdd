// The grammar of tensor keys in adapter_model.safetensors (PEFT's get_peft_model_state_dict):
//
//   [base_model.model.] <module path> . <role>
//
// roles of a LoRA layer:   lora_A.weight  lora_B.weight  lora_B.bias  lora_embedding_A
//                          lora_embedding_B  lora_magnitude_vector
// trainable tokens:        token_adapter.trainable_tokens_delta
// full replacement tensors (modules_to_save copies, bias="all" biases, saved embeddings):
//                          <param>  or  base_layer.<param>   (e.g. "weight", "bias", "base_layer.weight")
// LN_TUNING (a tuned norm):            ln_tuning_layers.<param>   (replaces <module>.<param>)
// TRAINABLE_TOKENS adapters:           trainable_tokens_delta (no token_adapter segment; that suffix)
//
// Keys that still carry an adapter name are accepted when the name is PEFT's default name
// "default" (`lora_A.default.weight`, `lora_magnitude_vector.default.weight`,
// `modules_to_save.default.weight`, `trainable_tokens_delta.default`): PEFT 0.21 loads such keys
// under the default adapter name, so a user who saved a raw state dict gets what PEFT gives. The key
// is then recorded as "had_adapter_name". Any other name inside a LoRA key (`lora_A.my_task.weight`)
// is rejected as an unresolved key: PEFT <= 0.20 silently ignores those tensors and 0.21 only loads
// them under that adapter name, so there is no single right answer.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace peft {

enum class TensorRole {
  lora_a,                  // lora_A.weight            (r, in) | conv (r, in, kh, kw)
  lora_b,                  // lora_B.weight            (out, r) | conv (out, r, 1, 1)
  lora_b_bias,             // lora_B.bias              (out,)      lora_bias=True
  lora_embedding_a,        // lora_embedding_A         (r, num_embeddings)
  lora_embedding_b,        // lora_embedding_B         (embedding_dim, r)
  lora_magnitude,          // lora_magnitude_vector    DoRA
  trainable_tokens_delta,  // token_adapter.trainable_tokens_delta  (n_indices, dim)
  full,                    // a whole tensor that replaces the base's tensor of the same name
  method_param,            // a parameter of another PEFT method (methods/peft_methods.hpp): its
                           // role_suffix is the parameter's name (hada_w1_a, lokr_w2, lora_E, ia3_l, ...)
};

// The parameter names of the non-LoRA methods (PEFT saves their ParameterDicts as
// "<module>.<name>", e.g. "model.layers.0.mlp.up_proj.hada_w1_a"): LoHa hada_w1_a hada_w1_b
// hada_w2_a hada_w2_b hada_t1 hada_t2; LoKr lokr_w1 lokr_w1_a lokr_w1_b lokr_w2 lokr_w2_a
// lokr_w2_b lokr_t2; AdaLoRA lora_A lora_B lora_E (no ".weight"); IA3 ia3_l; BOFT boft_R boft_s;
// HRA hra_u. OFT's "<module>.oft_R.weight" parses as the parameter "oft_R".
bool is_method_param(std::string_view segment);

// The key suffix of a role ("lora_A.weight"); for `full`, see ParsedKey::role_suffix.
const char* role_suffix(TensorRole role);
bool is_lora_role(TensorRole role);  // lora_* roles (not full, not trainable tokens)

inline constexpr std::string_view kPeftPrefix = "base_model.model.";

struct ParsedKey {
  std::string module;       // module path without "base_model.model.", e.g. "model.layers.0.mlp.up_proj"
  TensorRole role = TensorRole::full;
  std::string role_suffix;  // the canonical suffix: "lora_A.weight", "weight", "base_layer.bias", ...
  bool had_prefix = false;  // the key started with "base_model.model."
  bool had_adapter_name = false;  // a ".default" adapter name was removed
  // For `full` tensors: the name of the base model's tensor it replaces ("classifier.weight";
  // ".base_layer" removed).
  std::string base_tensor;

  // The canonical key: optional prefix + module + "." + role_suffix.
  std::string key(bool with_prefix) const;
};

// Parses one key. Returns nullopt for a key that fits no rule (empty, an empty segment, an adapter
// name other than "default", a lora_ segment with an unknown role, or nothing before the role).
std::optional<ParsedKey> parse_adapter_key(std::string_view key);

// The base parameter a full tensor's role suffix replaces: its last segment ("weight" of
// "base_layer.weight", "bias" of "bias").
std::string suffix_parameter(std::string_view role_suffix);

}  // namespace peft
