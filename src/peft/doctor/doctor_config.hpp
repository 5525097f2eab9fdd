// The config the doctor's checks read (adapter_doctor.hpp): the adapter folder's own
// adapter_config.json, or, for a folder without one (kohya / LyCORIS files), a LoRA config made
// from its tensors and reported as missing_config (--fix writes it); and the module matcher over
// that config, its target_modules expanded from the base when the config leaves them implicit.
#pragma once

#include "peft/doctor/doctor_state.hpp"

namespace peft::doctor {

// After doctor_scan: makes the config when the folder has none, then the matcher.
void settle_config(DoctorState& d);

}  // namespace peft::doctor
