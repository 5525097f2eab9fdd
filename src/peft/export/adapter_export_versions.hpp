// The adapter_config.json an exported adapter gets, and what "for PEFT X.Y" means.
//
// Every PEFT release knows a fixed set of LoraConfig fields (docs/peft-semantics.md, "Fields per
// PEFT release"): 0.13 knows 24, each release since adds some (0.14 exclude_modules, eva_config,
// lora_bias; ... 0.21 kasa_config).
// PEFT 0.13 and older raise TypeError on a field they do not know; 0.14+ drop it with a warning.
// Exporting for a version therefore writes only the fields that version knows, and refuses
// (PEFT_ERR_UNSUPPORTED naming the field) when leaving a field out would change what the adapter
// does: a non-default value of a field the version lacks (use_dora, lora_bias, exclude_modules,
// trainable_token_indices, ensure_weight_tying, ...). Fields that only steer a fresh
// initialisation (eva_config, corda_config, lora_ga_config, qalora_group_size) or record the writer
// (peft_version) are dropped freely.
//
// Releases also read some fields differently, and the check covers that too: for every LoRA module
// of the adapter, the target version must still target it (layers_to_transform takes the LAST
// numbered segment up to 0.19, the first since 0.20) and give it the same rank and alpha
// (rank_pattern / alpha_pattern keys: one combined list matched as `.*\.key$` in 0.13, separate
// lists with `.*\.key$` in 0.14, `(.*\.)?(key)$` since 0.15; first match in file order, and the
// written file is sorted). The same check, with PEFT 0.21's rules, guards every export, because
// sorting the keys of rank_pattern can change which key matches first.
//
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace peft {

struct PeftVersion {
  int major = 0;
  int minor = 0;
  std::string text;  // as the caller wrote it
};

// "X.Y" or "X.Y.Z" (Z ignored). INVALID_ARGUMENT for anything else; UNSUPPORTED for versions
// before 0.13, whose field sets are not known here. Versions after 0.21 get 0.21's fields.
PeftVersion parse_peft_version(std::string_view text);

// What the exported file must still mean for one LoRA module.
struct ExportedModule {
  std::string name;  // module path, e.g. "model.layers.0.self_attn.q_proj"
  int64_t rank = 0;
  double alpha = 0;
  // LoRA on a stacked expert parameter (target_parameters): `name` is "<module>.<param>", the key
  // its rank_pattern / alpha_pattern match, and target_modules does not select it.
  bool target_parameter = false;
};

// The config to write for an adapter whose source config is `source` (the document as read):
// inference_mode true; init_lora_weights false / "gaussian" / "eva" / "orthogonal" / "mica" made
// true (they only choose how fresh factors are drawn, and loading replaces the factors; "mica"
// and "eva" are unknown to older releases); runtime_config removed (PEFT never writes it); every
// other field as it was, unknown ones included. With a target version, only its fields, as above.
// Then checks `modules` against the result (see the file comment). `what` names the adapter in
// messages.
nlohmann::ordered_json export_config(const nlohmann::ordered_json& source, std::span<const ExportedModule> modules,
                                     const std::optional<PeftVersion>& target, const std::string& what);

}  // namespace peft
