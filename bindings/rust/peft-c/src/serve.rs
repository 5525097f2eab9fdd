//! Serving many adapters over one base model, in three parts as `src/capi` splits them: a registry of
//! adapters under a byte budget and leases on loaded adapters (`serve/registry.rs`), unmerged LoRA
//! added to a batch's outputs (`serve/apply.rs`), and hot-swapping the adapter merged into weight
//! buffers the host owns (`serve/host.rs`). This file holds the buffer views the last two share.

use std::ffi::c_void;

use crate::dtype::DType;
use crate::merge_buffer::Buffer;

mod apply;
mod host;
mod registry;

pub use apply::lora_apply;
pub use host::{HostModel, SwapStats};
pub use registry::{Lease, Registry, RegistryStats};

/// Values a call only reads, or a view of a [`HostModel`](crate::HostModel)'s buffer: F32, BF16 or F16 (the 16-bit
/// types as raw bits). The read-only counterpart of [`Buffer`].
#[derive(Debug, Clone, Copy)]
pub enum BufferRef<'a> {
    /// IEEE binary32 values.
    F32(&'a [f32]),
    /// bfloat16 values as their bits.
    BF16(&'a [u16]),
    /// IEEE binary16 values as their bits.
    F16(&'a [u16]),
}

impl BufferRef<'_> {
    /// The buffer's dtype.
    pub fn dtype(&self) -> DType {
        match self {
            BufferRef::F32(_) => DType::F32,
            BufferRef::BF16(_) => DType::BF16,
            BufferRef::F16(_) => DType::F16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            BufferRef::F32(v) => v.len(),
            BufferRef::BF16(v) | BufferRef::F16(v) => v.len(),
        }
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn as_ptr(&self) -> *const c_void {
        match self {
            BufferRef::F32(v) => v.as_ptr().cast(),
            BufferRef::BF16(v) | BufferRef::F16(v) => v.as_ptr().cast(),
        }
    }
}

/// Where a mutable buffer is, its dtype and its length: what the library is handed.
#[derive(Clone, Copy)]
struct RawBuffer {
    data: *mut c_void,
    dtype: DType,
    len: usize,
}

impl RawBuffer {
    fn of(buffer: Buffer<'_>) -> RawBuffer {
        let (dtype, len) = (buffer.dtype(), buffer.len());
        let data = match buffer {
            Buffer::F32(v) => v.as_mut_ptr().cast(),
            Buffer::BF16(v) | Buffer::F16(v) => v.as_mut_ptr().cast(),
        };
        RawBuffer { data, dtype, len }
    }

    /// A shared view of the buffer.
    ///
    /// # Safety
    /// The buffer must be valid, and nothing may write it, for `'v`.
    unsafe fn view<'v>(&self) -> BufferRef<'v> {
        match self.dtype {
            DType::F32 => BufferRef::F32(std::slice::from_raw_parts(self.data.cast(), self.len)),
            DType::BF16 => BufferRef::BF16(std::slice::from_raw_parts(self.data.cast(), self.len)),
            // F16: a Buffer holds no other dtype.
            _ => BufferRef::F16(std::slice::from_raw_parts(self.data.cast(), self.len)),
        }
    }
}
