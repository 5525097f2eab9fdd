// Checkpoint merge: adapters merged into a base model folder, streamed into a new folder; and whole-model task
// arithmetic over fine-tuned checkpoints of one base (peft_model_combine).
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Threading;

namespace PeftC
{
    /// <summary>Progress of a merge: bytes done and in all. Return false to cancel the merge.</summary>
    public delegate bool MergeProgress(long done, long total);

    /// <summary>Options of <see cref="Merge.Checkpoint"/>: the adapters with their weights, the output dtype,
    /// sharding and threads. They belong to one thread at a time; they may be reused for several merges.</summary>
    public sealed class MergeOptions : NativeObject
    {
        public MergeOptions() : base(Create()) { }

        private static MergeOptionsHandle Create()
        {
            MergeOptionsHandle h;
            PeftException.Check(Native.peft_merge_options_new(out h));
            return h;
        }

        internal MergeOptionsHandle Handle { get { return Live<MergeOptionsHandle>(); } }

        /// <summary>Adds an opened adapter (the options keep it alive; it may be disposed at once). Its LoRA scaling
        /// is multiplied by <paramref name="weight"/>; 1 merges as PEFT's merge_and_unload().</summary>
        public MergeOptions AddAdapter(Adapter adapter, double weight = 1.0)
        {
            if (adapter == null) throw new ArgumentNullException("adapter");
            PeftException.Check(Native.peft_merge_options_add_adapter(Handle, adapter.Handle, weight));
            return this;
        }

        /// <summary>Adds an adapter folder, opened against the base by the merge.</summary>
        public MergeOptions AddAdapterDir(string dir, double weight = 1.0)
        {
            PeftException.Check(Native.peft_merge_options_add_adapter_dir(Handle, Utf8.Required(dir, "dir"), weight));
            return this;
        }

        /// <summary>The output dtype: F32, BF16 or F16; null keeps every tensor's dtype (the default).</summary>
        public MergeOptions SetDType(DType? dtype)
        {
            PeftException.Check(Native.peft_merge_options_set_dtype(Handle, dtype.HasValue ? (int)dtype.Value : Native.PEFT_DTYPE_KEEP));
            return this;
        }

        /// <summary>Reshards by size (bytes of tensor data per shard); 0 keeps the base's layout.</summary>
        public MergeOptions SetMaxShardSize(long maxShardSize)
        {
            if (maxShardSize < 0) throw new ArgumentOutOfRangeException("maxShardSize");
            PeftException.Check(Native.peft_merge_options_set_max_shard_size(Handle, (ulong)maxShardSize));
            return this;
        }

        /// <summary>Threads to use; 0 for one per core. Results do not depend on it.</summary>
        public MergeOptions SetThreads(int threads)
        {
            if (threads < 0) throw new ArgumentOutOfRangeException("threads");
            PeftException.Check(Native.peft_merge_options_set_threads(Handle, (uint)threads));
            return this;
        }

        /// <summary>Whether the base folder must have a usable config.json (the default: true, as transformers cannot
        /// load a model folder without one). With false a base without it is merged and the output has none.</summary>
        public MergeOptions SetRequireConfig(bool require)
        {
            PeftException.Check(Native.peft_merge_options_set_require_config(Handle, require ? 1 : 0));
            return this;
        }

        /// <summary>Whether merged tensors holding an infinity or a NaN are written (by default, false, the merge
        /// fails with <see cref="ErrorCode.NonFinite"/> and writes nothing).</summary>
        public MergeOptions SetAllowNonFinite(bool allow)
        {
            PeftException.Check(Native.peft_merge_options_set_allow_nonfinite(Handle, allow ? 1 : 0));
            return this;
        }

        /// <summary>The ggml type the merged tensors of a GGUF base are written in (every merged tensor of two or more
        /// dimensions; one-dimensional ones keep theirs): F32, F16, BF16, Q8_0, Q4_K, ... (see
        /// <see cref="Ggml.ParseType"/>); null, the default, keeps each merged tensor's type, a block-quantized one
        /// quantized again with ggml's reference quantizer. Ignored for a safetensors base.</summary>
        /// <exception cref="PeftException">InvalidArgument for a number ggml does not define; Unsupported for a type without
        /// a quantizer here (the IQ types but IQ4_NL). With <see cref="SetDType"/> also set, the merge fails with
        /// InvalidArgument.</exception>
        public MergeOptions SetQuant(int? ggmlType)
        {
            PeftException.Check(Native.peft_merge_options_set_quant(Handle, ggmlType.HasValue ? ggmlType.Value : Native.PEFT_DTYPE_KEEP));
            return this;
        }

