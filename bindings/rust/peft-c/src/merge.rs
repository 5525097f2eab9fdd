//! Merging adapters into a base model folder, streaming, with progress and cancellation; and
//! whole-model task arithmetic over fine-tuned checkpoints of one base ([`combine_models`]).

use std::ffi::c_char;
use std::fmt;
use std::ops::ControlFlow;
use std::path::Path;

use peft_c_sys as sys;

use crate::adapter::Adapter;
use crate::callback::{progress_trampoline, CallbackState};
use crate::dtype::DType;
use crate::error::{check, Result};
use crate::export::{CombineMethod, ExportOptions};
use crate::ffi::{borrowed_str, c_path, handle, new_handle};
use crate::gguf::GgmlType;

handle!(
    /// Options of a checkpoint merge: the adapters with their weights, the output dtype and layout,
    /// the number of threads.
    ///
    /// Belongs to one thread at a time (`Send`, not `Sync`).
    MergeOptions,
    sys::peft_merge_options,
    sys::peft_merge_options_free
);

// SAFETY: the header lets options move between threads; they are not shared (not Sync).
unsafe impl Send for MergeOptions {}

impl MergeOptions {
    /// The defaults: no adapters, dtypes kept, the base's shard layout, one thread per core.
    pub fn new() -> Result<MergeOptions> {
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(MergeOptions { raw: unsafe { new_handle(|out| sys::peft_merge_options_new(out))? } })
    }

    fn ptr(&mut self) -> *mut sys::peft_merge_options {
        self.raw.as_ptr()
    }

    /// Adds an opened adapter with a weight that multiplies its LoRA scaling (1.0 merges it as
    /// PEFT's merge_and_unload does). The options keep the adapter alive.
    pub fn add_adapter(&mut self, adapter: &Adapter, weight: f64) -> Result<&mut Self> {
        // SAFETY: live handles.
        unsafe { check(sys::peft_merge_options_add_adapter(self.ptr(), adapter.as_ptr(), weight))? };
        Ok(self)
    }

    /// Adds an adapter folder, opened by the merge against the base (its errors come from the merge).
    pub fn add_adapter_dir(&mut self, dir: impl AsRef<Path>, weight: f64) -> Result<&mut Self> {
        let dir = c_path(dir.as_ref())?;
        // SAFETY: a live handle and a valid string (copied).
        unsafe { check(sys::peft_merge_options_add_adapter_dir(self.ptr(), dir.as_ptr(), weight))? };
        Ok(self)
    }

