//! Serving many adapters over one base model: a registry of adapters under a byte budget, leases on
//! loaded adapters, unmerged LoRA added to a batch's outputs, and hot-swapping the adapter merged
//! into weight buffers the host owns.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;

use peft_c_sys as sys;

use crate::adapter::AdapterOptions;
use crate::dtype::DType;
use crate::error::{check, Error, Result};
use crate::ffi::{borrowed_str, c_path, c_string, handle, new_handle, take_string};
use crate::merge_buffer::Buffer;
use crate::translator::Translator;

handle!(
    /// A registry of adapters under names, loaded on first use and kept under a byte budget
    /// (least recently used out first). See the header's `@defgroup serving`.
    ///
    /// Every method takes `&self`: the library synchronises, so one registry serves any number of
    /// threads at once (`Send + Sync`; share it with `&` or `Arc`).
    ///
    /// ```no_run
    /// use peft_c::{lora_apply, Buffer, BufferRef, DType, Registry};
    ///
    /// # fn main() -> peft_c::Result<()> {
    /// let registry = Registry::new(DType::BF16, 1 << 30, None)?;
    /// registry.register("support", "adapters/support", None)?; // reads the config and header only
    /// registry.register("legal", "adapters/legal", None)?;
    /// let (support, legal) = (registry.acquire("support")?, registry.acquire("legal")?); // loads, pins
    ///
    /// // A batch of 3 rows for one layer; row 2 uses no adapter.
    /// let (in_features, out_features) = (4096, 4096);
    /// let x = vec![0f32; 3 * in_features];
    /// let mut y = vec![0f32; 3 * out_features]; // what the base weight computed
    /// lora_apply(
    ///     "model.layers.0.self_attn.q_proj",
    ///     &[&support, &legal],
    ///     Some(&[0, 1, -1][..]),
    ///     BufferRef::F32(&x),
    ///     in_features as u64,
    ///     Buffer::F32(&mut y),
    ///     out_features as u64,
    /// )?;
    /// # Ok(())
    /// # }
    /// ```
    Registry,
    sys::peft_registry,
    sys::peft_registry_free
);

// SAFETY: the header lets a registry be used from any number of threads at once; freeing needs no
// other call running, which owning it (drop) guarantees.
unsafe impl Send for Registry {}
// SAFETY: as above.
unsafe impl Sync for Registry {}

/// A registry's counters ([`Registry::stats`]), read as one consistent snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RegistryStats {
    /// The byte budget.
    pub budget_bytes: u64,
    /// Bytes of adapter tensors in memory now (never above the budget).
    pub loaded_bytes: u64,
    /// The highest `loaded_bytes` seen.
    pub peak_loaded_bytes: u64,
    /// Names registered now.
    pub registered: u64,
    /// Adapter versions in memory now (replaced versions still leased included).
    pub loaded: u64,
    /// Of those, versions held by at least one lease or host model.
    pub pinned: u64,
    /// Loads of tensors since the registry was made.
    pub loads: u64,
    /// Acquisitions that found the tensors in memory.
    pub hits: u64,
    /// Loaded versions evicted to make room or by [`Registry::trim`].
    pub evictions: u64,
}

impl Registry {
    /// An empty registry keeping loaded tensors in `storage` (F32, BF16 or F16, rounded to nearest
    /// even as torch's `.to()`), at most `budget_bytes` of them at once. With a translator,
    /// [`lora_apply`] reads layer names as the host's own names (the table is shared; the
    /// translator may be dropped afterwards).
    pub fn new(storage: DType, budget_bytes: u64, translator: Option<&Translator>) -> Result<Registry> {
        let translator = translator.map_or(std::ptr::null(), Translator::as_ptr);
        // SAFETY: a live translator or NULL; the constructor stores an owned handle or fails.
        let raw = unsafe { new_handle(|out| sys::peft_registry_new(storage.raw(), budget_bytes, translator, out))? };
        Ok(Registry { raw })
    }

