// Export and combination: adapters written as PEFT's save_pretrained writes them; LoRA adapters converted to
// and from llama.cpp's GGUF LoRA files.
using System;
using System.Collections.Generic;

namespace PeftC
{
    /// <summary>Combination methods of <see cref="Export.Combine"/> (PEFT's combination_type).</summary>
    public enum CombineMethod
    {
        /// <summary>"cat": factors stacked; the weighted sum of deltas, exactly.</summary>
        Cat = 0,
        /// <summary>"linear": sqrt-weighted sums of factors; equal ranks; exact for one adapter only.</summary>
        Linear = 1,
        /// <summary>"ties": "linear" after magnitude pruning, sign election and disjoint mean of each factor (needs
        /// <see cref="ExportOptions.SetCombineDensity"/>; reads the majority sign).</summary>
        Ties = 2,
        /// <summary>"dare_linear": "linear" after random pruning with rescale of each factor (needs the density; reads
        /// the seed).</summary>
        DareLinear = 3,
        /// <summary>"dare_ties": "ties" with random pruning (with rescale) instead of magnitude (needs the density; reads
        /// the majority sign and the seed).</summary>
        DareTies = 4,
        /// <summary>"magnitude_prune": "linear" after magnitude pruning of each factor (needs the density).</summary>
        MagnitudePrune = 5,
        /// <summary>"svd": the weighted sum of the modules' deltas, factored by truncated SVD at the new rank
        /// (<see cref="ExportOptions.SetCombineSvdRank"/>, <see cref="ExportOptions.SetCombineSvdClamp"/>); the ranks may
        /// differ.</summary>
        Svd = 6,
        /// <summary>"ties_svd": "svd" of the deltas after magnitude pruning, sign election and disjoint mean (needs the
        /// density; reads the majority sign).</summary>
        TiesSvd = 7,
        /// <summary>"dare_linear_svd": "svd" of the deltas after random pruning with rescale (needs the density; reads the
        /// seed).</summary>
        DareLinearSvd = 8,
        /// <summary>"dare_ties_svd": "ties_svd" with random pruning (with rescale) instead of magnitude (needs the density;
        /// reads the majority sign and the seed).</summary>
        DareTiesSvd = 9,
        /// <summary>"magnitude_prune_svd": "svd" of the deltas after magnitude pruning (needs the density).</summary>
        MagnitudePruneSvd = 10,
    }

    /// <summary>How the TIES combinations elect each value's sign (PEFT's majority_sign_method;
    /// <see cref="ExportOptions.SetCombineMajoritySign"/>).</summary>
    public enum MajoritySign
    {
        /// <summary>"total": the sign of the sum of the pruned values (the default).</summary>
        Total = 0,
        /// <summary>"frequency": the sign of the sum of their signs.</summary>
        Frequency = 1,
    }

    /// <summary>Options of export and combination: output dtype, target PEFT version and the settings of the pruning
    /// and SVD combinations. One thread at a time.</summary>
    public sealed class ExportOptions : NativeObject
    {
        public ExportOptions() : base(Create()) { }

        private static ExportOptionsHandle Create()
        {
            ExportOptionsHandle h;
            PeftException.Check(Native.peft_export_options_new(out h));
            return h;
        }

        internal ExportOptionsHandle Handle { get { return Live<ExportOptionsHandle>(); } }

        /// <summary>Converts float tensors to F32, BF16 or F16; null keeps each tensor's dtype.</summary>
        public ExportOptions SetDType(DType? dtype)
        {
            PeftException.Check(Native.peft_export_options_set_dtype(Handle, dtype.HasValue ? (int)dtype.Value : Native.PEFT_DTYPE_KEEP));
            return this;
        }

        /// <summary>Targets an older PEFT release ("0.13", "0.14.0"); null or "" for the current one.</summary>
        public ExportOptions SetPeftVersion(string version)
        {
            PeftException.Check(Native.peft_export_options_set_peft_version(Handle, Utf8.Encode(version, "version")));
            return this;
        }

