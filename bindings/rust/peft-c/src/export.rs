//! Exporting adapters as PEFT adapter folders, combining adapters (add_weighted_adapter), and
//! converting LoRA adapters to and from llama.cpp's GGUF LoRA files.

use std::fmt;
use std::path::Path;

use peft_c_sys as sys;

use crate::adapter::Adapter;
use crate::dtype::DType;
use crate::error::{check, Error, Result};
use crate::ffi::{c_path, c_string, handle, new_handle};
use crate::gguf::GgmlType;

handle!(
    /// Options of [`Adapter::export`] and [`combine_adapters`]: the tensors' dtype and the PEFT
    /// release the config targets.
    ///
    /// Belongs to one thread at a time (`Send`, not `Sync`).
    ExportOptions,
    sys::peft_export_options,
    sys::peft_export_options_free
);

// SAFETY: the header lets options move between threads; they are not shared (not Sync).
unsafe impl Send for ExportOptions {}

impl ExportOptions {
    /// The defaults: tensors keep their dtypes, the config keeps every field.
    pub fn new() -> Result<ExportOptions> {
        // SAFETY: the constructor stores an owned handle or fails.
        Ok(ExportOptions { raw: unsafe { new_handle(|out| sys::peft_export_options_new(out))? } })
    }

    /// Converts the float tensors to F32, BF16 or F16 (None keeps each tensor's dtype).
    pub fn set_dtype(&mut self, dtype: Option<DType>) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_export_options_set_dtype(self.raw.as_ptr(), dtype.map_or(-1, DType::raw)))? };
        Ok(self)
    }

    /// Targets an older PEFT release ("0.13", "0.17.1"); None for the current one.
    pub fn set_peft_version(&mut self, version: Option<&str>) -> Result<&mut Self> {
        let version = version.map(|v| c_string(v, "PEFT version")).transpose()?;
        let ptr = version.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        // SAFETY: a live handle and a valid string or NULL.
        unsafe { check(sys::peft_export_options_set_peft_version(self.raw.as_ptr(), ptr))? };
        Ok(self)
    }

    /// Sets PEFT's `density` for the pruning combinations of [`combine_adapters`]: the fraction of
    /// each factor's values kept (of each module's delta for the SVD forms), from 0 to 1.
    ///
    /// [`CombineMethod::Ties`] and [`CombineMethod::MagnitudePrune`] keep each factor's
    /// int(density * size) largest magnitudes (equal magnitudes: the lower index first; torch's topk
    /// leaves that order open); [`CombineMethod::DareLinear`] and [`CombineMethod::DareTies`] keep
    /// each value with probability `density` (see [`set_combine_seed`](ExportOptions::set_combine_seed))
    /// and divide the kept ones by it; their SVD forms ([`CombineMethod::TiesSvd`],
    /// [`CombineMethod::DareLinearSvd`], [`CombineMethod::DareTiesSvd`],
    /// [`CombineMethod::MagnitudePruneSvd`]) do the same to each adapter's delta. 1 prunes nothing.
    /// Those eight methods need it (without it the combination fails with `InvalidArgument`); `Cat`,
    /// `Linear`, `Svd` and [`Adapter::export`] ignore it.
    ///
    /// Errors: [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a density
    /// outside [0, 1] or NaN (PEFT warns and prunes nothing above 1).
    pub fn set_combine_density(&mut self, density: f64) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_export_options_set_combine_density(self.raw.as_ptr(), density))? };
        Ok(self)
    }

    /// Sets PEFT's `majority_sign_method` for [`CombineMethod::Ties`] and
    /// [`CombineMethod::DareTies`] and their SVD forms ([`MajoritySign::Total`] by default); the other
    /// methods ignore it.
    pub fn set_combine_majority_sign(&mut self, method: MajoritySign) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_export_options_set_combine_majority_sign(self.raw.as_ptr(), method.raw()))? };
        Ok(self)
    }

    /// Sets the seed of the random masks of [`CombineMethod::DareLinear`] and
    /// [`CombineMethod::DareTies`] and their SVD forms (any value; 0 by default); the other methods
    /// ignore it.
    ///
    /// The masks are a function of the seed alone, the same on every machine and thread count (PEFT
    /// draws them with torch.bernoulli from torch's global generator, which no other program
    /// reproduces); include/peft_c.h (`peft_export_options_set_combine_seed`) gives the function.
    pub fn set_combine_seed(&mut self, seed: u64) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_export_options_set_combine_seed(self.raw.as_ptr(), seed))? };
        Ok(self)
    }

    /// Sets PEFT's `svd_rank`: the rank of the adapter the SVD combinations ([`CombineMethod::Svd`]
    /// and the `*Svd` methods) write; 0 (the default) for the largest of the adapters' ranks (each
    /// adapter's `r` or a larger `rank_pattern` value).
    ///
    /// A module whose layer allows less (min(out, in) below the rank) gets its full-rank factors
    /// padded with zeros (PEFT fails on such a module). The other methods ignore it.
    ///
    /// Errors: [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a negative rank.
    pub fn set_combine_svd_rank(&mut self, rank: i64) -> Result<&mut Self> {
        // SAFETY: a live handle.
        unsafe { check(sys::peft_export_options_set_combine_svd_rank(self.raw.as_ptr(), rank))? };
        Ok(self)
    }

    /// Sets PEFT's `svd_clamp` for the SVD combinations: after the SVD, with hi the quantile of level
    /// `quantile` of the new lora_B's and lora_A's values together (torch.quantile's linear
    /// interpolation, in f32), every value of both is clamped to [-hi, hi]. `None` (the default; also
    /// NaN) clears it: no clamp. The other methods ignore it.
    ///
    /// The values depend on the sign LAPACK gives each singular vector pair; peft_c fixes it (the
    /// value of largest magnitude in each column of lora_B, the first of equal ones, is positive), so
    /// the clamp gives the same result with every LAPACK.
    ///
    /// Errors: [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for a quantile
    /// outside [0, 1].
    pub fn set_combine_svd_clamp(&mut self, quantile: Option<f64>) -> Result<&mut Self> {
        let quantile = quantile.unwrap_or(f64::NAN);
        // SAFETY: a live handle.
        unsafe { check(sys::peft_export_options_set_combine_svd_clamp(self.raw.as_ptr(), quantile))? };
        Ok(self)
    }
}

