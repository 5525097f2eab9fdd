//! LoRA extraction from a fine-tuned checkpoint and conversion of adapters to plain LoRA (truncated
//! SVD, as PEFT's `convert_to_lora`): [`extract_lora`], [`convert_to_lora`], [`convert_initial`], and the
//! combination of adapters in delta space, [`combine_deltas`].

use std::ffi::CString;
use std::fmt;
use std::path::Path;
use std::ptr::{self, NonNull};

use peft_c_sys as sys;

use crate::adapter::Adapter;
use crate::dtype::DType;
use crate::error::{check, Error, Result};
use crate::export::{CombineMethod, ExportOptions};
use crate::ffi::{borrowed_str, c_path, c_string, handle, new_handle};

/// How the truncated SVD is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SvdMethod {
    /// LAPACK's sgesdd of the whole matrix (the default).
    #[default]
    Exact,
    /// A randomized range finder; exact where it does not pay.
    Randomized,
}

impl SvdMethod {
    fn raw(self) -> i32 {
        match self {
            SvdMethod::Exact => sys::PEFT_SVD_EXACT,
            SvdMethod::Randomized => sys::PEFT_SVD_RANDOMIZED,
        }
    }
}

handle!(
    /// Options of [`extract_lora`], [`convert_to_lora`] and [`combine_deltas`]: the rank (fixed, or
    /// per module by an energy fraction; the first two need one of them, [`combine_deltas`] without
    /// either writes the exact sum), the SVD method, threads, the factors' dtype and the modules
    /// extracted.
    ///
    /// Belongs to one thread at a time (`Send`, not `Sync`).
    LowRankOptions,
    sys::peft_lowrank_options,
    sys::peft_lowrank_options_free
);

// SAFETY: the header lets options move between threads; they are not shared (not Sync).
unsafe impl Send for LowRankOptions {}

impl LowRankOptions {
    /// No rank chosen yet, exact SVD, one thread per hardware thread, F32 factors, default modules.
    pub fn new() -> Result<LowRankOptions> {
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(LowRankOptions { raw: unsafe { new_handle(|out| sys::peft_lowrank_options_new(out))? } })
    }

    fn ptr(&mut self) -> *mut sys::peft_lowrank_options {
        self.raw.as_ptr()
    }

    /// A fixed rank for every module (at least 1; clears an energy fraction).
    pub fn set_rank(&mut self, rank: i64) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_lowrank_options_set_rank(self.ptr(), rank))? };
        Ok(self)
    }

    /// A rank per module: the smallest k whose top-k squared singular values reach `fraction`, in
    /// (0, 1], of their sum, as PEFT's `_find_cutoff_index` (clears a fixed rank).
    pub fn set_energy(&mut self, fraction: f64) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_lowrank_options_set_energy(self.ptr(), fraction))? };
        Ok(self)
    }

    /// The SVD method.
    pub fn set_svd(&mut self, method: SvdMethod) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_lowrank_options_set_svd(self.ptr(), method.raw()))? };
        Ok(self)
    }

    /// Modules factored at once (0: one per hardware thread).
    pub fn set_threads(&mut self, threads: u32) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_lowrank_options_set_threads(self.ptr(), threads))? };
        Ok(self)
    }

    /// The factors' dtype: F32 (None means the same), BF16 or F16.
    pub fn set_dtype(&mut self, dtype: Option<DType>) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe {
            check(sys::peft_lowrank_options_set_dtype(self.ptr(), dtype.map_or(sys::PEFT_DTYPE_KEEP, DType::raw)))?
        };
        Ok(self)
    }

    /// The modules [`extract_lora`] considers, as PEFT's `target_modules` list selects them (exact
    /// names or suffixes such as "q_proj"); empty restores the default, the Linear and Conv1D layers
    /// `"all-linear"` names. Not used by [`convert_to_lora`].
    pub fn set_modules(&mut self, names: &[&str]) -> Result<&mut Self> {
        let owned = names.iter().map(|n| c_string(n, "module name")).collect::<Result<Vec<CString>>>()?;
        let pointers: Vec<*const std::os::raw::c_char> = owned.iter().map(|n| n.as_ptr()).collect();
        let ptr = if pointers.is_empty() { ptr::null() } else { pointers.as_ptr() };
        // SAFETY: a live handle and `len` valid strings (copied).
        unsafe { check(sys::peft_lowrank_options_set_modules(self.ptr(), ptr, pointers.len()))? };
        Ok(self)
    }

    /// The base model (a folder, or a hub id in the offline cache) [`convert_to_lora`] converts
    /// against; None for none, the default, which uses the base the adapter was opened with, if
    /// any. Multiplicative methods (IA3, OFT, BOFT, HRA, MiSS "bat") need one, their dW being
    /// W' - W; additive ones such as VeRA take their layer shapes from it. Not used by
    /// [`extract_lora`].
    pub fn set_base(&mut self, base: Option<&Path>) -> Result<&mut Self> {
        let base = base.map(c_path).transpose()?;
        let ptr = base.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        // SAFETY: a live handle and a valid string or NULL (copied).
        unsafe { check(sys::peft_lowrank_options_set_base(self.ptr(), ptr))? };
        Ok(self)
    }
}

