//! PEFT LoRA adapters: opening, inspecting, validating against a base.

use std::fmt;
use std::path::Path;

use peft_c_sys as sys;

use crate::checkpoint::buffer_size;
use crate::dtype::{as_bytes_mut, require_little_endian, DType, Element};
use crate::error::{check, Error, ErrorCode, Result};
use crate::ffi::{borrowed_slice, borrowed_str, c_path, c_string, handle, new_handle};
use crate::translator::Translator;

handle!(
    /// Options for [`Adapter::open_with`]: a base model and an architecture table.
    ///
    /// Belongs to one thread at a time (`Send`, not `Sync`).
    AdapterOptions,
    sys::peft_adapter_options,
    sys::peft_adapter_options_free
);

// SAFETY: the header lets options move between threads; they are not shared (not Sync).
unsafe impl Send for AdapterOptions {}

impl AdapterOptions {
    /// The defaults: no base model, architecture table detected.
    pub fn new() -> Result<AdapterOptions> {
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(AdapterOptions { raw: unsafe { new_handle(|out| sys::peft_adapter_options_new(out))? } })
    }

    /// Opens the adapter against a base model folder (None for none): `all-linear` is expanded,
    /// layer kinds are told from the base and every module is validated against it.
    pub fn set_base_dir(&mut self, base_dir: Option<&Path>) -> Result<&mut Self> {
        let base = base_dir.map(c_path).transpose()?;
        let ptr = base.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        // SAFETY: a live handle and a valid string or NULL (copied).
        unsafe { check(sys::peft_adapter_options_set_base_dir(self.raw.as_ptr(), ptr))? };
        Ok(self)
    }

    /// Uses this translator's table instead of detecting one (None: detect). The table is shared;
    /// the translator may be dropped afterwards.
    pub fn set_translator(&mut self, translator: Option<&Translator>) -> Result<&mut Self> {
        let ptr = translator.map_or(std::ptr::null(), Translator::as_ptr);
        // SAFETY: a live handle and a live translator or NULL.
        unsafe { check(sys::peft_adapter_options_set_translator(self.raw.as_ptr(), ptr))? };
        Ok(self)
    }

    /// Loads the adapter as PEFT's `PeftModel.from_pretrained` does (true) or strictly (false, the
    /// default): what PEFT ignores (unexpected keys, missing keys that leave a layer without
    /// effect) is dropped and listed in [`Adapter::warnings`]; what PEFT refuses stays an error.
    pub fn set_lenient(&mut self, lenient: bool) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_adapter_options_set_lenient(self.raw.as_ptr(), i32::from(lenient)))? };
        Ok(self)
    }
}

impl fmt::Debug for AdapterOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdapterOptions").finish_non_exhaustive()
    }
}

handle!(
    /// A loaded PEFT LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`).
    ///
    /// Read-only after opening, so it may be used from many threads at once (`Send + Sync`).
    Adapter,
    sys::peft_adapter,
    sys::peft_adapter_free
);

// SAFETY: the header documents adapters as read-only after creation, all their functions callable
// from many threads at once, and free callable from any thread.
unsafe impl Send for Adapter {}
// SAFETY: as above.
unsafe impl Sync for Adapter {}

/// The kind of layer an adapter module applies to (`PEFT_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LayerKind {
    /// nn.Linear: base weight [out, in].
    Linear,
    /// transformers Conv1D (GPT-2): base weight [in, out].
    Conv1d,
    /// nn.Embedding: base [num, dim].
    Embedding,
    /// nn.Conv2d: base [out, in, kh, kw].
    Conv2d,
    /// Whole tensors that replace the base's (modules_to_save, biases).
    Full,
    /// Rows that replace base embedding rows (trainable_token_indices).
    TrainableTokens,
    /// A kind this binding does not know (from a newer library).
    Unknown(i32),
}

impl LayerKind {
    /// The kind of a `PEFT_LAYER_*` value.
    pub fn from_raw(value: i32) -> LayerKind {
        match value {
            sys::PEFT_LAYER_LINEAR => LayerKind::Linear,
            sys::PEFT_LAYER_CONV1D => LayerKind::Conv1d,
            sys::PEFT_LAYER_EMBEDDING => LayerKind::Embedding,
            sys::PEFT_LAYER_CONV2D => LayerKind::Conv2d,
            sys::PEFT_LAYER_FULL => LayerKind::Full,
            sys::PEFT_LAYER_TRAINABLE_TOKENS => LayerKind::TrainableTokens,
            other => LayerKind::Unknown(other),
        }
    }

