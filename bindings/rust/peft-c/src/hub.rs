//! Model ids of the local Hugging Face hub cache, resolved offline (the `hub` section of the header).
//!
//! Every function that takes a base model or adapter folder also takes such an id (`"org/name"`,
//! `"org/name@v1.0"`); these two show where an id leads and which cache is used.

use std::ffi::{c_char, CStr};
use std::path::{Path, PathBuf};

use peft_c_sys as sys;

use crate::error::{check, Result};
use crate::ffi::c_path;

/// Copies a path the library handed over (`char**`) and frees it.
///
/// # Safety
/// `ptr` must be a string from peft_c that nothing else frees.
unsafe fn take_path(ptr: *mut c_char) -> PathBuf {
    let bytes = CStr::from_ptr(ptr).to_bytes().to_vec();
    sys::peft_string_free(ptr);
    #[cfg(unix)]
    return PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes));
    #[cfg(not(unix))]
    return PathBuf::from(String::from_utf8_lossy(&bytes).into_owned());
}

/// The snapshot folder of a model id in the local hub cache, or `id_or_path` itself when a file
/// or folder of that name exists.
///
/// An id is `name` or `org/name`, optionally with `@revision`: a branch or tag under `refs/`
/// (`main` by default, `v1.0`, `refs/pr/3`), a full commit hash, or a prefix of at least 4 hex
/// digits of one snapshot's commit. The result is the folder huggingface_hub's
/// `snapshot_download(..., local_files_only=True)` returns. Nothing is downloaded.
/// [`ErrorCode::NotFound`](crate::ErrorCode::NotFound) when the model, revision or snapshot is not
/// in the cache (or a short hash is ambiguous);
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a text that is neither an
/// existing path nor an id.
pub fn hub_resolve(id_or_path: impl AsRef<Path>) -> Result<PathBuf> {
    let text = c_path(id_or_path.as_ref())?;
    let mut out = std::ptr::null_mut();
    // SAFETY: valid C string in; the string out is ours on success.
    unsafe {
        check(sys::peft_hub_resolve(text.as_ptr(), &mut out))?;
        Ok(take_path(out))
    }
}

/// The hub cache folder ids are looked up in, from the environment as huggingface_hub computes it
/// (`HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
/// `~/.cache/huggingface/hub`). The folder need not exist.
pub fn hub_cache_dir() -> Result<PathBuf> {
    let mut out = std::ptr::null_mut();
    // SAFETY: the string out is ours on success.
    unsafe {
        check(sys::peft_hub_cache_dir(&mut out))?;
        Ok(take_path(out))
    }
}
