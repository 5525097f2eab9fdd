//! GGUF files: the formats of a checkpoint's files, GGUF metadata as typed values, ggml types.
//!
//! [`Checkpoint`] opens GGUF files like safetensors ones; the methods here read what only GGUF has.

use std::fmt;
use std::str::FromStr;

use peft_c_sys as sys;

use crate::checkpoint::Checkpoint;
use crate::error::{check, Error, ErrorCode, Result};
use crate::ffi::{borrowed_slice, borrowed_str, c_string};

/// The format of one file of a checkpoint (`PEFT_FORMAT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileFormat {
    /// A safetensors file.
    Safetensors,
    /// A GGUF file.
    Gguf,
}

/// The type of a GGUF metadata value (`PEFT_GGUF_*`, the numbers of gguf.h's `enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum GgufType {
    /// Unsigned 8-bit integer.
    U8 = sys::PEFT_GGUF_U8,
    /// Signed 8-bit integer.
    I8 = sys::PEFT_GGUF_I8,
    /// Unsigned 16-bit integer.
    U16 = sys::PEFT_GGUF_U16,
    /// Signed 16-bit integer.
    I16 = sys::PEFT_GGUF_I16,
    /// Unsigned 32-bit integer.
    U32 = sys::PEFT_GGUF_U32,
    /// Signed 32-bit integer.
    I32 = sys::PEFT_GGUF_I32,
    /// binary32.
    F32 = sys::PEFT_GGUF_F32,
    /// Boolean.
    Bool = sys::PEFT_GGUF_BOOL,
    /// String.
    String = sys::PEFT_GGUF_STRING,
    /// Array of values of one type.
    Array = sys::PEFT_GGUF_ARRAY,
    /// Unsigned 64-bit integer.
    U64 = sys::PEFT_GGUF_U64,
    /// Signed 64-bit integer.
    I64 = sys::PEFT_GGUF_I64,
    /// binary64.
    F64 = sys::PEFT_GGUF_F64,
}

impl GgufType {
    /// Every type, in `PEFT_GGUF_*` order.
    pub const ALL: [GgufType; 13] = [
        GgufType::U8,
        GgufType::I8,
        GgufType::U16,
        GgufType::I16,
        GgufType::U32,
        GgufType::I32,
        GgufType::F32,
        GgufType::Bool,
        GgufType::String,
        GgufType::Array,
        GgufType::U64,
        GgufType::I64,
        GgufType::F64,
    ];

    /// The type of a `PEFT_GGUF_*` value.
    pub fn from_raw(value: i32) -> Option<GgufType> {
        usize::try_from(value).ok().and_then(|i| GgufType::ALL.get(i).copied())
    }

    /// The `PEFT_GGUF_*` value.
    pub fn raw(self) -> i32 {
        self as i32
    }
}

