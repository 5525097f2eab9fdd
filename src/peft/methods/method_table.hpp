// The PEFT methods this library loads and merges, one row per method: everything the rest of the
// library needs to know about a method, so that nothing outside this room switches on it. A row
// holds the method's peft_type, its parameter names as saved (which the key grammar parses and the
// doctor recognises), the parameters saved once for the whole model, its layer kinds, what its
// merge does (a LoRA product, a dense delta, IA3's scale, a rotation on the input side, or
// replaced tensors), the out x in its parameters imply, the functions building its delta or its
// rotation from its parameters, and what conversion and export make of it. The arithmetic itself
// stays in the method's own file (peft_methods.hpp).
//
// A new method is one row here, its arithmetic file, its config reader and module resolution
// (method_fields.cpp, on the interfaces of method_config.hpp) and its tests;
// tests/unit/test_method_table.cpp walks the table and fails for a row that some part of the
// library does not support.
//
// Thread safety: the table is constant.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "peft/methods/method_config.hpp"
#include "peft/methods/peft_methods.hpp"

namespace peft {

// The PEFT methods whose adapters load and merge (peft_type). Every other peft_type is
// PEFT_ERR_UNSUPPORTED naming the method and why. LN_TUNING and TRAINABLE_TOKENS adapters hold
// replacements only: whole norm tensors (full modules) and embedding rows (trainable_tokens
// modules, their token_indices read as trainable_token_indices); they have no LoRA layers.
enum class PeftMethod {
  lora, loha, lokr, adalora, ia3, miss, shira, vera, randlora, fourierft, oft, boft, hra, ln_tuning, trainable_tokens,
  vblora, c3a
};

// What a module of the method does to its weight in a merge.
enum class MethodEffect {
  lora,         // LoRA's factors (methods/lora_math.hpp), not a method_param module
  delta,        // W += dW, a dense delta from the parameters (MethodRow::delta)
  scale,        // IA3: W *= l per output (or input) feature
  rotation,     // OFT, BOFT, HRA: W' = (W @ M) * s (MethodRow::transform)
  replacement,  // LN_TUNING, TRAINABLE_TOKENS: whole tensors or rows replaced, no method_param
};

// One module's parameters read as f32 (its own and the shared ones it uses), by parameter name
// ("hada_w1_a"), with its settings: what a row's delta and transform read.
struct MethodParams {
  std::string module;  // the module's name, for messages
  std::map<std::string, merge::MethodTensor> tensors;
  MethodSettings settings;
  const merge::MethodTensor* get(const std::string& name) const;
};

// out x in of a layer as its parameters fix them; 0 where they do not (the base decides).
struct MethodFeatures {
  int64_t out = 0;
  int64_t in = 0;
};
// A parameter's shape by name (empty when the module has no such parameter).
using ParamShapeOf = std::function<std::vector<int64_t>(std::string_view param)>;

struct MethodRow {
  PeftMethod method;
  const char* peft_type;  // "LOHA": adapter_config.json's peft_type
  // Every parameter name the method saves per module or once (shared); the key grammar parses
  // "<module>.<name>[.default]", or "<module>.<name>[.default].<key_tail>" when key_tail is set.
  std::span<const std::string_view> params;
  const char* key_tail;  // nullptr, or "weight" for OFT's oft_R (an OFTRotationModule's weight)
  // Parameters saved once as "base_model.<name>" and shared by every layer (VeRA's projections).
  std::span<const std::string_view> shared;
  MethodEffect effect;
  bool conv2d;  // also merges into nn.Conv2d weights [out, c, kh, kw] (LoHa, LoKr)
  // nullptr when the method merges into GPT-2 Conv1D layers; otherwise which layers PEFT
  // implements it for ("Linear and Conv layers"), said when a Conv1D layer is refused.
  const char* conv1d_refusal;
  // LyCORIS names: the doctor reads these parameters in any adapter (kohya/LyCORIS files).
  bool lycoris;
  // The out x in the parameters imply (0: not implied; the base model decides), or nullptr for
  // methods with no method_param modules.
  MethodFeatures (*features)(const ParamShapeOf& shape, const MethodSettings& settings);
  // Whether a module's delta depends on the weight it is added to (MiSS "bat"); nullptr: never.
  bool (*reads_weight)(const MethodSettings& settings);
  // dW [out * in] in PyTorch order (effect delta), `weight` the weight as it stands when
  // reads_weight; nullptr for other effects.
  std::vector<float> (*delta)(const MethodParams& params, double coefficient, const merge::DeltaLayout& layout,
                              const float* weight);
  // The input-side rotation (effect rotation); `inverse` gives PEFT's unmerge.
  merge::InputTransform (*transform)(const MethodParams& params, const merge::DeltaLayout& layout, bool inverse);
  // Conversion to plain LoRA without the base model: whether out x in come from the parameters
  // alone (features gives both) and the delta does not read the base.
  bool converts_without_base;
  // What adapter export (which writes LoRA only) tells the user to do instead.
  const char* export_hint;
  // Reads the method's own fields of adapter_config.json into `out` and edits `view` into LoRA's
  // names (FieldReader's errors); nullptr for LoRA itself.
  void (*read_config)(const FieldReader& fields, ConfigView& view, MethodConfig& out);
  // Sets a module's rank, alpha, scaling and settings from its parameters and the config, and
  // reports what does not fit; nullptr for methods without method_param modules (LoRA, whose
  // modules the loader resolves itself, and the replacements).
  void (*resolve)(ModuleResolution& module);
};

// Every row, in the order of PeftMethod.
std::span<const MethodRow> method_table();
const MethodRow& method_row(PeftMethod method);
// The row whose peft_type is `peft_type`, or null.
const MethodRow* method_row_for_type(std::string_view peft_type);
// The row that saves a parameter named `param` (LoHa for "hada_w1_a"), or null. "lora_A" /
// "lora_B" / "lora_E" are AdaLoRA's.
const MethodRow* method_row_for_param(std::string_view param);
// Whether `row` saves a parameter named `param`.
bool row_has_param(const MethodRow& row, std::string_view param);

// The row's effect: what the merges branch on.
MethodEffect effect_of(PeftMethod method);

// "LORA", "LOHA", ...: the row's peft_type.
const char* peft_method_name(PeftMethod method);

}  // namespace peft
