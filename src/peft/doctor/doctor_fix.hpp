// The doctor's --fix (adapter_doctor.hpp): writes a copy of the adapter folder with every rename
// the scan and the checks settled on (each entry's final_key; tensors without a known fix under
// their key as found), the config entries they added (kohya alphas and ranks as alpha_pattern /
// rank_pattern, or the whole config made for a folder without one) and renamed modules renamed in
// target_modules and modules_to_save. It never writes over what it reads.
#pragma once

#include <string>

#include "peft/doctor/doctor_state.hpp"

namespace peft::doctor {

// PEFT_ERR_INVALID_ARGUMENT when `out_dir` (weakly canonical) is the adapter folder, the base
// folder, or inside a hub cache snapshot; checked before anything is written.
void check_out_dir(const DoctorState& d, const std::string& out_dir);

// Writes the fixed copy into `out_dir` as adapter export writes a folder (temporaries renamed into
// place).
void write_fix(const DoctorState& d, const std::string& out_dir);

}  // namespace peft::doctor
