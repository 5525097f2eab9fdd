// The doctor's report (adapter_doctor.hpp, which gives its schema): what the scan and the checks
// found, as the JSON text json.dumps(indent=2, sort_keys=True) writes (core/python_json.hpp). Each
// module's line (its keys, kind, dtype, base tensor, host name, rank, alpha, scaling, DoRA, method),
// each problem with the renames that fix it, every rename and every config entry --fix makes, and
// the summary. It holds no NaN or Infinity: a value that is not finite is null.
#pragma once

#include <string>

#include "peft/doctor/doctor_state.hpp"

namespace peft::doctor {

// After doctor_checks: the report, schema 1.
std::string report_json(const DoctorState& d);

}  // namespace peft::doctor