    /// The handle for the library's calls that change the registry: it synchronises them itself.
    fn ptr(&self) -> *mut sys::peft_registry {
        self.raw.as_ptr()
    }

    /// Registers the adapter in `dir` under `name`, or replaces the adapter of that name (leases
    /// on the old version keep working with it). Reads and validates the config and the
    /// safetensors header only; the tensors load at the first [`acquire`](Registry::acquire).
    /// `options` as for [`crate::Adapter::open_with`] (a base model to validate against). On
    /// failure the registry is unchanged.
    pub fn register(&self, name: &str, dir: impl AsRef<Path>, options: Option<&AdapterOptions>) -> Result<()> {
        let name = c_string(name, "adapter name")?;
        let dir = c_path(dir.as_ref())?;
        let opts = options.map_or(std::ptr::null(), AdapterOptions::as_ptr);
        // SAFETY: a live registry, valid strings, live options or NULL.
        unsafe { check(sys::peft_registry_register(self.ptr(), name.as_ptr(), dir.as_ptr(), opts)) }
    }

    /// As [`register`](Registry::register), from the text of `adapter_config.json` and the bytes of
    /// `adapter_model.safetensors` (both copied).
    pub fn register_memory(
        &self,
        name: &str,
        config_json: &str,
        weights: &[u8],
        options: Option<&AdapterOptions>,
    ) -> Result<()> {
        let name = c_string(name, "adapter name")?;
        let config = c_string(config_json, "adapter config")?;
        let opts = options.map_or(std::ptr::null(), AdapterOptions::as_ptr);
        // SAFETY: a live registry, valid strings, `weights.len()` readable bytes (copied), live
        // options or NULL.
        unsafe {
            check(sys::peft_registry_register_memory(
                self.ptr(),
                name.as_ptr(),
                config.as_ptr(),
                weights.as_ptr().cast(),
                weights.len(),
                opts,
            ))
        }
    }

    /// Removes a name ([`ErrorCode::NotFound`](crate::ErrorCode::NotFound) when not registered).
    /// Leases on its adapter keep working; its memory goes with the last of them.
    pub fn unregister(&self, name: &str) -> Result<()> {
        let name = c_string(name, "adapter name")?;
        // SAFETY: a live registry and a valid string.
        unsafe { check(sys::peft_registry_unregister(self.ptr(), name.as_ptr())) }
    }

    /// The registered names, in the order they were first registered.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut out = std::ptr::null_mut();
        // SAFETY: a live registry; on success `out` holds a string that take_string frees.
        let text = unsafe {
            check(sys::peft_registry_names(self.as_ptr(), &mut out))?;
            take_string(out)
        };
        Ok(text.lines().map(str::to_string).collect())
    }

    /// Acquires the adapter registered under `name`: loads its tensors if they are not in memory
    /// (evicting unpinned adapters, least recently used first, to make room) and pins it until the
    /// lease is dropped. Fails with [`ErrorCode::NotFound`](crate::ErrorCode::NotFound) for a name
    /// not registered and [`ErrorCode::OverBudget`](crate::ErrorCode::OverBudget) when the adapter
    /// does not fit beside the pinned ones. Threads acquiring an adapter being loaded wait for
    /// that one load.
    pub fn acquire(&self, name: &str) -> Result<Lease> {
        let name = c_string(name, "adapter name")?;
        // SAFETY: a live registry and a valid string; the call stores an owned lease or fails.
        let raw = unsafe { new_handle(|out| sys::peft_registry_acquire(self.ptr(), name.as_ptr(), out))? };
        Ok(Lease { raw })
    }

    /// Evicts every loaded adapter that nothing pins.
    pub fn trim(&self) -> Result<()> {
        // SAFETY: a live registry.
        unsafe { check(sys::peft_registry_trim(self.ptr())) }
    }

    /// Changes the byte budget, evicting unpinned adapters (least recently used first) until the
    /// loaded bytes fit; [`ErrorCode::OverBudget`](crate::ErrorCode::OverBudget), with nothing
    /// evicted and the budget unchanged, when the pinned adapters alone take more.
    pub fn set_budget(&self, budget_bytes: u64) -> Result<()> {
        // SAFETY: a live registry.
        unsafe { check(sys::peft_registry_set_budget(self.ptr(), budget_bytes)) }
    }

    /// The registry's counters.
    pub fn stats(&self) -> Result<RegistryStats> {
        let mut raw = sys::peft_registry_stats {
            size: std::mem::size_of::<sys::peft_registry_stats>() as u64,
            ..Default::default()
        };
        // SAFETY: a live registry and a struct whose size field says how large it is.
        unsafe { check(sys::peft_registry_get_stats(self.as_ptr(), &mut raw))? };
        Ok(RegistryStats {
            budget_bytes: raw.budget_bytes,
            loaded_bytes: raw.loaded_bytes,
            peak_loaded_bytes: raw.peak_loaded_bytes,
            registered: raw.registered,
            loaded: raw.loaded,
            pinned: raw.pinned,
            loads: raw.loads,
            hits: raw.hits,
            evictions: raw.evictions,
        })
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").field("stats", &self.stats().ok()).finish()
    }
}

