// The weight change dW of one module of a loaded adapter, in the layout of the base weight it
// applies to: the one place where a method's delta is computed for conversions (lora_lowrank.hpp),
// so that each PEFT method plugs in here.
//
// * LoRA Linear and GPT-2 Conv1D modules: dW = scaling * B @ A (transposed for Conv1D), as PEFT's
//   LoraLayer.get_delta_weight computes it in f32 (peft/methods/lora_math.hpp compute_delta).
// * Additive methods (every method whose module method_delta handles: LoHa, LoKr, AdaLoRA, and the
//   methods added there later): dW = method_delta(module, scaling), PEFT's get_delta_weight. The
//   layer's out x in features come from the base weight when a base is given, otherwise from the
//   parameters' shapes for LoHa, LoKr and AdaLoRA (a later method without a base is UNSUPPORTED,
//   asking for one).
// * Multiplicative methods (IA3, and later those the buffer merge applies by transforming the weight):
//   dW = W' - W in f32, with W the base weight read as f32 and W' the same values after the buffer
//   merge of the module (BufferMerge::apply into an f32 copy: the "transformed weight" entry point,
//   so any method the buffer merge takes converts). A base is required. IA3 on a layer that also
//   scales a base bias (not feed-forward, the base has "<module>.bias") is UNSUPPORTED: the bias
//   change is not a weight change a plain LoRA can hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peft/adapter/adapter.hpp"
#include "peft/base/base_model.hpp"

namespace peft {

struct ModuleDelta {
  std::vector<float> values;  // rows x cols, row-major
  int64_t rows = 0;
  int64_t cols = 0;
  bool transposed = false;    // Conv1D: storage holds [in, out], the transpose of B @ A
};

// Whether module `m`'s change depends on the base weight (IA3's scale, the OFT/BOFT/HRA rotations,
// MiSS's "bat" form): its dW is W' - W, computed against a base.
bool is_multiplicative(const AdapterModule& m);

// Whether module_delta handles `m` (with a base model when `with_base`); otherwise `why` says what it is.
// A LoRA module's lora_B.bias is refused (PEFT's convert_to_lora does not take it) unless
// `bias_apart`: the caller carries the bias itself (the delta-space combination), dW is the weight's.
bool has_module_delta(const Adapter& adapter, const AdapterModule& m, bool with_base, std::string& why,
                      bool bias_apart = false);

// A module whose change is a LoRA product exactly, as PEFT's convert_to_lora takes it without an
// SVD: MiSS in its standard and "mini" forms (dW[o, j] = block[j % r, o % cols]) gives
// lora_A [r, in] with A[k, j] = 1 where j % r == k and lora_B [out, r] = the block transposed
// (repeated across the output features for "mini"), at MiSS's own rank r whatever rank or energy
// the conversion asks for. Needs the base for the layer's features, as module_delta does.
struct ExactLora {
  std::vector<float> a;  // [rank, in]
  std::vector<float> b;  // [out, rank]
  int64_t rank = 0;
};

// Whether module `m` converts exactly (exact_lora); false for every other module.
bool has_exact_lora(const AdapterModule& m);

// The exact factors of a module has_exact_lora accepts; the errors of module_delta.
ExactLora exact_lora(const Adapter& adapter, const AdapterModule& m, const BaseModel* base);

// dW of module `m` of `adapter`; `base` may be null for LoRA and LoHa/LoKr/AdaLoRA modules.
// UNSUPPORTED for what has_module_delta refuses; NOT_FOUND when the base has no weight for the
// module; SHAPE_MISMATCH when the parameters do not fit it; the checkpoints' read errors.
ModuleDelta module_delta(const Adapter& adapter, const AdapterModule& m, const BaseModel* base,
                         bool bias_apart = false);

}  // namespace peft
