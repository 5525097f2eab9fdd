//! Writing safetensors files and checkpoint folders, byte-identical to the reference writer.

use std::ffi::{c_char, CString};
use std::fmt;
use std::path::Path;

use peft_c_sys as sys;

use crate::callback::{source_trampoline, CallbackState};
use crate::checkpoint::Checkpoint;
use crate::dtype::{as_bytes, require_little_endian, DType, Element};
use crate::error::{check, Error, ErrorCode, Result};
use crate::ffi::{borrowed_path, borrowed_slice, c_path, c_string, new_handle};

/// A streaming writer of one `.safetensors` file ([`Writer::new`]) or of a checkpoint folder laid
/// out as transformers writes it ([`Writer::checkpoint`]).
///
/// Declare every tensor, then write each in [`Writer::order`], then [`Writer::finish`]. The output
/// appears atomically when finishing succeeds; dropping an unfinished writer discards it. A writer
/// belongs to one thread at a time (`Send`, not `Sync`).
pub struct Writer {
    raw: std::ptr::NonNull<sys::peft_writer>,
    /// Position, in the writer's order, of the next tensor to begin. Every successful call that
    /// begins a tensor begins the one at this position (the library refuses any other), so counting
    /// them tells which tensor comes next.
    next: usize,
}

impl Drop for Writer {
    fn drop(&mut self) {
        // SAFETY: owned by self and freed once, here; an unfinished output is discarded.
        unsafe { sys::peft_writer_free(self.raw.as_ptr()) }
    }
}

// SAFETY: the header lets a writer be used by one thread at a time, any thread; it is not Sync and
// every mutating call takes &mut self.
unsafe impl Send for Writer {}

impl Writer {
    /// A writer of one `.safetensors` file at `path`; nothing is created before writing starts.
    pub fn new(path: impl AsRef<Path>) -> Result<Writer> {
        let path = c_path(path.as_ref())?;
        // SAFETY: a valid string; the constructor stores an owned handle.
        let raw = unsafe { new_handle(|out| sys::peft_writer_new(path.as_ptr(), out))? };
        Ok(Writer { raw, next: 0 })
    }

    /// A writer of a checkpoint folder, sharded by `max_shard_size` bytes of tensor data (0: one file).
    pub fn checkpoint(folder: impl AsRef<Path>, max_shard_size: u64) -> Result<Writer> {
        let folder = c_path(folder.as_ref())?;
        // SAFETY: as above.
        let raw = unsafe { new_handle(|out| sys::peft_writer_new_checkpoint(folder.as_ptr(), max_shard_size, out))? };
        Ok(Writer { raw, next: 0 })
    }

    /// The raw handle, for calls through `peft-c-sys`. It stays owned by `self`.
    pub fn as_ptr(&self) -> *const sys::peft_writer {
        self.raw.as_ptr()
    }

    fn ptr(&mut self) -> *mut sys::peft_writer {
        self.raw.as_ptr()
    }

    /// Declares a tensor: its name (UTF-8, not `__metadata__`, not declared before; it may hold NUL
    /// bytes), its dtype in the file and its shape (empty for a scalar).
    pub fn add_tensor(&mut self, name: &str, dtype: DType, shape: &[u64]) -> Result<()> {
        // SAFETY: name.len() readable bytes and shape.len() dimensions, both copied.
        unsafe {
            check(sys::peft_writer_add_tensor_n(
                self.ptr(),
                name.as_ptr().cast(),
                name.len(),
                dtype.raw(),
                shape.as_ptr(),
                shape.len(),
            ))
        }
    }