impl fmt::Debug for ExportOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportOptions").finish_non_exhaustive()
    }
}

impl Adapter {
    /// Writes the adapter as a PEFT adapter folder (`adapter_model.safetensors` and
    /// `adapter_config.json` as `save_pretrained` writes them), atomically. `out_dir` is created if
    /// needed and may be the adapter's own folder.
    pub fn export(&self, out_dir: impl AsRef<Path>, options: Option<&ExportOptions>) -> Result<()> {
        let out = c_path(out_dir.as_ref())?;
        let opts = options.map_or(std::ptr::null(), ExportOptions::as_ptr);
        // SAFETY: live handles, a valid string.
        unsafe { check(sys::peft_adapter_export(self.as_ptr(), out.as_ptr(), opts)) }
    }

    /// Writes the adapter as a GGUF LoRA adapter that llama.cpp loads (`--lora`,
    /// `llama-export-lora`), atomically, with PEFT's exact scale for every module: the base's
    /// `general.architecture`, `adapter.lora.alpha`, and a `<GGUF tensor>.lora_a`/`.lora_b` pair per
    /// module, named by the base's architecture table.
    ///
    /// `base` is a Hugging Face model folder or hub id (its config.json) or a GGUF model file; None
    /// uses the adapter's `base_model_name_or_path`. `ggml_type` is the factors' type:
    /// [`GgmlType::F32`], [`F16`](GgmlType::F16), [`BF16`](GgmlType::BF16) or
    /// [`Q8_0`](GgmlType::Q8_0) (a factor whose rows are not a multiple of 32 values is then written
    /// F16, as llama.cpp's converter does).
    ///
    /// Errors: [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported) listing the modules GGUF
    /// cannot hold (DoRA, lora_B.bias, whole tensors, trainable tokens, conv layers) or for a base
    /// architecture without GGUF names; `UnresolvedKey` listing the modules without a GGUF tensor;
    /// `InvalidArgument` for another type or no base; `InvalidConfig` for a base folder without a
    /// usable config.json; `NonFinite`; `Io` and the errors of [`Checkpoint::open`](crate::Checkpoint::open)
    /// for the base.
    pub fn export_gguf(&self, out_path: impl AsRef<Path>, base: Option<&Path>, ggml_type: GgmlType) -> Result<()> {
        let out = c_path(out_path.as_ref())?;
        let base = base.map(c_path).transpose()?;
        let base_ptr = base.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
        // SAFETY: a live handle, valid strings (the base may be NULL).
        unsafe { check(sys::peft_adapter_export_gguf(self.as_ptr(), out.as_ptr(), base_ptr, ggml_type.0)) }
    }

