//! Serving, the registry part (as `src/capi/serve_registry_api.cpp`): [`Registry`], its stats, and the
//! [`Lease`]s that pin its adapters.

use std::fmt;
use std::path::Path;

use peft_c_sys as sys;

use crate::adapter::AdapterOptions;
use crate::dtype::DType;
use crate::error::{check, Error, ErrorCode, Result};
use crate::ffi::{borrowed_str, c_path, c_string, handle, new_handle, take_string_list};
use crate::serve::BufferRef;
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
    /// [`lora_apply`](crate::lora_apply) reads layer names as the host's own names (the table is shared; the
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
        // SAFETY: a live registry; on success `out` holds a list that take_string_list frees.
        unsafe {
            check(sys::peft_registry_name_list(self.as_ptr(), &mut out))?;
            Ok(take_string_list(out))
        }
    }

    /// What lenient loading ([`AdapterOptions::set_lenient`](crate::AdapterOptions::set_lenient))
    /// ignored when the adapter registered under `name` now was registered, as
    /// [`Adapter::warnings`](crate::Adapter::warnings) gives them; empty for a strict registration.
    /// Fails with [`ErrorCode::NotFound`](crate::ErrorCode::NotFound) for a name not registered.
    pub fn warnings(&self, name: &str) -> Result<Vec<String>> {
        let name = c_string(name, "adapter name")?;
        let mut out = std::ptr::null_mut();
        // SAFETY: a live registry and a valid string; on success `out` holds a list that
        // take_string_list frees.
        unsafe {
            check(sys::peft_registry_warning_list(self.as_ptr(), name.as_ptr(), &mut out))?;
            Ok(take_string_list(out))
        }
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

    /// Gives the registry the host's base weight of one layer, which [`lora_apply`](crate::lora_apply)
    /// needs for DoRA layers (their weight norm ||W + scaling B A|| per output feature), and the
    /// layer's bias (None for a layer without one). `weight` is laid out as the base model stores it,
    /// `shape` [out, in] for Linear, [in, out] for GPT-2 Conv1D; `bias` holds the output features.
    /// For a DoRA layer the `y` given to `lora_apply` is then the base output with its bias. `name` is
    /// the weight's name or its layer's (the registry's translator applies); giving a layer again
    /// replaces its buffers.
    ///
    /// Errors: `ShapeMismatch` for a shape that is not two-dimensional, a zero dimension or an empty
    /// bias; `InvalidArgument` for a weight whose length is not the shape's; `UnresolvedKey` when the
    /// translator does not resolve `name`. Whether the shape fits a DoRA layer is checked by
    /// `lora_apply` (`ShapeMismatch`).
    ///
    /// # Safety
    /// The library keeps the addresses of `weight` and `bias`, not copies: both must stay valid, and
    /// hold the base weights without any adapter merged, until this registry and every [`Lease`] of
    /// it are dropped (or the layer is given again). Their contents may change only while no
    /// `lora_apply` with a lease of this registry runs, followed by
    /// [`base_weights_changed`](Self::base_weights_changed).
    pub unsafe fn set_base_weight(
        &self,
        name: &str,
        weight: BufferRef<'_>,
        shape: &[u64],
        bias: Option<BufferRef<'_>>,
    ) -> Result<()> {
        let count = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        if count != Some(weight.len() as u64) {
            return Err(Error::invalid_argument(format!(
                "the base weight of {name:?} holds {} elements; shape {shape:?} needs {}",
                weight.len(),
                count.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string())
            )));
        }
        let name = c_string(name, "weight name")?;
        let (bias_ptr, bias_dtype, bias_len) =
            bias.as_ref().map_or((std::ptr::null(), 0, 0), |b| (b.as_ptr(), b.dtype().raw(), b.len() as u64));
        if bias.as_ref().is_some_and(BufferRef::is_empty) {
            return Err(Error::new(ErrorCode::ShapeMismatch, "the bias has no elements".to_string()));
        }
        // SAFETY: a live registry, a valid string, `shape.len()` dimensions (copied); the caller keeps
        // the buffers valid as the library needs (see above).
        unsafe {
            check(sys::peft_registry_set_base_weight(
                self.ptr(),
                name.as_ptr(),
                weight.as_ptr(),
                weight.dtype().raw(),
                shape.as_ptr(),
                shape.len(),
                bias_ptr,
                bias_dtype,
                bias_len,
            ))
        }
    }

    /// Tells the registry that the contents of the base weights (or biases) given with
    /// [`set_base_weight`](Self::set_base_weight) changed: every DoRA layer's scale is computed
    /// again, from the buffers as they are then, at its next `lora_apply`.
    pub fn base_weights_changed(&self) -> Result<()> {
        // SAFETY: a live registry.
        unsafe { check(sys::peft_registry_base_weights_changed(self.ptr())) }
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
    sys::peft_lease_free
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
