//! The adapter doctor: checks an adapter folder against a base model folder without merging (and
//! without the strict loader, so it also reads adapters [`Adapter::open`](crate::Adapter::open)
//! refuses), and writes a copy with every known rename applied. The report is JSON (schema 1,
//! docs/doctor.md): `summary.ok`, `problems` (each with a stable `kind`), `modules`, `renames`,
//! `config_changes`; parse it with the JSON library of your choice.

use std::ffi::CString;
use std::os::raw::c_char;
use std::path::Path;

use peft_c_sys as sys;

use crate::error::{check, Result};
use crate::ffi::{c_path, take_string};

fn optional_path(path: Option<&Path>) -> Result<Option<CString>> {
    path.map(c_path).transpose()
}

/// The doctor's report on `adapter_dir` (against `base_dir` when given), as JSON. Problems are in the
/// report; errors (a missing folder, an unreadable config) are `Err`. Thread-safe.
pub fn adapter_doctor(adapter_dir: &Path, base_dir: Option<&Path>) -> Result<String> {
    let adapter = c_path(adapter_dir)?;
    let base = optional_path(base_dir)?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: valid strings (or NULL for no base); the report is ours on success.
    unsafe {
        check(sys::peft_adapter_doctor(
            adapter.as_ptr(),
            base.as_ref().map_or(std::ptr::null(), |b| b.as_ptr()),
            &mut out,
        ))?;
        Ok(take_string(out))
    }
}

/// Writes `out_dir`: `adapter_dir` with every rename the doctor knows applied (atomically, as an
/// adapter export). Returns the report on `adapter_dir`; run [`adapter_doctor`] on `out_dir` to see
/// what remains. Thread-safe for distinct output folders.
pub fn adapter_doctor_fix(adapter_dir: &Path, base_dir: Option<&Path>, out_dir: &Path) -> Result<String> {
    let adapter = c_path(adapter_dir)?;
    let base = optional_path(base_dir)?;
    let out_path = c_path(out_dir)?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: as above.
    unsafe {
        check(sys::peft_adapter_doctor_fix(
            adapter.as_ptr(),
            base.as_ref().map_or(std::ptr::null(), |b| b.as_ptr()),
            out_path.as_ptr(),
            &mut out,
        ))?;
        Ok(take_string(out))
    }
}
