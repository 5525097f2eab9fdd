// The doctor's first job (adapter_doctor.hpp): opens the adapter folder as it is (its config, or a
// stand-in LoRA config when it has none, its safetensors header, the base model when given, the
// architecture family), reads every key of the adapter (PEFT's grammar, kohya / LyCORIS names and
// suffix variants through key_renames.hpp) into an Entry, groups the entries by module and finds
// each module in the base, with a known rename when exactly one fits. Problems with keys and
// module names are recorded as found; the checks of each module are doctor_checks'.
#pragma once

#include "peft/doctor/doctor_state.hpp"

namespace peft::doctor {

// Fills dir (a hub model id resolved), missing_config, config, weights, base, table and family.
// Errors as diagnose_adapter's (adapter_doctor.hpp).
void open_adapter(DoctorState& d);

// One Entry per tensor, in the file's order, with its module, role and (for keys it cannot read)
// its final key; records missing_peft_prefix and unmatched_key.
void scan_keys(DoctorState& d);

// One Group per module as written, resolved against the base (base_index, the renamed name);
// records kohya_name, ambiguous_rename and unmatched_key for modules it cannot place.
void resolve_modules(DoctorState& d);

}  // namespace peft::doctor