/// One GGUF metadata value, in the type the file stores it in. Strings borrow from the
/// [`Checkpoint`]; they are UTF-8 by convention, so they come as bytes ([`GgufValue::as_str`]).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue<'a> {
    /// U8.
    U8(u8),
    /// I8.
    I8(i8),
    /// U16.
    U16(u16),
    /// I16.
    I16(i16),
    /// U32.
    U32(u32),
    /// I32.
    I32(i32),
    /// U64.
    U64(u64),
    /// I64.
    I64(i64),
    /// F32.
    F32(f32),
    /// F64.
    F64(f64),
    /// BOOL.
    Bool(bool),
    /// STRING: its bytes.
    String(&'a [u8]),
    /// ARRAY: the element type and the elements.
    Array(GgufType, Vec<GgufValue<'a>>),
}

impl<'a> GgufValue<'a> {
    /// The type the file stores the value in.
    pub fn value_type(&self) -> GgufType {
        match self {
            GgufValue::U8(_) => GgufType::U8,
            GgufValue::I8(_) => GgufType::I8,
            GgufValue::U16(_) => GgufType::U16,
            GgufValue::I16(_) => GgufType::I16,
            GgufValue::U32(_) => GgufType::U32,
            GgufValue::I32(_) => GgufType::I32,
            GgufValue::U64(_) => GgufType::U64,
            GgufValue::I64(_) => GgufType::I64,
            GgufValue::F32(_) => GgufType::F32,
            GgufValue::F64(_) => GgufType::F64,
            GgufValue::Bool(_) => GgufType::Bool,
            GgufValue::String(_) => GgufType::String,
            GgufValue::Array(..) => GgufType::Array,
        }
    }

    /// An integer value of any width that fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U64(x) => i64::try_from(x).ok(),
            _ => self.as_integer(),
        }
    }

    /// An integer value of any width that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(x) => Some(x),
            _ => self.as_integer().and_then(|x| u64::try_from(x).ok()),
        }
    }

    fn as_integer(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(x) => Some(x.into()),
            GgufValue::I8(x) => Some(x.into()),
            GgufValue::U16(x) => Some(x.into()),
            GgufValue::I16(x) => Some(x.into()),
            GgufValue::U32(x) => Some(x.into()),
            GgufValue::I32(x) => Some(x.into()),
            GgufValue::I64(x) => Some(x),
            _ => None,
        }
    }

    /// An F32 (widened exactly) or F64 value.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(x) => Some(x.into()),
            GgufValue::F64(x) => Some(x),
            _ => None,
        }
    }

    /// A BOOL value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(x) => Some(x),
            _ => None,
        }
    }

    /// A STRING value that is UTF-8.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            GgufValue::String(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }

    /// The elements of an ARRAY value.
    pub fn as_array(&self) -> Option<&[GgufValue<'a>]> {
        match self {
            GgufValue::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

/// A ggml tensor type (ggml's numbering: 0 F32, 1 F16, 8 Q8_0, 12 Q4_K, 30 BF16, ...), as a GGUF
/// file stores a tensor. The table of types lives in the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GgmlType(pub i32);

impl GgmlType {
    /// F32, one of the types [`Adapter::export_gguf`](crate::Adapter::export_gguf) writes factors in.
    pub const F32: GgmlType = GgmlType(0);
    /// F16.
    pub const F16: GgmlType = GgmlType(1);
    /// Q8_0 (blocks of 32 values).
    pub const Q8_0: GgmlType = GgmlType(8);
    /// BF16.
    pub const BF16: GgmlType = GgmlType(30);

    /// The name as gguf-py spells it ("Q4_K"); None for a number ggml does not define.
    pub fn name(self) -> Option<&'static str> {
        // SAFETY: takes any integer; a non-NULL result is a static string.
        unsafe { borrowed_str(sys::peft_ggml_type_name(self.0)) }
    }

    /// The type of an exact name ("BF16", "Q8_0"); None for a name ggml does not define.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        let name = c_string(name, "ggml type name").ok()?;
        // SAFETY: a valid NUL-terminated string.
        let value = unsafe { sys::peft_ggml_type_from_name(name.as_ptr()) };
        (value >= 0).then_some(GgmlType(value))
    }

    /// `(block_size, type_size)`: a row of n elements (a multiple of the block size) takes
    /// n / block_size blocks of type_size bytes ((32, 34) for Q8_0). [`ErrorCode::InvalidArgument`]
    /// for a type ggml does not define.
    pub fn geometry(self) -> Result<(u32, u32)> {
        let (mut block, mut size) = (0u32, 0u32);
        // SAFETY: valid out-pointers, written only on success.
        unsafe { check(sys::peft_ggml_type_geometry(self.0, &mut block, &mut size))? };
        Ok((block, size))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "GgmlType({})", self.0),
        }
    }
}

impl FromStr for GgmlType {
    type Err = Error;
    fn from_str(name: &str) -> Result<GgmlType> {
        GgmlType::from_name(name).ok_or_else(|| Error::invalid_argument(format!("{name:?} is not a ggml type")))
    }
}

impl Checkpoint {
    /// The format of file `file`; None out of range.
    pub fn file_format(&self, file: usize) -> Option<FileFormat> {
        // SAFETY: a live handle; out of range gives -1.
        match unsafe { sys::peft_checkpoint_file_format(self.ptr(), file) } {
            sys::PEFT_FORMAT_SAFETENSORS => Some(FileFormat::Safetensors),
            sys::PEFT_FORMAT_GGUF => Some(FileFormat::Gguf),
            _ => None,
        }
    }

    /// The GGUF version (2 or 3) of file `file`; None for a safetensors file or out of range.
    pub fn gguf_version(&self, file: usize) -> Option<u32> {
        // SAFETY: a live handle; 0 for a safetensors file or out of range.
        let version = unsafe { sys::peft_checkpoint_gguf_version(self.ptr(), file) };
        (version != 0).then_some(version)
    }

    /// The ggml type of tensor `index` as its GGUF file stores it; None for a tensor of a
    /// safetensors file or out of range.
    pub fn tensor_ggml_type(&self, index: usize) -> Option<GgmlType> {
        // SAFETY: a live handle; -1 for a safetensors tensor or out of range.
        let value = unsafe { sys::peft_checkpoint_tensor_ggml_type(self.ptr(), index) };
        (value >= 0).then_some(GgmlType(value))
    }

