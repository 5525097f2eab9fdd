//! The error type: the library's stable code and its message.

use std::ffi::CStr;
use std::fmt;

use peft_c_sys as sys;

/// The stable error codes of peft_c (`PEFT_ERR_*`); a value is never renumbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The file is shorter than the 8-byte length prefix.
    HeaderTooSmall,
    /// The header length is over the cap.
    HeaderTooLarge,
    /// 8 + header length is past the end of the file.
    InvalidHeaderLength,
    /// The header bytes are not valid UTF-8.
    InvalidHeaderUtf8,
    /// The header is not the JSON the format requires.
    InvalidHeader,
    /// Tensor data is not contiguous from 0.
    InvalidOffset,
    /// Shape or size arithmetic overflows 64 bits.
    ValidationOverflow,
    /// A sub-byte dtype does not fill whole bytes.
    MisalignedSlice,
    /// A tensor's byte span differs from elements x dtype size.
    TensorInvalidInfo,
    /// File length differs from 8 + header + data.
    MetadataIncompleteBuffer,
    /// An operating-system call failed.
    Io,
    /// A tensor, file or entry that was asked for does not exist.
    NotFound,
    /// Valid input that the library does not handle.
    Unsupported,
    /// Keys that a translation or a base model cannot resolve.
    UnresolvedKey,
    /// Shapes or dtypes that do not fit together.
    ShapeMismatch,
    /// A NULL, out-of-range or contradictory argument.
    InvalidArgument,
    /// An allocation failed.
    OutOfMemory,
    /// A callback asked to stop.
    Cancelled,
    /// An adapter_config.json or other JSON file that is wrong.
    InvalidConfig,
    /// A checkpoint folder or index that is wrong.
    InvalidCheckpoint,
    /// An adapter does not fit in a registry's byte budget beside the pinned ones (or pinned
    /// adapters alone exceed a smaller budget).
    OverBudget,
    /// A computed value that is infinite or NaN (a merged weight, a LoRA scale).
    NonFinite,
    /// A bug in peft_c.
    Internal,
    /// A code this binding does not know (from a newer library).
    Unknown(i32),
}

