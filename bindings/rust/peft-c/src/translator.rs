//! Translating tensor keys between HuggingFace names and a host's native names.

use std::ffi::c_char;
use std::fmt;
use std::path::Path;

use peft_c_sys as sys;

use crate::checkpoint::Checkpoint;
use crate::error::{check, Result};
use crate::ffi::{borrowed_str, c_path, c_string, handle, new_handle, take_string, take_string_list};

handle!(
    /// A key translator backed by an architecture table (built in, or the caller's own).
    ///
    /// Read-only after creation, so it may be used from many threads at once (`Send + Sync`).
    Translator,
    sys::peft_translator,
    sys::peft_translator_free
);

// SAFETY: the header documents translators as read-only after creation, all their functions
// callable from many threads at once, and free callable from any thread.
unsafe impl Send for Translator {}
// SAFETY: as above.
unsafe impl Sync for Translator {}

impl Translator {
    pub(crate) fn from_raw(raw: std::ptr::NonNull<sys::peft_translator>) -> Translator {
        Translator { raw }
    }

    /// The built-in table of an architecture family ("llama", "gpt2", ...).
    pub fn builtin(family: &str) -> Result<Translator> {
        let family = c_string(family, "family")?;
        // SAFETY: a valid string; the constructor stores an owned handle.
        Ok(Translator { raw: unsafe { new_handle(|out| sys::peft_translator_new_builtin(family.as_ptr(), out))? } })
    }