        /// <summary>Sets PEFT's density for the pruning combinations of <see cref="Export.Combine"/>: the fraction of each
        /// factor's values kept (of each module's delta for the SVD forms), from 0 to 1. <see cref="CombineMethod.Ties"/>
        /// and <see cref="CombineMethod.MagnitudePrune"/> keep each factor's int(density * size) largest magnitudes (equal
        /// magnitudes: the lower index first; torch's topk leaves that order open); <see cref="CombineMethod.DareLinear"/>
        /// and <see cref="CombineMethod.DareTies"/> keep each value with probability density (see
        /// <see cref="SetCombineSeed"/>) and divide the kept ones by it; their SVD forms (<see cref="CombineMethod.TiesSvd"/>,
        /// <see cref="CombineMethod.DareLinearSvd"/>, <see cref="CombineMethod.DareTiesSvd"/>,
        /// <see cref="CombineMethod.MagnitudePruneSvd"/>) do the same to each adapter's delta. 1 prunes nothing. Those
        /// eight methods need it (without it Combine fails with InvalidArgument); Cat, Linear, Svd and
        /// <see cref="Export.Save"/> ignore it.</summary>
        /// <exception cref="PeftException">InvalidArgument for a density outside [0, 1] or NaN (PEFT warns and prunes
        /// nothing above 1).</exception>
        public ExportOptions SetCombineDensity(double density)
        {
            PeftException.Check(Native.peft_export_options_set_combine_density(Handle, density));
            return this;
        }

        /// <summary>Sets PEFT's majority_sign_method for <see cref="CombineMethod.Ties"/> and
        /// <see cref="CombineMethod.DareTies"/> and their SVD forms: <see cref="MajoritySign.Total"/> (the default) or
        /// <see cref="MajoritySign.Frequency"/>; the other methods ignore it.</summary>
        /// <exception cref="PeftException">InvalidArgument for a value that is neither.</exception>
        public ExportOptions SetCombineMajoritySign(MajoritySign method)
        {
            PeftException.Check(Native.peft_export_options_set_combine_majority_sign(Handle, (int)method));
            return this;
        }

        /// <summary>Sets the seed of the random masks of <see cref="CombineMethod.DareLinear"/> and
        /// <see cref="CombineMethod.DareTies"/> and their SVD forms (any value; 0 by default); the other methods ignore it.
        /// The masks are a
        /// function of the seed alone, the same on every machine and thread count (PEFT draws them with torch.bernoulli
        /// from torch's global generator, which no other program reproduces); include/peft_c.h
        /// (peft_export_options_set_combine_seed) gives the function.</summary>
        public ExportOptions SetCombineSeed(ulong seed)
        {
            PeftException.Check(Native.peft_export_options_set_combine_seed(Handle, seed));
            return this;
        }

        /// <summary>Sets PEFT's svd_rank: the rank of the adapter the SVD combinations (<see cref="CombineMethod.Svd"/> and
        /// the *Svd methods) write; 0 (the default) for the largest of the adapters' ranks (each adapter's r or a larger
        /// rank_pattern value). A module whose layer allows less (min(out, in) below the rank) gets its full-rank factors
        /// padded with zeros (PEFT fails on such a module). The other methods ignore it.</summary>
        /// <exception cref="PeftException">InvalidArgument for a negative rank.</exception>
        public ExportOptions SetCombineSvdRank(long rank)
        {
            PeftException.Check(Native.peft_export_options_set_combine_svd_rank(Handle, rank));
            return this;
        }

