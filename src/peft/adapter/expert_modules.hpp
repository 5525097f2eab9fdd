// LoRA on stacked MoE expert parameters (LoraConfig.target_parameters, PEFT 0.21's ParamWrapper):
// which adapter modules they are, and what in PEFT's key layout says which parameter each adapts.
//
// PEFT saves such a layer under the experts module's path with no parameter name. Several targeted
// parameters of one module are nested wrappers, in the module's declaration order (the first
// declared is the innermost), so "<experts>.base_layer.lora_A.weight" is the inner one and
// "<experts>.lora_A.weight" the outer: a module wrapped d times in "base_layer" adapts the
// parameter at index (n - 1 - d) among its n targeted parameters, in declaration order. The order
// and the parameters are architecture data (arch/expert_params.hpp). A parameter is targeted when
// "<module>.<param>" equals a target_parameters entry or ends with "." + the entry (PEFT's match).
#pragma once

#include <string>
#include <vector>

#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/adapter_module.hpp"
#include "peft/arch/arch_table.hpp"

namespace peft {

// Sets AdapterModule::expert (and the base_tensor of its LoRA tensors, "<module>.<param>") on
// every LoRA module that adapts a stacked expert parameter. A module whose path (without its
// "base_layer" wrappers) holds a parameter some target_parameters entry names, but that the table
// (null: none) does not resolve to a parameter, is PEFT_ERR_UNRESOLVED_KEY naming its keys.
void resolve_expert_modules(std::vector<AdapterModule>& modules, const LoraConfig& config, const ArchTable* table,
                            const std::string& dir);

// PEFT_ERR_UNSUPPORTED naming the module and `job` ("combining adapters") when one of the modules
// adapts a stacked expert parameter, which that job does not support.
void refuse_expert_modules(const std::vector<AdapterModule>& modules, const std::string& job);

}  // namespace peft
