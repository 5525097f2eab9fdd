// Checkpoint merge: adapters merged into a base model folder, streamed into a new folder.
using System;
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

        internal static MergeResult From(MergeResultHandle r)
        {
            var files = new string[Checkpoint.ToInt(Native.peft_merge_result_file_count(r))];
            for (int i = 0; i < files.Length; i++) files[i] = Utf8.Decode(Native.peft_merge_result_file_name(r, (UIntPtr)i));
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
            };
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
            MergeOptionsHandle h = options.Handle;
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
                err = Native.peft_merge_checkpoint(b, o, h, out result);
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