    /// The output dtype: None keeps every tensor's; F32, BF16 or F16 convert the float tensors.
    pub fn set_dtype(&mut self, dtype: Option<DType>) -> Result<&mut Self> {
        let raw = dtype.map_or(sys::PEFT_DTYPE_KEEP, DType::raw);
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_dtype(self.ptr(), raw))? };
        Ok(self)
    }

    /// Reshards the output by size (bytes of tensor data per shard); 0 keeps the base's layout.
    pub fn set_max_shard_size(&mut self, max_shard_size: u64) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_max_shard_size(self.ptr(), max_shard_size))? };
        Ok(self)
    }

    /// Limits the threads (0: one per core; 1: only the calling thread). Results do not change.
    pub fn set_threads(&mut self, threads: u32) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_threads(self.ptr(), threads))? };
        Ok(self)
    }

    /// Whether the base folder must have a usable config.json (the default: true, as transformers
    /// cannot load a model folder without one; the merge then fails with `NotFound` before writing
    /// anything). With false such a base is merged and the output has no config.json.
    pub fn set_require_config(&mut self, require: bool) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_require_config(self.ptr(), i32::from(require)))? };
        Ok(self)
    }

    /// Whether merged tensors holding an infinity or a NaN are written as computed (by default, false,
    /// the merge fails with `NonFinite` naming the first such tensor, nothing written).
    pub fn set_allow_nonfinite(&mut self, allow: bool) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_allow_nonfinite(self.ptr(), i32::from(allow)))? };
        Ok(self)
    }

    /// The ggml type the merged tensors of a GGUF base are written in (F32, F16, BF16, Q8_0, Q4_K,
    /// ...; every merged tensor of two or more dimensions, one-dimensional ones keep theirs). None,
    /// the default, keeps each merged tensor's own type, a block-quantized one quantized again with
    /// ggml's reference quantizer. Refused here: a number ggml does not define (`InvalidArgument`)
    /// or a type without a quantizer (`Unsupported`). With [`set_dtype`](Self::set_dtype) also
    /// set, the merge fails with `InvalidArgument`. Ignored for a safetensors base.
    pub fn set_quant(&mut self, ggml_type: Option<GgmlType>) -> Result<&mut Self> {
        let raw = ggml_type.map_or(sys::PEFT_DTYPE_KEEP, |t| t.0);
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_quant(self.ptr(), raw))? };
        Ok(self)
    }

    /// Whether a merge into a GGUF base measures what storing each merged tensor costs
    /// ([`MergeResult::store_report_json`]); one more quantization per merged tensor. Ignored for a
    /// safetensors base.
    pub fn set_report(&mut self, report: bool) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_report(self.ptr(), i32::from(report)))? };
        Ok(self)
    }

    /// What the merge does with a base whose output embedding (`lm_head`) is tied to its input
    /// embedding (`tie_word_embeddings`) when the adapters change one side; see [`TiedEmbeddings`].
    pub fn set_tied_embeddings(&mut self, policy: TiedEmbeddings) -> Result<&mut Self> {
        let raw = match policy {
            TiedEmbeddings::Untie => sys::PEFT_MERGE_TIED_UNTIE,
            TiedEmbeddings::Shared => sys::PEFT_MERGE_TIED_SHARED,
        };
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_tied_embeddings(self.ptr(), raw))? };
        Ok(self)
    }

    /// The order of the merge's f32 arithmetic for plain LoRA modules: PEFT's (the default) or
    /// ggml's; see [`Arithmetic`].
    ///
    /// Both orders give the same bits on every CPU. The ggml order applies to plain LoRA modules
    /// (lora_B.bias keeps PEFT's arithmetic), into GGUF bases and into safetensors bases (exact against
    /// ggml for F32 weights; BF16/F16 weights are rounded after each adapter). With it, the merge
    /// refuses DoRA modules and the other PEFT methods (LoHa, LoKr, IA3, ...) with
    /// [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported) naming each module and its method,
    /// before anything is written.
    pub fn set_arithmetic(&mut self, arithmetic: Arithmetic) -> Result<&mut Self> {
        let raw = match arithmetic {
            Arithmetic::Peft => sys::PEFT_MERGE_ARITHMETIC_PEFT,
            Arithmetic::Ggml => sys::PEFT_MERGE_ARITHMETIC_GGML,
        };
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_arithmetic(self.ptr(), raw))? };
        Ok(self)
    }

    /// What a merge into a split GGUF base (`NAME-00001-of-00003.gguf`, ... as `llama-gguf-split`
    /// cuts them) writes. By default (false) the same layout: one output part per base part, named
    /// `OUT-0000K-of-0000N.gguf` after the output path (its prefix when it is itself such a name, else
    /// the path without `.gguf`), each with the same tensors, order and metadata as its base part; the
    /// parts appear together or not at all, and [`MergeResult::files`] lists them. With true the merge
    /// writes the one output file instead, as `llama-gguf-split --merge` joins parts (the first part's
    /// metadata with `split.count` set to 0, then every tensor in part order). No effect on a base of
    /// one file.
    pub fn set_join_split(&mut self, join: bool) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_merge_options_set_join_split(self.ptr(), i32::from(join)))? };
        Ok(self)
    }

    /// Makes a merge of several adapters combine their changes on the deltas, as PEFT's merge_utils
    /// does, before they go into each weight, instead of adding them one after the other:
    /// W' = round(W + combine(w_i dW_i)), each dW_i the module's own change (PEFT's
    /// `get_delta_weight`), combined in f32. `method` is [`CombineMethod::Linear`] (the default:
    /// adapters added in turn) or [`Ties`](CombineMethod::Ties),
    /// [`DareLinear`](CombineMethod::DareLinear), [`DareTies`](CombineMethod::DareTies) or
    /// [`MagnitudePrune`](CombineMethod::MagnitudePrune), with the density, majority sign and seed
    /// of `combine_options` ([`ExportOptions::set_combine_density`],
    /// [`ExportOptions::set_combine_majority_sign`], [`ExportOptions::set_combine_seed`]; its other
    /// settings are not used; copied): the weights [`combine_deltas`](crate::combine_deltas) writes
    /// for the same inputs, merged in one pass and without a rank. lora_B biases and trainable token
    /// rows are added as usual. It is `peftc merge --combine`.
    ///
    /// Fails here with `InvalidArgument` for another method, or a pruning method without a density
    /// (`None` has none). The merge then fails, before writing anything, with `Unsupported` listing the
    /// modules that have no delta to combine (DoRA, stacked expert parameters, embedding and
    /// convolution layers, IA3 and the rotations on a quantized base) or for a GGUF base, and with
    /// `InvalidArgument` with [`Arithmetic::Ggml`]. [`combine_models`] ignores this setting.
    pub fn set_combine(&mut self, method: CombineMethod, combine_options: Option<&ExportOptions>) -> Result<&mut Self> {
        let combine = combine_options.map_or(std::ptr::null(), ExportOptions::as_ptr);
        // SAFETY: a live handle and live export options or NULL (copied).
        unsafe { check(sys::peft_merge_options_set_combine(self.ptr(), method.raw(), combine))? };
        Ok(self)
    }
}