impl fmt::Debug for LowRankOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LowRankOptions").finish_non_exhaustive()
    }
}

/// One module of an extraction or conversion.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LowRankModule {
    /// The module's name ("model.layers.0.self_attn.q_proj").
    pub name: String,
    /// Its rank in the written adapter.
    pub rank: i64,
    /// The relative error ||dW - B A||_F / ||dW||_F of the f32 factors (0 for a zero dW).
    pub error: f64,
}

/// Copies a report and frees it.
///
/// # Safety
/// `report` is a report the library returned, owned by the caller.
unsafe fn take_report(report: NonNull<sys::peft_lowrank_report>) -> Vec<LowRankModule> {
    let r = report.as_ptr();
    let modules = (0..sys::peft_lowrank_report_module_count(r))
        .map(|i| LowRankModule {
            name: borrowed_str(sys::peft_lowrank_report_module_name(r, i)).unwrap_or("").to_string(),
            rank: sys::peft_lowrank_report_module_rank(r, i),
            error: sys::peft_lowrank_report_module_error(r, i),
        })
        .collect();
    sys::peft_lowrank_report_free(r);
    modules
}

/// Makes a LoRA adapter from a fully fine-tuned checkpoint: dW = W_tuned - W_base per module,
/// truncated SVD (lora_B = U S, lora_A = V^T), written to `out_dir` as a PEFT adapter folder.
/// `base` and `tuned` are model folders (or hub ids in the offline cache) with the same tensor
/// names. Returns one entry per extracted module.
///
/// Errors: `InvalidArgument` (options without a rank or energy, a rank above a module's dimensions,
/// modules that select nothing, no weight that changed); `UnresolvedKey`; `ShapeMismatch`;
/// `Unsupported` for a selected module that is not Linear or Conv1D; `NonFinite`; `NotFound`, `Io`
/// and the format errors of [`Checkpoint::open`](crate::Checkpoint::open).
pub fn extract_lora(
    base: impl AsRef<Path>,
    tuned: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    options: &LowRankOptions,
) -> Result<Vec<LowRankModule>> {
    let (base, tuned, out) = (c_path(base.as_ref())?, c_path(tuned.as_ref())?, c_path(out_dir.as_ref())?);
    // SAFETY: valid strings and options; the report is ours on success.
    unsafe {
        let report = new_handle(|report| {
            sys::peft_adapter_extract(base.as_ptr(), tuned.as_ptr(), out.as_ptr(), options.as_ptr(), report)
        })?;
        Ok(take_report(report))
    }
}

/// Writes `adapter` as a plain LoRA of another rank, by truncated SVD of each module's dW, as PEFT's
/// `convert_to_lora` / `save_as_lora` do. Returns one entry per module.
///
/// Errors: `Unsupported` naming what PEFT does not convert (lora_bias, DoRA, embedding and conv
/// modules, modules_to_save, trainable tokens); `InvalidArgument` (no rank or energy, a rank above
/// a module's dimensions); `NonFinite`; `Io`.
pub fn convert_to_lora(
    adapter: &Adapter,
    out_dir: impl AsRef<Path>,
    options: &LowRankOptions,
) -> Result<Vec<LowRankModule>> {
    let out = c_path(out_dir.as_ref())?;
    // SAFETY: a live adapter, a valid string and options; the report is ours on success.
    unsafe {
        let report = new_handle(|report| {
            sys::peft_adapter_convert_to_lora(adapter.as_ptr(), out.as_ptr(), options.as_ptr(), report)
        })?;
        Ok(take_report(report))
    }
}