    /// Chooses whether the file has a `__metadata__` entry at all (false also removes set keys).
    pub fn set_metadata_present(&mut self, present: bool) -> Result<()> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_writer_set_metadata_present(self.ptr(), i32::from(present))) }
    }

    /// Sets a metadata entry; makes the metadata present.
    pub fn set_metadata(&mut self, key: &str, value: &str) -> Result<()> {
        let (key, value) = (c_string(key, "metadata key")?, c_string(value, "metadata value")?);
        // SAFETY: valid strings, copied.
        unsafe { check(sys::peft_writer_set_metadata(self.ptr(), key.as_ptr(), value.as_ptr())) }
    }

    /// Checkpoint writers: the next declared tensor starts a new shard.
    pub fn break_shard(&mut self) -> Result<()> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_writer_break_shard(self.ptr())) }
    }

    /// Checkpoint writers: extra entries (a JSON object) for the index's `"metadata"`.
    pub fn set_index_metadata_json(&mut self, json_object: &str) -> Result<()> {
        let json = c_string(json_object, "index metadata")?;
        // SAFETY: a valid string, copied.
        unsafe { check(sys::peft_writer_set_index_metadata_json(self.ptr(), json.as_ptr())) }
    }

    /// Ends the declarations and computes the headers (done by the first write if not called).
    pub fn start(&mut self) -> Result<()> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_writer_start(self.ptr())) }
    }

    /// Number of declared tensors.
    pub fn tensor_count(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::peft_writer_tensor_count(self.raw.as_ptr()) }
    }

    /// Name of the tensor to write at `position` (NUL bytes included); None before
    /// [`Writer::start`] or out of range.
    pub fn tensor_name(&self, position: usize) -> Option<&str> {
        // SAFETY: the name's storage holds `length` bytes (then a NUL) and lives as long as the writer.
        unsafe {
            let ptr = sys::peft_writer_tensor_name(self.raw.as_ptr(), position);
            if ptr.is_null() {
                return None;
            }
            let length = sys::peft_writer_tensor_name_length(self.raw.as_ptr(), position);
            std::str::from_utf8(borrowed_slice(ptr.cast::<u8>(), length)).ok()
        }
    }

    /// Declaration index of the tensor at `position`; None before start or out of range.
    pub fn tensor_declaration(&self, position: usize) -> Option<usize> {
        // SAFETY: a live handle.
        let index = unsafe { sys::peft_writer_tensor_declaration(self.raw.as_ptr(), position) };
        (index != usize::MAX).then_some(index)
    }

    /// The names in the order they must be written (empty before [`Writer::start`]).
    pub fn order(&self) -> Vec<String> {
        (0..self.tensor_count()).map_while(|i| self.tensor_name(i).map(str::to_owned)).collect()
    }

    /// Number of files the writer produces (0 before start; an index file is not counted).
    pub fn file_count(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::peft_writer_file_count(self.raw.as_ptr()) }
    }

    /// Path of output file `file`; None before start or out of range.
    pub fn file_path(&self, file: usize) -> Option<&Path> {
        // SAFETY: the string lives as long as the writer.
        unsafe { borrowed_path(sys::peft_writer_file_path(self.raw.as_ptr(), file)) }
    }

    /// The C name to pass for the next tensor, which must be `name`. A name holding NUL bytes
    /// cannot travel as a C string: the binding checks it against the writer's order itself and
    /// passes NULL, which the library reads as "the next tensor".
    fn next_tensor_name(&mut self, name: &str) -> Result<Option<CString>> {
        if !name.contains('\0') {
            return c_string(name, "tensor name").map(Some);
        }
        self.start()?;
        match self.tensor_name(self.next) {
            Some(next) if next == name => Ok(None),
            next => Err(Error::invalid_argument(format!(
                "tensor {name:?} is not the next one to write (that is {:?})",
                next.unwrap_or("none: every tensor has begun")
            ))),
        }
    }

    /// Runs a call that begins the next tensor, named `name`, and moves on once it succeeds.
    fn begin_call(
        &mut self,
        name: &str,
        call: impl FnOnce(*mut sys::peft_writer, *const c_char) -> Result<()>,
    ) -> Result<()> {
        let c_name = self.next_tensor_name(name)?;
        call(self.ptr(), c_name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()))?;
        self.next += 1;
        Ok(())
    }

    /// Begins the next tensor; its bytes (of `src_dtype`) then come through [`Writer::write`].
    pub fn begin_tensor(&mut self, name: &str, src_dtype: DType) -> Result<()> {
        // SAFETY: a live handle and a valid name or NULL.
        self.begin_call(name, |w, name| unsafe { check(sys::peft_writer_begin_tensor(w, name, src_dtype.raw())) })
    }

    /// Appends bytes of the tensor begun with [`Writer::begin_tensor`].
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        // SAFETY: data.len() readable bytes, not kept.
        unsafe { check(sys::peft_writer_write(self.ptr(), data.as_ptr().cast(), data.len() as u64)) }
    }

    /// Writes the next tensor whole from bytes of `src_dtype` (converted when it is not the
    /// declared dtype).
    pub fn write_tensor(&mut self, name: &str, src_dtype: DType, data: &[u8]) -> Result<()> {
        self.begin_call(name, |w, name| {
            // SAFETY: data.len() readable bytes, not kept.
            unsafe {
                check(sys::peft_writer_write_tensor(w, name, src_dtype.raw(), data.as_ptr().cast(), data.len() as u64))
            }
        })
    }

    /// Writes the next tensor whole from typed values (converted when `T` is not the declared dtype).
    pub fn write_tensor_as<T: Element>(&mut self, name: &str, values: &[T]) -> Result<()> {
        require_little_endian()?;
        self.write_tensor(name, T::DTYPE, as_bytes(values))
    }

    /// Writes the next tensor from a closure that fills chunks: it is called with the byte offset
    /// of each chunk (of `src_dtype` bytes) until the tensor is complete. An `Err` from the closure
    /// cancels the write ([`ErrorCode::Cancelled`], carrying its message) and discards the output;
    /// a panic does the same and is then resumed.
    pub fn write_from_fn<F>(&mut self, name: &str, src_dtype: DType, source: F) -> Result<()>
    where
        F: FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    {
        let mut state = CallbackState::<F, std::io::Error>::new(source);
        let user_data = state.as_user_data();
        let result = self.begin_call(name, |w, name| {
            // SAFETY: the state outlives the call and the trampoline matches its type.
            unsafe {
                check(sys::peft_writer_write_from_callback(
                    w,
                    name,
                    src_dtype.raw(),
                    Some(source_trampoline::<F>),
                    user_data,
                ))
            }
        });
        match (result, state.finish()) {
            (Err(e), Some(reason)) if e.code() == ErrorCode::Cancelled => {
                Err(Error::new(ErrorCode::Cancelled, format!("{}: {reason}", e.message())))
            }
            (result, _) => result,
        }
    }

    /// Writes the next tensor from tensor `index` of an opened checkpoint (streamed, converted to
    /// the declared dtype if needed).
    pub fn write_from_checkpoint(&mut self, name: &str, checkpoint: &Checkpoint, index: usize) -> Result<()> {
        self.begin_call(name, |w, name| {
            // SAFETY: live handles and a valid name or NULL.
            unsafe { check(sys::peft_writer_write_from_checkpoint(w, name, checkpoint.as_ptr(), index)) }
        })
    }

    /// Completes the output: flushes every file and renames it into place. A missing tensor is an
    /// error after which the writer can still be completed.
    pub fn finish(&mut self) -> Result<()> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_writer_finish(self.ptr())) }
    }
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer").field("tensors", &self.tensor_count()).finish_non_exhaustive()
    }
}
