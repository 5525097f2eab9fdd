// Architecture tables: data (data/arch/<family>.json, or a user's file or string) that map
// HuggingFace module paths to a host's own slash-separated names, say which kind of layer each
// module is, and how to recognise the family. The format is documented in docs/translation-tables.md.
//
//   {"hf": "model.layers.{layer}.self_attn.q_proj",
//    "native": "transformer/layer_{layer}/attention/query", "kind": "linear"}
//
// A rule may also name the module in GGUF files ("gguf": "blk.{layer}.attn_q", the tensor name
// without ".weight"/".bias") and the row order llama.cpp's converter gives its weight ("gguf_rows":
// "rope_q" or "rope_k", the LLaMA-family RoPE permutation over the attention heads or the key/value
// heads; "qkv_per_head" or "qkv_per_kv_group", the fused query_key_value reordered to all queries,
// keys, values); "gguf_stack": "expert" says the converter stacks the modules that differ only in
// that placeholder into one tensor of one more dimension (outermost), the placeholder's value being
// the slice (Mixtral's experts.{expert}.w1 in blk.{layer}.ffn_gate_exps; see
// peft/arch/gguf_experts.hpp); "gguf_architectures" maps each GGUF architecture
// (general.architecture) whose files the
// table reads to the model_types llama.cpp's converter gives it ({"llama": ["llama"]}). See
// docs/gguf.md.
//
// A placeholder such as {layer} matches one or more ASCII digits, copied verbatim to the other side,
// so that HF -> native -> HF is the identity. Rules are tried in file order; the first whose pattern
// matches the whole module path wins (in either direction). Roles (the key's tail after the module
// path: "lora_A.weight" <-> "lora_a", "weight" <-> "weight") come from a built-in list that a table
// may replace ("roles") or extend ("extra_roles").
//
// An ArchTable is immutable once parsed; every const method may be called from many threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace peft {

enum class ModuleKind { linear, conv1d, embedding, conv2d, norm, other };
const char* module_kind_name(ModuleKind kind);

// "model.layers.{layer}.mlp" as literal pieces and digit placeholders.
class NameTemplate {
 public:
  using Captures = std::vector<std::pair<std::string, std::string>>;
  // `what` names the rule in messages; throws PEFT_ERR_INVALID_CONFIG on a malformed template.
  static NameTemplate parse(std::string_view text, const std::string& what);
  bool match(std::string_view text, Captures& captures) const;
  std::string fill(const Captures& captures) const;
  std::vector<std::string> placeholder_names() const;  // in order of appearance
  const std::string& text() const { return text_; }

 private:
  struct Token {
    bool placeholder;
    std::string text;  // the literal, or the placeholder's name
  };
  std::string text_;
  std::vector<Token> tokens_;
};

// How llama.cpp's converter orders a weight's rows in GGUF. rope_q / rope_k (conversion/llama.py's
// permute): within each head, the two halves of the rotary dimensions interleaved, over the
// attention heads / the key/value heads. qkv_per_head (gptneox.py, bloom.py): a fused
// query_key_value whose PyTorch rows are per head [q, k, v] becomes [all q; all k; all v];
// qkv_per_kv_group (falcon.py): the same from key/value groups of [q heads..., k, v]. Each is a row
// permutation (peft/arch/gguf_row_order.hpp applies them).
enum class GgufRows { same, rope_q, rope_k, qkv_per_head, qkv_per_kv_group };

struct ModuleRule {
  NameTemplate hf;
  NameTemplate native;
  ModuleKind kind = ModuleKind::other;
  std::optional<NameTemplate> gguf;  // the GGUF tensor name without ".weight"/".bias"
  GgufRows gguf_rows = GgufRows::same;
  std::optional<std::string> gguf_stack;  // the placeholder that indexes a stacked GGUF tensor
};

struct RoleRule {
  std::string hf;      // "lora_A.weight"
  std::string native;  // "lora_a" (one segment: no "/")
};

// The built-in roles every table starts from.
const std::vector<RoleRule>& default_roles();

class ArchTable {
 public:
  // Parses and checks a table (PEFT_ERR_INVALID_CONFIG naming `source` and the rule at fault):
  // malformed templates, different placeholders on the two sides, duplicate roles, and rules whose
  // own example does not survive a round trip through the whole table (a rule shadowed by an
  // earlier one) are all rejected here, so a table that loads is invertible on its examples.
  static std::shared_ptr<const ArchTable> parse(std::string_view json_text, const std::string& source);
  static std::shared_ptr<const ArchTable> from_file(const std::string& path);

