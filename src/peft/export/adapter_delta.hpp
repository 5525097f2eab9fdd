// The weight change dW of one module of a loaded adapter, in the layout of the base weight it
// applies to: the one place where a method's delta is computed for conversions (lora_lowrank.hpp),
// so that each PEFT method plugs in here. Today: LoRA Linear and GPT-2 Conv1D modules,
// dW = scaling * B @ A (transposed for Conv1D), as PEFT's LoraLayer.get_delta_weight computes it in
// f32 (peft/methods/lora_math.hpp compute_delta).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peft/adapter/adapter.hpp"

namespace peft {

struct ModuleDelta {
  std::vector<float> values;  // rows x cols, row-major
  int64_t rows = 0;
  int64_t cols = 0;
  bool transposed = false;    // Conv1D: storage holds [in, out], the transpose of B @ A
};

// Whether module_delta handles `m`; otherwise `why` says what it is.
bool has_module_delta(const Adapter& adapter, const AdapterModule& m, std::string& why);

// dW of module `m` of `adapter`. UNSUPPORTED for what has_module_delta refuses; the checkpoint's
// read errors.
ModuleDelta module_delta(const Adapter& adapter, const AdapterModule& m);

}  // namespace peft
