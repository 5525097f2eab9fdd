// The renames the adapter doctor (adapter_doctor.hpp) knows, in one place: ways in which an
// adapter's keys differ from what PEFT saves for the base model at hand while the tensors are the
// right ones. Each is a pure function of names; whether a candidate is right is decided by the
// doctor against the base checkpoint (a rename is proposed only when exactly one candidate exists).
//
// * Key grammar (no base needed):
//   - ".weight" suffix variants: "lora_A" / "lora_B" without ".weight" (-> "lora_A.weight"),
//     "lora_embedding_A.weight" / "lora_embedding_B.weight" with one (-> "lora_embedding_A");
//   - kohya / LyCORIS LoRA names: "<path>.lora_down.weight" -> lora_A.weight,
//     "<path>.lora_up.weight" -> lora_B.weight, "<path>.alpha" (a per-module alpha, a scalar),
//     "<path>.dora_scale" (LyCORIS DoRA magnitude: [1, in] or [out, 1], not PEFT's [out]); the path
//     is dotted, or underscore-joined after a "lora_unet_" / "lora_te_" / "lora_te1_" /
//     "lora_te2_" / "lora_transformer_" prefix (matched against the base's module paths joined
//     the same way).
// * Module paths (base needed): transformers' checkpoint-conversion renames between releases
//   (transformers/conversion_mapping.py, in 4.52+ `_checkpoint_conversion_mapping`), each used in
//   both directions:
//     llava family (llava, gemma3, mistral3, paligemma, aya_vision, ...):
//       "language_model.model." <-> "model.language_model."   "language_model.lm_head" <-> "lm_head"
//       "vision_tower." <-> "model.vision_tower."   "multi_modal_projector." <-> "model.multi_modal_projector."
//     qwen2_vl family: "model." <-> "model.language_model."   "visual." <-> "model.visual."
//   and PEFT's own prefix twice ("base_model.model.base_model.model.<module>").
// * lora_A / lora_B <-> lora_embedding_A / lora_embedding_B, decided by the base layer's kind.
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace peft {

// A key the PEFT grammar rejects, read as another family's spelling of a PEFT tensor.
struct KeyRewrite {
  enum class Family { weight_suffix, kohya };
  enum class Role { lora_tensor, kohya_alpha, kohya_dora_scale };
  Family family = Family::weight_suffix;
  Role role = Role::lora_tensor;
  std::string module;  // the module path as written (without "base_model.model."), maybe kohya's underscores
  std::string suffix;  // PEFT's role suffix for lora_tensor ("lora_A.weight", "lora_embedding_A"); else ""
};

// The rewrite of one key, or nullopt when no known family explains it. `kohya_modules` lists the
// module paths that have "lora_down.weight" (so that "<path>.alpha" is only read as a kohya alpha
// next to kohya factors; elsewhere it is a PEFT full tensor).
std::optional<KeyRewrite> rewrite_key(std::string_view key, const std::vector<std::string>& kohya_modules);

// The module path of a kohya "lora_down.weight" key (without "base_model.model."), or nullopt.
std::optional<std::string> kohya_down_module(std::string_view key);

// True for a kohya underscore path ("lora_unet_..." and the other prefixes above); `rest` receives
// the underscore-joined module path after the prefix.
bool kohya_underscore_path(std::string_view module, std::string& rest);

// "model.layers.0.q_proj" -> "model_layers_0_q_proj".
std::string underscore_path(std::string_view dotted);

// A name the base may hold module `module` under, and the rename that gives it.
struct RenameCandidate {
  std::string module;
  std::string origin;  // "transformers 5.24's checkpoint conversion of LlavaForConditionalGeneration (on load)"
};
// The candidates for a module whose parameter `param` ("weight") the base lacks: every name the key
// "<module>.<param>" takes under transformers' checkpoint conversions (arch/conversions.hpp: any
// model's save or load renames, so an adapter written for a VLM's text model or for the other
// transformers major version is found), and PEFT's "base_model.model." written twice.
std::vector<RenameCandidate> rename_candidates(std::string_view module, std::string_view param);

}  // namespace peft