  const std::string& family() const { return family_; }
  const std::string& source() const { return source_; }
  const std::string& base_model_prefix() const { return base_model_prefix_; }  // "" if none
  const std::optional<std::string>& output_embedding() const { return output_embedding_; }
  // The input embedding modules the output embedding can be tied to, tried in order (a base stores
  // one of them), and the config.json key that ties them (tie_word_embeddings); both empty when the
  // family's output embedding is never tied, or tied in a way a copy cannot undo (T5's rescaling).
  const std::vector<std::string>& input_embeddings() const { return input_embeddings_; }
  const std::optional<std::string>& tie_embeddings_config() const { return tie_embeddings_config_; }
  const std::vector<std::string>& model_types() const { return model_types_; }
  const std::vector<std::string>& architectures() const { return architectures_; }
  const std::vector<std::string>& name_patterns() const { return name_patterns_; }
  // PEFT's default target_modules for a model_type (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
  const std::vector<std::string>* default_targets(const std::string& model_type) const;

  // Module paths (no role): the rule that matches, and the translation.
  const ModuleRule* rule_for_hf(std::string_view hf_module, NameTemplate::Captures* captures = nullptr) const;
  // The rule of an adapter's module path: as it is, else with base_model_prefix (PEFT's module
  // names of a task model may lack it, e.g. "layers.0.q_proj" of a "model." table).
  const ModuleRule* rule_for_module(std::string_view module) const;
  const ModuleRule* rule_for_native(std::string_view native_module,
                                    NameTemplate::Captures* captures = nullptr) const;
  std::optional<std::string> module_to_native(std::string_view hf_module) const;
  std::optional<std::string> module_to_hf(std::string_view native_module) const;

  // Whole keys: "[base_model.model.]<module>.<role>" <-> "<native module>/<native role>".
  std::optional<std::string> key_to_native(std::string_view hf_key) const;
  std::optional<std::string> key_to_hf(std::string_view native_key, bool with_peft_prefix) const;

  // GGUF: whether the table reads files of a GGUF architecture; the GGUF architecture of a
  // model_type (nullopt if none); module paths both ways (module_to_gguf gives a stacked module's
  // stacked tensor; module_from_gguf gives nullopt for a stacked tensor, which holds several modules).
  bool reads_gguf_architecture(std::string_view architecture) const;
  // Whether llama.cpp always computes this GGUF architecture's output from token_embd (its loader
  // reads no output.weight: Gemma 1 and 2), so that a tied pair cannot be untied in such a file.
  bool gguf_output_always_tied(std::string_view architecture) const;
  std::optional<std::string> gguf_architecture_of(std::string_view model_type) const;
  const ModuleRule* rule_for_gguf(std::string_view gguf_module, NameTemplate::Captures* captures = nullptr) const;
  std::optional<std::string> module_to_gguf(std::string_view hf_module) const;
  std::optional<std::string> module_from_gguf(std::string_view gguf_module) const;

  const std::vector<ModuleRule>& modules() const { return modules_; }
  const std::vector<RoleRule>& roles() const { return roles_; }

  // Other names of the same module: transformers >= 5 renames some modules in memory (ViT's
  // "vit.layers.N.attention.q_proj") while checkpoint files keep the original names
  // ("vit.encoder.layer.N.attention.attention.query"). Adapters trained on either carry those
  // names; "checkpoint_aliases" lists the pairs, used in both directions to find base tensors.
  std::vector<std::string> aliases_of(std::string_view module) const;

  // The "experts" section as written (null when absent): stacked expert parameters, read by
  // peft/arch/expert_params.hpp.
  const nlohmann::json& experts_data() const { return experts_; }

 private:
  void check_round_trips() const;

  std::string source_;
  std::string family_;
  std::string base_model_prefix_;
  std::map<std::string, std::vector<std::string>> gguf_architectures_;  // GGUF architecture -> model_types
  std::vector<std::string> gguf_output_always_tied_;
  std::optional<std::string> output_embedding_;
  std::vector<std::string> input_embeddings_;
  std::optional<std::string> tie_embeddings_config_;
  std::vector<std::string> model_types_;
  std::vector<std::string> architectures_;
  std::vector<std::string> name_patterns_;
  std::map<std::string, std::vector<std::string>> default_targets_;
  std::vector<ModuleRule> modules_;
  std::vector<std::pair<NameTemplate, NameTemplate>> aliases_;  // (in-memory name, checkpoint name)
  std::vector<RoleRule> roles_;           // file order
  nlohmann::json experts_;                // the "experts" section, or null
  std::vector<size_t> roles_by_hf_length_;  // indices, longest hf suffix first
};

}  // namespace peft
