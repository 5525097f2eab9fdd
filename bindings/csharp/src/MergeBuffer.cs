// Buffer merge: one LoRA layer merged into a weight the host owns, and taken out again.
using System;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>Options of a buffer merge (weight, kept rows, threads, translator). One thread at a time.</summary>
    public sealed class MergeBufferOptions : NativeObject
    {
        private Translator translator_;

        public MergeBufferOptions() : base(Create()) { }

        private static MergeBufferOptionsHandle Create()
        {
            MergeBufferOptionsHandle h;
            PeftException.Check(Native.peft_merge_buffer_options_new(out h));
            return h;
        }

        internal MergeBufferOptionsHandle Handle { get { return Live<MergeBufferOptionsHandle>(); } }
        internal Translator TranslatorUsed { get { return translator_; } }

        /// <summary>The weight multiplying the layer's LoRA scaling (default 1).</summary>
        public MergeBufferOptions SetWeight(double weight)
        {
            PeftException.Check(Native.peft_merge_buffer_options_set_weight(Handle, weight));
            return this;
        }

        /// <summary>Keep the original bytes of changed rows, so that removal restores the buffer bit for bit.</summary>
        public MergeBufferOptions SetKeepOriginalRows(bool keep)
        {
            PeftException.Check(Native.peft_merge_buffer_options_set_keep_original_rows(Handle, keep ? 1 : 0));
            return this;
        }

        /// <summary>Threads per merge; 0 for one per core.</summary>
        public MergeBufferOptions SetThreads(int threads)
        {
            if (threads < 0) throw new ArgumentOutOfRangeException("threads");
            PeftException.Check(Native.peft_merge_buffer_options_set_threads(Handle, (uint)threads));
            return this;
        }

        /// <summary>Read layer names as the host's native names through this translator (null: HuggingFace names).</summary>
        public MergeBufferOptions SetTranslator(Translator translator)
        {
            PeftException.Check(Native.peft_merge_buffer_options_set_translator(
                Handle, translator == null ? PeftHandle.Null<TranslatorHandle>() : translator.Handle));
            translator_ = translator;
            return this;
        }
    }

    /// <summary>One adapter layer merged into a host buffer, and what removing it needs. Disposing it does not
    /// undo the merge. One thread at a time.</summary>
    public sealed class MergeRecord : NativeObject
    {
        private readonly int dataBytes_;
        private readonly int biasBytes_;

        internal MergeRecord(MergeRecordHandle h, int dataBytes, int biasBytes) : base(h)
        {
            dataBytes_ = dataBytes;
            biasBytes_ = biasBytes;
        }

        private MergeRecordHandle Handle { get { return Live<MergeRecordHandle>(); } }

        /// <summary>The adapter module merged (its HuggingFace path).</summary>
        public string Module { get { return Utf8.Decode(Native.peft_merge_record_module(Handle)); } }
        /// <summary>Whether the merge is still in the buffer.</summary>
        public bool Active { get { return Native.peft_merge_record_active(Handle) != 0; } }
        /// <summary>Bytes of original rows kept for an exact removal.</summary>
        public long SavedBytes { get { return (long)Native.peft_merge_record_saved_bytes(Handle); } }

        /// <summary>Takes the merge out of the buffers again (same dtype and shape; they may have moved).</summary>
        public unsafe void Remove(Span<byte> data, Span<byte> bias)
        {
            if (data.Length != dataBytes_)
                throw new ArgumentException("data has " + data.Length + " bytes; the merged weight had " + dataBytes_, "data");
            if (!bias.IsEmpty && bias.Length < biasBytes_)
                throw new ArgumentException("bias has " + bias.Length + " bytes; the layer's bias needs " + biasBytes_, "bias");
            fixed (byte* d = &MemoryMarshal.GetReference(data))
            fixed (byte* b = &MemoryMarshal.GetReference(bias))
            {
                PeftException.Check(Native.peft_merge_record_unmerge(Handle, d, b));
            }
        }

        public void Remove(Span<byte> data) { Remove(data, Span<byte>.Empty); }
        public void Remove(Span<float> data) { Remove(MemoryMarshal.AsBytes(data), Span<byte>.Empty); }
        public void Remove(Span<float> data, Span<float> bias) { Remove(MemoryMarshal.AsBytes(data), MemoryMarshal.AsBytes(bias)); }
    }

    /// <summary>Merging one adapter layer into buffers the host owns.</summary>
    public static class MergeBuffer
    {
        /// <summary>
        /// Merges layer <paramref name="name"/> of <paramref name="adapter"/> into <paramref name="data"/> in place
        /// (row-major <paramref name="dtype"/> elements: F32, BF16 or F16, of <paramref name="shape"/>), and its
        /// lora_B.bias, if any, into <paramref name="bias"/>. On failure nothing is changed.
        /// </summary>
        public static unsafe MergeRecord Apply(Adapter adapter, string name, Span<byte> data, DType dtype, long[] shape,
                                               Span<byte> bias, DType biasDtype, MergeBufferOptions options)
        {
            if (adapter == null) throw new ArgumentNullException("adapter");
            if (shape == null) throw new ArgumentNullException("shape");
            byte[] n = Utf8.Required(name, "name");
            var dims = new ulong[shape.Length];
            long elements = 1;
            for (int i = 0; i < shape.Length; i++)
            {
                if (shape[i] < 0) throw new ArgumentOutOfRangeException("shape", "dimension " + i + " is negative");
                dims[i] = (ulong)shape[i];
                elements = checked(elements * shape[i]);
            }
            if (dtype != DType.F32 && dtype != DType.BF16 && dtype != DType.F16)
                throw new PeftException(ErrorCode.Unsupported, "buffer merge supports F32, BF16 and F16, not " + Peft.DTypeName(dtype));
            long dataBytes = Peft.ByteSize(dtype, elements);
            if (data.Length != dataBytes)
                throw new ArgumentException("data has " + data.Length + " bytes; shape [" + string.Join(", ", shape) + "] of " +
                                            Peft.DTypeName(dtype) + " needs " + dataBytes, "data");
            int biasBytes = 0;
            if (!bias.IsEmpty)
            {
                // C writes [out] elements of the layer's bias: make sure the span holds them.
                long needed = Peft.ByteSize(biasDtype, BiasElements(adapter, name, options));
                if (bias.Length < needed)
                    throw new ArgumentException("bias has " + bias.Length + " bytes; the layer's bias needs " + needed, "bias");
                biasBytes = (int)needed;
            }
            MergeRecordHandle record;
            fixed (byte* d = &MemoryMarshal.GetReference(data))
            fixed (byte* b = &MemoryMarshal.GetReference(bias))
            {
                PeftException.Check(Native.peft_merge_buffer_apply(
                    adapter.Handle, n, d, (int)dtype, dims, (UIntPtr)dims.Length, b, (int)biasDtype,
                    options == null ? PeftHandle.Null<MergeBufferOptionsHandle>() : options.Handle, out record));
            }
            return new MergeRecord(record, (int)dataBytes, biasBytes);
        }

        /// <summary>Merges a layer into a weight buffer without a bias.</summary>
        public static MergeRecord Apply(Adapter adapter, string name, Span<byte> data, DType dtype, long[] shape,
                                        MergeBufferOptions options = null)
        {
            return Apply(adapter, name, data, dtype, shape, Span<byte>.Empty, DType.F32, options);
        }

        /// <summary>Merges a layer into an F32 weight.</summary>
        public static MergeRecord Apply(Adapter adapter, string name, Span<float> data, long[] shape, MergeBufferOptions options = null)
        {
            return Apply(adapter, name, MemoryMarshal.AsBytes(data), DType.F32, shape, Span<byte>.Empty, DType.F32, options);
        }

        /// <summary>Merges a layer into an F32 weight and its F32 bias.</summary>
        public static MergeRecord Apply(Adapter adapter, string name, Span<float> data, long[] shape, Span<float> bias,
                                        MergeBufferOptions options = null)
        {
            return Apply(adapter, name, MemoryMarshal.AsBytes(data), DType.F32, shape, MemoryMarshal.AsBytes(bias), DType.F32, options);
        }

        // Elements of the lora_B.bias the layer `name` adds to a bias (0 when it has none). When the name does
        // not lead to a module here, the largest lora_B.bias of the adapter is required, which is always safe.
        private static long BiasElements(Adapter adapter, string name, MergeBufferOptions options)
        {
            string module = ModulePath(name, options == null ? null : options.TranslatorUsed);
            long largest = 0;
            foreach (AdapterModule m in adapter.Modules())
            {
                AdapterTensor t = m.Tensor("lora_B.bias");
                long count = t == null ? 0 : t.ElementCount;
                if (module != null && m.Name == module) return count;
                largest = Math.Max(largest, count);
            }
            return largest;
        }

        private static string ModulePath(string name, Translator translator)
        {
            string path = name;
            if (translator != null)
            {
                try
                {
                    path = translator.ToHf(name);
                }
                catch (PeftException)
                {
                    return null;
                }
            }
            const string prefix = "base_model.model.";
            if (path.StartsWith(prefix, StringComparison.Ordinal)) path = path.Substring(prefix.Length);
            if (path.EndsWith(".weight", StringComparison.Ordinal)) path = path.Substring(0, path.Length - ".weight".Length);
            return path;
        }
    }
}
