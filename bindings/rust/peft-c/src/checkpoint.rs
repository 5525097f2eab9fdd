//! Reading safetensors and GGUF files and checkpoint folders.

use std::fmt;
use std::path::Path;

use peft_c_sys as sys;

use crate::dtype::{as_bytes_mut, require_little_endian, DType, Element};
use crate::error::{check, Error, ErrorCode, Result};
use crate::ffi::{borrowed_path, borrowed_slice, borrowed_str, c_path, handle, new_handle};
use crate::gguf::GgmlType;

handle!(
    /// Options for opening files: the header cap and mmap or pread.
    ///
    /// Belongs to one thread at a time (`Send`, not `Sync`).
    OpenOptions,
    sys::peft_open_options,
    sys::peft_open_options_free
);

// SAFETY: the header lets options move between threads; they are not shared (not Sync).
unsafe impl Send for OpenOptions {}

impl OpenOptions {
    /// The defaults: memory-mapped, header cap 100,000,000 bytes.
    pub fn new() -> Result<OpenOptions> {
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(OpenOptions { raw: unsafe { new_handle(|out| sys::peft_open_options_new(out))? } })
    }

    /// The largest header length accepted ([`ErrorCode::HeaderTooLarge`] above it).
    pub fn set_max_header_size(&mut self, max_bytes: u64) -> Result<&mut Self> {
        // SAFETY: a live handle owned by self.
        unsafe { check(sys::peft_open_options_set_max_header_size(self.raw.as_ptr(), max_bytes))? };
        Ok(self)
    }

    /// Reads with pread instead of memory mapping: each tensor is read when first viewed.
    pub fn set_use_pread(&mut self, use_pread: bool) -> Result<&mut Self> {
        // SAFETY: a live handle owned by self.
        unsafe { check(sys::peft_open_options_set_use_pread(self.raw.as_ptr(), i32::from(use_pread)))? };
        Ok(self)
    }
}

impl fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenOptions").finish_non_exhaustive()
    }
}

handle!(
    /// A validated, opened checkpoint: one `.safetensors` or GGUF file, or a folder holding
    /// `model.safetensors` or `model.safetensors.index.json` and its shards.
    ///
    /// Read-only after opening, so it may be used from many threads at once (`Send + Sync`).
    /// Views borrow from it and cannot outlive it.
    Checkpoint,
    sys::peft_checkpoint,
    sys::peft_checkpoint_free
);

// SAFETY: the header documents a checkpoint as read-only after opening, every function callable
// from many threads at once, and free callable from any thread.
unsafe impl Send for Checkpoint {}
// SAFETY: as above.
unsafe impl Sync for Checkpoint {}

/// What the header says about one tensor. Borrowed from its [`Checkpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorInfo<'a> {
    /// The tensor's index in the checkpoint (file by file, each file in data order).
    pub index: usize,
    /// The tensor's name.
    pub name: &'a str,
    /// Its dtype; None for a block-quantized GGUF tensor (Q8_0, Q4_K, ...), which has none (see
    /// `ggml_type`), and for a dtype newer than this binding.
    pub dtype: Option<DType>,
    /// Its shape (empty for a scalar).
    pub shape: &'a [u64],
    /// Its byte range in its file's data section (`data_offsets`: begin, end).
    pub data_offsets: (u64, u64),
    /// Which file of the checkpoint holds it.
    pub file: usize,
    /// Its ggml type as its GGUF file stores it; None in a safetensors file.
    pub ggml_type: Option<GgmlType>,
}

impl TensorInfo<'_> {
    /// The number of elements (1 for a scalar).
    pub fn num_elements(&self) -> u64 {
        // The library checked that the product fits when it opened the file.
        self.shape.iter().product()
    }

    /// The number of bytes.
    pub fn nbytes(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }
}

