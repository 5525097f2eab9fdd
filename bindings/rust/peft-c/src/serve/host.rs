//! Serving, the host-model part (as `src/capi/serve_host_api.cpp`): [`HostModel`], the host's weight
//! buffers into which adapters are swapped, and [`SwapStats`].

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use peft_c_sys as sys;

use super::registry::Lease;
use super::{BufferRef, RawBuffer};
use crate::dtype::DType;
use crate::error::{check, Error, Result};
use crate::ffi::{borrowed_str, c_string, new_handle};
use crate::merge_buffer::Buffer;
use crate::translator::Translator;

/// The number of elements `shape` describes, if it fits in 64 bits.
fn element_count(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
}

/// What a swap did ([`HostModel::swap`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct SwapStats {
    /// Wall time taking the previous adapter out, in seconds.
    pub remove_seconds: f64,
    /// Wall time merging the new adapter in, in seconds.
    pub merge_seconds: f64,
    /// Layers of the previous adapter taken out.
    pub layers_removed: u64,
    /// Layers of the new adapter merged in.
    pub layers_merged: u64,
    /// Bytes of original weights (and biases) the host model keeps for exact removal.
    pub saved_bytes: u64,
}

/// One weight given to a host model, kept for the views between swaps.
struct HostWeight {
    name: String,
    weight: RawBuffer,
    bias: Option<RawBuffer>,
}

/// The weight buffers of a host's model, into which adapters from a [`Registry`](crate::Registry) are swapped in
/// place: [`swap`](HostModel::swap) takes the current adapter out (bit for bit by default) and
/// merges the next one in.
///
/// The host model borrows the buffers mutably for its whole life (`'a`): while it lives, the
/// library may change them at any swap, so the rest of the program reads them only through
/// [`weight`](HostModel::weight) and [`bias`](HostModel::bias), views that end before the next
/// swap. Dropping the host model leaves the buffers as they are (swap to `None` first to restore
/// them) and ends the borrow. It belongs to one thread at a time (`Send`, not `Sync`).
///
/// ```no_run
/// use peft_c::{Buffer, DType, HostModel, Registry};
///
/// # fn main() -> peft_c::Result<()> {
/// let registry = Registry::new(DType::F32, 1 << 30, None)?;
/// registry.register("support", "adapters/support", None)?;
/// let mut q_proj = vec![0f32; 4096 * 4096]; // the host's weight, [out, in]
/// let mut host = HostModel::new()?;
/// host.add_weight("model.layers.0.self_attn.q_proj.weight", Buffer::F32(&mut q_proj), &[4096, 4096], None)?;
/// host.swap(Some(&registry.acquire("support")?), 1.0)?; // the host model holds the adapter now
/// if let Some(peft_c::BufferRef::F32(merged)) = host.weight("model.layers.0.self_attn.q_proj.weight") {
///     println!("{}", merged[0]); // run the model with the merged weights
/// }
/// host.swap(None, 1.0)?; // back to the base weights, bit for bit
/// drop(host);
/// println!("{}", q_proj[0]); // the borrow ended with the host model
/// # Ok(())
/// # }
/// ```
///
/// The buffers cannot be read behind the host model's back:
///
/// ```compile_fail
/// # let mut q_proj = vec![0f32; 16 * 16];
/// let mut host = peft_c::HostModel::new().unwrap();
/// host.add_weight("model.layers.0.self_attn.q_proj", peft_c::Buffer::F32(&mut q_proj), &[16, 16], None).unwrap();
/// let first = q_proj[0]; // error: `q_proj` is borrowed by the host model
/// host.swap(None, 1.0).unwrap();
/// ```
///
/// nor must they be dropped before it:
///
/// ```compile_fail
/// let mut host = peft_c::HostModel::new().unwrap();
/// {
///     let mut q_proj = vec![0f32; 16 * 16];
///     host.add_weight("model.layers.0.self_attn.q_proj", peft_c::Buffer::F32(&mut q_proj), &[16, 16], None)
///         .unwrap();
/// } // error: `q_proj` does not live long enough
/// host.swap(None, 1.0).unwrap();
/// ```
///
/// and a view does not last across a swap:
///
/// ```compile_fail
/// # let mut q_proj = vec![0f32; 16 * 16];
/// # let mut host = peft_c::HostModel::new().unwrap();
/// # host.add_weight("q", peft_c::Buffer::F32(&mut q_proj), &[16, 16], None).unwrap();
/// let view = host.weight("q").unwrap();
/// host.swap(None, 1.0).unwrap(); // error: `host` is borrowed by `view`
/// println!("{view:?}");
/// ```
pub struct HostModel<'a> {
    raw: NonNull<sys::peft_host_model>,
    weights: Vec<HostWeight>,
    /// The buffers handed to the library, borrowed mutably for `'a`.
    _buffers: PhantomData<&'a mut [u8]>,
}