    /// Whether this is a LoRA layer (with a rank and a scaling).
    pub fn is_lora(self) -> bool {
        matches!(self, LayerKind::Linear | LayerKind::Conv1d | LayerKind::Embedding | LayerKind::Conv2d)
    }
}

impl Adapter {
    /// Opens an adapter folder without a base model.
    pub fn open(dir: impl AsRef<Path>) -> Result<Adapter> {
        Adapter::open_impl(dir.as_ref(), None)
    }

    /// Opens an adapter folder against a base model folder (see [`AdapterOptions::set_base_dir`]).
    pub fn open_with_base(dir: impl AsRef<Path>, base_dir: impl AsRef<Path>) -> Result<Adapter> {
        let mut options = AdapterOptions::new()?;
        options.set_base_dir(Some(base_dir.as_ref()))?;
        Adapter::open_impl(dir.as_ref(), Some(&options))
    }

    /// Opens an adapter folder with options.
    pub fn open_with(dir: impl AsRef<Path>, options: &AdapterOptions) -> Result<Adapter> {
        Adapter::open_impl(dir.as_ref(), Some(options))
    }

    fn open_impl(dir: &Path, options: Option<&AdapterOptions>) -> Result<Adapter> {
        let dir = c_path(dir)?;
        let opts = options.map_or(std::ptr::null(), AdapterOptions::as_ptr);
        // SAFETY: valid arguments; the constructor stores an owned handle.
        Ok(Adapter { raw: unsafe { new_handle(|out| sys::peft_adapter_open(dir.as_ptr(), opts, out))? } })
    }

    fn ptr(&self) -> *const sys::peft_adapter {
        self.raw.as_ptr()
    }

    /// Validates the adapter against a base model folder, listing every problem in the error.
    pub fn validate(&self, base_dir: impl AsRef<Path>) -> Result<()> {
        let base = c_path(base_dir.as_ref())?;
        // SAFETY: valid arguments.
        unsafe { check(sys::peft_adapter_validate(self.ptr(), base.as_ptr())) }
    }

    /// The config as PEFT writes it (`json.dumps(config, indent=2, sort_keys=True)`).
    pub fn config_json(&self) -> &str {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_adapter_config_json(self.ptr())) }.unwrap_or("")
    }

    /// One field of the config as compact JSON (`"LORA"`, `8`, `null`); None when absent.
    pub fn config_field(&self, field: &str) -> Option<&str> {
        let field = c_string(field, "field").ok()?;
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_adapter_config_field(self.ptr(), field.as_ptr())) }
    }

    /// `r` as PEFT uses it.
    pub fn r(&self) -> i64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_r(self.ptr()) }
    }

    /// `lora_alpha` as PEFT uses it.
    pub fn lora_alpha(&self) -> f64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_lora_alpha(self.ptr()) }
    }

    /// `use_rslora`: scaling alpha / sqrt(r) instead of alpha / r.
    pub fn use_rslora(&self) -> bool {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_use_rslora(self.ptr()) != 0 }
    }

    /// `use_dora`: a DoRA adapter.
    pub fn use_dora(&self) -> bool {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_use_dora(self.ptr()) != 0 }
    }

    /// `lora_bias`: lora_B carries a bias.
    pub fn lora_bias(&self) -> bool {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_lora_bias(self.ptr()) != 0 }
    }

    /// `fan_in_fan_out` as written in the file.
    pub fn fan_in_fan_out(&self) -> bool {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_fan_in_fan_out(self.ptr()) != 0 }
    }

    /// `peft_type` ("LORA").
    pub fn peft_type(&self) -> &str {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_adapter_peft_type(self.ptr())) }.unwrap_or("")
    }

    /// `bias`: "none", "all" or "lora_only".
    pub fn bias(&self) -> &str {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_adapter_bias(self.ptr())) }.unwrap_or("")
    }

    /// `task_type`, e.g. "CAUSAL_LM"; None when null or absent.
    pub fn task_type(&self) -> Option<&str> {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_adapter_task_type(self.ptr())) }
    }

    /// `base_model_name_or_path`; None when null or absent.
    pub fn base_model_name_or_path(&self) -> Option<&str> {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_adapter_base_model_name_or_path(self.ptr())) }
    }

    /// The architecture family whose table the adapter uses; None when no table applies.
    pub fn family(&self) -> Option<&str> {
        // SAFETY: the string lives as long as self.
        unsafe { borrowed_str(sys::peft_adapter_family(self.ptr())) }
    }

    /// A translator over the adapter's table ([`ErrorCode::NotFound`] without one).
    pub fn translator(&self) -> Result<Translator> {
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(Translator::from_raw(unsafe { new_handle(|out| sys::peft_adapter_translator(self.ptr(), out))? }))
    }

    /// Notes: things worth knowing that are not errors.
    pub fn notes(&self) -> Vec<&str> {
        // SAFETY: a live handle; strings live as long as self.
        unsafe {
            (0..sys::peft_adapter_note_count(self.ptr()))
                .filter_map(|i| borrowed_str(sys::peft_adapter_note(self.ptr(), i)))
                .collect()
        }
    }

    /// What lenient loading ignored ([`AdapterOptions::set_lenient`]), one sentence each, starting
    /// with `unexpected key "<key>": ` or `missing key "<key>": `. Empty for a strict adapter.
    pub fn warnings(&self) -> Vec<&str> {
        // SAFETY: a live handle; strings live as long as self.
        unsafe {
            (0..sys::peft_adapter_warning_count(self.ptr()))
                .filter_map(|i| borrowed_str(sys::peft_adapter_warning(self.ptr(), i)))
                .collect()
        }
    }

    /// Number of modules.
    pub fn module_count(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_module_count(self.ptr()) }
    }

    /// Module `index`; None when out of range.
    pub fn module(&self, index: usize) -> Option<Module<'_>> {
        (index < self.module_count()).then_some(Module { adapter: self, index })
    }

    /// Every module, in the order of their first tensor in the file.
    pub fn modules(&self) -> impl ExactSizeIterator<Item = Module<'_>> + '_ {
        (0..self.module_count()).map(move |index| Module { adapter: self, index })
    }

    /// Finds a module by its path ("model.layers.0.self_attn.q_proj").
    pub fn find_module(&self, name: &str) -> Result<Module<'_>> {
        let c_name = c_string(name, "module name")?;
        let mut index = 0usize;
        // SAFETY: valid arguments; index is written only on success.
        unsafe { check(sys::peft_adapter_find_module(self.ptr(), c_name.as_ptr(), &mut index))? };
        Ok(Module { adapter: self, index })
    }
}

