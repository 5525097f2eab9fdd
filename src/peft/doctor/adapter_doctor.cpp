// The adapter doctor (adapter_doctor.hpp): strings its jobs together on one DoctorState: the scan
// (doctor_scan: the folder opened, every key read, each module placed in the base), the config
// (doctor_config), the checks (doctor_checks), the report (doctor_report) and the fix (doctor_fix).
#include "peft/doctor/adapter_doctor.hpp"

#include "peft/doctor/doctor_checks.hpp"
#include "peft/doctor/doctor_config.hpp"
#include "peft/doctor/doctor_fix.hpp"
#include "peft/doctor/doctor_report.hpp"
#include "peft/doctor/doctor_scan.hpp"
#include "peft/doctor/doctor_state.hpp"

namespace peft {
namespace {

doctor::DoctorState examine(const std::string& adapter_dir, const std::string& base_dir) {
  doctor::DoctorState d;
  d.dir = adapter_dir;
  d.base_dir = base_dir;
  doctor::open_adapter(d);
  doctor::scan_keys(d);
  doctor::resolve_modules(d);
  doctor::settle_config(d);
  doctor::check_modules(d);
  return d;
}

DoctorResult result_of(const doctor::DoctorState& d) { return {doctor::report_json(d), d.problems.empty()}; }

}  // namespace

DoctorResult diagnose_adapter(const std::string& adapter_dir, const std::string& base_dir) {
  return result_of(examine(adapter_dir, base_dir));
}

DoctorResult fix_adapter(const std::string& adapter_dir, const std::string& base_dir, const std::string& out_dir) {
  const doctor::DoctorState d = examine(adapter_dir, base_dir);
  doctor::check_out_dir(d, out_dir);
  DoctorResult result = result_of(d);
  doctor::write_fix(d, out_dir);
  return result;
}

}  // namespace peft
