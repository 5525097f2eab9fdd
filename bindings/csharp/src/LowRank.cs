// LoRA extraction from a fine-tuned checkpoint and conversion of adapters to plain LoRA (peft_c.h, group
// "Extraction and conversion to plain LoRA"; src/capi/lowrank_api.cpp): truncated SVD as PEFT's convert_to_lora; and
// the combination of adapters in delta space (peft_adapter_combine_deltas).
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>How the truncated SVD is computed.</summary>
    public enum SvdMethod
    {
        /// <summary>LAPACK's sgesdd of the whole matrix (the default).</summary>
        Exact = 0,
        /// <summary>A randomized range finder; exact where it does not pay.</summary>
        Randomized = 1,
    }

    /// <summary>Options of <see cref="LowRank.Extract"/>, <see cref="LowRank.ConvertToLora"/> and
    /// <see cref="LowRank.CombineDeltas"/>: a rank (fixed, or per module by an energy fraction; Extract and ConvertToLora
    /// need one of them, CombineDeltas without either writes the exact sum), the SVD method, threads, the factors' dtype
    /// and the modules extracted. They belong to one thread at a time.</summary>
    public sealed class LowRankOptions : NativeObject
    {
        /// <summary>No rank chosen yet, exact SVD, one thread per hardware thread, F32 factors, default modules.</summary>
        public LowRankOptions() : base(Create()) { }

        private static LowrankOptionsHandle Create()
        {
            LowrankOptionsHandle h;
            PeftException.Check(Native.peft_lowrank_options_new(out h));
            return h;
        }

        internal LowrankOptionsHandle Handle { get { return Live<LowrankOptionsHandle>(); } }

        /// <summary>A fixed rank for every module (at least 1; clears an energy fraction).</summary>
        public LowRankOptions SetRank(long rank)
        {
            PeftException.Check(Native.peft_lowrank_options_set_rank(Handle, rank));
            return this;
        }

        /// <summary>A rank per module: the smallest k whose top-k squared singular values reach
        /// <paramref name="fraction"/>, in (0, 1], of their sum, as PEFT's _find_cutoff_index (clears a fixed rank).</summary>
        public LowRankOptions SetEnergy(double fraction)
        {
            PeftException.Check(Native.peft_lowrank_options_set_energy(Handle, fraction));
            return this;
        }

        /// <summary>The SVD method.</summary>
        public LowRankOptions SetSvd(SvdMethod method)
        {
            PeftException.Check(Native.peft_lowrank_options_set_svd(Handle, (int)method));
            return this;
        }

        /// <summary>Modules factored at once; 0 for one per hardware thread.</summary>
        public LowRankOptions SetThreads(int threads)
        {
            if (threads < 0) throw new ArgumentOutOfRangeException("threads");
            PeftException.Check(Native.peft_lowrank_options_set_threads(Handle, (uint)threads));
            return this;
        }

        /// <summary>The factors' dtype: F32 (null means the same), BF16 or F16.</summary>
        public LowRankOptions SetDType(DType? dtype)
        {
            PeftException.Check(Native.peft_lowrank_options_set_dtype(Handle, dtype.HasValue ? (int)dtype.Value : Native.PEFT_DTYPE_KEEP));
            return this;
        }

        /// <summary>The modules <see cref="LowRank.Extract"/> considers, as PEFT's target_modules list selects them (exact
        /// names or suffixes such as "q_proj"); none restores the default, the Linear and Conv1D layers "all-linear"
        /// names. Not used by <see cref="LowRank.ConvertToLora"/>.</summary>
        public unsafe LowRankOptions SetModules(params string[] names)
        {
            if (names == null) throw new ArgumentNullException("names");
            var handles = new GCHandle[names.Length];
            var pointers = new IntPtr[Math.Max(names.Length, 1)];
            try
            {
                for (int i = 0; i < names.Length; i++)
                {
                    handles[i] = GCHandle.Alloc(Utf8.Required(names[i], "names"), GCHandleType.Pinned);
                    pointers[i] = handles[i].AddrOfPinnedObject();
                }
                fixed (IntPtr* p = pointers)
                    PeftException.Check(Native.peft_lowrank_options_set_modules(Handle, names.Length == 0 ? null : p, (UIntPtr)names.Length));
            }
            finally
            {
                foreach (GCHandle h in handles)
                    if (h.IsAllocated) h.Free();
            }
            return this;
        }

        /// <summary>The base model (a folder, or a hub id in the offline cache) <see cref="LowRank.ConvertToLora"/>
        /// converts against; null (the default) for none, which uses the base the adapter was opened with, if any.
        /// Multiplicative methods (IA3, OFT, BOFT, HRA, MiSS "bat") need one, their dW being W' - W; additive ones
        /// such as VeRA take their layer shapes from it. Not used by <see cref="LowRank.Extract"/>.</summary>
        public LowRankOptions SetBase(string baseDir)
        {
            PeftException.Check(Native.peft_lowrank_options_set_base(Handle, Utf8.Encode(baseDir, "baseDir")));
            return this;
        }

        internal static LowrankOptionsHandle HandleOf(LowRankOptions options)
        {
            return options == null ? PeftHandle.Null<LowrankOptionsHandle>() : options.Handle;
        }
    }

    /// <summary>One module of an extraction or conversion.</summary>
    public sealed class LowRankModule
    {
        /// <summary>The module's name ("model.layers.0.self_attn.q_proj").</summary>
        public string Name { get; internal set; }
        /// <summary>Its rank in the written adapter.</summary>
        public long Rank { get; internal set; }
        /// <summary>The relative error ||dW - B A||_F / ||dW||_F of the f32 factors (0 for a zero dW).</summary>
        public double Error { get; internal set; }

        public override string ToString() { return Name + " rank " + Rank + " error " + Error; }
    }

    /// <summary>LoRA extraction and conversion to plain LoRA; each writes a PEFT adapter folder that PEFT loads with no
    /// missing or unexpected keys.</summary>
    public static class LowRank
    {
        /// <summary>Makes a LoRA adapter from a fully fine-tuned checkpoint: dW = W_tuned - W_base per module, truncated
        /// SVD (lora_B = U S, lora_A = V^T), written to <paramref name="outDir"/>. <paramref name="baseModel"/> and
        /// <paramref name="tuned"/> are model folders (or hub ids in the offline cache) with the same tensor names.
        /// Returns one entry per extracted module.</summary>
        /// <exception cref="PeftException">InvalidArgument (no rank or energy, a rank above a module's dimensions, modules
        /// that select nothing, no weight that changed); UnresolvedKey; ShapeMismatch; Unsupported for a selected module
        /// that is not Linear or Conv1D; NonFinite; NotFound, Io and the format errors of reading a checkpoint.</exception>
        public static LowRankModule[] Extract(string baseModel, string tuned, string outDir, LowRankOptions options)
        {
            if (options == null) throw new ArgumentNullException("options");
            LowrankReportHandle report;
            PeftException.Check(Native.peft_adapter_extract(Utf8.Required(baseModel, "baseModel"), Utf8.Required(tuned, "tuned"),
                                                            Utf8.Required(outDir, "outDir"), options.Handle, out report));
            return Read(report);
        }

        /// <summary>Writes <paramref name="adapter"/> as a plain LoRA of another rank, by truncated SVD of each module's
        /// dW, as PEFT's convert_to_lora / save_as_lora. Returns one entry per module.</summary>
        /// <exception cref="PeftException">Unsupported naming what PEFT does not convert (lora_bias, DoRA, embedding and
        /// conv modules, modules_to_save, trainable tokens); InvalidArgument (no rank or energy, a rank above a module's
        /// dimensions); NonFinite; Io.</exception>
        public static LowRankModule[] ConvertToLora(Adapter adapter, string outDir, LowRankOptions options)
        {
            if (adapter == null) throw new ArgumentNullException("adapter");
            if (options == null) throw new ArgumentNullException("options");
            LowrankReportHandle report;
            PeftException.Check(Native.peft_adapter_convert_to_lora(adapter.Handle, Utf8.Required(outDir, "outDir"), options.Handle,
                                                                    out report));
            return Read(report);
        }

        /// <summary>Combines adapters in delta space and writes the result to <paramref name="outDir"/> as a plain LoRA
        /// adapter: the weighted sum of each module's true change dW_i, as <see cref="ConvertToLora"/> computes it (any
        /// mergeable method; LoRA with its own scaling, rsLoRA and patterns included; with a base, W' - W of IA3, OFT, BOFT
        /// and HRA). One finite weight per adapter (negative weights subtract); the inputs may mix methods and ranks.
        /// Unlike <see cref="Export.Combine"/>, whose Linear and pruning methods combine the LoRA factors, this adds what a
        /// merge would add.
        /// <para><paramref name="method"/> is <see cref="CombineMethod.Linear"/> (sum_i w_i dW_i) or one of
        /// <see cref="CombineMethod.Ties"/>, <see cref="CombineMethod.DareLinear"/>, <see cref="CombineMethod.DareTies"/> and
        /// <see cref="CombineMethod.MagnitudePrune"/>, which prune and elect on the deltas as PEFT's merge_utils functions
        /// do, with the density, majority sign and seed of <paramref name="combineOptions"/>
        /// (<see cref="ExportOptions.SetCombineDensity"/>, <see cref="ExportOptions.SetCombineMajoritySign"/>,
        /// <see cref="ExportOptions.SetCombineSeed"/>; its other settings are not used).</para>
        /// <para>With <paramref name="options"/> choosing neither a rank nor an energy (or null) the sum is written exactly:
        /// lora_A the rows w_i * s_i * A_i, lora_B the columns B_i, the rank the sum of the ranks, error 0; that needs LoRA
        /// inputs and Linear. With a rank or an energy, each module's sum is factored by truncated SVD as
        /// <see cref="ConvertToLora"/> does; the SVD method, threads, dtype and base (<see cref="LowRankOptions.SetBase"/>;
        /// default: the first adapter's) apply too. Returns one entry per written module.</para></summary>
        /// <exception cref="PeftException">Unsupported naming the adapter and module (DoRA, lora_bias, modules_to_save and
        /// other whole tensors, trainable tokens, embedding and conv modules, a multiplicative module without a base);
        /// InvalidArgument for no adapters, another method, a weight that is not finite, a pruning method without a
        /// density, an exact combination of a non-LoRA module or with pruning, or a rank above a module's dimensions;
        /// ShapeMismatch; NotFound (the base has no weight for a module); NonFinite; Io.</exception>
        /// <exception cref="ArgumentException">A count mismatch between <paramref name="adapters"/> and
        /// <paramref name="weights"/>.</exception>
        public static unsafe LowRankModule[] CombineDeltas(IList<Adapter> adapters, IList<double> weights, CombineMethod method,
                                                           string outDir, ExportOptions combineOptions = null,
                                                           LowRankOptions options = null)
        {
            byte[] o = Utf8.Required(outDir, "outDir");
            LowrankReportHandle report;
            using (var list = new AdapterArray(adapters, weights))
            {
                fixed (IntPtr* p = list.Pointers)
                {
                    PeftException.Check(Native.peft_adapter_combine_deltas(p, list.Weights, (UIntPtr)list.Count, (int)method, o,
                                                                           ExportOptions.HandleOf(combineOptions),
                                                                           LowRankOptions.HandleOf(options), out report));
                }
            }
            return Read(report);
        }

        /// <summary>Turns a PiSSA / CorDA / OLoRA / LoRA-GA / LoftQ initialised adapter after training
        /// (<paramref name="tunedDir"/>) into a LoRA on the original base, exactly as PEFT's
        /// save_pretrained(path_initial_model_for_weight_conversion=<paramref name="initialDir"/>): lora_A = [A; A0],
        /// lora_B = [B, -B0], the rank doubled. The options' dtype converts the factors (null: each keeps its own).</summary>
        /// <exception cref="PeftException">Unsupported for a tensor other than lora_A / lora_B weights, or use_rslora with
        /// rank or alpha patterns; InvalidArgument for adapters with different modules; ShapeMismatch; Io; the errors of
        /// <see cref="Adapter.Open"/>.</exception>
        public static void ConvertInitial(string tunedDir, string initialDir, string outDir, ExportOptions options = null)
        {
            PeftException.Check(Native.peft_adapter_convert_initial(Utf8.Required(tunedDir, "tunedDir"), Utf8.Required(initialDir, "initialDir"),
                                                                    Utf8.Required(outDir, "outDir"), ExportOptions.HandleOf(options)));
        }

        private static LowRankModule[] Read(LowrankReportHandle report)
        {
            using (report)
            {
                var modules = new LowRankModule[Checkpoint.ToInt(Native.peft_lowrank_report_module_count(report))];
                for (int i = 0; i < modules.Length; i++)
                {
                    modules[i] = new LowRankModule
                    {
                        Name = Utf8.Decode(Native.peft_lowrank_report_module_name(report, (UIntPtr)i)),
                        Rank = Native.peft_lowrank_report_module_rank(report, (UIntPtr)i),
                        Error = Native.peft_lowrank_report_module_error(report, (UIntPtr)i),
                    };
                }
                return modules;
            }
        }
    }
}