/// The order of a merge's f32 arithmetic for plain LoRA modules ([`MergeOptions::set_arithmetic`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// PEFT's order: the merge equals PEFT's `merge_and_unload()` bit for bit (the delta
    /// `scaling * B @ A` as one float chain over the rank, every adapter's delta summed, added to the
    /// weight once).
    #[default]
    Peft,
    /// llama.cpp's `llama-export-lora` as ggml's scalar reference CPU code computes it: each delta
    /// value is the rank's float products added in double in rank order and rounded to float once,
    /// multiplied by the adapter's scale `weight * alpha / rank` (in float; the weight alone when
    /// alpha is 0) and added to the weight in float, adapter after adapter. A merge into a GGUF base
    /// then equals, byte for byte, ggml's quantization of `llama-export-lora`'s F32 merge of the same
    /// (dequantized) base. SIMD builds of llama.cpp differ from both orders in the last bits.
    Ggml,
}

/// A merge's policy for tied embeddings ([`MergeOptions::set_tied_embeddings`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TiedEmbeddings {
    /// The merged model computes what the adapter's forward computes: where the two sides change
    /// differently they are untied (`lm_head.weight` written as the original embedding plus its own
    /// changes, `tie_word_embeddings` set to false, a note); changes PEFT makes to both sides alike
    /// (trainable tokens, `ensure_weight_tying`'s tied LoRA) land once in the shared tensor, which
    /// stays tied.
    #[default]
    Untie,
    /// PEFT's `merge_and_unload`: the changes of either side land in the one shared tensor, which
    /// stays tied (a `modules_to_save` copy still unties).
    Shared,
}

impl fmt::Debug for MergeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MergeOptions").finish_non_exhaustive()
    }
}

handle!(
    /// What a checkpoint merge did. Read-only (`Send + Sync`).
    MergeResult,
    sys::peft_merge_result,
    sys::peft_merge_result_free
);

// SAFETY: a result is never changed after the merge; its getters are documented thread-safe.
unsafe impl Send for MergeResult {}
// SAFETY: as above.
unsafe impl Sync for MergeResult {}

impl MergeResult {
    fn count(&self, which: i32) -> u64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_merge_result_tensor_count(self.as_ptr(), which) }
    }

    /// Tensors changed by LoRA, DoRA, lora_B.bias or token rows.
    pub fn merged(&self) -> u64 {
        self.count(sys::PEFT_MERGE_TENSORS_MERGED)
    }

    /// Tensors replaced whole by an adapter tensor.
    pub fn replaced(&self) -> u64 {
        self.count(sys::PEFT_MERGE_TENSORS_REPLACED)
    }

    /// Base tensors written unchanged (converted if the dtype changed).
    pub fn copied(&self) -> u64 {
        self.count(sys::PEFT_MERGE_TENSORS_COPIED)
    }

    /// Tensors the base file lacks (an untied output embedding).
    pub fn added(&self) -> u64 {
        self.count(sys::PEFT_MERGE_TENSORS_ADDED)
    }

    /// Tensor bytes written.
    pub fn bytes(&self) -> u64 {
        // SAFETY: a live handle.
        unsafe { sys::peft_merge_result_bytes(self.as_ptr()) }
    }

    /// Files written into the output folder, relative to it (weight files first, in order).
    pub fn files(&self) -> Vec<&str> {
        // SAFETY: a live handle; strings live as long as self.
        unsafe {
            (0..sys::peft_merge_result_file_count(self.as_ptr()))
                .filter_map(|i| borrowed_str(sys::peft_merge_result_file_name(self.as_ptr(), i)))
                .collect()
        }
    }

    /// Whether `tie_word_embeddings` was set to false in config.json.
    pub fn untied_embeddings(&self) -> bool {
        // SAFETY: a live handle.
        unsafe { sys::peft_merge_result_untied_embeddings(self.as_ptr()) != 0 }
    }

    /// The store report of a merge into a GGUF base with [`MergeOptions::set_report`]: a JSON array
    /// with one object per merged tensor, in file order, `{"tensor": "blk.0.attn_q.weight",
    /// "base_type": "Q4_K", "type": "Q4_K", "values": 4194304, "rms": ..., "max": ..., "base_rms":
    /// ..., "base_max": ...}` (`rms`, `max`: the stored merge against the exact f32 merge;
    /// `base_rms`, `base_max`: the base stored in `type` against the base). `[]` without a report.
    pub fn store_report_json(&self) -> &str {
        // SAFETY: a live handle; the string lives as long as self.
        unsafe { borrowed_str(sys::peft_merge_result_report_json(self.as_ptr())) }.unwrap_or("[]")
    }

    /// Notes: decisions worth knowing (untied embeddings, added tensors).
    pub fn notes(&self) -> Vec<&str> {
        // SAFETY: a live handle; strings live as long as self.
        unsafe {
            (0..sys::peft_merge_result_note_count(self.as_ptr()))
                .filter_map(|i| borrowed_str(sys::peft_merge_result_note(self.as_ptr(), i)))
                .collect()
        }
    }
}

