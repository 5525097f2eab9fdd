//! Merging one LoRA layer into a weight buffer the host owns, and taking it out again.

use std::fmt;

use peft_c_sys as sys;

use crate::adapter::Adapter;
use crate::dtype::DType;
use crate::error::{check, Error, Result};
use crate::ffi::{borrowed_str, c_string, new_handle};
use crate::translator::Translator;

/// A host buffer of weights or biases: F32, BF16 or F16 values (the 16-bit types as raw bits).
#[derive(Debug)]
pub enum Buffer<'a> {
    /// IEEE binary32 values.
    F32(&'a mut [f32]),
    /// bfloat16 values as their bits.
    BF16(&'a mut [u16]),
    /// IEEE binary16 values as their bits.
    F16(&'a mut [u16]),
}

impl Buffer<'_> {
    /// The buffer's dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::BF16(_) => DType::BF16,
            Buffer::F16(_) => DType::F16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Buffer::F32(v) => v.len(),
            Buffer::BF16(v) | Buffer::F16(v) => v.len(),
        }
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut std::ffi::c_void {
        match self {
            Buffer::F32(v) => v.as_mut_ptr().cast(),
            Buffer::BF16(v) | Buffer::F16(v) => v.as_mut_ptr().cast(),
        }
    }
}

/// Options of a buffer merge: the weight, whether to keep original rows for an exact removal,
/// threads, and a translator for host names.
///
/// Belongs to one thread at a time (`Send`, not `Sync`).
pub struct MergeBufferOptions {
    raw: std::ptr::NonNull<sys::peft_merge_buffer_options>,
    /// Whether a translator is set (names are then the host's).
    translated: bool,
}

impl Drop for MergeBufferOptions {
    fn drop(&mut self) {
        // SAFETY: owned by self, freed once.
        unsafe { sys::peft_merge_buffer_options_free(self.raw.as_ptr()) }
    }
}

// SAFETY: the header lets options move between threads; they are not shared (not Sync).
unsafe impl Send for MergeBufferOptions {}

impl MergeBufferOptions {
    /// The defaults: weight 1.0, original rows not kept, HuggingFace names, one thread per core.
    pub fn new() -> Result<MergeBufferOptions> {
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(MergeBufferOptions {
            raw: unsafe { new_handle(|out| sys::peft_merge_buffer_options_new(out))? },
            translated: false,
        })
    }

    /// The raw handle, for calls through `peft-c-sys`. It stays owned by `self`.
    pub fn as_ptr(&self) -> *const sys::peft_merge_buffer_options {
        self.raw.as_ptr()
    }

    fn ptr(&mut self) -> *mut sys::peft_merge_buffer_options {
        self.raw.as_ptr()
    }

    /// The weight that multiplies the layer's LoRA scaling.
    pub fn set_weight(&mut self, weight: f64) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_buffer_options_set_weight(self.ptr(), weight))? };
        Ok(self)
    }

    /// Keeps the original bytes of every changed row, so that [`MergeRecord::remove`] restores the
    /// buffer bit for bit (otherwise removal is PEFT's arithmetic unmerge).
    pub fn set_keep_original_rows(&mut self, keep: bool) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_buffer_options_set_keep_original_rows(self.ptr(), i32::from(keep)))? };
        Ok(self)
    }

    /// Limits the threads one merge uses (0: one per core). Results do not change.
    pub fn set_threads(&mut self, threads: u32) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_buffer_options_set_threads(self.ptr(), threads))? };
        Ok(self)
    }

    /// Reads layer names as the host's own names through this translator (None: HuggingFace
    /// names). The table is shared; the translator may be dropped afterwards.
    pub fn set_translator(&mut self, translator: Option<&Translator>) -> Result<&mut Self> {
        let ptr = translator.map_or(std::ptr::null(), Translator::as_ptr);
        // SAFETY: live handles or NULL.
        unsafe { check(sys::peft_merge_buffer_options_set_translator(self.ptr(), ptr))? };
        self.translated = translator.is_some();
        Ok(self)
    }
}

impl fmt::Debug for MergeBufferOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MergeBufferOptions").finish_non_exhaustive()
    }
}

/// What the binding checks the buffers of [`MergeRecord::remove`] against: the weight buffer of
/// the merge had this dtype and length; the bias, if one was given, this dtype and length.
#[derive(Debug, Clone, Copy)]
struct BufferLayout {
    dtype: DType,
    len: usize,
    bias: Option<(DType, usize)>,
}

/// The number of bias elements the library may touch when merging layer `name`: the length of
/// its `lora_B.bias`; without a way to find the exact module (a translator, or a name that is
/// no module path), the longest `lora_B.bias` of the adapter, which bounds it.
fn bias_elements_needed(adapter: &Adapter, name: &str, translated: bool) -> usize {
    if !adapter.lora_bias() {
        return 0; // no module has a lora_B.bias, so the library ignores the bias
    }
    let bias_len = |m: crate::Module<'_>| {
        m.tensor_by_role("lora_B.bias").map_or(0, |t| usize::try_from(t.num_elements()).unwrap_or(usize::MAX))
    };
    if !translated {
        let path = name.strip_prefix("base_model.model.").unwrap_or(name);
        let candidates = [path, path.strip_suffix(".weight").unwrap_or(path)];
        if let Some(module) = candidates.iter().find_map(|c| adapter.find_module(c).ok()) {
            return bias_len(module);
        }
    }
    adapter.modules().map(bias_len).max().unwrap_or(0)
}