    /// [`export_gguf`](Adapter::export_gguf) for any LoRA adapter: what a GGUF LoRA cannot hold
    /// (DoRA, lora_B.bias, whole tensors such as modules_to_save, trainable tokens, conv layers) is
    /// merged PEFT-exactly into a copy of the base written to `base_out`, the rest is written to
    /// `out_path` exactly as `export_gguf` writes it, so that llama.cpp applying `out_path` to
    /// `base_out` gives PEFT's merged model.
    ///
    /// `base_out` is a GGUF file for a GGUF base, a folder (created if needed) that transformers
    /// loads for a Hugging Face base; it must be neither the base nor `out_path`. With nothing to
    /// merge it is a copy of the base. `base` and `ggml_type` are as for `export_gguf`. All or
    /// nothing: a failure leaves neither output.
    ///
    /// Errors: [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an empty path,
    /// `base_out` equal to the base or to `out_path`, another type or no base; the errors of
    /// `export_gguf` for the exported modules and of the checkpoint merge for the merged ones
    /// (`UnresolvedKey`, `Unsupported` for trainable tokens or a target whose ggml type has no quantizer (the IQ types but IQ4_NL) in a GGUF
    /// base, `NonFinite`, `Io`).
    pub fn export_gguf_split(
        &self,
        out_path: impl AsRef<Path>,
        base: Option<&Path>,
        ggml_type: GgmlType,
        base_out: impl AsRef<Path>,
    ) -> Result<()> {
        let out = c_path(out_path.as_ref())?;
        let base = base.map(c_path).transpose()?;
        let base_ptr = base.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
        let base_out = c_path(base_out.as_ref())?;
        // SAFETY: a live handle, valid strings (the base may be NULL).
        unsafe {
            check(sys::peft_adapter_export_gguf_split(
                self.as_ptr(),
                out.as_ptr(),
                base_ptr,
                ggml_type.0,
                base_out.as_ptr(),
            ))
        }
    }
}

/// Writes a GGUF LoRA adapter (llama.cpp's `convert_lora_to_gguf.py` output, or
/// [`Adapter::export_gguf`]'s) as a PEFT LoRA adapter folder that PEFT loads and merges to the weights
/// llama.cpp applies; factors are written F32, `out_dir` is created if needed, and a failure leaves
/// it as it was.
///
/// `base` is required: a Hugging Face model folder or hub id, or a GGUF model file; it gives the head
/// counts and becomes `base_model_name_or_path`.
///
/// Errors: [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an empty argument, a
/// file that is not a GGUF adapter or a base of another architecture; `Unsupported` for an adapter
/// type other than LoRA, an unknown architecture or tensors that are not LoRA factors;
/// `UnresolvedKey` listing the GGUF modules without a PEFT module; `InvalidCheckpoint` for incomplete
/// pairs; `ShapeMismatch`; `Io` and the errors of [`Checkpoint::open`](crate::Checkpoint::open).
pub fn import_adapter_gguf(
    gguf_path: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    base: impl AsRef<Path>,
) -> Result<()> {
    let path = c_path(gguf_path.as_ref())?;
    let out = c_path(out_dir.as_ref())?;
    let base = c_path(base.as_ref())?;
    // SAFETY: valid strings.
    unsafe { check(sys::peft_adapter_import_gguf(path.as_ptr(), out.as_ptr(), base.as_ptr())) }
}

/// How [`combine_adapters`] combines (PEFT's `combination_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CombineMethod {
    /// "cat": factors stacked; the rank is the sum of ranks; exactly the weighted sum of deltas.
    Cat,
    /// "linear": sqrt-weighted sums of factors; equal ranks; exact for one adapter only.
    Linear,
    /// "ties": "linear" after magnitude pruning, sign election and disjoint mean of each factor
    /// (needs [`ExportOptions::set_combine_density`]; reads the majority sign).
    Ties,
    /// "dare_linear": "linear" after random pruning with rescale of each factor (needs the density;
    /// reads the seed).
    DareLinear,
    /// "dare_ties": "ties" with random pruning (with rescale) instead of magnitude (needs the density;
    /// reads the majority sign and the seed).
    DareTies,
    /// "magnitude_prune": "linear" after magnitude pruning of each factor (needs the density).
    MagnitudePrune,
    /// "svd": the weighted sum of the modules' deltas, factored by truncated SVD at the new rank
    /// ([`ExportOptions::set_combine_svd_rank`], [`ExportOptions::set_combine_svd_clamp`]); the ranks
    /// may differ.
    Svd,
    /// "ties_svd": "svd" of the deltas after magnitude pruning, sign election and disjoint mean (needs
    /// the density; reads the majority sign).
    TiesSvd,
    /// "dare_linear_svd": "svd" of the deltas after random pruning with rescale (needs the density;
    /// reads the seed).
    DareLinearSvd,
    /// "dare_ties_svd": "ties_svd" with random pruning (with rescale) instead of magnitude (needs the
    /// density; reads the majority sign and the seed).
    DareTiesSvd,
    /// "magnitude_prune_svd": "svd" of the deltas after magnitude pruning (needs the density).
    MagnitudePruneSvd,
}