impl ErrorCode {
    /// Every known code, in numeric order.
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::HeaderTooSmall,
        ErrorCode::HeaderTooLarge,
        ErrorCode::InvalidHeaderLength,
        ErrorCode::InvalidHeaderUtf8,
        ErrorCode::InvalidHeader,
        ErrorCode::InvalidOffset,
        ErrorCode::ValidationOverflow,
        ErrorCode::MisalignedSlice,
        ErrorCode::TensorInvalidInfo,
        ErrorCode::MetadataIncompleteBuffer,
        ErrorCode::Io,
        ErrorCode::NotFound,
        ErrorCode::Unsupported,
        ErrorCode::UnresolvedKey,
        ErrorCode::ShapeMismatch,
        ErrorCode::InvalidArgument,
        ErrorCode::OutOfMemory,
        ErrorCode::Cancelled,
        ErrorCode::InvalidConfig,
        ErrorCode::InvalidCheckpoint,
        ErrorCode::OverBudget,
        ErrorCode::NonFinite,
        ErrorCode::Internal,
    ];

    /// The code of a `PEFT_ERR_*` value.
    pub fn from_raw(code: i32) -> ErrorCode {
        match code {
            sys::PEFT_ERR_HEADER_TOO_SMALL => ErrorCode::HeaderTooSmall,
            sys::PEFT_ERR_HEADER_TOO_LARGE => ErrorCode::HeaderTooLarge,
            sys::PEFT_ERR_INVALID_HEADER_LENGTH => ErrorCode::InvalidHeaderLength,
            sys::PEFT_ERR_INVALID_HEADER_UTF8 => ErrorCode::InvalidHeaderUtf8,
            sys::PEFT_ERR_INVALID_HEADER => ErrorCode::InvalidHeader,
            sys::PEFT_ERR_INVALID_OFFSET => ErrorCode::InvalidOffset,
            sys::PEFT_ERR_VALIDATION_OVERFLOW => ErrorCode::ValidationOverflow,
            sys::PEFT_ERR_MISALIGNED_SLICE => ErrorCode::MisalignedSlice,
            sys::PEFT_ERR_TENSOR_INVALID_INFO => ErrorCode::TensorInvalidInfo,
            sys::PEFT_ERR_METADATA_INCOMPLETE_BUFFER => ErrorCode::MetadataIncompleteBuffer,
            sys::PEFT_ERR_IO => ErrorCode::Io,
            sys::PEFT_ERR_NOT_FOUND => ErrorCode::NotFound,
            sys::PEFT_ERR_UNSUPPORTED => ErrorCode::Unsupported,
            sys::PEFT_ERR_UNRESOLVED_KEY => ErrorCode::UnresolvedKey,
            sys::PEFT_ERR_SHAPE_MISMATCH => ErrorCode::ShapeMismatch,
            sys::PEFT_ERR_INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            sys::PEFT_ERR_OUT_OF_MEMORY => ErrorCode::OutOfMemory,
            sys::PEFT_ERR_CANCELLED => ErrorCode::Cancelled,
            sys::PEFT_ERR_INVALID_CONFIG => ErrorCode::InvalidConfig,
            sys::PEFT_ERR_INVALID_CHECKPOINT => ErrorCode::InvalidCheckpoint,
            sys::PEFT_ERR_OVER_BUDGET => ErrorCode::OverBudget,
            sys::PEFT_ERR_NON_FINITE => ErrorCode::NonFinite,
            sys::PEFT_ERR_INTERNAL => ErrorCode::Internal,
            other => ErrorCode::Unknown(other),
        }
    }

    /// The `PEFT_ERR_*` value.
    pub fn raw(self) -> i32 {
        match self {
            ErrorCode::HeaderTooSmall => sys::PEFT_ERR_HEADER_TOO_SMALL,
            ErrorCode::HeaderTooLarge => sys::PEFT_ERR_HEADER_TOO_LARGE,
            ErrorCode::InvalidHeaderLength => sys::PEFT_ERR_INVALID_HEADER_LENGTH,
            ErrorCode::InvalidHeaderUtf8 => sys::PEFT_ERR_INVALID_HEADER_UTF8,
            ErrorCode::InvalidHeader => sys::PEFT_ERR_INVALID_HEADER,
            ErrorCode::InvalidOffset => sys::PEFT_ERR_INVALID_OFFSET,
            ErrorCode::ValidationOverflow => sys::PEFT_ERR_VALIDATION_OVERFLOW,
            ErrorCode::MisalignedSlice => sys::PEFT_ERR_MISALIGNED_SLICE,
            ErrorCode::TensorInvalidInfo => sys::PEFT_ERR_TENSOR_INVALID_INFO,
            ErrorCode::MetadataIncompleteBuffer => sys::PEFT_ERR_METADATA_INCOMPLETE_BUFFER,
            ErrorCode::Io => sys::PEFT_ERR_IO,
            ErrorCode::NotFound => sys::PEFT_ERR_NOT_FOUND,
            ErrorCode::Unsupported => sys::PEFT_ERR_UNSUPPORTED,
            ErrorCode::UnresolvedKey => sys::PEFT_ERR_UNRESOLVED_KEY,
            ErrorCode::ShapeMismatch => sys::PEFT_ERR_SHAPE_MISMATCH,
            ErrorCode::InvalidArgument => sys::PEFT_ERR_INVALID_ARGUMENT,
            ErrorCode::OutOfMemory => sys::PEFT_ERR_OUT_OF_MEMORY,
            ErrorCode::Cancelled => sys::PEFT_ERR_CANCELLED,
            ErrorCode::InvalidConfig => sys::PEFT_ERR_INVALID_CONFIG,
            ErrorCode::InvalidCheckpoint => sys::PEFT_ERR_INVALID_CHECKPOINT,
            ErrorCode::OverBudget => sys::PEFT_ERR_OVER_BUDGET,
            ErrorCode::NonFinite => sys::PEFT_ERR_NON_FINITE,
            ErrorCode::Internal => sys::PEFT_ERR_INTERNAL,
            ErrorCode::Unknown(code) => code,
        }
    }

    /// The code's name as the library spells it, e.g. "INVALID_OFFSET" ("UNKNOWN" for an unknown code).
    pub fn name(self) -> &'static str {
        // SAFETY: the function accepts any integer and returns a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(sys::peft_error_code_name(self.raw())) };
        name.to_str().unwrap_or("UNKNOWN")
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error of peft_c: a stable [`ErrorCode`] and a message naming the file, tensor or key at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

/// The result of a fallible call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error made on the Rust side (an argument the library never sees, such as a slice of the
    /// wrong length or a string holding a NUL byte).
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The message (UTF-8; invalid bytes from the library are replaced).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Takes ownership of an error object of the library: copies it and frees it.
    ///
    /// # Safety
    /// `err` must be NULL or an error returned by peft_c that nothing else frees.
    pub(crate) unsafe fn from_raw(err: *mut sys::peft_error) -> Option<Error> {
        if err.is_null() {
            return None;
        }
        let code = ErrorCode::from_raw(sys::peft_error_code(err));
        let message = CStr::from_ptr(sys::peft_error_message(err)).to_string_lossy().into_owned();
        sys::peft_error_free(err);
        Some(Error { code, message })
    }

    pub(crate) fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::InvalidArgument, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// Turns a returned `peft_error*` into a `Result`.
///
/// # Safety
/// As for [`Error::from_raw`].
pub(crate) unsafe fn check(err: *mut sys::peft_error) -> Result<()> {
    match Error::from_raw(err) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}