/// Merges one LoRA layer of `adapter` into `weight`, in place: W = round(W + weight * scaling *
/// delta), rounded once to the buffer's dtype. A layer with a `lora_B.bias` also adds it to `bias`.
///
/// `name` is the layer's HuggingFace module path or tensor name ("model.layers.0.self_attn.q_proj"),
/// or the host's name when the options carry a translator. `shape` is the weight's shape (Linear
/// [out, in], GPT-2 Conv1D [in, out], Embedding [num, dim], Conv2d [out, in, kh, kw]); `weight` must
/// hold exactly its elements. When a bias is given it must hold at least as many elements as the
/// layer's `lora_B.bias` (when the layer cannot be looked up beforehand, as many as the adapter's
/// longest). On failure both buffers are unchanged.
pub fn merge_into(
    adapter: &Adapter,
    name: &str,
    mut weight: Buffer<'_>,
    shape: &[u64],
    mut bias: Option<Buffer<'_>>,
    options: Option<&MergeBufferOptions>,
) -> Result<MergeRecord> {
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    if elements != Some(weight.len() as u64) {
        return Err(Error::invalid_argument(format!(
            "the weight buffer of {name:?} holds {} elements, its shape {shape:?} has {elements:?}",
            weight.len()
        )));
    }
    if let Some(b) = &bias {
        let needed = bias_elements_needed(adapter, name, options.is_some_and(|o| o.translated));
        if b.len() < needed {
            return Err(Error::invalid_argument(format!(
                "the bias buffer of {name:?} holds {} elements; the layer's lora_B.bias needs {needed}",
                b.len()
            )));
        }
    }
    let c_name = c_string(name, "layer name")?;
    let layout =
        BufferLayout { dtype: weight.dtype(), len: weight.len(), bias: bias.as_ref().map(|b| (b.dtype(), b.len())) };
    let (bias_ptr, bias_dtype) = match bias.as_mut() {
        Some(b) => (b.as_mut_ptr(), b.dtype().raw()),
        None => (std::ptr::null_mut(), DType::F32.raw()),
    };
    let opts = options.map_or(std::ptr::null(), MergeBufferOptions::as_ptr);
    // SAFETY: the weight buffer holds exactly the shape's elements, the bias at least the elements
    // the layer's lora_B.bias has (checked above), both exclusively borrowed for the call.
    let raw = unsafe {
        new_handle(|out| {
            sys::peft_merge_buffer_apply(
                adapter.as_ptr(),
                c_name.as_ptr(),
                weight.as_mut_ptr(),
                weight.dtype().raw(),
                shape.as_ptr(),
                shape.len(),
                bias_ptr,
                bias_dtype,
                opts,
                out,
            )
        })?
    };
    Ok(MergeRecord { raw, layout })
}

/// One adapter layer merged into a host buffer, and what removing it needs. Dropping it does not
/// undo the merge. Belongs to one thread at a time (`Send`, not `Sync`).
pub struct MergeRecord {
    raw: std::ptr::NonNull<sys::peft_merge_record>,
    layout: BufferLayout,
}

impl Drop for MergeRecord {
    fn drop(&mut self) {
        // SAFETY: owned by self, freed once.
        unsafe { sys::peft_merge_record_free(self.raw.as_ptr()) }
    }
}

// SAFETY: the header lets records move between threads, one thread at a time (not Sync).
unsafe impl Send for MergeRecord {}

impl MergeRecord {
    /// The raw handle, for calls through `peft-c-sys`. It stays owned by `self`.
    pub fn as_ptr(&self) -> *const sys::peft_merge_record {
        self.raw.as_ptr()
    }

    /// The adapter module that was merged (its HuggingFace path).
    pub fn module(&self) -> &str {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_merge_record_module(self.as_ptr())) }.unwrap_or("")
    }

    /// Whether the merge is still in the buffer.
    pub fn is_active(&self) -> bool {
        // SAFETY: a live handle.
        unsafe { sys::peft_merge_record_active(self.as_ptr()) != 0 }
    }

    /// Bytes of original rows kept for an exact removal.
    pub fn saved_bytes(&self) -> u64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_merge_record_saved_bytes(self.as_ptr()) }
    }

    /// Takes the merge out of the buffers again (they may have moved, but must have the dtype and
    /// length they had at the merge). With original rows kept, the buffer is restored bit for bit;
    /// otherwise PEFT's unmerge is applied. On failure nothing is changed.
    pub fn remove(&mut self, mut weight: Buffer<'_>, mut bias: Option<Buffer<'_>>) -> Result<()> {
        let layout = self.layout;
        if weight.dtype() != layout.dtype || weight.len() != layout.len {
            return Err(Error::invalid_argument(format!(
                "the weight buffer is {} x {}; the merge of {:?} was into {} x {}",
                weight.len(),
                weight.dtype(),
                self.module(),
                layout.len,
                layout.dtype
            )));
        }
        if let Some(b) = &bias {
            if layout.bias.is_some_and(|(dtype, len)| b.dtype() != dtype || b.len() != len) {
                return Err(Error::invalid_argument(format!(
                    "the bias buffer differs from the one of the merge of {:?}",
                    self.module()
                )));
            }
            if layout.bias.is_none() {
                bias = None; // no bias took part in the merge, so none can need restoring
            }
        }
        let bias_ptr = bias.as_mut().map_or(std::ptr::null_mut(), Buffer::as_mut_ptr);
        // SAFETY: the buffers have the dtype and length of the merge (checked above), exclusively
        // borrowed for the call; the record is live.
        unsafe { check(sys::peft_merge_record_unmerge(self.raw.as_ptr(), weight.as_mut_ptr(), bias_ptr)) }
    }
}

impl fmt::Debug for MergeRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MergeRecord")
            .field("module", &self.module())
            .field("active", &self.is_active())
            .field("saved_bytes", &self.saved_bytes())
            .finish()
    }
}