        /// <summary>Whether a merge into a GGUF base measures what storing each merged tensor costs
        /// (<see cref="MergeResult.StoreReport"/>); one more quantization per merged tensor. Ignored for a safetensors base.</summary>
        public MergeOptions SetReport(bool report)
        {
            PeftException.Check(Native.peft_merge_options_set_report(Handle, report ? 1 : 0));
            return this;
        }

        /// <summary>What the merge does with a base whose output embedding (lm_head) is tied to its input embedding
        /// (tie_word_embeddings) when the adapters change one side: <see cref="TiedEmbeddings.Untie"/> (the default) or
        /// <see cref="TiedEmbeddings.Shared"/>.</summary>
        /// <exception cref="PeftException">InvalidArgument for a value that is neither.</exception>
        public MergeOptions SetTiedEmbeddings(TiedEmbeddings policy)
        {
            PeftException.Check(Native.peft_merge_options_set_tied_embeddings(Handle, (int)policy));
            return this;
        }

        /// <summary>The order of the merge's f32 arithmetic for plain LoRA modules: <see cref="Arithmetic.Peft"/> (the
        /// default) or <see cref="Arithmetic.Ggml"/>. Both orders give the same bits on every CPU. The ggml order applies to
        /// plain LoRA modules (lora_B.bias keeps PEFT's arithmetic), into GGUF bases and into safetensors bases (exact
        /// against ggml for F32 weights; BF16/F16 weights are rounded after each adapter); with it, the merge refuses DoRA
        /// modules and the other PEFT methods (LoHa, LoKr, IA3, ...) with Unsupported naming each module and its method,
        /// before anything is written.</summary>
        /// <exception cref="PeftException">InvalidArgument for a value that is neither.</exception>
        public MergeOptions SetArithmetic(Arithmetic arithmetic)
        {
            PeftException.Check(Native.peft_merge_options_set_arithmetic(Handle, (int)arithmetic));
            return this;
        }

        /// <summary>What a merge into a split GGUF base (NAME-00001-of-00003.gguf, ... as llama-gguf-split cuts them)
        /// writes. By default (false) the same layout: one output part per base part, named OUT-0000K-of-0000N.gguf after
        /// the output path (its prefix when it is itself such a name, else the path without .gguf), each with the same
        /// tensors, order and metadata as its base part; the parts appear together or not at all, and
        /// <see cref="MergeResult.Files"/> lists them. With true the merge writes the one output file instead, as
        /// llama-gguf-split --merge joins parts (the first part's metadata with split.count set to 0, then every tensor
        /// in part order). No effect on a base of one file.</summary>
        public MergeOptions SetJoinSplit(bool join)
        {
            PeftException.Check(Native.peft_merge_options_set_join_split(Handle, join ? 1 : 0));
            return this;
        }

        /// <summary>Makes a merge of several adapters combine their changes on the deltas, as PEFT's merge_utils does,
        /// before they go into each weight, instead of adding them one after the other: W' = round(W + combine(w_i dW_i)),
        /// each dW_i the module's own change (PEFT's get_delta_weight), combined in f32. <paramref name="method"/> is
        /// <see cref="CombineMethod.Linear"/> (the default: adapters added in turn) or <see cref="CombineMethod.Ties"/>,
        /// <see cref="CombineMethod.DareLinear"/>, <see cref="CombineMethod.DareTies"/> or
        /// <see cref="CombineMethod.MagnitudePrune"/>, with the density, majority sign and seed of
        /// <paramref name="combineOptions"/> (<see cref="ExportOptions.SetCombineDensity"/>,
        /// <see cref="ExportOptions.SetCombineMajoritySign"/>, <see cref="ExportOptions.SetCombineSeed"/>; its other
        /// settings are not used; copied; null for the defaults, which have no density): the weights
        /// <see cref="LowRank.CombineDeltas"/> writes for the same inputs, merged in one pass and without a rank. lora_B
        /// biases and trainable token rows are added as usual. It is peftc merge --combine. The merge then fails, before
        /// writing anything, with Unsupported listing the modules that have no delta to combine (DoRA, stacked expert
        /// parameters, embedding and convolution layers, IA3 and the rotations on a quantized base) or for a GGUF base,
        /// and with InvalidArgument with <see cref="Arithmetic.Ggml"/>. <see cref="Merge.CombineModels"/> ignores this
        /// setting.</summary>
        /// <exception cref="PeftException">InvalidArgument for another method, or a pruning method without a density in
        /// [0, 1].</exception>
        public MergeOptions SetCombine(CombineMethod method, ExportOptions combineOptions = null)
        {
            PeftException.Check(Native.peft_merge_options_set_combine(Handle, (int)method,
                                                                      ExportOptions.HandleOf(combineOptions)));
            GC.KeepAlive(combineOptions);
            return this;
        }
    }