impl fmt::Debug for Adapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adapter")
            .field("peft_type", &self.peft_type())
            .field("r", &self.r())
            .field("modules", &self.module_count())
            .finish()
    }
}

/// One module of an adapter: a LoRA layer or a module with full replacement tensors.
#[derive(Clone, Copy)]
pub struct Module<'a> {
    adapter: &'a Adapter,
    index: usize,
}

impl<'a> Module<'a> {
    fn ptr(&self) -> *const sys::peft_adapter {
        self.adapter.ptr()
    }

    /// The module's index in its adapter.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its path (transformers module name, without "base_model.model.").
    pub fn name(&self) -> &'a str {
        // SAFETY: the string lives as long as the adapter.
        unsafe { borrowed_str(sys::peft_adapter_module_name(self.ptr(), self.index)) }.unwrap_or("")
    }

    /// Its layer kind.
    pub fn kind(&self) -> LayerKind {
        // SAFETY: a live handle.
        LayerKind::from_raw(unsafe { sys::peft_adapter_module_kind(self.ptr(), self.index) })
    }

    /// Rank of a LoRA module (0 for full / trainable-token modules).
    pub fn rank(&self) -> i64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_module_rank(self.ptr(), self.index) }
    }

    /// Alpha of a LoRA module (0 for full / trainable-token modules).
    pub fn alpha(&self) -> f64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_module_alpha(self.ptr(), self.index) }
    }

    /// Scaling of a LoRA module: alpha / rank, or alpha / sqrt(rank) with rsLoRA.
    pub fn scaling(&self) -> f64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_module_scaling(self.ptr(), self.index) }
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::peft_adapter_module_tensor_count(self.ptr(), self.index) }
    }

    /// Tensor `index` of the module; None when out of range.
    pub fn tensor(&self, index: usize) -> Option<ModuleTensor<'a>> {
        (index < self.tensor_count()).then_some(ModuleTensor { module: *self, index })
    }

    /// Every tensor of the module.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = ModuleTensor<'a>> {
        let module = *self;
        (0..self.tensor_count()).map(move |index| ModuleTensor { module, index })
    }

    /// The tensor with this role ("lora_A.weight", "lora_B.bias", ...).
    pub fn tensor_by_role(&self, role: &str) -> Option<ModuleTensor<'a>> {
        self.tensors().find(|t| t.role() == role)
    }

    /// Token indices of a trainable-tokens module (empty for other modules).
    pub fn token_indices(&self) -> &'a [i64] {
        let mut count = 0usize;
        // SAFETY: the array lives as long as the adapter and holds `count` values.
        unsafe { borrowed_slice(sys::peft_adapter_module_token_indices(self.ptr(), self.index, &mut count), count) }
    }
}