handle!(
    /// An acquired adapter of a [`Registry`]: loaded and pinned (never evicted) until dropped.
    ///
    /// A lease has no lifetime tied to its registry: the library keeps the adapter for it, also
    /// after the registry is dropped or the name is replaced or unregistered. Leases may be used
    /// from many threads at once (`Send + Sync`; share one with `&` or `Arc`).
    ///
    /// ```no_run
    /// # fn main() -> peft_c::Result<()> {
    /// let registry = peft_c::Registry::new(peft_c::DType::F32, 1 << 30, None)?;
    /// registry.register("support", "adapters/support", None)?;
    /// let lease = registry.acquire("support")?;
    /// drop(registry);
    /// assert!(lease.has_module("model.layers.0.self_attn.q_proj")); // still loaded
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// What it lends borrows from it:
    ///
    /// ```compile_fail
    /// # let registry = peft_c::Registry::new(peft_c::DType::F32, 1 << 30, None).unwrap();
    /// let name = {
    ///     let lease = registry.acquire("support").unwrap();
    ///     lease.name() // error: `lease` does not live long enough
    /// };
    /// ```
    Lease,
    sys::peft_lease,
    sys::peft_lease_release
);

// SAFETY: the header lets leases be used and released from any number of threads at once; each is
// released once, by its owner's drop.
unsafe impl Send for Lease {}
// SAFETY: as above.
unsafe impl Sync for Lease {}

impl Lease {
    /// The name the adapter was acquired under.
    pub fn name(&self) -> &str {
        // SAFETY: the string lives as long as the lease.
        unsafe { borrowed_str(sys::peft_lease_name(self.as_ptr())) }.unwrap_or("")
    }

    /// The version of the adapter: the registry numbers registrations 1, 2, 3, ... so a
    /// replacement has a higher version than what it replaced.
    pub fn version(&self) -> u64 {
        // SAFETY: a live lease.
        unsafe { sys::peft_lease_version(self.as_ptr()) }
    }

    /// Bytes the adapter's loaded tensors take (what it counts against the budget).
    pub fn bytes(&self) -> u64 {
        // SAFETY: a live lease.
        unsafe { sys::peft_lease_bytes(self.as_ptr()) }
    }

