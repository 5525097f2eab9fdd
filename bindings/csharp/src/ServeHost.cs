// Serving, the host-model part (peft_c.h, section "serving"; src/capi/serve_host_api.cpp): HostModel, the
// host's weight buffers into which adapters are swapped, and SwapStats.
using System;
using System.Buffers;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>
    /// The weight buffers of a host's model, given once, into which adapters are swapped in place:
    /// <see cref="Swap"/> takes the merged adapter out (bit for bit by default) and merges another in.
    /// One thread at a time, and nothing may read or write the buffers during a swap. While the host model lives it
    /// owns the buffers' contents: the host reads them but does not write them (in exact mode, taking an adapter out
    /// writes the original bytes back, whatever they hold).
    /// </summary>
    /// <remarks>
    /// <para>The buffers are the host's. The host model keeps their addresses from <c>AddWeight</c> until it is
    /// released, and every <see cref="Swap"/> writes through them, so they must neither move nor be freed until then:</para>
    /// <list type="bullet">
    /// <item><description>Managed arrays (<c>float[]</c>) and <see cref="Memory{T}"/> are pinned by
    /// <c>AddWeight</c> and unpinned when the host model is released (<c>Dispose</c>, or its finalizer when it was not
    /// disposed: the C object is freed first, then the pins). Pinned arrays cannot be moved by the garbage collector;
    /// for a large model prefer unmanaged memory.</description></item>
    /// <item><description>Unmanaged memory (<see cref="IntPtr"/>) is the caller's to keep valid until the host model
    /// is disposed. Releasing the host model never touches the buffers, so they may be freed right after
    /// <c>Dispose</c> (swap to none first to get the base weights back).</description></item>
    /// </list>
    /// </remarks>
    public sealed class HostModel : NativeObject
    {
        public HostModel() : base(Create()) { }

        private static HostModelHandle Create()
        {
            HostModelHandle h;
            PeftException.Check(Native.peft_host_model_new(out h));
            return h;
        }

        private HostModelHandle Handle { get { return Live<HostModelHandle>(); } }

        /// <summary>Reads weight names as the host's own names through <paramref name="translator"/> (the table is
        /// shared: it may be disposed afterwards); null for HuggingFace names. Before any weight is added.</summary>
        public HostModel SetTranslator(Translator translator)
        {
            PeftException.Check(Native.peft_host_model_set_translator(
                Handle, translator == null ? PeftHandle.Null<TranslatorHandle>() : translator.Handle));
            return this;
        }

        /// <summary>Exact removal (the default): a copy of each weight's bytes, taken at its first exact merge and kept
        /// while the host model lives, is written back, bit for bit; or not (PEFT's arithmetic unmerge; copies already
        /// taken are kept). Takes effect at the next merge; a layer comes out the way it went in.</summary>
        public HostModel SetExact(bool exact)
        {
            PeftException.Check(Native.peft_host_model_set_exact(Handle, exact ? 1 : 0));
            return this;
        }

        /// <summary>Adds an F32 weight of <paramref name="shape"/> ([out, in] for Linear, [in, out] for GPT-2 Conv1D,
        /// [num, dim] for embeddings, [experts, out, in] for a fused expert parameter, [out, in, kh, kw] for Conv2d)
        /// and its layer's bias (needed by adapters with lora_bias; its output features: shape[0], or shape[1] for
        /// Conv1D). Both arrays are pinned until the host model is released. The library is told the bias's length
        /// and never writes past it: a <see cref="Swap"/> of an adapter whose layer has another number of output
        /// features throws ShapeMismatch.</summary>
        /// <exception cref="PeftException">UnresolvedKey when the translator does not resolve the name; InvalidArgument
        /// for a layer given twice or while an adapter is merged; ShapeMismatch for a zero dimension or an empty
        /// bias.</exception>
        public HostModel AddWeight(string name, float[] data, long[] shape, float[] bias = null)
        {
            if (data == null) throw new ArgumentNullException("data");
            ulong[] dims = CheckedDims(shape, DType.F32, data.Length * 4L);
            return AddPinned(name, new Memory<float>(data).Pin(), DType.F32, dims,
                             bias == null ? default(MemoryHandle) : new Memory<float>(bias).Pin(), DType.F32,
                             bias == null ? 0 : (ulong)bias.Length);
        }

        /// <summary>Adds a weight of <paramref name="dtype"/> (F32, BF16 or F16) and optionally its layer's bias, as
        /// bytes (whole elements of <paramref name="biasDtype"/>; its length is passed on as with <c>float[]</c>).
        /// Both are pinned (<see cref="Memory{T}.Pin"/>) until the host model is released.</summary>
        public HostModel AddWeight(string name, Memory<byte> data, DType dtype, long[] shape, Memory<byte> bias = default(Memory<byte>),
                                   DType biasDtype = DType.F32)
        {
            ulong[] dims = CheckedDims(shape, dtype, data.Length);
            ulong biasElements = 0;
            if (!bias.IsEmpty)
            {
                Serving.RequireFloatDType(biasDtype, "biasDtype");
                long elementBytes = Peft.ByteSize(biasDtype, 1);
                if (bias.Length % elementBytes != 0)
                    throw new ArgumentException("bias has " + bias.Length + " bytes, not whole " + Peft.DTypeName(biasDtype) + " elements", "bias");
                biasElements = (ulong)(bias.Length / elementBytes);
            }
            return AddPinned(name, data.Pin(), dtype, dims, bias.IsEmpty ? default(MemoryHandle) : bias.Pin(), biasDtype, biasElements);
        }

        /// <summary>Adds a weight in unmanaged memory and optionally its layer's bias of <paramref name="biasElements"/>
        /// elements (or <see cref="IntPtr.Zero"/>). The memory must hold the whole weight and the bias's elements and stay
        /// valid and in place until the host model is disposed: sizes cannot be checked here. The library writes no
        /// more than <paramref name="biasElements"/> into the bias.</summary>
        public unsafe HostModel AddWeight(string name, IntPtr data, DType dtype, long[] shape, IntPtr bias = default(IntPtr),
                                          long biasElements = 0, DType biasDtype = DType.F32)
        {
            ulong[] dims = Dims(shape, dtype);
            if (bias != IntPtr.Zero)
            {
                Serving.RequireFloatDType(biasDtype, "biasDtype");
                if (biasElements < 0) throw new ArgumentOutOfRangeException("biasElements", "the bias's element count is negative");
            }
            Add(Handle, name, (void*)data, dtype, dims, (void*)bias, biasDtype, bias == IntPtr.Zero ? 0 : (ulong)biasElements);
            return this;
        }

        // Hands C the pinned addresses; the host model keeps the pins once C holds the addresses.
        private unsafe HostModel AddPinned(string name, MemoryHandle data, DType dtype, ulong[] dims, MemoryHandle bias, DType biasDtype,
                                           ulong biasElements)
        {
            HostModelHandle h;
            try
            {
                h = Handle;
                Add(h, name, data.Pointer, dtype, dims, bias.Pointer, biasDtype, biasElements);
            }
            catch
            {
                data.Dispose();
                bias.Dispose();
                throw;
            }
            h.KeepPinned(data);
            h.KeepPinned(bias);
            return this;
        }

        private static unsafe void Add(HostModelHandle h, string name, void* data, DType dtype, ulong[] dims, void* bias, DType biasDtype,
                                       ulong biasElements)
        {
            PeftException.Check(Native.peft_host_model_add_weight(h, Utf8.Required(name, "name"), data, (int)dtype, dims, (UIntPtr)dims.Length,
                                                                  bias, (int)biasDtype, biasElements));
        }

        private static ulong[] Dims(long[] shape, DType dtype)
        {
            if (shape == null) throw new ArgumentNullException("shape");
            Serving.RequireFloatDType(dtype, "dtype");
            var dims = new ulong[shape.Length];
            for (int i = 0; i < shape.Length; i++)
            {
                if (shape[i] < 0) throw new ArgumentOutOfRangeException("shape", "dimension " + i + " is negative");
                dims[i] = (ulong)shape[i];
            }
            return dims;
        }

        // Dims, and a weight span of exactly the shape's bytes.
        private static ulong[] CheckedDims(long[] shape, DType dtype, long dataBytes)
        {
            ulong[] dims = Dims(shape, dtype);
            long elements = 1;
            foreach (long d in shape) elements = checked(elements * d);
            Serving.RequireBytes(dataBytes, Peft.ByteSize(dtype, elements), "data", "[" + string.Join(", ", shape) + "]", dtype);
            return dims;
        }

        /// <summary>Takes the merged adapter out (if any) and merges <paramref name="lease"/>'s in, scaled by
        /// <paramref name="weight"/>; null swaps to no adapter. Everything is checked before a buffer changes. The
        /// host model holds the adapter (pinned in its registry) until the next swap or its release: the lease may
        /// be disposed at once.</summary>
        /// <exception cref="PeftException">UnresolvedKey listing the adapter's layers without a weight here;
        /// ShapeMismatch naming a layer whose weight does not fit, or whose bias has another length than its output
        /// features; Unsupported for modules_to_save or trainable tokens; InvalidArgument for a weight that is not
        /// finite, a missing bias, or two layers of the adapter on one weight. The buffers hold what they held before
        /// on failure.</exception>
        public SwapStats Swap(Lease lease, double weight = 1.0)
        {
            var s = new NativeSwapStats { Size = (ulong)Marshal.SizeOf(typeof(NativeSwapStats)) };
            PeftException.Check(Native.peft_host_model_swap(Handle, lease == null ? PeftHandle.Null<LeaseHandle>() : lease.Handle, weight, ref s));
            return new SwapStats(s);
        }

        /// <summary>The name of the adapter merged now; null when none.</summary>
        public string Current { get { return Utf8.Decode(Native.peft_host_model_current(Handle)); } }
    }

    /// <summary>What one <see cref="HostModel.Swap"/> did.</summary>
    public sealed class SwapStats
    {
        internal SwapStats(NativeSwapStats s)
        {
            RemoveSeconds = s.RemoveSeconds;
            MergeSeconds = s.MergeSeconds;
            LayersRemoved = (long)s.LayersRemoved;
            LayersMerged = (long)s.LayersMerged;
            SavedBytes = (long)s.SavedBytes;
        }

        /// <summary>Wall time taking the previous adapter out.</summary>
        public double RemoveSeconds { get; private set; }
        /// <summary>Wall time merging the new adapter in.</summary>
        public double MergeSeconds { get; private set; }
        /// <summary>Layers of the previous adapter taken out.</summary>
        public long LayersRemoved { get; private set; }
        /// <summary>Layers of the new adapter merged in.</summary>
        public long LayersMerged { get; private set; }
        /// <summary>Bytes of original weights (and biases) the host model keeps for exact removal.</summary>
        public long SavedBytes { get; private set; }
    }
}