        /// <summary>Sets PEFT's svd_clamp for the SVD combinations: after the SVD, with hi the quantile of level quantile
        /// of the new lora_B's and lora_A's values together (torch.quantile's linear interpolation, in f32), every value
        /// of both is clamped to [-hi, hi]. null (the default; also NaN) clears it: no clamp. The values depend on the
        /// sign LAPACK gives each singular vector pair; peft_c fixes it (the value of largest magnitude in each column of
        /// lora_B, the first of equal ones, is positive), so the clamp gives the same result with every LAPACK. The other
        /// methods ignore it.</summary>
        /// <exception cref="PeftException">InvalidArgument for a quantile outside [0, 1].</exception>
        public ExportOptions SetCombineSvdClamp(double? quantile)
        {
            PeftException.Check(Native.peft_export_options_set_combine_svd_clamp(Handle, quantile ?? double.NaN));
            return this;
        }

        internal static ExportOptionsHandle HandleOf(ExportOptions options)
        {
            return options == null ? PeftHandle.Null<ExportOptionsHandle>() : options.Handle;
        }
    }

    /// <summary>Writing adapters as PEFT adapter folders (adapter_model.safetensors + adapter_config.json,
    /// atomically), and as or from GGUF LoRA adapters. Only reads the adapters: may run concurrently on the same
    /// adapters.</summary>
    public static class Export
    {
        /// <summary>Writes <paramref name="adapter"/> into <paramref name="outDir"/> (created if needed).</summary>
        public static void Save(Adapter adapter, string outDir, ExportOptions options = null)
        {
            if (adapter == null) throw new ArgumentNullException("adapter");
            PeftException.Check(Native.peft_adapter_export(adapter.Handle, Utf8.Required(outDir, "outDir"), ExportOptions.HandleOf(options)));
        }

        /// <summary>Writes <paramref name="adapter"/> as a GGUF LoRA adapter that llama.cpp loads (--lora,
        /// llama-export-lora), atomically, with PEFT's exact scale for every module: the base's general.architecture,
        /// adapter.lora.alpha, and a "&lt;GGUF tensor&gt;.lora_a"/".lora_b" pair per module, named by the base's
        /// architecture table.</summary>
        /// <param name="adapter">A LoRA adapter.</param>
        /// <param name="outPath">The GGUF file to write.</param>
        /// <param name="baseModel">A Hugging Face model folder or hub id (its config.json) or a GGUF model file; null or
        /// "" for the adapter's base_model_name_or_path.</param>
        /// <param name="ggmlType">The factors' type: <see cref="Ggml.F32"/>, <see cref="Ggml.F16"/>,
        /// <see cref="Ggml.BF16"/> or <see cref="Ggml.Q8_0"/> (a factor whose rows are not a multiple of 32 values is
        /// then written F16, as llama.cpp's converter does).</param>
        /// <exception cref="PeftException">Unsupported listing the modules GGUF cannot hold (DoRA, lora_B.bias, whole
        /// tensors, trainable tokens, conv layers) or for a base architecture without GGUF names; UnresolvedKey
        /// listing the modules without a GGUF tensor; InvalidArgument for another type or no base; InvalidConfig for
        /// a base folder without a usable config.json; NonFinite; Io and the errors of Checkpoint.Open for the
        /// base.</exception>
        public static void SaveGguf(Adapter adapter, string outPath, string baseModel = null, int ggmlType = Ggml.F32)
        {
            if (adapter == null) throw new ArgumentNullException("adapter");
            PeftException.Check(Native.peft_adapter_export_gguf(adapter.Handle, Utf8.Required(outPath, "outPath"),
                                                                Utf8.Encode(baseModel, "baseModel"), ggmlType));
        }

