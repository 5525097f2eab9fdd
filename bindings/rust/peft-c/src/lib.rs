//! Safe Rust binding of peft_c: read, write, translate, merge and export HuggingFace safetensors
//! checkpoints and PEFT LoRA adapters, and serve many adapters over one base model ([`Registry`],
//! [`Lease`], [`lora_apply`], [`HostModel`]).
//!
//! ```no_run
//! use peft_c::{Adapter, Checkpoint, MergeOptions};
//!
//! # fn main() -> peft_c::Result<()> {
//! let ckpt = Checkpoint::open("model.safetensors")?;
//! for tensor in ckpt.tensors() {
//!     let bytes: &[u8] = ckpt.view(tensor.index)?; // zero-copy, lives as long as `ckpt`
//!     println!("{} {:?} {:?} {} bytes", tensor.name, tensor.dtype, tensor.shape, bytes.len());
//! }
//! let adapter = Adapter::open_with_base("adapter_dir", "base_dir")?;
//! let mut options = MergeOptions::new()?;
//! options.add_adapter(&adapter, 1.0)?;
//! peft_c::merge_checkpoint("base_dir", "merged_dir", &options)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Handles, lifetimes and threads
//!
//! Every library object is one Rust type that frees it on drop. The library keeps parents alive
//! for their children (an adapter for a merge's options, a table for a translator's users), so
//! drop order never matters. What the library lends (tensor views, names, shapes) borrows from the
//! handle it came from, and the compiler keeps it from outliving it.
//!
//! The header states thread safety per type, and the marker traits follow it:
//! read-only handles ([`Checkpoint`], [`Adapter`], [`Translator`], [`MergeResult`]) and the
//! internally synchronised serving handles ([`Registry`], [`Lease`]) are `Send + Sync`; writers,
//! options, merge records and host models belong to one thread at a time and are only `Send`:
//!
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::Writer>();
//! ```
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::MergeOptions>();
//! ```
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::MergeRecord>();
//! ```
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::ExportOptions>();
//! ```
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::MergeBufferOptions>();
//! ```
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::OpenOptions>();
//! ```
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::AdapterOptions>();
//! ```
//! ```compile_fail
//! fn shared<T: Sync>() {}
//! shared::<peft_c::HostModel<'static>>();
//! ```
//!
//! A view cannot outlive its checkpoint:
//!
//! ```compile_fail
//! let view = {
//!     let ckpt = peft_c::Checkpoint::open("model.safetensors").unwrap();
//!     ckpt.view(0).unwrap()
//! };
//! ```
//!
//! Nor can a source callback touch its own writer (the library is in the middle of a call on it):
//!
//! ```compile_fail
//! let mut w = peft_c::Writer::new("x.safetensors").unwrap();
//! w.add_tensor("x", peft_c::DType::F32, &[1]).unwrap();
//! w.write_from_fn("x", peft_c::DType::F32, |_, _| {
//!     w.write(&[0; 4]).unwrap();
//!     Ok(())
//! })
//! .unwrap();
//! ```
//!
//! A [`HostModel`] borrows the host's weight buffers mutably for its whole life: safe code reads
//! them only through the host model's views, which end before the next swap (its documentation
//! shows what the compiler refuses).
//!
//! # Errors
//!
//! Every fallible call returns [`Result`]; an [`Error`] carries the library's stable
//! [`ErrorCode`] and a message naming the file, tensor or key at fault.
//!
//! # Callbacks
//!
//! Progress and tensor-source callbacks are closures. A closure that panics cancels the operation
//! cleanly inside the library and the panic is resumed once the library has returned; it never
//! unwinds through C.
#![warn(missing_docs)]

mod adapter;
mod callback;
mod checkpoint;
mod control;
mod doctor;
mod dtype;
mod error;
mod export;
mod ffi;
mod gguf;
mod hub;
mod lowrank;
mod merge;
mod merge_buffer;
mod serve;
mod translator;
mod writer;

pub use adapter::{Adapter, AdapterOptions, LayerKind, Module, ModuleTensor};
pub use checkpoint::{Checkpoint, OpenOptions, TensorInfo};
pub use control::{ControlRecord, ControlVector};
pub use doctor::{adapter_doctor, adapter_doctor_fix};
pub use dtype::{convert, DType, Element};
pub use error::{Error, ErrorCode, Result};
pub use export::{combine_adapters, import_adapter_gguf, CombineMethod, ExportOptions, MajoritySign};
pub use gguf::{FileFormat, GgmlType, GgufType, GgufValue};
pub use hub::{hub_cache_dir, hub_resolve};
pub use lowrank::{
    combine_deltas, convert_initial, convert_to_lora, extract_lora, LowRankModule, LowRankOptions, SvdMethod,
};
pub use merge::{
    combine_models, combine_models_with_progress, merge_checkpoint, merge_checkpoint_with_progress, Arithmetic,
    MergeOptions, MergeResult, TiedEmbeddings,
};
pub use merge_buffer::{merge_into, Buffer, MergeBufferOptions, MergeRecord};
pub use serve::{lora_apply, BufferRef, HostModel, Lease, Registry, RegistryStats, SwapStats};
pub use translator::Translator;
pub use writer::Writer;

/// The raw declarations, for what this crate does not wrap.
pub use peft_c_sys as sys;

/// The version (major, minor, patch) of the header this binding was written against.
pub const HEADER_VERSION: (u32, u32, u32) = (sys::PEFT_VERSION_MAJOR, sys::PEFT_VERSION_MINOR, sys::PEFT_VERSION_PATCH);

/// The ABI version of the header this binding was written against.
pub const HEADER_ABI_VERSION: u32 = sys::PEFT_ABI_VERSION;

/// The running library's version as a string such as "0.1.0".
pub fn version() -> &'static str {
    // SAFETY: a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(sys::peft_version()) }.to_str().unwrap_or("")
}

/// The running library's version as major * 10000 + minor * 100 + patch.
pub fn version_number() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::peft_version_number() }
}

/// The running library's ABI version (its SONAME number).
pub fn abi_version() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::peft_abi_version() }
}

/// The kernel table the library computes with: `"avx512"`, `"avx2"` or `"portable"`, chosen once per
/// process (the `PEFT_C_KERNELS` environment variable can lower it; see `peft_kernels` in the header).
pub fn kernels() -> &'static str {
    // SAFETY: no arguments; the result is a static NUL-terminated ASCII string.
    unsafe { std::ffi::CStr::from_ptr(sys::peft_kernels()) }.to_str().unwrap_or("")
}