/// Combines adapters in delta space and writes the result to `out_dir` as a plain LoRA adapter: the
/// weighted sum of each module's true change dW_i, as [`convert_to_lora`] computes it (any mergeable
/// method; LoRA with its own scaling, rsLoRA and patterns included; with a base, W' - W of IA3, OFT,
/// BOFT and HRA). `adapters` and `weights` (finite; negative values subtract) must have the same
/// length; the inputs may mix methods and ranks. Unlike [`combine_adapters`](crate::combine_adapters),
/// whose `Linear` and pruning methods combine the LoRA factors, this adds what a merge would add.
///
/// `method` is [`CombineMethod::Linear`] (sum_i w_i dW_i) or one of [`Ties`](CombineMethod::Ties),
/// [`DareLinear`](CombineMethod::DareLinear), [`DareTies`](CombineMethod::DareTies) and
/// [`MagnitudePrune`](CombineMethod::MagnitudePrune), which prune and elect on the deltas as PEFT's
/// merge_utils functions do, with the density, majority sign and seed of `combine_options`
/// ([`ExportOptions::set_combine_density`], [`ExportOptions::set_combine_majority_sign`],
/// [`ExportOptions::set_combine_seed`]; its other settings are not used). With `options` choosing
/// neither a rank nor an energy (or `None`) the sum is written exactly: lora_A the rows w_i * s_i * A_i,
/// lora_B the columns B_i, the rank the sum of the ranks, error 0; that needs LoRA inputs and `Linear`.
/// With a rank or an energy, each module's sum is factored by truncated SVD as [`convert_to_lora`]
/// does; the SVD method, threads, dtype and base ([`LowRankOptions::set_base`]; default: the first
/// adapter's) apply too. Returns one entry per written module.
///
/// Errors: `Unsupported` naming the adapter and module (DoRA, lora_bias, modules_to_save and other
/// whole tensors, trainable tokens, embedding and conv modules, a multiplicative module without a
/// base); `InvalidArgument` for no adapters, a count mismatch, another method, a weight that is not
/// finite, a pruning method without a density, an exact combination of a non-LoRA module or with
/// pruning, or a rank above a module's dimensions; `ShapeMismatch`; `NotFound` (the base has no
/// weight for a module); `NonFinite`; `Io`.
pub fn combine_deltas(
    adapters: &[&Adapter],
    weights: &[f64],
    method: CombineMethod,
    out_dir: impl AsRef<Path>,
    combine_options: Option<&ExportOptions>,
    options: Option<&LowRankOptions>,
) -> Result<Vec<LowRankModule>> {
    if adapters.len() != weights.len() {
        return Err(Error::invalid_argument(format!("{} adapters but {} weights", adapters.len(), weights.len())));
    }
    let out = c_path(out_dir.as_ref())?;
    let handles: Vec<*const sys::peft_adapter> = adapters.iter().map(|a| a.as_ptr()).collect();
    let combine = combine_options.map_or(ptr::null(), ExportOptions::as_ptr);
    let opts = options.map_or(ptr::null(), LowRankOptions::as_ptr);
    // SAFETY: `count` live adapters and weights, a valid string, options or NULL; the report is ours
    // on success.
    unsafe {
        let report = new_handle(|report| {
            sys::peft_adapter_combine_deltas(
                handles.as_ptr(),
                weights.as_ptr(),
                handles.len(),
                method.raw(),
                out.as_ptr(),
                combine,
                opts,
                report,
            )
        })?;
        Ok(take_report(report))
    }
}

/// Turns a PiSSA / CorDA / OLoRA / LoRA-GA / LoftQ initialised adapter after training (`tuned_dir`)
/// into a LoRA on the original base, exactly as PEFT's
/// `save_pretrained(path_initial_model_for_weight_conversion=initial_dir)` does: lora_A = [A; A0],
/// lora_B = [B, -B0], the rank doubled. The options' dtype converts the factors (None: each keeps
/// its own).
///
/// Errors: `Unsupported` for a tensor other than lora_A / lora_B weights, or use_rslora with rank or
/// alpha patterns; `InvalidArgument` for adapters with different modules; `ShapeMismatch`; `Io`; the
/// errors of [`Adapter::open`].
pub fn convert_initial(
    tuned_dir: impl AsRef<Path>,
    initial_dir: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    options: Option<&ExportOptions>,
) -> Result<()> {
    let (tuned, initial, out) = (c_path(tuned_dir.as_ref())?, c_path(initial_dir.as_ref())?, c_path(out_dir.as_ref())?);
    let opts = options.map_or(ptr::null(), ExportOptions::as_ptr);
    // SAFETY: valid strings and options or NULL.
    unsafe { check(sys::peft_adapter_convert_initial(tuned.as_ptr(), initial.as_ptr(), out.as_ptr(), opts)) }
}