impl CombineMethod {
    /// The `PEFT_COMBINE_*` value.
    pub fn raw(self) -> i32 {
        match self {
            CombineMethod::Cat => sys::PEFT_COMBINE_CAT,
            CombineMethod::Linear => sys::PEFT_COMBINE_LINEAR,
            CombineMethod::Ties => sys::PEFT_COMBINE_TIES,
            CombineMethod::DareLinear => sys::PEFT_COMBINE_DARE_LINEAR,
            CombineMethod::DareTies => sys::PEFT_COMBINE_DARE_TIES,
            CombineMethod::MagnitudePrune => sys::PEFT_COMBINE_MAGNITUDE_PRUNE,
            CombineMethod::Svd => sys::PEFT_COMBINE_SVD,
            CombineMethod::TiesSvd => sys::PEFT_COMBINE_TIES_SVD,
            CombineMethod::DareLinearSvd => sys::PEFT_COMBINE_DARE_LINEAR_SVD,
            CombineMethod::DareTiesSvd => sys::PEFT_COMBINE_DARE_TIES_SVD,
            CombineMethod::MagnitudePruneSvd => sys::PEFT_COMBINE_MAGNITUDE_PRUNE_SVD,
        }
    }
}

/// How the TIES combinations elect each value's sign (PEFT's `majority_sign_method`;
/// [`ExportOptions::set_combine_majority_sign`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum MajoritySign {
    /// "total": the sign of the sum of the pruned values.
    #[default]
    Total,
    /// "frequency": the sign of the sum of their signs.
    Frequency,
}

impl MajoritySign {
    /// The `PEFT_MAJORITY_SIGN_*` value.
    pub fn raw(self) -> i32 {
        match self {
            MajoritySign::Total => sys::PEFT_MAJORITY_SIGN_TOTAL,
            MajoritySign::Frequency => sys::PEFT_MAJORITY_SIGN_FREQUENCY,
        }
    }
}

/// Combines adapters with weights into a new adapter folder as PEFT's `add_weighted_adapter` does.
/// `adapters` and `weights` must have the same length.
///
/// [`CombineMethod::Ties`], [`DareLinear`](CombineMethod::DareLinear),
/// [`DareTies`](CombineMethod::DareTies) and [`MagnitudePrune`](CombineMethod::MagnitudePrune) are
/// `Linear` with the A factors and the B factors each pruned and merged by PEFT's function of that
/// name (peft/utils/merge_utils.py): magnitude or random pruning
/// ([`ExportOptions::set_combine_density`]), then the weighted sum, or for the TIES types per value
/// the mean of the weighted values whose sign is the majority sign of the pruned values
/// ([`ExportOptions::set_combine_majority_sign`]). Like `Linear`, they combine the factors, not the
/// deltas.
///
/// [`CombineMethod::Svd`] and its pruning forms ([`TiesSvd`](CombineMethod::TiesSvd),
/// [`DareLinearSvd`](CombineMethod::DareLinearSvd), [`DareTiesSvd`](CombineMethod::DareTiesSvd),
/// [`MagnitudePruneSvd`](CombineMethod::MagnitudePruneSvd)) combine each module's deltas instead:
/// dW_i = s_i * B_i @ A_i in f32, pruned as above for all but `Svd`, summed with the weights (or
/// elected for the TIES types), then factored by truncated SVD (LAPACK's sgesdd, as
/// torch.linalg.svd on CPU): lora_B = U S and lora_A = V^T of the leading r components, r =
/// [`ExportOptions::set_combine_svd_rank`] or the largest of the adapters' ranks, clamped as
/// [`ExportOptions::set_combine_svd_clamp`] says. The ranks may differ. The result is the best
/// rank-r approximation of the combined delta.
///
/// Errors: [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported) for what PEFT cannot combine
/// (DoRA, lora_bias, full tensors, trainable tokens, ...); `InvalidArgument` for no adapters, a count
/// mismatch, a weight that is not finite, a method other than `Cat` or the SVD types with unequal
/// ranks or a pruning method without a density; `NonFinite` when a module's combined delta is not
/// finite (SVD types); `ShapeMismatch` naming the module; `Io`.
pub fn combine_adapters(
    adapters: &[&Adapter],
    weights: &[f64],
    method: CombineMethod,
    out_dir: impl AsRef<Path>,
    options: Option<&ExportOptions>,
) -> Result<()> {
    if adapters.len() != weights.len() {
        return Err(Error::invalid_argument(format!("{} adapters but {} weights", adapters.len(), weights.len())));
    }
    let out = c_path(out_dir.as_ref())?;
    let handles: Vec<*const sys::peft_adapter> = adapters.iter().map(|a| a.as_ptr()).collect();
    let opts = options.map_or(std::ptr::null(), ExportOptions::as_ptr);
    // SAFETY: `count` live adapters and weights; a valid string.
    unsafe {
        check(sys::peft_adapter_combine(
            handles.as_ptr(),
            weights.as_ptr(),
            handles.len(),
            method.raw(),
            out.as_ptr(),
            opts,
        ))
    }
}