impl Drop for HostModel<'_> {
    fn drop(&mut self) {
        // SAFETY: owned by self, freed once; the library does not touch the buffers when freeing.
        unsafe { sys::peft_host_model_free(self.raw.as_ptr()) }
    }
}

// SAFETY: the header lets a host model move between threads, one thread at a time (not Sync); the
// buffers it holds are exclusively borrowed slices of f32 / u16, which may move with it.
unsafe impl Send for HostModel<'_> {}

impl<'a> HostModel<'a> {
    /// A host model with no weights: HuggingFace names, exact restoration.
    pub fn new() -> Result<HostModel<'a>> {
        // SAFETY: the constructor stores an owned handle or fails.
        let raw = unsafe { new_handle(|out| sys::peft_host_model_new(out))? };
        Ok(HostModel { raw, weights: Vec::new(), _buffers: PhantomData })
    }

    /// The raw handle, for calls through `peft-c-sys`. It stays owned by `self`.
    pub fn as_ptr(&self) -> *const sys::peft_host_model {
        self.raw.as_ptr()
    }

    /// Reads weight names as the host's own names through this translator (None: HuggingFace
    /// names, the default). Only before weights are added. The table is shared; the translator
    /// may be dropped afterwards.
    pub fn set_translator(&mut self, translator: Option<&Translator>) -> Result<&mut Self> {
        let ptr = translator.map_or(std::ptr::null(), Translator::as_ptr);
        // SAFETY: a live host model and a live translator or NULL.
        unsafe { check(sys::peft_host_model_set_translator(self.raw.as_ptr(), ptr))? };
        Ok(self)
    }

    /// Chooses how swaps take adapters out: exactly (`true`, the default: a copy of each weight's
    /// bytes, taken at its first exact merge and kept for the host model's life, is written back,
    /// bit for bit), or by PEFT's arithmetic unmerge (`false`: no copy; in BF16/F16 it may change
    /// last bits, swap after swap; copies already taken are kept). Takes effect at the next merge;
    /// a layer comes out the way it went in.
    pub fn set_exact(&mut self, exact: bool) -> Result<&mut Self> {
        // SAFETY: a live host model.
        unsafe { check(sys::peft_host_model_set_exact(self.raw.as_ptr(), i32::from(exact)))? };
        Ok(self)
    }

    /// Gives the host model one weight buffer (F32, BF16 or F16), borrowed for its whole life.
    ///
    /// `name` is the weight's name or its layer's (a HuggingFace module path, or the host's name
    /// with a translator). `shape` is the weight's: [out, in] for Linear, [in, out] for GPT-2
    /// Conv1D, [num_embeddings, dim] for embeddings, [experts, out, in] for a fused expert
    /// parameter, 4-D for Conv2d; `weight` must hold exactly its
    /// elements (checked by the binding). `bias` is the layer's bias, which adapters with lora_bias
    /// change; the library is told its length and never writes past it: a [`swap`](HostModel::swap)
    /// of an adapter whose layer has another number of output features fails with
    /// [`ErrorCode::ShapeMismatch`](crate::ErrorCode::ShapeMismatch).
    ///
    /// Fails with [`ErrorCode::UnresolvedKey`](crate::ErrorCode::UnresolvedKey) when the translator
    /// does not resolve `name`, [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument)
    /// for a layer given twice or while an adapter is merged, and
    /// [`ErrorCode::ShapeMismatch`](crate::ErrorCode::ShapeMismatch) for a zero dimension or an
    /// empty bias. The buffers stay borrowed even when it fails.
    pub fn add_weight(
        &mut self,
        name: &str,
        weight: Buffer<'a>,
        shape: &[u64],
        bias: Option<Buffer<'a>>,
    ) -> Result<()> {
        let elements = element_count(shape);
        if elements != Some(weight.len() as u64) {
            return Err(Error::invalid_argument(format!(
                "the weight buffer of {name:?} holds {} elements, its shape {shape:?} has {elements:?}",
                weight.len()
            )));
        }
        let c_name = c_string(name, "weight name")?;
        let weight = RawBuffer::of(weight);
        let bias = bias.map(RawBuffer::of);
        let (bias_ptr, bias_dtype, bias_len) =
            bias.map_or((std::ptr::null_mut(), DType::F32, 0), |b| (b.data, b.dtype, b.len));
        // SAFETY: the weight buffer holds exactly the shape's elements (checked above) and the bias
        // `bias_len`, the length the library is given; both stay exclusively borrowed, and in
        // place, for 'a, which outlives the host model (the shape is copied).
        unsafe {
            check(sys::peft_host_model_add_weight(
                self.raw.as_ptr(),
                c_name.as_ptr(),
                weight.data,
                weight.dtype.raw(),
                shape.as_ptr(),
                shape.len(),
                bias_ptr,
                bias_dtype.raw(),
                bias_len as u64,
            ))?
        };
        self.weights.push(HostWeight { name: name.to_string(), weight, bias });
        Ok(())
    }

    /// Switches the adapter merged into the buffers: takes the current one out (if any) and
    /// merges `lease`'s in (if not `None`), scaled by `weight` (1.0 for the adapter as trained;
    /// finite). Everything is checked before a buffer changes; on failure the buffers hold what
    /// they held before. The host model holds the new adapter (pinned in its registry) until the
    /// next swap or its drop, so the lease may be dropped at once.
    ///
    /// Fails with [`ErrorCode::UnresolvedKey`](crate::ErrorCode::UnresolvedKey) listing the
    /// adapter's layers the host model has no weight for,
    /// [`ErrorCode::ShapeMismatch`](crate::ErrorCode::ShapeMismatch) naming a layer whose weight
    /// does not fit or whose bias has another length than its output features,
    /// [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported) when the adapter replaces whole
    /// tensors (modules_to_save, trainable tokens), and
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a weight that is not
    /// finite, a missing bias buffer, or two layers of the adapter on one weight.
    pub fn swap(&mut self, lease: Option<&Lease>, weight: f64) -> Result<SwapStats> {
        let lease = lease.map_or(std::ptr::null(), Lease::as_ptr);
        let mut raw =
            sys::peft_swap_stats { size: std::mem::size_of::<sys::peft_swap_stats>() as u64, ..Default::default() };
        // SAFETY: a live host model whose buffers are exclusively borrowed (by 'a and, for the
        // views, by `&mut self`), a live lease or NULL, and a stats struct of the size it says.
        unsafe { check(sys::peft_host_model_swap(self.raw.as_ptr(), lease, weight, &mut raw))? };
        Ok(SwapStats {
            remove_seconds: raw.remove_seconds,
            merge_seconds: raw.merge_seconds,
            layers_removed: raw.layers_removed,
            layers_merged: raw.layers_merged,
            saved_bytes: raw.saved_bytes,
        })
    }

    /// The name of the adapter merged into the buffers; None when none.
    pub fn current(&self) -> Option<&str> {
        // SAFETY: the string lives until the next swap, which needs `&mut self`.
        unsafe { borrowed_str(sys::peft_host_model_current(self.as_ptr())) }
    }

    /// The weight buffer given under `name` to [`add_weight`](HostModel::add_weight), as it is now.
    pub fn weight(&self, name: &str) -> Option<BufferRef<'_>> {
        let found = self.weights.iter().find(|w| w.name == name)?;
        // SAFETY: the buffer is borrowed for 'a, which outlives self; only swaps write it, and they
        // need `&mut self`, so nothing writes it while the view lives.
        Some(unsafe { found.weight.view() })
    }

    /// The bias buffer given with the weight `name`, as it is now; None without one.
    pub fn bias(&self, name: &str) -> Option<BufferRef<'_>> {
        let found = self.weights.iter().find(|w| w.name == name)?;
        // SAFETY: as for `weight`.
        found.bias.map(|b| unsafe { b.view() })
    }
}

impl fmt::Debug for HostModel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostModel")
            .field("weights", &self.weights.iter().map(|w| w.name.as_str()).collect::<Vec<_>>())
            .field("current", &self.current())
            .finish()
    }
}
