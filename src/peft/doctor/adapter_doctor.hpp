// The adapter doctor: checks a PEFT LoRA adapter folder against a base checkpoint without merging,
// reports every problem at once, and writes a copy with the known renames applied. It works on
// adapters the strict loader (Adapter::open) refuses: it reads adapter_config.json (LoraConfig) and
// the adapter's safetensors header (Checkpoint) itself and reuses the key grammar, the module
// matcher, the base model lookup, the base validation and the architecture tables; the renames it
// knows are in key_renames.hpp.
//
// The report is JSON (json.dumps(indent=2, sort_keys=True), core/python_json.hpp); schema 1, stable
// (fields are only ever added):
//   {"schema": 1, "adapter": str, "base": str|null, "family": str|null,
//    "summary": {"ok": bool, "keys": int, "modules": int, "matched_modules": int,
//                "problems": int, "fixable_problems": int, "renames": int},
//    "modules": [{"module": str (the name after the fix), "keys": [str], "kind": "linear"|"conv1d"|
//                 "embedding"|"conv2d"|"full"|"trainable_tokens", "dtype": str, "base_tensor": str|null,
//                 "base_shape": [int]|null, "base_dtype": str|null, "host_name": str|null,
//                 "rank": int|null, "alpha": float|null, "scaling": float|null, "use_rslora": bool,
//                 "dora": null|"lora_magnitude_vector"|"dora_scale",
//                 "method": null|"LORA"|"LOHA"|"LOKR"|"ADALORA"|"IA3"|"LYCORIS_LOHA"|"LYCORIS_LOKR"}],
//    "problems": [{"kind": str, "keys": [str], "modules": [str], "message": str,
//                  "fix": null|{"renames": [{"from": str, "to": str}]}}],
//    "renames": [{"from": str, "to": str}],            every key --fix renames
//    "config_changes": [{"field": str, "key": str, "value": number}],   every entry --fix adds
//    "tied_embeddings": null|{"input": str, "output": str, "output_stored": bool, "config_key": str,
//                             "case": "output_only"|"input_only"|"both"|"ensure_weight_tying"|
//                                     "trainable_tokens"|"modules_to_save",
//                             "trainable_tokens": bool, "modules": [str], "untie": str, "shared": str}}
//      set when the base ties its embeddings and the adapter changes either side: the case, and
//      what a checkpoint merge does under each tied embeddings policy (not a problem).
// Problem kinds (stable strings): missing_config, missing_peft_prefix, weight_suffix, kohya_name, renamed_module,
// embedding_role, ambiguous_rename, unmatched_key, duplicate_key, incomplete_module,
// untargeted_module, rank_mismatch, dora_mismatch, dora_convention, lora_bias_mismatch,
// shape_transposed, vocabulary_resized, shape_mismatch, missing_base_tensor,
// target_without_tensors, unsupported_dtype, invalid_value, lycoris_method. docs/doctor.md describes each. The report
// holds no NaN / Infinity: a rank, alpha or scaling that is not finite is null (invalid_value).
//
// Pure functions of the files they read; thread-safe.
#pragma once

#include <string>

namespace peft {

struct DoctorResult {
  std::string json;  // the report
  bool ok = false;   // no problems
};

// Examines `adapter_dir` (adapter_config.json + adapter_model.safetensors; without the config, one
// is made from the tensors and reported as missing_config), against `base_dir` when not empty.
// Errors (not problems): PEFT_ERR_NOT_FOUND for a missing folder or adapter_model.safetensors or an
// incomplete hub download of either file, PEFT_ERR_UNSUPPORTED for adapter_model.bin (the folder is
// read by adapter_folder_files, as Adapter::open reads it),
// PEFT_ERR_INVALID_CONFIG for a config that cannot be read, format errors for a file that is not
// safetensors.
DoctorResult diagnose_adapter(const std::string& adapter_dir, const std::string& base_dir);

// The same report, and writes `out_dir` (as adapter export writes a folder: temporaries renamed into
// place) with every known rename applied: keys as PEFT saves them, kohya alphas and ranks as
// alpha_pattern / rank_pattern entries, renamed modules also renamed in target_modules and
// modules_to_save. Tensors whose problem has no known fix are written under their key as found (so
// are keys whose renames would collide). PEFT_ERR_INVALID_ARGUMENT, before anything is written, when
// `out_dir` (weakly canonical) is the adapter folder, the base folder, or in a hub cache snapshot.
DoctorResult fix_adapter(const std::string& adapter_dir, const std::string& base_dir, const std::string& out_dir);

}  // namespace peft
