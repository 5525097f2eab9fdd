//! Serving, unmerged LoRA on activations (as `src/capi/serve_apply_api.cpp`): [`lora_apply`].

use peft_c_sys as sys;

use super::registry::Lease;
use super::{BufferRef, RawBuffer};
use crate::error::{check, Error, Result};
use crate::ffi::c_string;
use crate::merge_buffer::Buffer;

/// Adds each row's adapter contribution to one layer's output, without merging: for every row `i`
/// whose adapter `leases[row_lease[i]]` has a LoRA layer `module`,
/// `y[i] += scaling * (x[i] A^T) B^T` (plus `scaling * lora_B.bias` with lora_bias), computed in
/// F32 and rounded once into `y`'s dtype, as PEFT's forward of an unmerged model with mixed-batch
/// `adapter_names` does.
///
/// `x` holds the batch's activations, rows of `in_features`; `y` the base layer's output for the
/// same rows, rows of `out_features`, changed in place. `row_lease` gives each row an index into
/// `leases`, or -1 for no adapter; `None` uses `leases[0]` for every row. Rows with -1, or whose
/// adapter has no such layer, are left unchanged. Linear and GPT-2 Conv1D layers are supported;
/// `module` is a HuggingFace module path or weight name, or the host's name when the registry has
/// a translator.
///
/// On failure `y` is unchanged: [`ErrorCode::ShapeMismatch`](crate::ErrorCode::ShapeMismatch)
/// naming the adapter whose layer has other features, [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported)
/// for DoRA, embedding and Conv2d layers, [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument)
/// for no leases, an index out of range, or buffers that do not hold whole rows of the same count
/// (checked by the binding). Calls writing different outputs may run at once, also with the same
/// leases.
pub fn lora_apply(
    module: &str,
    leases: &[&Lease],
    row_lease: Option<&[i32]>,
    x: BufferRef<'_>,
    in_features: u64,
    y: Buffer<'_>,
    out_features: u64,
) -> Result<()> {
    if leases.is_empty() {
        return Err(Error::invalid_argument("lora_apply needs at least one lease"));
    }
    if in_features == 0 {
        return Err(Error::invalid_argument(format!("layer {module:?}: in_features is 0")));
    }
    let rows = x.len() as u64 / in_features;
    if rows * in_features != x.len() as u64 {
        return Err(Error::invalid_argument(format!(
            "layer {module:?}: x holds {} elements, not whole rows of {in_features}",
            x.len()
        )));
    }
    if rows.checked_mul(out_features) != Some(y.len() as u64) {
        return Err(Error::invalid_argument(format!(
            "layer {module:?}: y holds {} elements; {rows} rows of {out_features} are {:?}",
            y.len(),
            rows.checked_mul(out_features)
        )));
    }
    if let Some(indices) = row_lease {
        if indices.len() as u64 != rows {
            return Err(Error::invalid_argument(format!(
                "layer {module:?}: {} adapter indices for {rows} rows",
                indices.len()
            )));
        }
    }
    let c_module = c_string(module, "layer name")?;
    let raw_leases: Vec<*const sys::peft_lease> = leases.iter().map(|lease| lease.as_ptr()).collect();
    let row_ptr = row_lease.map_or(std::ptr::null(), <[i32]>::as_ptr);
    let y = RawBuffer::of(y);
    // SAFETY: live leases; x holds rows x in_features and y rows x out_features elements of their
    // dtypes, and row_lease (when given) rows indices (all checked above); y is exclusively
    // borrowed for the call.
    unsafe {
        check(sys::peft_lora_apply(
            c_module.as_ptr(),
            raw_leases.as_ptr(),
            raw_leases.len(),
            row_ptr,
            x.as_ptr(),
            x.dtype().raw(),
            rows,
            in_features,
            y.data,
            y.dtype.raw(),
            out_features,
        ))
    }
}