impl fmt::Debug for MergeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MergeResult")
            .field("merged", &self.merged())
            .field("replaced", &self.replaced())
            .field("copied", &self.copied())
            .field("added", &self.added())
            .field("bytes", &self.bytes())
            .field("files", &self.files())
            .finish()
    }
}

fn run_merge(base_dir: &Path, out_dir: &Path, options: *const sys::peft_merge_options) -> Result<MergeResult> {
    let (base, out) = (c_path(base_dir)?, c_path(out_dir)?);
    // SAFETY: valid strings and options; the result is ours on success.
    let raw = unsafe { new_handle(|result| sys::peft_merge_checkpoint(base.as_ptr(), out.as_ptr(), options, result))? };
    Ok(MergeResult { raw })
}

/// Runs `run` with `progress` set as the callback of `options`, cleared again afterwards.
fn with_progress<F>(
    options: &mut MergeOptions,
    progress: F,
    run: impl FnOnce(*const sys::peft_merge_options) -> Result<MergeResult>,
) -> Result<MergeResult>
where
    F: FnMut(u64, u64) -> ControlFlow<()>,
{
    let mut state = CallbackState::<F>::new(progress);
    // SAFETY: the callback state outlives the merge; the callback is removed again below, before
    // the state goes away, so the options never keep a dangling pointer.
    unsafe {
        check(sys::peft_merge_options_set_progress(
            options.ptr(),
            Some(progress_trampoline::<F>),
            state.as_user_data(),
        ))?;
    }
    let result = run(options.as_ptr());
    // SAFETY: a live handle; clearing cannot fail for it.
    let cleared = unsafe { check(sys::peft_merge_options_set_progress(options.ptr(), None, std::ptr::null_mut())) };
    state.finish(); // re-raises a panic of the callback
    cleared?;
    result
}

/// Merges the adapters of `options` into the base model folder `base_dir` and writes the merged
/// model folder `out_dir` (created if needed; unchanged on failure).
pub fn merge_checkpoint(
    base_dir: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    options: &MergeOptions,
) -> Result<MergeResult> {
    run_merge(base_dir.as_ref(), out_dir.as_ref(), options.as_ptr())
}

/// [`merge_checkpoint`] with a progress callback, called on this thread with (bytes done, bytes in
/// all): first with done = 0, then at least once per tensor, last with done = total. Returning
/// `ControlFlow::Break(())` cancels the merge ([`crate::ErrorCode::Cancelled`]) and leaves `out_dir` as it
/// was; a panic in the callback does the same and is then resumed.
pub fn merge_checkpoint_with_progress<F>(
    base_dir: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    options: &mut MergeOptions,
    progress: F,
) -> Result<MergeResult>
where
    F: FnMut(u64, u64) -> ControlFlow<()>,
{
    with_progress(options, progress, |opts| run_merge(base_dir.as_ref(), out_dir.as_ref(), opts))
}

