//! Control vectors (steering vectors): one direction of `n_embd` values per decoder layer, read from
//! and written to llama.cpp's GGUF or safetensors files, combined, and added to a host's buffer.

use std::fmt;
use std::path::Path;

use peft_c_sys as sys;

use crate::dtype::{as_bytes, require_little_endian, DType};
use crate::error::{check, Error, Result};
use crate::ffi::{borrowed_str, c_path, c_string, new_handle};
use crate::gguf::FileFormat;
use crate::merge_buffer::Buffer;

/// A control vector: directions by layer, each of [`n_embd`](ControlVector::n_embd) f32 values. A
/// host adds `strength` x the direction of layer N to the output of its 0-based decoder layer N, the
/// way llama.cpp applies `--control-vector`.
///
/// The reading methods may run on many threads at once (`Send + Sync`); the changing ones take
/// `&mut self`.
pub struct ControlVector {
    raw: std::ptr::NonNull<sys::peft_control_vector>,
}

impl Drop for ControlVector {
    fn drop(&mut self) {
        // SAFETY: owned by self, freed once.
        unsafe { sys::peft_control_vector_free(self.raw.as_ptr()) }
    }
}

// SAFETY: the header makes the const functions thread-safe; the others take &mut self.
unsafe impl Send for ControlVector {}
// SAFETY: as above.
unsafe impl Sync for ControlVector {}

impl ControlVector {
    /// Reads a control vector from a GGUF or safetensors file (the format is told by its contents).
    /// Errors: [`ErrorCode::Io`](crate::ErrorCode::Io) for a file that does not open,
    /// `InvalidCheckpoint` for a file that is no control vector, `NonFinite` for an infinite or NaN
    /// value.
    pub fn open(path: impl AsRef<Path>) -> Result<ControlVector> {
        let c_path = c_path(path.as_ref())?;
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(ControlVector { raw: unsafe { new_handle(|out| sys::peft_control_vector_open(c_path.as_ptr(), out))? } })
    }

    /// An empty control vector of `n_embd` values per direction (in [1, 2^31]), made for the model
    /// `model_hint` (None: none).
    pub fn new(n_embd: u64, model_hint: Option<&str>) -> Result<ControlVector> {
        let hint = model_hint.map(|h| c_string(h, "model hint")).transpose()?;
        let hint_ptr = hint.as_ref().map_or(std::ptr::null(), |h| h.as_ptr());
        // SAFETY: the constructor stores an owned handle or fails; the hint is copied.
        Ok(ControlVector { raw: unsafe { new_handle(|out| sys::peft_control_vector_new(n_embd, hint_ptr, out))? } })
    }

    /// The raw handle, for calls through `peft-c-sys`. It stays owned by `self`.
    pub fn as_ptr(&self) -> *const sys::peft_control_vector {
        self.raw.as_ptr()
    }