        /// <summary><see cref="SaveGguf"/> for any LoRA adapter: what a GGUF LoRA cannot hold (DoRA, lora_B.bias, whole
        /// tensors such as modules_to_save, trainable tokens, conv layers) is merged PEFT-exactly into a copy of the base
        /// written to <paramref name="baseOut"/>, the rest is written to <paramref name="outPath"/> exactly as SaveGguf
        /// writes it, so that llama.cpp applying outPath to baseOut gives PEFT's merged model. With nothing to merge,
        /// baseOut is a copy of the base. All or nothing: a failure leaves neither output.</summary>
        /// <param name="adapter">A LoRA adapter.</param>
        /// <param name="outPath">The GGUF adapter file to write.</param>
        /// <param name="baseOut">Where the merged base goes: a GGUF file for a GGUF base, a folder (created if needed)
        /// that transformers loads for a Hugging Face base; neither the base nor outPath.</param>
        /// <param name="baseModel">As for <see cref="SaveGguf"/>; null or "" for the adapter's
        /// base_model_name_or_path.</param>
        /// <param name="ggmlType">The factors' type, as for <see cref="SaveGguf"/>.</param>
        /// <exception cref="PeftException">InvalidArgument for an empty path, baseOut equal to the base or to outPath,
        /// another type or no base; the errors of SaveGguf for the exported modules and of Merge.Checkpoint for the
        /// merged ones (UnresolvedKey, Unsupported for trainable tokens or a target whose ggml type has no quantizer (the IQ types but IQ4_NL) in a GGUF base,
        /// NonFinite, Io).</exception>
        public static void SaveGgufSplit(Adapter adapter, string outPath, string baseOut, string baseModel = null, int ggmlType = Ggml.F32)
        {
            if (adapter == null) throw new ArgumentNullException("adapter");
            PeftException.Check(Native.peft_adapter_export_gguf_split(adapter.Handle, Utf8.Required(outPath, "outPath"),
                                                                      Utf8.Encode(baseModel, "baseModel"), ggmlType,
                                                                      Utf8.Required(baseOut, "baseOut")));
        }

        /// <summary>Writes a GGUF LoRA adapter (llama.cpp's convert_lora_to_gguf.py output, or
        /// <see cref="SaveGguf"/>'s) as a PEFT LoRA adapter folder that PEFT loads and merges to the weights llama.cpp
        /// applies; factors are written F32, <paramref name="outDir"/> is created if needed, and a failure leaves it
        /// as it was.</summary>
        /// <param name="ggufPath">The GGUF adapter file.</param>
        /// <param name="outDir">The folder to write adapter_model.safetensors and adapter_config.json into.</param>
        /// <param name="baseModel">Required: a Hugging Face model folder or hub id, or a GGUF model file; it gives the
        /// head counts and becomes base_model_name_or_path.</param>
        /// <exception cref="PeftException">InvalidArgument for an empty argument, a file that is not a GGUF adapter or
        /// a base of another architecture; Unsupported for an adapter type other than LoRA, an unknown architecture or
        /// tensors that are not LoRA factors; UnresolvedKey listing the GGUF modules without a PEFT module;
        /// InvalidCheckpoint for incomplete pairs; ShapeMismatch; Io and the errors of Checkpoint.Open.</exception>
        public static void ImportGguf(string ggufPath, string outDir, string baseModel)
        {
            PeftException.Check(Native.peft_adapter_import_gguf(Utf8.Required(ggufPath, "ggufPath"), Utf8.Required(outDir, "outDir"),
                                                                Utf8.Required(baseModel, "baseModel")));
        }