    /// <summary>The order of a merge's f32 arithmetic for plain LoRA modules (<see cref="MergeOptions.SetArithmetic"/>).</summary>
    public enum Arithmetic
    {
        /// <summary>PEFT's order (the default): the merge equals PEFT's merge_and_unload() bit for bit (the delta
        /// scaling * B @ A as one float chain over the rank, every adapter's delta summed, added to the weight
        /// once).</summary>
        Peft = 0,
        /// <summary>llama.cpp's llama-export-lora as ggml's scalar reference CPU code computes it: each delta value is the
        /// rank's float products added in double in rank order and rounded to float once, multiplied by the adapter's
        /// scale weight * alpha / rank (in float; the weight alone when alpha is 0) and added to the weight in float,
        /// adapter after adapter. A merge into a GGUF base then equals, byte for byte, ggml's quantization of
        /// llama-export-lora's F32 merge of the same (dequantized) base. SIMD builds of llama.cpp differ from both
        /// orders in the last bits.</summary>
        Ggml = 1,
    }

    /// <summary>A merge's policy for tied embeddings (<see cref="MergeOptions.SetTiedEmbeddings"/>).</summary>
    public enum TiedEmbeddings
    {
        /// <summary>The merged model computes what the adapter's forward computes: where the two sides change differently
        /// they are untied (lm_head.weight written as the original embedding plus its own changes, tie_word_embeddings
        /// set to false, a note); changes PEFT makes to both sides alike (trainable tokens, ensure_weight_tying's tied
        /// LoRA) land once in the shared tensor, which stays tied.</summary>
        Untie = 0,
        /// <summary>PEFT's merge_and_unload: the changes of either side land in the one shared tensor, which stays tied
        /// (a modules_to_save copy still unties).</summary>
        Shared = 1,
    }

    /// <summary>What storing one merged GGUF tensor costs (<see cref="MergeOptions.SetReport"/>): <see cref="Rms"/> and
    /// <see cref="Max"/> compare the stored merge with the exact f32 merge, <see cref="BaseRms"/> and <see cref="BaseMax"/>
    /// the base stored in <see cref="Type"/> with the base itself (0 for a tensor an adapter replaced whole).</summary>
    public sealed class StoreReportEntry
    {
        public string Tensor { get; internal set; }
        /// <summary>The base tensor's ggml type name ("Q4_K").</summary>
        public string BaseType { get; internal set; }
        /// <summary>The ggml type name it was written in.</summary>
        public string Type { get; internal set; }
        /// <summary>Number of values.</summary>
        public long Values { get; internal set; }
        public double Rms { get; internal set; }
        public double Max { get; internal set; }
        public double BaseRms { get; internal set; }
        public double BaseMax { get; internal set; }

        public override string ToString() { return Tensor + " " + BaseType + " -> " + Type + " rms " + Rms; }
    }

