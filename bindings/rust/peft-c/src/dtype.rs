//! The safetensors dtypes, element types for typed access, and conversions between dtypes.

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;

use peft_c_sys as sys;

use crate::error::{check, Error, ErrorCode, Result};
use crate::ffi::c_string;

/// A safetensors dtype (`PEFT_DTYPE_*`), numbered in the reference's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
#[allow(missing_docs)]
pub enum DType {
    Bool = sys::PEFT_DTYPE_BOOL,
    F4 = sys::PEFT_DTYPE_F4,
    F6E2M3 = sys::PEFT_DTYPE_F6_E2M3,
    F6E3M2 = sys::PEFT_DTYPE_F6_E3M2,
    U8 = sys::PEFT_DTYPE_U8,
    I8 = sys::PEFT_DTYPE_I8,
    F8E5M2 = sys::PEFT_DTYPE_F8_E5M2,
    F8E4M3 = sys::PEFT_DTYPE_F8_E4M3,
    F8E8M0 = sys::PEFT_DTYPE_F8_E8M0,
    F8E4M3Fnuz = sys::PEFT_DTYPE_F8_E4M3FNUZ,
    F8E5M2Fnuz = sys::PEFT_DTYPE_F8_E5M2FNUZ,
    I16 = sys::PEFT_DTYPE_I16,
    U16 = sys::PEFT_DTYPE_U16,
    F16 = sys::PEFT_DTYPE_F16,
    BF16 = sys::PEFT_DTYPE_BF16,
    I32 = sys::PEFT_DTYPE_I32,
    U32 = sys::PEFT_DTYPE_U32,
    F32 = sys::PEFT_DTYPE_F32,
    C64 = sys::PEFT_DTYPE_C64,
    F64 = sys::PEFT_DTYPE_F64,
    I64 = sys::PEFT_DTYPE_I64,
    U64 = sys::PEFT_DTYPE_U64,
}

impl DType {
    /// Every dtype, in numeric order.
    pub const ALL: [DType; sys::PEFT_DTYPE_COUNT as usize] = [
        DType::Bool,
        DType::F4,
        DType::F6E2M3,
        DType::F6E3M2,
        DType::U8,
        DType::I8,
        DType::F8E5M2,
        DType::F8E4M3,
        DType::F8E8M0,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::I16,
        DType::U16,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::F32,
        DType::C64,
        DType::F64,
        DType::I64,
        DType::U64,
    ];

    /// The dtype of a `PEFT_DTYPE_*` value.
    pub fn from_raw(value: i32) -> Option<DType> {
        usize::try_from(value).ok().and_then(|i| DType::ALL.get(i).copied())
    }

    /// The `PEFT_DTYPE_*` value.
    pub fn raw(self) -> i32 {
        self as i32
    }

    /// The safetensors name, e.g. "BF16".
    pub fn name(self) -> &'static str {
        // SAFETY: every DType is a valid dtype, for which the library returns a static string.
        unsafe { CStr::from_ptr(sys::peft_dtype_name(self.raw())) }.to_str().unwrap_or("?")
    }

    /// The dtype of a safetensors name (exact and case-sensitive, as the reference reads it).
    pub fn from_name(name: &str) -> Option<DType> {
        let name = c_string(name, "dtype name").ok()?;
        // SAFETY: a valid NUL-terminated string.
        DType::from_raw(unsafe { sys::peft_dtype_from_name(name.as_ptr()) })
    }

    /// Size of one element in bits (4 for F4, 6 for the F6 types, 8 x bytes otherwise).
    pub fn bits(self) -> u32 {
        // SAFETY: takes any integer.
        unsafe { sys::peft_dtype_bits(self.raw()) }
    }

    /// Bytes of `count` elements, or None when they do not fill whole bytes or overflow.
    pub fn bytes_for(self, count: u64) -> Option<u64> {
        let bits = count.checked_mul(u64::from(self.bits()))?;
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// Elements in `nbytes` bytes, or None when the bytes do not hold whole elements.
    pub fn elements_in(self, nbytes: u64) -> Option<u64> {
        let bits = nbytes.checked_mul(8)?;
        let per = u64::from(self.bits());
        (bits % per == 0).then_some(bits / per)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(name: &str) -> Result<DType> {
        DType::from_name(name).ok_or_else(|| Error::invalid_argument(format!("{name:?} is not a safetensors dtype")))
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type whose values are the elements of a dtype, for typed views, reads and writes.
///
/// Implemented for the integer and float types whose every bit pattern is a valid value; typed
/// access needs a little-endian machine (safetensors data is little-endian).
pub trait Element: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The dtype these values are.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(u8 => U8, i8 => I8, i16 => I16, u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
         f32 => F32, f64 => F64);

pub(crate) fn require_little_endian() -> Result<()> {
    if cfg!(target_endian = "little") {
        Ok(())
    } else {
        Err(Error::new(ErrorCode::Unsupported, "typed access to little-endian tensor data on a big-endian machine"))
    }
}

/// The bytes of a slice of elements.
pub(crate) fn as_bytes<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: Element types are plain integers and floats without padding.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

/// The bytes of a mutable slice of elements (every byte pattern is a valid element).
pub(crate) fn as_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and any bytes written form valid values of T.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

/// Converts the elements in `src` (of `src_dtype`) into `dst` (of `dst_dtype`), rounding to nearest,
/// ties to even (see `peft_convert` for the supported pairs).
///
/// The element count is taken from `src`; `dst` must hold exactly as many elements.
/// Returns the number of elements converted.
pub fn convert(src_dtype: DType, src: &[u8], dst_dtype: DType, dst: &mut [u8]) -> Result<u64> {
    let count = src_dtype
        .elements_in(src.len() as u64)
        .ok_or_else(|| Error::invalid_argument(format!("{} bytes are not whole {} elements", src.len(), src_dtype)))?;
    if dst_dtype.bytes_for(count) != Some(dst.len() as u64) {
        return Err(Error::invalid_argument(format!(
            "{count} {src_dtype} elements need {:?} bytes of {dst_dtype}, the destination has {}",
            dst_dtype.bytes_for(count),
            dst.len()
        )));
    }
    // SAFETY: both buffers hold `count` elements of their dtype and cannot overlap (& and &mut).
    unsafe {
        check(sys::peft_convert(
            src_dtype.raw(),
            src.as_ptr().cast(),
            dst_dtype.raw(),
            dst.as_mut_ptr().cast(),
            count,
        ))?;
    }
    Ok(count)
}