    /// The caller's table from a JSON file (format: docs/translation-tables.md).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Translator> {
        let path = c_path(path.as_ref())?;
        // SAFETY: as above.
        Ok(Translator { raw: unsafe { new_handle(|out| sys::peft_translator_from_file(path.as_ptr(), out))? } })
    }

    /// The caller's table from a JSON string.
    pub fn from_json(json: &str) -> Result<Translator> {
        let json = c_string(json, "translation table")?;
        // SAFETY: as above.
        Ok(Translator { raw: unsafe { new_handle(|out| sys::peft_translator_from_json(json.as_ptr(), out))? } })
    }

    /// A translator for GGUF names from a checkpoint opened on one GGUF model file: its
    /// `general.architecture` chooses the table, its attention head counts the RoPE row order.
    ///
    /// [`to_native`](Translator::to_native) turns "model.layers.0.self_attn.q_proj.weight" into
    /// "blk.0.attn_q.weight" (the roles weight and bias only) and [`to_hf`](Translator::to_hf)
    /// back; given to a buffer merge or [`HostModel::set_translator`](crate::HostModel::set_translator),
    /// layer names are GGUF tensor names of buffers laid out as a llama.cpp-family engine loads
    /// them (include/peft_c.h, `peft_translator_from_gguf`). The translator copies what it needs; the
    /// checkpoint may be dropped afterwards. A file without head counts gives a translator whose
    /// reordered weights fail (`ShapeMismatch`) when merged or added to a host model.
    ///
    /// Errors: [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a checkpoint that
    /// is not one GGUF file; `InvalidCheckpoint` without a string `general.architecture`;
    /// `Unsupported` when no built-in table reads the architecture; `NotFound` or `InvalidConfig`
    /// when the tables cannot be read.
    pub fn from_gguf(checkpoint: &Checkpoint) -> Result<Translator> {
        // SAFETY: a live checkpoint handle; the constructor stores an owned handle.
        Ok(Translator { raw: unsafe { new_handle(|out| sys::peft_translator_from_gguf(checkpoint.as_ptr(), out))? } })
    }

    /// A translator for GGUF names from a GGUF architecture ("llama", "qwen2", "gemma2", ...) and its
    /// attention head counts, for hosts that hold the weights without the file (see
    /// [`from_gguf`](Translator::from_gguf)). `head_count` is at least 1; `head_count_kv` 0 means
    /// `head_count`.
    ///
    /// Errors: [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a `head_count`
    /// of 0; `Unsupported` when no built-in table reads the architecture; `NotFound` or
    /// `InvalidConfig` when the tables cannot be read.
    pub fn new_gguf(architecture: &str, head_count: u64, head_count_kv: u64) -> Result<Translator> {
        let architecture = c_string(architecture, "architecture")?;
        // SAFETY: a valid string; the constructor stores an owned handle.
        Ok(Translator {
            raw: unsafe {
                new_handle(|out| sys::peft_translator_new_gguf(architecture.as_ptr(), head_count, head_count_kv, out))?
            },
        })
    }

    /// Detects the family of a base model (its config.json), failing that of a model name (such
    /// as an adapter's base_model_name_or_path), and returns its built-in translator.
    pub fn detect(base_dir: Option<&Path>, model_name: Option<&str>) -> Result<Translator> {
        let base_dir = base_dir.map(c_path).transpose()?;
        let model_name = model_name.map(|n| c_string(n, "model name")).transpose()?;
        let base_ptr = base_dir.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        let name_ptr = model_name.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        // SAFETY: valid strings or NULL.
        Ok(Translator { raw: unsafe { new_handle(|out| sys::peft_translator_detect(base_ptr, name_ptr, out))? } })
    }

    /// The built-in families, sorted.
    pub fn builtin_families() -> Result<Vec<String>> {
        let mut list = std::ptr::null_mut();
        // SAFETY: the list is ours on success.
        unsafe {
            check(sys::peft_translator_builtin_family_list(&mut list))?;
            Ok(take_string_list(list))
        }
    }

    /// The table's family name.
    pub fn family(&self) -> &str {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_translator_family(self.as_ptr())) }.unwrap_or("")
    }

    /// Translates one HuggingFace key (with or without "base_model.model.") to its native name.
    pub fn to_native(&self, hf_key: &str) -> Result<String> {
        let key = c_string(hf_key, "key")?;
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid arguments; the result is ours on success.
        unsafe {
            check(sys::peft_translator_to_native(self.as_ptr(), key.as_ptr(), &mut out))?;
            Ok(take_string(out))
        }
    }

    /// Translates one native name back to its HuggingFace key (with "base_model.model." when asked).
    pub fn to_hf(&self, native_key: &str, with_peft_prefix: bool) -> Result<String> {
        let key = c_string(native_key, "key")?;
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: as above.
        unsafe {
            check(sys::peft_translator_to_hf(self.as_ptr(), key.as_ptr(), i32::from(with_peft_prefix), &mut out))?;
            Ok(take_string(out))
        }
    }

    /// Translates many HuggingFace keys; the error lists every key that does not resolve.
    pub fn to_native_batch<S: AsRef<str>>(&self, hf_keys: &[S]) -> Result<Vec<String>> {
        self.batch(hf_keys, |keys, count, out| {
            // SAFETY: `keys` holds `count` valid strings and `out` room for `count` results.
            unsafe { sys::peft_translator_to_native_batch(self.as_ptr(), keys, count, out) }
        })
    }

    /// Translates many native names back; the error lists every name that does not resolve.
    pub fn to_hf_batch<S: AsRef<str>>(&self, native_keys: &[S], with_peft_prefix: bool) -> Result<Vec<String>> {
        self.batch(native_keys, |keys, count, out| {
            // SAFETY: as above.
            unsafe { sys::peft_translator_to_hf_batch(self.as_ptr(), keys, count, i32::from(with_peft_prefix), out) }
        })
    }

    fn batch<S: AsRef<str>>(
        &self,
        keys: &[S],
        call: impl FnOnce(*const *const c_char, usize, *mut *mut c_char) -> *mut sys::peft_error,
    ) -> Result<Vec<String>> {
        let owned = keys.iter().map(|k| c_string(k.as_ref(), "key")).collect::<Result<Vec<_>>>()?;
        let pointers: Vec<*const c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        let mut out: Vec<*mut c_char> = vec![std::ptr::null_mut(); keys.len()];
        // SAFETY: on success every slot holds a string that is ours; on failure none is written.
        unsafe {
            check(call(pointers.as_ptr(), pointers.len(), out.as_mut_ptr()))?;
            Ok(out.into_iter().map(|p| take_string(p)).collect())
        }
    }
}

impl fmt::Debug for Translator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Translator").field("family", &self.family()).finish()
    }
}