        /// <summary>Combines adapters with weights into a new adapter folder as PEFT's add_weighted_adapter does.
        /// <see cref="CombineMethod.Ties"/>, <see cref="CombineMethod.DareLinear"/>, <see cref="CombineMethod.DareTies"/> and
        /// <see cref="CombineMethod.MagnitudePrune"/> are Linear with the A factors and the B factors each pruned and merged
        /// by PEFT's function of that name (peft/utils/merge_utils.py): magnitude or random pruning
        /// (<see cref="ExportOptions.SetCombineDensity"/>), then the weighted sum, or for the TIES types per value the mean
        /// of the weighted values whose sign is the majority sign of the pruned values
        /// (<see cref="ExportOptions.SetCombineMajoritySign"/>). Like Linear, they combine the factors, not the
        /// deltas. <see cref="CombineMethod.Svd"/> and its pruning forms (<see cref="CombineMethod.TiesSvd"/>,
        /// <see cref="CombineMethod.DareLinearSvd"/>, <see cref="CombineMethod.DareTiesSvd"/>,
        /// <see cref="CombineMethod.MagnitudePruneSvd"/>) combine each module's deltas instead: dW_i = s_i * B_i @ A_i in
        /// f32, pruned as above for all but Svd, summed with the weights (or elected for the TIES types), then factored by
        /// truncated SVD (LAPACK's sgesdd, as torch.linalg.svd on CPU): lora_B = U S and lora_A = V^T of the leading r
        /// components, r = <see cref="ExportOptions.SetCombineSvdRank"/> or the largest of the adapters' ranks, clamped as
        /// <see cref="ExportOptions.SetCombineSvdClamp"/> says. The ranks may differ. The result is the best rank-r
        /// approximation of the combined delta.</summary>
        /// <exception cref="PeftException">Unsupported for what PEFT cannot combine (DoRA, lora_bias, full tensors,
        /// trainable tokens, ...); InvalidArgument for no adapters, a weight that is not finite, an unknown method, a
        /// method other than Cat or the SVD types with unequal ranks or a pruning method without a density; NonFinite
        /// when a module's combined delta is not finite (SVD types); ShapeMismatch naming the module; Io.</exception>
        public static unsafe void Combine(IList<Adapter> adapters, IList<double> weights, CombineMethod method, string outDir,
                                          ExportOptions options = null)
        {
            if (adapters == null) throw new ArgumentNullException("adapters");
            if (weights == null) throw new ArgumentNullException("weights");
            if (adapters.Count != weights.Count)
                throw new ArgumentException(adapters.Count + " adapters but " + weights.Count + " weights", "weights");
            byte[] o = Utf8.Required(outDir, "outDir");
            using (var list = new AdapterArray(adapters, weights))
            {
                fixed (IntPtr* p = list.Pointers)
                {
                    PeftException.Check(Native.peft_adapter_combine(p, list.Weights, (UIntPtr)list.Count, (int)method, o,
                                                                    ExportOptions.HandleOf(options)));
                }
            }
        }
    }

    /// <summary>The adapters and weights of a combination (<see cref="Export.Combine"/>, <see cref="LowRank.CombineDeltas"/>)
    /// as the C arrays the library reads: each adapter's handle is referenced by hand until Dispose, since the handles
    /// travel inside an array the marshaller does not see.</summary>
    internal sealed class AdapterArray : IDisposable
    {
        private readonly AdapterHandle[] handles;
        private readonly bool[] added;

        /// <summary>The adapters' handles (at least one element, for fixed).</summary>
        internal readonly IntPtr[] Pointers;
        /// <summary>The weights (at least one element).</summary>
        internal readonly double[] Weights;
        internal readonly int Count;

        internal AdapterArray(IList<Adapter> adapters, IList<double> weights)
        {
            if (adapters == null) throw new ArgumentNullException("adapters");
            if (weights == null) throw new ArgumentNullException("weights");
            if (adapters.Count != weights.Count)
                throw new ArgumentException(adapters.Count + " adapters but " + weights.Count + " weights", "weights");
            Count = adapters.Count;
            handles = new AdapterHandle[Count];
            added = new bool[Count];
            Pointers = new IntPtr[Math.Max(Count, 1)];
            Weights = new double[Math.Max(Count, 1)];
            try
            {
                for (int i = 0; i < Count; i++)
                {
                    if (adapters[i] == null) throw new ArgumentNullException("adapters", "adapter " + i + " is null");
                    handles[i] = adapters[i].Handle;
                    handles[i].DangerousAddRef(ref added[i]);
                    Pointers[i] = handles[i].DangerousGetHandle();
                    Weights[i] = weights[i];
                }
            }
            catch
            {
                Dispose();
                throw;
            }
        }

        public void Dispose()
        {
            for (int i = 0; i < Count; i++)
            {
                if (added[i]) handles[i].DangerousRelease();
                added[i] = false;
            }
        }
    }
}