    /// The metadata key/values of GGUF file `file`, in file order (empty for a safetensors file or
    /// out of range; the safetensors metadata is [`Checkpoint::metadata`]).
    pub fn gguf_metadata(&self, file: usize) -> Result<Vec<(&str, GgufValue<'_>)>> {
        // SAFETY: a live handle; 0 for a safetensors file or out of range.
        let count = unsafe { sys::peft_checkpoint_gguf_kv_count(self.ptr(), file) };
        (0..count)
            .map(|kv| {
                // SAFETY: kv is in range; the key lives as long as self.
                let key = unsafe { borrowed_str(sys::peft_checkpoint_gguf_kv_key(self.ptr(), file, kv)) }.ok_or_else(
                    || Error::new(ErrorCode::InvalidHeaderUtf8, format!("GGUF metadata key {kv} is not UTF-8")),
                )?;
                Ok((key, self.gguf_entry(file, kv)?))
            })
            .collect()
    }

    /// The metadata value of `key` in file `file` ([`ErrorCode::NotFound`] naming the key when the
    /// file has no such entry, also for a safetensors file).
    pub fn gguf_value(&self, file: usize, key: &str) -> Result<GgufValue<'_>> {
        let key = c_string(key, "key")?;
        let mut kv = 0usize;
        // SAFETY: valid string and out-pointer.
        unsafe { check(sys::peft_checkpoint_gguf_kv_find(self.ptr(), file, key.as_ptr(), &mut kv))? };
        self.gguf_entry(file, kv)
    }

    fn gguf_entry(&self, file: usize, kv: usize) -> Result<GgufValue<'_>> {
        // SAFETY: a live handle; -1 out of range.
        let raw = unsafe { sys::peft_checkpoint_gguf_kv_type(self.ptr(), file, kv) };
        let kind = GgufType::from_raw(raw).ok_or_else(|| unreadable(raw))?;
        if kind != GgufType::Array {
            return self.gguf_scalar(file, kv, 0, kind);
        }
        // SAFETY: as above.
        let (raw, length) = unsafe {
            (
                sys::peft_checkpoint_gguf_kv_array_type(self.ptr(), file, kv),
                sys::peft_checkpoint_gguf_kv_array_length(self.ptr(), file, kv),
            )
        };
        let element = GgufType::from_raw(raw).ok_or_else(|| unreadable(raw))?;
        let items = (0..length).map(|i| self.gguf_scalar(file, kv, i, element)).collect::<Result<_>>()?;
        Ok(GgufValue::Array(element, items))
    }

    fn gguf_scalar(&self, file: usize, kv: usize, element: u64, kind: GgufType) -> Result<GgufValue<'_>> {
        let p = self.ptr();
        // SAFETY: valid out-pointers, written only on success; strings live as long as self.
        unsafe {
            let unsigned = || -> Result<u64> {
                let mut out = 0u64;
                check(sys::peft_checkpoint_gguf_kv_uint(p, file, kv, element, &mut out))?;
                Ok(out)
            };
            let signed = || -> Result<i64> {
                let mut out = 0i64;
                check(sys::peft_checkpoint_gguf_kv_int(p, file, kv, element, &mut out))?;
                Ok(out)
            };
            let float = || -> Result<f64> {
                let mut out = 0f64;
                check(sys::peft_checkpoint_gguf_kv_float(p, file, kv, element, &mut out))?;
                Ok(out)
            };
            // The library stores each value in its own type, so the narrowing casts are exact.
            Ok(match kind {
                GgufType::U8 => GgufValue::U8(unsigned()? as u8),
                GgufType::I8 => GgufValue::I8(signed()? as i8),
                GgufType::U16 => GgufValue::U16(unsigned()? as u16),
                GgufType::I16 => GgufValue::I16(signed()? as i16),
                GgufType::U32 => GgufValue::U32(unsigned()? as u32),
                GgufType::I32 => GgufValue::I32(signed()? as i32),
                GgufType::U64 => GgufValue::U64(unsigned()?),
                GgufType::I64 => GgufValue::I64(signed()?),
                GgufType::F32 => GgufValue::F32(float()? as f32),
                GgufType::F64 => GgufValue::F64(float()?),
                GgufType::Bool => GgufValue::Bool(signed()? != 0),
                GgufType::String => {
                    let mut data: *const std::ffi::c_char = std::ptr::null();
                    let mut length = 0usize;
                    check(sys::peft_checkpoint_gguf_kv_string(p, file, kv, element, &mut data, &mut length))?;
                    GgufValue::String(borrowed_slice(data.cast::<u8>(), length))
                }
                GgufType::Array => return Err(unreadable(kind.raw())),
            })
        }
    }
}

fn unreadable(raw: i32) -> Error {
    Error::new(ErrorCode::Unsupported, format!("GGUF metadata of type {raw} cannot be read here"))
}