    /// <summary>What a checkpoint merge did (copied out of the library; nothing to dispose).</summary>
    public sealed class MergeResult
    {
        /// <summary>Tensors changed by LoRA, DoRA, lora_B.bias or token rows.</summary>
        public long Merged { get; internal set; }
        /// <summary>Tensors replaced whole by an adapter tensor.</summary>
        public long Replaced { get; internal set; }
        /// <summary>Base tensors written unchanged (converted if the dtype changed).</summary>
        public long Copied { get; internal set; }
        /// <summary>Tensors the base file lacks (an untied output embedding).</summary>
        public long Added { get; internal set; }
        /// <summary>Tensor bytes written.</summary>
        public long Bytes { get; internal set; }
        /// <summary>Files written, relative to the output folder (weight files first).</summary>
        public string[] Files { get; internal set; }
        /// <summary>Whether tie_word_embeddings was set to false.</summary>
        public bool UntiedEmbeddings { get; internal set; }
        public string[] Notes { get; internal set; }
        /// <summary>The store report, one entry per merged tensor in file order, for a GGUF base with
        /// <see cref="MergeOptions.SetReport"/>; empty otherwise.</summary>
        public StoreReportEntry[] StoreReport { get; internal set; }
        /// <summary>The same report as the library's JSON array.</summary>
        public string StoreReportJson { get; internal set; }

        internal static MergeResult From(MergeResultHandle r)
        {
            var files = new string[Checkpoint.ToInt(Native.peft_merge_result_file_count(r))];
            for (int i = 0; i < files.Length; i++) files[i] = Utf8.Decode(Native.peft_merge_result_file_name(r, (UIntPtr)i));
            string report = Utf8.Decode(Native.peft_merge_result_report_json(r)) ?? "[]";
            var notes = new string[Checkpoint.ToInt(Native.peft_merge_result_note_count(r))];
            for (int i = 0; i < notes.Length; i++) notes[i] = Utf8.Decode(Native.peft_merge_result_note(r, (UIntPtr)i));
            return new MergeResult
            {
                Merged = (long)Native.peft_merge_result_tensor_count(r, 0),
                Replaced = (long)Native.peft_merge_result_tensor_count(r, 1),
                Copied = (long)Native.peft_merge_result_tensor_count(r, 2),
                Added = (long)Native.peft_merge_result_tensor_count(r, 3),
                Bytes = (long)Native.peft_merge_result_bytes(r),
                Files = files,
                UntiedEmbeddings = Native.peft_merge_result_untied_embeddings(r) != 0,
                Notes = notes,
                StoreReport = StoreReportParser.Parse(report),
                StoreReportJson = report,
            };
        }
    }

    /// <summary>Reads the store report's JSON: an array of flat objects with string and number values, as the
    /// library writes it.</summary>
    internal sealed class StoreReportParser
    {
        private readonly string s_;
        private int i_;

        private StoreReportParser(string s) { s_ = s; }

        internal static StoreReportEntry[] Parse(string json)
        {
            var p = new StoreReportParser(json);
            var entries = new System.Collections.Generic.List<StoreReportEntry>();
            p.Expect('[');
            if (!p.Take(']'))
            {
                do entries.Add(p.Entry()); while (p.Take(','));
                p.Expect(']');
            }
            p.Space();
            if (p.i_ != json.Length) throw p.Bad();
            return entries.ToArray();
        }

        private StoreReportEntry Entry()
        {
            var e = new StoreReportEntry();
            Expect('{');
            if (Take('}')) return e;
            do
            {
                string key = String();
                Expect(':');
                Space();
                if (i_ < s_.Length && s_[i_] == '"')
                {
                    string value = String();
                    if (key == "tensor") e.Tensor = value;
                    else if (key == "base_type") e.BaseType = value;
                    else if (key == "type") e.Type = value;
                }
                else
                {
                    double value = Number();
                    if (key == "values") e.Values = (long)value;
                    else if (key == "rms") e.Rms = value;
                    else if (key == "max") e.Max = value;
                    else if (key == "base_rms") e.BaseRms = value;
                    else if (key == "base_max") e.BaseMax = value;
                }
            } while (Take(','));
            Expect('}');
            return e;
        }

        private void Space()
        {
            while (i_ < s_.Length && char.IsWhiteSpace(s_[i_])) i_++;
        }

        private bool Take(char c)
        {
            Space();
            if (i_ < s_.Length && s_[i_] == c) { i_++; return true; }
            return false;
        }

        private void Expect(char c)
        {
            if (!Take(c)) throw Bad();
        }