    /// Whether the adapter has a LoRA layer of that name (a HuggingFace module path or weight
    /// name, or the host's name when the registry has a translator).
    pub fn has_module(&self, module: &str) -> bool {
        let Ok(module) = c_string(module, "layer name") else { return false };
        // SAFETY: a live lease and a valid string.
        unsafe { sys::peft_lease_has_module(self.as_ptr(), module.as_ptr()) != 0 }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name())
            .field("version", &self.version())
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// Values a call only reads, or a view of a [`HostModel`]'s buffer: F32, BF16 or F16 (the 16-bit
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

/// The number of elements `shape` describes, if it fits in 64 bits.
fn element_count(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
}

/// Adds each row's adapter contribution to one layer's output, without merging: for every row `i`
/// whose adapter `leases[row_lease[i]]` has a LoRA layer `module`,
/// `y[i] += scaling * (x[i] A^T) B^T` (plus `scaling * lora_B.bias` with lora_bias), computed in
/// F32 and rounded once into `y`'s dtype, as PEFT's forward of an unmerged model with mixed-batch
/// `adapter_names` does.
///
/// `x` holds the batch's activations, rows of `in_features`; `y` the base layer's output for the
/// same rows, rows of `out_features`, changed in place. `row_lease` gives each row an index into
/// `leases`, or -1 for no adapter; `None` uses `leases[0]` for every row. Rows with -1, or whose
/// adapter has no such layer, are left unchanged. Linear and GPT-2 Conv1D layers are supported;
/// `module` is a HuggingFace module path or weight name, or the host's name when the registry has
/// a translator.
///
/// On failure `y` is unchanged: [`ErrorCode::ShapeMismatch`](crate::ErrorCode::ShapeMismatch)
/// naming the adapter whose layer has other features, [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported)
/// for DoRA, embedding and Conv2d layers, [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument)
/// for no leases, an index out of range, or buffers that do not hold whole rows of the same count
/// (checked by the binding). Calls writing different outputs may run at once, also with the same
/// leases.
pub fn lora_apply(
    module: &str,
    leases: &[&Lease],
    row_lease: Option<&[i32]>,
    x: BufferRef<'_>,
    in_features: u64,
    y: Buffer<'_>,
    out_features: u64,
) -> Result<()> {
    if leases.is_empty() {
        return Err(Error::invalid_argument("lora_apply needs at least one lease"));
    }
    if in_features == 0 {
        return Err(Error::invalid_argument(format!("layer {module:?}: in_features is 0")));
    }
    let rows = x.len() as u64 / in_features;
    if rows * in_features != x.len() as u64 {
        return Err(Error::invalid_argument(format!(
            "layer {module:?}: x holds {} elements, not whole rows of {in_features}",
            x.len()
        )));
    }
    if rows.checked_mul(out_features) != Some(y.len() as u64) {
        return Err(Error::invalid_argument(format!(
            "layer {module:?}: y holds {} elements; {rows} rows of {out_features} are {:?}",
            y.len(),
            rows.checked_mul(out_features)
        )));
    }
    if let Some(indices) = row_lease {
        if indices.len() as u64 != rows {
            return Err(Error::invalid_argument(format!(
                "layer {module:?}: {} adapter indices for {rows} rows",
                indices.len()
            )));
        }
    }
    let c_module = c_string(module, "layer name")?;
    let raw_leases: Vec<*const sys::peft_lease> = leases.iter().map(|lease| lease.as_ptr()).collect();
    let row_ptr = row_lease.map_or(std::ptr::null(), <[i32]>::as_ptr);
    let y = RawBuffer::of(y);
    // SAFETY: live leases; x holds rows x in_features and y rows x out_features elements of their
    // dtypes, and row_lease (when given) rows indices (all checked above); y is exclusively
    // borrowed for the call.
    unsafe {
        check(sys::peft_lora_apply(
            c_module.as_ptr(),
            raw_leases.as_ptr(),
            raw_leases.len(),
            row_ptr,
            x.as_ptr(),
            x.dtype().raw(),
            rows,
            in_features,
            y.data,
            y.dtype.raw(),
            out_features,
        ))
    }
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

/// The weight buffers of a host's model, into which adapters from a [`Registry`] are swapped in
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
    /// Conv1D, [num_embeddings, dim] for embeddings, 4-D for Conv2d; `weight` must hold exactly its
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