impl Checkpoint {
    /// Opens a `.safetensors` or GGUF file or a checkpoint folder and validates it completely.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        Checkpoint::open_impl(path.as_ref(), None)
    }

    /// Opens with options (see [`OpenOptions`]).
    pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Checkpoint> {
        Checkpoint::open_impl(path.as_ref(), Some(options))
    }

    fn open_impl(path: &Path, options: Option<&OpenOptions>) -> Result<Checkpoint> {
        let path = c_path(path)?;
        let opts = options.map_or(std::ptr::null(), OpenOptions::as_ptr);
        // SAFETY: valid string and options (or NULL); the constructor stores an owned handle.
        let raw = unsafe { new_handle(|out| sys::peft_checkpoint_open(path.as_ptr(), opts, out))? };
        Ok(Checkpoint { raw })
    }

    /// Validates a safetensors or GGUF file held in memory and opens it. The bytes are copied.
    pub fn from_bytes(data: &[u8]) -> Result<Checkpoint> {
        Checkpoint::from_bytes_impl(data, None)
    }

    /// [`Checkpoint::from_bytes`] with options (the pread option does not apply).
    pub fn from_bytes_with(data: &[u8], options: &OpenOptions) -> Result<Checkpoint> {
        Checkpoint::from_bytes_impl(data, Some(options))
    }

    fn from_bytes_impl(data: &[u8], options: Option<&OpenOptions>) -> Result<Checkpoint> {
        let opts = options.map_or(std::ptr::null(), OpenOptions::as_ptr);
        // SAFETY: data.len() readable bytes; the library copies them.
        let raw =
            unsafe { new_handle(|out| sys::peft_checkpoint_open_memory(data.as_ptr().cast(), data.len(), opts, out))? };
        Ok(Checkpoint { raw })
    }

    pub(crate) fn ptr(&self) -> *const sys::peft_checkpoint {
        self.raw.as_ptr()
    }

    /// Number of files: 1 for a single file, else the number of shards.
    pub fn file_count(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::peft_checkpoint_file_count(self.ptr()) }
    }

    /// Path of file `file` as opened (a folder joined with the shard name); None out of range.
    pub fn file_path(&self, file: usize) -> Option<&Path> {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_path(sys::peft_checkpoint_file_path(self.ptr(), file)) }
    }

    /// Whether file `file` has a `__metadata__` entry (which may be empty).
    pub fn has_metadata(&self, file: usize) -> bool {
        // SAFETY: a live handle; out-of-range indices give 0.
        unsafe { sys::peft_checkpoint_has_metadata(self.ptr(), file) != 0 }
    }

    /// The `__metadata__` entries of file `file`, sorted by key bytes (empty when it has none).
    pub fn metadata(&self, file: usize) -> Vec<(&str, &str)> {
        // SAFETY: a live handle; the strings live as long as self.
        unsafe {
            let count = sys::peft_checkpoint_metadata_count(self.ptr(), file);
            (0..count)
                .filter_map(|entry| {
                    let key = borrowed_str(sys::peft_checkpoint_metadata_key(self.ptr(), file, entry))?;
                    let value = borrowed_str(sys::peft_checkpoint_metadata_value(self.ptr(), file, entry))?;
                    Some((key, value))
                })
                .collect()
        }
    }

    /// The value of metadata key `key` of file `file`.
    pub fn metadata_value(&self, file: usize, key: &str) -> Option<&str> {
        self.metadata(file).into_iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The `"metadata"` object of `model.safetensors.index.json` as compact JSON; None without an
    /// index or without that object.
    pub fn index_metadata_json(&self) -> Option<&str> {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_checkpoint_index_metadata_json(self.ptr())) }
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::peft_checkpoint_tensor_count(self.ptr()) }
    }

    /// Whether the checkpoint has no tensors.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index of the tensor named `name` ([`ErrorCode::NotFound`] when absent). Names may
    /// hold NUL bytes (JSON can spell `\u0000`).
    pub fn find(&self, name: &str) -> Result<usize> {
        let mut index = 0usize;
        // SAFETY: name.len() readable bytes; index is written only on success.
        unsafe { check(sys::peft_checkpoint_find_n(self.ptr(), name.as_ptr().cast(), name.len(), &mut index))? };
        Ok(index)
    }

    /// The name of tensor `index`, NUL bytes included.
    fn tensor_name(&self, index: usize) -> Option<&str> {
        // SAFETY: the name's storage holds `length` bytes (then a NUL) and lives as long as self.
        unsafe {
            let ptr = sys::peft_checkpoint_tensor_name(self.ptr(), index);
            if ptr.is_null() {
                return None;
            }
            let length = sys::peft_checkpoint_tensor_name_length(self.ptr(), index);
            std::str::from_utf8(borrowed_slice(ptr.cast::<u8>(), length)).ok()
        }
    }

    /// What the header says about tensor `index`; None when out of range.
    pub fn tensor(&self, index: usize) -> Option<TensorInfo<'_>> {
        // SAFETY: a live handle; every getter checks the index; borrowed data lives as long as self.
        unsafe {
            let name = self.tensor_name(index)?;
            let dtype = DType::from_raw(sys::peft_checkpoint_tensor_dtype(self.ptr(), index));
            let ndim = sys::peft_checkpoint_tensor_ndim(self.ptr(), index);
            let shape = borrowed_slice(sys::peft_checkpoint_tensor_shape(self.ptr(), index), ndim);
            let (mut begin, mut end) = (0u64, 0u64);
            check(sys::peft_checkpoint_tensor_offsets(self.ptr(), index, &mut begin, &mut end)).ok()?;
            let file = sys::peft_checkpoint_tensor_file(self.ptr(), index);
            let ggml_type = self.tensor_ggml_type(index);
            Some(TensorInfo { index, name, dtype, shape, data_offsets: (begin, end), file, ggml_type })
        }
    }

    /// What the header says about the tensor named `name`.
    pub fn tensor_by_name(&self, name: &str) -> Result<TensorInfo<'_>> {
        let index = self.find(name)?;
        self.tensor(index).ok_or_else(|| Error::new(ErrorCode::Internal, format!("tensor {name:?} vanished")))
    }

    /// Every tensor, in index order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorInfo<'_>> + '_ {
        (0..self.len()).filter_map(move |i| self.tensor(i))
    }

    /// A zero-copy view of tensor `index`'s bytes (little-endian, row-major), valid as long as
    /// the checkpoint.
    pub fn view(&self, index: usize) -> Result<&[u8]> {
        let mut data: *const std::ffi::c_void = std::ptr::null();
        let mut nbytes = 0u64;
        // SAFETY: valid out-pointers; the view stays valid while self lives, which the returned
        // lifetime enforces.
        unsafe {
            check(sys::peft_checkpoint_tensor_view(self.ptr(), index, &mut data, &mut nbytes))?;
            let len = usize::try_from(nbytes)
                .map_err(|_| Error::new(ErrorCode::OutOfMemory, "tensor larger than the address space"))?;
            Ok(borrowed_slice(data.cast::<u8>(), len))
        }
    }

    /// A zero-copy typed view of tensor `index`. Fails with [`ErrorCode::ShapeMismatch`] when the
    /// tensor's dtype is not `T`'s and with [`ErrorCode::InvalidArgument`] when the bytes are not
    /// aligned for `T` (files written by the reference writer are).
    pub fn view_as<T: Element>(&self, index: usize) -> Result<&[T]> {
        require_little_endian()?;
        let info = self.tensor(index).ok_or_else(|| Error::invalid_argument(format!("no tensor {index}")))?;
        if info.dtype != Some(T::DTYPE) {
            let actual =
                info.dtype.map_or_else(|| info.ggml_type.map_or("?".to_string(), |t| t.to_string()), |d| d.to_string());
            return Err(Error::new(
                ErrorCode::ShapeMismatch,
                format!("tensor {:?} is {actual}, not {}", info.name, T::DTYPE),
            ));
        }
        let bytes = self.view(index)?;
        if bytes.is_empty() {
            return Ok(&[]);
        }
        if bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
            return Err(Error::invalid_argument(format!(
                "tensor {:?} is not aligned to {} bytes in its file",
                info.name,
                std::mem::align_of::<T>()
            )));
        }
        // SAFETY: aligned, whole elements (the library checked the byte span against the shape),
        // every bit pattern is a valid T, and the bytes live as long as self.
        Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / std::mem::size_of::<T>()) })
    }

    /// Reads tensor `index` into `dst`, converted to `dtype`; `dst` must hold exactly its elements
    /// in that dtype. On failure `dst` may have been partly written.
    pub fn read_into(&self, index: usize, dtype: DType, dst: &mut [u8]) -> Result<()> {
        // SAFETY: dst.len() writable bytes; the library checks the size.
        unsafe {
            check(sys::peft_checkpoint_tensor_read(
                self.ptr(),
                index,
                dtype.raw(),
                dst.as_mut_ptr().cast(),
                dst.len() as u64,
            ))
        }
    }

    /// Reads tensor `index` converted to `dtype` into a new buffer.
    pub fn read(&self, index: usize, dtype: DType) -> Result<Vec<u8>> {
        let info = self.tensor(index).ok_or_else(|| Error::invalid_argument(format!("no tensor {index}")))?;
        let nbytes = buffer_size(info.name, info.num_elements(), dtype)?;
        let mut out = vec![0u8; nbytes];
        self.read_into(index, dtype, &mut out)?;
        Ok(out)
    }

    /// Reads tensor `index` converted to `T`'s dtype (e.g. any float tensor as `f32`).
    pub fn read_as<T: Element>(&self, index: usize) -> Result<Vec<T>> {
        require_little_endian()?;
        let info = self.tensor(index).ok_or_else(|| Error::invalid_argument(format!("no tensor {index}")))?;
        let count = usize::try_from(info.num_elements())
            .map_err(|_| Error::new(ErrorCode::OutOfMemory, format!("tensor {:?} is too large", info.name)))?;
        let mut out = vec![T::default(); count];
        self.read_into(index, T::DTYPE, as_bytes_mut(&mut out))?;
        Ok(out)
    }
}

/// Bytes of `count` elements of `dtype`, as a buffer length.
pub(crate) fn buffer_size(name: &str, count: u64, dtype: DType) -> Result<usize> {
    dtype
        .bytes_for(count)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| Error::invalid_argument(format!("{count} elements of {name:?} do not fit a {dtype} buffer")))
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint").field("files", &self.file_count()).field("tensors", &self.len()).finish()
    }
}