    /// Values per direction (the model's hidden size).
    pub fn n_embd(&self) -> u64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_control_vector_n_embd(self.as_ptr()) }
    }

    /// The model the vector was made for, as its file names it ("" when none).
    pub fn model_hint(&self) -> &str {
        // SAFETY: the string lives until the vector is changed (&mut self) or dropped.
        unsafe { borrowed_str(sys::peft_control_vector_model_hint(self.as_ptr())) }.unwrap_or("")
    }

    /// How many layers have a direction.
    pub fn layer_count(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::peft_control_vector_layer_count(self.as_ptr()) }
    }

    /// The layer of the `index`-th direction (layers in ascending order); None out of range.
    pub fn layer(&self, index: usize) -> Option<i64> {
        // SAFETY: a live handle; the index is checked by the library.
        let layer = unsafe { sys::peft_control_vector_layer(self.as_ptr(), index) };
        (layer >= 0).then_some(layer)
    }

    /// The layers that have a direction, ascending.
    pub fn layers(&self) -> Vec<i64> {
        (0..self.layer_count()).filter_map(|i| self.layer(i)).collect()
    }

    /// A copy of one layer's direction; None for a layer without one.
    pub fn direction(&self, layer: i64) -> Option<Vec<f32>> {
        let n = usize::try_from(self.n_embd()).ok()?;
        // SAFETY: a live handle; a non-NULL result points to n_embd floats valid until the vector
        // changes, which cannot happen while self is borrowed.
        let ptr = unsafe { sys::peft_control_vector_direction(self.as_ptr(), layer) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: as above.
        Some(unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec())
    }

    /// Sets one layer's direction (layer >= 0) from `n_embd` f32 values, replacing what it had.
    /// On failure the vector is unchanged (`NonFinite` for an infinite or NaN value).
    pub fn set_direction(&mut self, layer: i64, values: &[f32]) -> Result<()> {
        require_little_endian()?;
        self.set_direction_raw(layer, DType::F32, as_bytes(values))
    }

    /// Sets one layer's direction from the raw little-endian bytes of `n_embd` elements of `dtype`
    /// (F32, BF16, F16 or F64), converted to f32.
    pub fn set_direction_raw(&mut self, layer: i64, dtype: DType, data: &[u8]) -> Result<()> {
        let n = self.n_embd();
        if dtype.bytes_for(n) != Some(data.len() as u64) {
            return Err(Error::invalid_argument(format!(
                "a direction is {n} elements; {} bytes of {dtype} were given",
                data.len()
            )));
        }
        // SAFETY: data holds n_embd elements of dtype (checked above); copied by the library.
        unsafe {
            check(sys::peft_control_vector_set_direction(self.raw.as_ptr(), layer, dtype.raw(), data.as_ptr().cast()))
        }
    }

    /// Adds `strength` x `src` to this vector, layer by layer, with llama.cpp's f32 arithmetic (a
    /// layer this vector lacks starts at zero). On failure the vector is unchanged
    /// (`ShapeMismatch` when the `n_embd` differ, `NonFinite` when a sum overflows).
    pub fn add(&mut self, src: &ControlVector, strength: f64) -> Result<()> {
        // SAFETY: live handles; src is borrowed shared, self exclusively, so they differ.
        unsafe { check(sys::peft_control_vector_add(self.raw.as_ptr(), src.as_ptr(), strength)) }
    }

    /// Writes the vector to `path`, atomically, as llama.cpp's GGUF or as safetensors. A GGUF file
    /// cannot hold a direction for layer 0 (`InvalidArgument`).
    pub fn save(&self, path: impl AsRef<Path>, format: FileFormat) -> Result<()> {
        let c_path = c_path(path.as_ref())?;
        let format = match format {
            FileFormat::Safetensors => sys::PEFT_FORMAT_SAFETENSORS,
            FileFormat::Gguf => sys::PEFT_FORMAT_GGUF,
        };
        // SAFETY: a live handle and a NUL-terminated path.
        unsafe { check(sys::peft_control_vector_save(self.as_ptr(), c_path.as_ptr(), format)) }
    }

    /// Adds layer `layer`'s direction x `strength` to every row of `buffer` (F32, BF16 or F16, a
    /// whole number of rows of `n_embd` elements), in place: y = round(x + d * (float)strength) as
    /// llama.cpp computes it. A layer without a direction leaves the buffer as it is. Returns the
    /// record with which [`ControlRecord::remove`] takes the direction out again exactly.
    pub fn apply(&self, layer: i64, strength: f64, buffer: Buffer<'_>) -> Result<ControlRecord> {
        let len = buffer.len();
        let dtype = buffer.dtype();
        let mut out: *mut sys::peft_control_record = std::ptr::null_mut();
        self.apply_raw(layer, strength, buffer, &mut out)?;
        let raw = std::ptr::NonNull::new(out)
            .ok_or_else(|| Error::new(crate::ErrorCode::Internal, "peft_c returned no record and no error"))?;
        Ok(ControlRecord { raw, dtype, len })
    }

    /// [`apply`](ControlVector::apply) without a record (the direction cannot be taken out exactly).
    pub fn apply_without_record(&self, layer: i64, strength: f64, buffer: Buffer<'_>) -> Result<()> {
        self.apply_raw(layer, strength, buffer, std::ptr::null_mut())
    }

    fn apply_raw(
        &self,
        layer: i64,
        strength: f64,
        mut buffer: Buffer<'_>,
        out: *mut *mut sys::peft_control_record,
    ) -> Result<()> {
        let rows = rows_of(buffer.len(), self.n_embd())?;
        // SAFETY: the buffer holds rows x n_embd elements of its dtype (checked above), exclusively
        // borrowed for the call; out is NULL or a valid out-parameter.
        unsafe {
            check(sys::peft_control_vector_apply(
                self.as_ptr(),
                layer,
                strength,
                buffer.as_mut_ptr(),
                buffer.dtype().raw(),
                rows,
                out,
            ))
        }
    }
}

/// The rows a buffer of `len` elements holds: a whole, nonzero number of `n_embd`-element rows.
fn rows_of(len: usize, n_embd: u64) -> Result<u64> {
    let len = len as u64;
    if n_embd == 0 || len == 0 || len % n_embd != 0 {
        return Err(Error::invalid_argument(format!(
            "the buffer holds {len} elements, not a whole nonzero number of rows of {n_embd}"
        )));
    }
    Ok(len / n_embd)
}

impl fmt::Debug for ControlVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlVector")
            .field("n_embd", &self.n_embd())
            .field("model_hint", &self.model_hint())
            .field("layers", &self.layers())
            .finish()
    }
}

/// A direction added to a buffer by [`ControlVector::apply`], and what taking it out exactly needs
/// (twice the buffer's bytes). Dropping it leaves the buffer as it is. Belongs to one thread at a
/// time (`Send`, not `Sync`).
pub struct ControlRecord {
    raw: std::ptr::NonNull<sys::peft_control_record>,
    dtype: DType,
    len: usize,
}

impl Drop for ControlRecord {
    fn drop(&mut self) {
        // SAFETY: owned by self, freed once.
        unsafe { sys::peft_control_record_free(self.raw.as_ptr()) }
    }
}

// SAFETY: the header makes records thread-safe for different records; not shared (not Sync).
unsafe impl Send for ControlRecord {}

impl ControlRecord {
    /// The raw handle, for calls through `peft-c-sys`. It stays owned by `self`.
    pub fn as_ptr(&self) -> *const sys::peft_control_record {
        self.raw.as_ptr()
    }

    /// Puts back the bytes the buffer held before the apply, after checking that it still holds what
    /// the apply wrote (it may have moved; with several applies, remove them in reverse order). On
    /// failure nothing is changed; on success the record is spent (a second remove fails).
    pub fn remove(&mut self, mut buffer: Buffer<'_>) -> Result<()> {
        if buffer.dtype() != self.dtype || buffer.len() != self.len {
            return Err(Error::invalid_argument(format!(
                "the buffer is {} x {}; the apply was to {} x {}",
                buffer.len(),
                buffer.dtype(),
                self.len,
                self.dtype
            )));
        }
        // SAFETY: the buffer has the dtype and length of the apply (checked above), exclusively
        // borrowed for the call; the record is live.
        unsafe { check(sys::peft_control_record_remove(self.raw.as_ptr(), buffer.as_mut_ptr())) }
    }
}

impl fmt::Debug for ControlRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlRecord").field("dtype", &self.dtype).field("len", &self.len).finish()
    }
}
