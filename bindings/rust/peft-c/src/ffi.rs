//! Conversions at the C boundary: strings and paths in, borrowed and owned strings out, handles.

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::ptr::{self, NonNull};

use peft_c_sys as sys;

use crate::error::{check, Error, ErrorCode, Result};

/// A NUL-terminated copy of `text`; a NUL byte inside is an argument error naming `what`.
pub(crate) fn c_string(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::invalid_argument(format!("{what} {text:?} contains a NUL byte")))
}

/// A NUL-terminated path. On Unix the bytes are passed as they are; elsewhere the path must be UTF-8.
pub(crate) fn c_path(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| Error::invalid_argument(format!("path {} is not UTF-8", path.display())))?
        .as_bytes()
        .to_vec();
    CString::new(bytes).map_err(|_| Error::invalid_argument(format!("path {} contains a NUL byte", path.display())))
}

/// A string the library lends: NULL gives None. The library's strings are UTF-8; should one not be,
/// it reads as None rather than as wrong text.
///
/// # Safety
/// `ptr` must be NULL or a NUL-terminated string that stays valid for `'a`.
pub(crate) unsafe fn borrowed_str<'a>(ptr: *const c_char) -> Option<&'a str> {
    if ptr.is_null() {
        None
    } else {
        CStr::from_ptr(ptr).to_str().ok()
    }
}

/// A path the library lends (any bytes on Unix).
///
/// # Safety
/// As for [`borrowed_str`].
pub(crate) unsafe fn borrowed_path<'a>(ptr: *const c_char) -> Option<&'a Path> {
    if ptr.is_null() {
        return None;
    }
    let bytes = CStr::from_ptr(ptr).to_bytes();
    #[cfg(unix)]
    return Some(Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes)));
    #[cfg(not(unix))]
    return std::str::from_utf8(bytes).ok().map(Path::new);
}

/// Copies a string the library handed over (`char**` out-parameter) and frees it.
///
/// # Safety
/// `ptr` must be NULL or a string from peft_c that nothing else frees.
pub(crate) unsafe fn take_string(ptr: *mut c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    let text = CStr::from_ptr(ptr).to_string_lossy().into_owned();
    sys::peft_string_free(ptr);
    text
}

/// Copies the strings of a list the library handed over and frees it.
///
/// # Safety
/// `list` must be NULL or a list from peft_c that nothing else frees.
pub(crate) unsafe fn take_string_list(list: *mut sys::peft_string_list) -> Vec<String> {
    let strings = (0..sys::peft_string_list_count(list))
        .map(|i| borrowed_str(sys::peft_string_list_get(list, i)).unwrap_or_default().to_owned())
        .collect();
    sys::peft_string_list_free(list);
    strings
}

/// Calls a constructor with a `T**` out-parameter and returns the new handle.
///
/// # Safety
/// `create` must be a peft_c call that either fails or stores an owned handle through its argument.
pub(crate) unsafe fn new_handle<T>(create: impl FnOnce(*mut *mut T) -> *mut sys::peft_error) -> Result<NonNull<T>> {
    let mut out: *mut T = ptr::null_mut();
    check(create(&mut out))?;
    NonNull::new(out).ok_or_else(|| Error::new(ErrorCode::Internal, "peft_c returned no handle and no error"))
}

/// A borrowed slice from a pointer and a length; NULL or 0 gives an empty slice.
///
/// # Safety
/// When `len > 0`, `ptr` must point to `len` initialised values that stay valid for `'a`.
pub(crate) unsafe fn borrowed_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, len)
    }
}

/// Defines a handle type: a non-null pointer that is freed once, on drop.
macro_rules! handle {
    ($(#[$attr:meta])* $name:ident, $raw:ty, $free:path) => {
        $(#[$attr])*
        pub struct $name {
            raw: std::ptr::NonNull<$raw>,
        }

        impl $name {
            /// The raw handle, for calls through `peft-c-sys`. It stays owned by `self`.
            pub fn as_ptr(&self) -> *const $raw {
                self.raw.as_ptr()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the handle is owned by self and freed exactly once, here.
                unsafe { $free(self.raw.as_ptr()) }
            }
        }
    };
}
pub(crate) use handle;
