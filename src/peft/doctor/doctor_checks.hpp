// The doctor's checks (adapter_doctor.hpp): each module as the loader and the base validation
// would see it. Names first (renamed_module, weight_suffix, kohya_name, embedding_role: the
// problems --fix renames away), then the module's tensors: dtypes, kohya alphas and dora_scales,
// LoRA's factors (ranks, transposed or mismatched shapes, alpha and scaling, DoRA, lora_bias,
// targeting), other methods' parameters (LyCORIS files told apart from PEFT ones), and the shapes
// against the base. Then over the whole adapter: keys whose renames would meet, and targets with
// no tensors. Each module's report line and the key --fix writes for each entry are set here.
#pragma once

#include "peft/doctor/doctor_state.hpp"

namespace peft::doctor {

// After doctor_config: checks every group, fills reports and each entry's final_key, and records
// the problems.
void check_modules(DoctorState& d);

}  // namespace peft::doctor