fn run_combine(
    base_dir: &Path,
    models: &[(&Path, f64)],
    method: CombineMethod,
    out_dir: &Path,
    combine_options: Option<&ExportOptions>,
    options: *const sys::peft_merge_options,
) -> Result<MergeResult> {
    let (base, out) = (c_path(base_dir)?, c_path(out_dir)?);
    let paths = models.iter().map(|(m, _)| c_path(m)).collect::<Result<Vec<_>>>()?;
    let weights: Vec<f64> = models.iter().map(|&(_, w)| w).collect();
    let ptrs: Vec<*const c_char> = paths.iter().map(|p| p.as_ptr()).collect();
    let combine = combine_options.map_or(std::ptr::null(), ExportOptions::as_ptr);
    // SAFETY: `count` valid strings and weights, options or NULL; the result is ours on success.
    let raw = unsafe {
        new_handle(|result| {
            sys::peft_model_combine(
                base.as_ptr(),
                ptrs.as_ptr(),
                weights.as_ptr(),
                ptrs.len(),
                method.raw(),
                out.as_ptr(),
                combine,
                options,
                result,
            )
        })?
    };
    Ok(MergeResult { raw })
}

/// Whole-model task arithmetic: combines checkpoint folders (or hub ids) fine-tuned from `base_dir`
/// into the model folder `out_dir`. `models` are (folder, weight) pairs, at least one; the weights
/// are finite (negative values subtract). Every floating-point tensor W of the base becomes W + combine(w_i (M_i - W)),
/// M_i the same-named tensor of model i, the differences taken in f32 and rounded once to the output
/// dtype; other tensors are copied from the base. The output has the base's files, shard names,
/// index and other files, as [`merge_checkpoint`] writes them, all at once.
///
/// `method` is [`CombineMethod::Linear`] (the weighted sum of the differences) or one of
/// [`Ties`](CombineMethod::Ties), [`DareLinear`](CombineMethod::DareLinear),
/// [`DareTies`](CombineMethod::DareTies) and [`MagnitudePrune`](CombineMethod::MagnitudePrune), which
/// prune and elect each tensor's differences as PEFT's merge_utils functions do, with the density,
/// majority sign and seed of `combine_options` ([`ExportOptions::set_combine_density`],
/// [`ExportOptions::set_combine_majority_sign`], [`ExportOptions::set_combine_seed`]; its other
/// settings are not used). `options` are [`MergeOptions`] without adapters: their dtype, maximum
/// shard size, require-config and allow-non-finite settings apply (threads and the GGUF settings do
/// not); `None` for the defaults. In the result, [`MergeResult::merged`] counts the combined tensors
/// and [`MergeResult::copied`] the others.
///
/// Errors: `InvalidArgument` for no models, a weight that is not finite, another
/// method, a pruning method without a density, options holding adapters, or an output over an input;
/// `NotFound` naming a base tensor a model lacks, or a missing folder; `ShapeMismatch`; `Unsupported`
/// (a GGUF or quantized base); `NonFinite`; `Io`. Nothing is written on failure.
pub fn combine_models<P: AsRef<Path>>(
    base_dir: impl AsRef<Path>,
    models: &[(P, f64)],
    method: CombineMethod,
    out_dir: impl AsRef<Path>,
    combine_options: Option<&ExportOptions>,
    options: Option<&MergeOptions>,
) -> Result<MergeResult> {
    let models: Vec<(&Path, f64)> = models.iter().map(|(m, w)| (m.as_ref(), *w)).collect();
    let opts = options.map_or(std::ptr::null(), MergeOptions::as_ptr);
    run_combine(base_dir.as_ref(), &models, method, out_dir.as_ref(), combine_options, opts)
}

/// [`combine_models`] with a progress callback, as [`merge_checkpoint_with_progress`] calls it
/// (returning `ControlFlow::Break(())` cancels; a panic cancels and is then resumed).
pub fn combine_models_with_progress<P: AsRef<Path>, F>(
    base_dir: impl AsRef<Path>,
    models: &[(P, f64)],
    method: CombineMethod,
    out_dir: impl AsRef<Path>,
    combine_options: Option<&ExportOptions>,
    options: &mut MergeOptions,
    progress: F,
) -> Result<MergeResult>
where
    F: FnMut(u64, u64) -> ControlFlow<()>,
{
    let models: Vec<(&Path, f64)> = models.iter().map(|(m, w)| (m.as_ref(), *w)).collect();
    with_progress(options, progress, |opts| {
        run_combine(base_dir.as_ref(), &models, method, out_dir.as_ref(), combine_options, opts)
    })
}