        private string String()
        {
            Expect('"');
            var b = new System.Text.StringBuilder();
            while (i_ < s_.Length && s_[i_] != '"')
            {
                char c = s_[i_++];
                if (c != '\\') { b.Append(c); continue; }
                if (i_ >= s_.Length) throw Bad();
                char esc = s_[i_++];
                switch (esc)
                {
                    case 'n': b.Append('\n'); break;
                    case 't': b.Append('\t'); break;
                    case 'r': b.Append('\r'); break;
                    case 'b': b.Append('\b'); break;
                    case 'f': b.Append('\f'); break;
                    case 'u':
                        if (i_ + 4 > s_.Length) throw Bad();
                        b.Append((char)Convert.ToInt32(s_.Substring(i_, 4), 16));
                        i_ += 4;
                        break;
                    default: b.Append(esc); break;
                }
            }
            if (i_ >= s_.Length) throw Bad();
            i_++;
            return b.ToString();
        }

        private double Number()
        {
            int start = i_;
            while (i_ < s_.Length && "+-.eE0123456789".IndexOf(s_[i_]) >= 0) i_++;
            double value;
            if (!double.TryParse(s_.Substring(start, i_ - start), System.Globalization.NumberStyles.Float,
                                 System.Globalization.CultureInfo.InvariantCulture, out value))
                throw Bad();
            return value;
        }

        private PeftException Bad()
        {
            return new PeftException(ErrorCode.Internal, "the merge's store report is not the JSON expected, at offset " + i_);
        }
    }

    /// <summary>Merging adapters into base model folders.</summary>
    public static class Merge
    {
        /// <summary>
        /// Merges the options' adapters into the base model folder <paramref name="baseDir"/> and writes the merged
        /// model into <paramref name="outDir"/> (all or nothing: after a failure or cancellation the folder is as it
        /// was). <paramref name="progress"/> runs on the calling thread; returning false stops the merge with
        /// PeftException Cancelled; a cancelled <paramref name="cancellation"/> stops it with
        /// OperationCanceledException (whose InnerException is that PeftException). An exception the
        /// callback throws stops it too and becomes the PeftException's InnerException.
        /// </summary>
        public static MergeResult Checkpoint(string baseDir, string outDir, MergeOptions options, MergeProgress progress = null,
                                             CancellationToken cancellation = default(CancellationToken))
        {
            if (options == null) throw new ArgumentNullException("options");
            byte[] b = Utf8.Required(baseDir, "baseDir");
            byte[] o = Utf8.Required(outDir, "outDir");
            return Run(options.Handle, progress, cancellation,
                       (MergeOptionsHandle h, out MergeResultHandle r) => Native.peft_merge_checkpoint(b, o, h, out r));
        }