impl fmt::Debug for Module<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("index", &self.index)
            .field("name", &self.name())
            .field("kind", &self.kind())
            .field("rank", &self.rank())
            .field("scaling", &self.scaling())
            .finish()
    }
}

/// One tensor of an adapter module.
#[derive(Clone, Copy)]
pub struct ModuleTensor<'a> {
    module: Module<'a>,
    index: usize,
}

impl<'a> ModuleTensor<'a> {
    fn ptr(&self) -> *const sys::peft_adapter {
        self.module.ptr()
    }

    /// The tensor's index within its module.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The module it belongs to.
    pub fn module(&self) -> Module<'a> {
        self.module
    }

    /// Its role: the key's tail after the module path ("lora_A.weight", "lora_B.bias", "weight", ...).
    pub fn role(&self) -> &'a str {
        // SAFETY: the string lives as long as the adapter.
        unsafe { borrowed_str(sys::peft_adapter_module_tensor_role(self.ptr(), self.module.index, self.index)) }
            .unwrap_or("")
    }

    /// Its key as stored in adapter_model.safetensors.
    pub fn key(&self) -> &'a str {
        // SAFETY: as above.
        unsafe { borrowed_str(sys::peft_adapter_module_tensor_key(self.ptr(), self.module.index, self.index)) }
            .unwrap_or("")
    }

    /// The base model tensor it applies to or replaces.
    pub fn base_name(&self) -> &'a str {
        // SAFETY: as above.
        unsafe { borrowed_str(sys::peft_adapter_module_tensor_base_name(self.ptr(), self.module.index, self.index)) }
            .unwrap_or("")
    }

    /// Its dtype.
    pub fn dtype(&self) -> Option<DType> {
        // SAFETY: a live handle.
        DType::from_raw(unsafe { sys::peft_adapter_module_tensor_dtype(self.ptr(), self.module.index, self.index) })
    }

    /// Its shape.
    pub fn shape(&self) -> &'a [u64] {
        // SAFETY: the array lives as long as the adapter and holds ndim values.
        unsafe {
            let ndim = sys::peft_adapter_module_tensor_ndim(self.ptr(), self.module.index, self.index);
            borrowed_slice(sys::peft_adapter_module_tensor_shape(self.ptr(), self.module.index, self.index), ndim)
        }
    }

    /// The number of elements.
    pub fn num_elements(&self) -> u64 {
        self.shape().iter().product()
    }

    /// Reads the tensor into `dst`, converted to `dtype`; `dst` must hold exactly its elements.
    pub fn read_into(&self, dtype: DType, dst: &mut [u8]) -> Result<()> {
        // SAFETY: dst.len() writable bytes; the library checks the size.
        unsafe {
            check(sys::peft_adapter_module_tensor_read(
                self.ptr(),
                self.module.index,
                self.index,
                dtype.raw(),
                dst.as_mut_ptr().cast(),
                dst.len() as u64,
            ))
        }
    }

    /// Reads the tensor converted to `dtype` into a new buffer.
    pub fn read(&self, dtype: DType) -> Result<Vec<u8>> {
        let mut out = vec![0u8; buffer_size(self.key(), self.num_elements(), dtype)?];
        self.read_into(dtype, &mut out)?;
        Ok(out)
    }

    /// Reads the tensor converted to `T`'s dtype.
    pub fn read_as<T: Element>(&self) -> Result<Vec<T>> {
        require_little_endian()?;
        let count = usize::try_from(self.num_elements())
            .map_err(|_| Error::new(ErrorCode::OutOfMemory, format!("tensor {:?} is too large", self.key())))?;
        let mut out = vec![T::default(); count];
        self.read_into(T::DTYPE, as_bytes_mut(&mut out))?;
        Ok(out)
    }
}

impl fmt::Debug for ModuleTensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModuleTensor")
            .field("role", &self.role())
            .field("key", &self.key())
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .finish()
    }
}