        /// <summary>
        /// Whole-model task arithmetic: combines the checkpoint folders (or hub ids) <paramref name="models"/>, fine-tuned
        /// from <paramref name="baseDir"/>, into the model folder <paramref name="outDir"/>, one finite weight each
        /// (negative weights subtract). Every floating-point tensor W of the base becomes W + combine(w_i (M_i - W)), M_i
        /// the same-named tensor of model i, the differences taken in f32 and rounded once to the output dtype; other
        /// tensors are copied from the base. The output has the base's files, shard names, index and other files, as
        /// <see cref="Checkpoint"/> writes them, all at once (nothing is written on failure).
        /// <para><paramref name="method"/> is <see cref="CombineMethod.Linear"/> (the weighted sum of the differences) or
        /// one of <see cref="CombineMethod.Ties"/>, <see cref="CombineMethod.DareLinear"/>,
        /// <see cref="CombineMethod.DareTies"/> and <see cref="CombineMethod.MagnitudePrune"/>, which prune and elect each
        /// tensor's differences as PEFT's merge_utils functions do, with the density, majority sign and seed of
        /// <paramref name="combineOptions"/> (<see cref="ExportOptions.SetCombineDensity"/>,
        /// <see cref="ExportOptions.SetCombineMajoritySign"/>, <see cref="ExportOptions.SetCombineSeed"/>; its other
        /// settings are not used). <paramref name="options"/> are merge options without adapters: their dtype, maximum
        /// shard size, require-config and allow-non-finite settings apply (threads and the GGUF settings do not); null for
        /// the defaults. <paramref name="progress"/> and <paramref name="cancellation"/> work as for
        /// <see cref="Checkpoint"/>. In the result, <see cref="MergeResult.Merged"/> counts the combined tensors and
        /// <see cref="MergeResult.Copied"/> the others.</para>
        /// </summary>
        /// <exception cref="PeftException">InvalidArgument for no models, a weight that is not finite, another method, a
        /// pruning method without a density, options holding adapters, or an output over an input; NotFound naming a base
        /// tensor a model lacks, or a missing folder; ShapeMismatch; Unsupported (a GGUF or quantized base); NonFinite;
        /// Cancelled; Io.</exception>
        /// <exception cref="ArgumentException">A count mismatch between <paramref name="models"/> and
        /// <paramref name="weights"/>.</exception>
        public static unsafe MergeResult CombineModels(string baseDir, IList<string> models, IList<double> weights,
                                                       CombineMethod method, string outDir, ExportOptions combineOptions = null,
                                                       MergeOptions options = null, MergeProgress progress = null,
                                                       CancellationToken cancellation = default(CancellationToken))
        {
            if (models == null) throw new ArgumentNullException("models");
            if (weights == null) throw new ArgumentNullException("weights");
            if (models.Count != weights.Count)
                throw new ArgumentException(models.Count + " models but " + weights.Count + " weights", "weights");
            byte[] b = Utf8.Required(baseDir, "baseDir");
            byte[] o = Utf8.Required(outDir, "outDir");
            int count = models.Count;
            var pins = new GCHandle[count];
            var pointers = new IntPtr[Math.Max(count, 1)];
            var w = new double[Math.Max(count, 1)];
            MergeOptions defaults = null;
            try
            {
                for (int i = 0; i < count; i++)
                {
                    pins[i] = GCHandle.Alloc(Utf8.Required(models[i], "models"), GCHandleType.Pinned);
                    pointers[i] = pins[i].AddrOfPinnedObject();
                    w[i] = weights[i];
                }
                // The progress callback lives in merge options: without options, defaults of our own carry it.
                if (options == null && (progress != null || cancellation.CanBeCanceled)) defaults = new MergeOptions();
                MergeOptions used = options ?? defaults;
                MergeOptionsHandle h = used == null ? PeftHandle.Null<MergeOptionsHandle>() : used.Handle;
                ExportOptionsHandle c = ExportOptions.HandleOf(combineOptions);
                return Run(h, progress, cancellation, (MergeOptionsHandle opts, out MergeResultHandle r) =>
                {
                    fixed (IntPtr* p = pointers)
                    {
                        return Native.peft_model_combine(b, p, w, (UIntPtr)count, (int)method, o, c, opts, out r);
                    }
                });
            }
            finally
            {
                foreach (GCHandle pin in pins)
                    if (pin.IsAllocated) pin.Free();
                if (defaults != null) defaults.Dispose();
            }
        }

        private delegate ErrorHandle MergeCall(MergeOptionsHandle options, out MergeResultHandle result);

        /// <summary>Runs a merge (<paramref name="call"/>) with the progress callback and cancellation set on
        /// <paramref name="h"/> for its duration, and reads its result.</summary>
        private static MergeResult Run(MergeOptionsHandle h, MergeProgress progress, CancellationToken cancellation,
                                       MergeCall call)
        {
            Exception thrown = null;
            NativeProgress trampoline = null;
            if (progress != null || cancellation.CanBeCanceled)
            {
                trampoline = (user, done, total) =>
                {
                    try
                    {
                        if (cancellation.IsCancellationRequested) return 1;
                        return progress == null || progress((long)done, (long)total) ? 0 : 1;
                    }
                    catch (Exception e)
                    {
                        thrown = e;
                        return 1;
                    }
                };
                PeftException.Check(Native.peft_merge_options_set_progress(h, trampoline, IntPtr.Zero));
            }
            ErrorHandle err;
            MergeResultHandle result;
            try
            {
                err = call(h, out result);
            }
            finally
            {
                // The options must not keep a pointer to a delegate that may be collected after this call.
                if (trampoline != null) PeftException.Check(Native.peft_merge_options_set_progress(h, null, IntPtr.Zero));
                GC.KeepAlive(trampoline);
            }
            using (result)
            {
                try
                {
                    PeftException.Check(err, thrown);
                }
                catch (PeftException e)
                {
                    if (e.Code == ErrorCode.Cancelled && thrown == null && cancellation.IsCancellationRequested)
                        throw new OperationCanceledException(e.Message, e, cancellation);
                    throw;
                }
                return MergeResult.From(result);
            }
        }
    }
}
