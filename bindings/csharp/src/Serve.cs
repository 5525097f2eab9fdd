// Serving many adapters over one base model (peft_c.h, section "serving"): a registry of adapters under a
// byte budget, leases on loaded adapters, unmerged LoRA applied to activations, and a host model whose
// weight buffers adapters are swapped into and out of.
using System;
using System.Buffers;
using System.Collections.Generic;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>Counters of a <see cref="Registry"/>, read in one consistent snapshot.</summary>
    public sealed class RegistryStats
    {
        internal RegistryStats(NativeRegistryStats s)
        {
            BudgetBytes = (long)s.BudgetBytes;
            LoadedBytes = (long)s.LoadedBytes;
            PeakLoadedBytes = (long)s.PeakLoadedBytes;
            Registered = (long)s.Registered;
            Loaded = (long)s.Loaded;
            Pinned = (long)s.Pinned;
            Loads = (long)s.Loads;
            Hits = (long)s.Hits;
            Evictions = (long)s.Evictions;
        }

        /// <summary>The byte budget.</summary>
        public long BudgetBytes { get; private set; }
        /// <summary>Bytes of adapter tensors in memory now (never above the budget).</summary>
        public long LoadedBytes { get; private set; }
        /// <summary>The highest <see cref="LoadedBytes"/> seen.</summary>
        public long PeakLoadedBytes { get; private set; }
        /// <summary>Names registered now.</summary>
        public long Registered { get; private set; }
        /// <summary>Adapter versions in memory now (replaced versions still leased included).</summary>
        public long Loaded { get; private set; }
        /// <summary>Of those, versions held by at least one lease or host model.</summary>
        public long Pinned { get; private set; }
        /// <summary>Loads of tensors since the registry was made.</summary>
        public long Loads { get; private set; }
        /// <summary>Acquisitions that found the tensors in memory.</summary>
        public long Hits { get; private set; }
        /// <summary>Loaded versions evicted to make room or by <see cref="Registry.Trim"/>.</summary>
        public long Evictions { get; private set; }
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

    /// <summary>
    /// Adapters registered under names, loaded on first <see cref="Acquire"/> into the storage dtype and kept in
    /// memory under a byte budget (least recently used out first; leased adapters are never evicted).
    /// Every member may be used from many threads at once. Leases outlive the registry's <c>Dispose</c>.
    /// </summary>
    public sealed class Registry : NativeObject
    {
        /// <summary>An empty registry keeping loaded tensors in <paramref name="storageDtype"/> (F32, BF16 or F16), at
        /// most <paramref name="budgetBytes"/> of them at once. With <paramref name="translator"/>,
        /// <see cref="Serving.LoraApply(string, IList{Lease}, int[], ReadOnlySpan{float}, long, long, Span{float}, long)"/>
        /// and <see cref="Lease.HasModule"/> read layer names as the host's own names (the table is shared: the
        /// translator may be disposed afterwards).</summary>
        /// <exception cref="PeftException">InvalidArgument for another storage dtype.</exception>
        public Registry(DType storageDtype, long budgetBytes, Translator translator = null) : base(Create(storageDtype, budgetBytes, translator)) { }

        private static RegistryHandle Create(DType storageDtype, long budgetBytes, Translator translator)
        {
            if (budgetBytes < 0) throw new ArgumentOutOfRangeException("budgetBytes", budgetBytes, "negative budget");
            RegistryHandle h;
            PeftException.Check(Native.peft_registry_new((int)storageDtype, (ulong)budgetBytes,
                                                         translator == null ? PeftHandle.Null<TranslatorHandle>() : translator.Handle, out h));
            return h;
        }

        private RegistryHandle Handle { get { return Live<RegistryHandle>(); } }

        /// <summary>Registers the adapter folder <paramref name="dir"/> under <paramref name="name"/>, or replaces the
        /// adapter of that name for new acquisitions (leases on the old version keep it). Reads the config and the
        /// safetensors header only. <paramref name="baseDir"/> and <paramref name="translator"/> are as for
        /// <see cref="Adapter.Open"/>.</summary>
        /// <exception cref="PeftException">The errors of <see cref="Adapter.Open"/>; Unsupported for tensors that are
        /// not F64/F32/F16/BF16. The registry is unchanged on failure.</exception>
        public Registry Register(string name, string dir, string baseDir = null, Translator translator = null)
        {
            byte[] n = Utf8.Required(name, "name");
            byte[] d = Utf8.Required(dir, "dir");
            using (AdapterOptionsHandle o = AdapterOptions(baseDir, translator))
            {
                PeftException.Check(Native.peft_registry_register(Handle, n, d, o));
            }
            return this;
        }

        /// <summary>As <see cref="Register"/>, from the text of adapter_config.json and the bytes of
        /// adapter_model.safetensors (both copied).</summary>
        public unsafe Registry RegisterMemory(string name, string configJson, ReadOnlySpan<byte> weights, string baseDir = null,
                                              Translator translator = null)
        {
            byte[] n = Utf8.Required(name, "name");
            byte[] c = Utf8.Required(configJson, "configJson");
            using (AdapterOptionsHandle o = AdapterOptions(baseDir, translator))
            fixed (byte* w = &MemoryMarshal.GetReference(weights))
            {
                PeftException.Check(Native.peft_registry_register_memory(Handle, n, c, w, (UIntPtr)weights.Length, o));
            }
            return this;
        }

        private static AdapterOptionsHandle AdapterOptions(string baseDir, Translator translator)
        {
            AdapterOptionsHandle o;
            PeftException.Check(Native.peft_adapter_options_new(out o));
            try
            {
                if (baseDir != null) PeftException.Check(Native.peft_adapter_options_set_base_dir(o, Utf8.Encode(baseDir, "baseDir")));
                if (translator != null) PeftException.Check(Native.peft_adapter_options_set_translator(o, translator.Handle));
                return o;
            }
            catch
            {
                o.Dispose();
                throw;
            }
        }

        /// <summary>Removes a name; leases on its adapter keep working.</summary>
        /// <exception cref="PeftException">NotFound for a name not registered.</exception>
        public void Unregister(string name)
        {
            PeftException.Check(Native.peft_registry_unregister(Handle, Utf8.Required(name, "name")));
        }

        /// <summary>The registered names, in the order they were first registered.</summary>
        public string[] Names()
        {
            IntPtr text;
            PeftException.Check(Native.peft_registry_names(Handle, out text));
            return Utf8.TakeOwned(text).Split(new[] { '\n' }, StringSplitOptions.RemoveEmptyEntries);
        }

        /// <summary>The adapter registered under <paramref name="name"/>, loaded if it is not in memory (evicting
        /// unpinned adapters to make room) and pinned until the lease is disposed.</summary>
        /// <exception cref="PeftException">NotFound for a name not registered; OverBudget when it does not fit beside
        /// the pinned adapters; Io or a format error when its files changed since registration.</exception>
        public Lease Acquire(string name)
        {
            byte[] n = Utf8.Required(name, "name");
            LeaseHandle h;
            PeftException.Check(Native.peft_registry_acquire(Handle, n, out h));
            return new Lease(h);
        }

        /// <summary>Evicts every loaded adapter that nothing pins.</summary>
        public void Trim()
        {
            PeftException.Check(Native.peft_registry_trim(Handle));
        }

        /// <summary>Changes the budget, evicting unpinned adapters until the loaded bytes fit.</summary>
        /// <exception cref="PeftException">OverBudget, with nothing evicted and the budget unchanged, when the pinned
        /// adapters alone take more.</exception>
        public void SetBudget(long budgetBytes)
        {
            if (budgetBytes < 0) throw new ArgumentOutOfRangeException("budgetBytes", budgetBytes, "negative budget");
            PeftException.Check(Native.peft_registry_set_budget(Handle, (ulong)budgetBytes));
        }

        /// <summary>The counters now.</summary>
        public RegistryStats Stats
        {
            get
            {
                var s = new NativeRegistryStats { Size = (ulong)Marshal.SizeOf(typeof(NativeRegistryStats)) };
                PeftException.Check(Native.peft_registry_get_stats(Handle, ref s));
                return new RegistryStats(s);
            }
        }
    }

    /// <summary>
    /// An acquired adapter: loaded and pinned in its registry until disposed. May be used from many threads at
    /// once (<see cref="Serving.LoraApply(string, IList{Lease}, int[], ReadOnlySpan{byte}, DType, long, long, Span{byte}, DType, long)"/>,
    /// <see cref="HostModel.Swap"/>); a <c>Dispose</c> while calls are running takes effect when they return.
    /// Stays valid after its registry is disposed.
    /// </summary>
    public sealed class Lease : NativeObject
    {
        // Fixed for the lease's life; read once so that no borrowed C string outlives a call.
        private readonly string name_;
        private readonly long version_;
        private readonly long bytes_;

        internal Lease(LeaseHandle h) : base(h)
        {
            name_ = Utf8.Decode(Native.peft_lease_name(h));
            version_ = (long)Native.peft_lease_version(h);
            bytes_ = (long)Native.peft_lease_bytes(h);
        }

        internal LeaseHandle Handle { get { return Live<LeaseHandle>(); } }

        /// <summary>The name it was acquired under.</summary>
        public string Name { get { ThrowIfDisposed(); return name_; } }
        /// <summary>The registration it holds: registrations are numbered 1, 2, 3, ..., so a replacement has a higher
        /// version than what it replaced.</summary>
        public long Version { get { ThrowIfDisposed(); return version_; } }
        /// <summary>Bytes of its loaded tensors (what it counts against the budget).</summary>
        public long Bytes { get { ThrowIfDisposed(); return bytes_; } }

        /// <summary>Whether the adapter has a LoRA layer of that name (a HuggingFace module path or weight name, or
        /// the host's name when the registry has a translator).</summary>
        public bool HasModule(string module)
        {
            return Native.peft_lease_has_module(Handle, Utf8.Required(module, "module")) != 0;
        }

        public override string ToString() { return name_ + " v" + version_; }
    }

    /// <summary>Unmerged LoRA: the adapters' contributions added to a layer's output computed with the base weight.</summary>
    public static class Serving
    {
        /// <summary>
        /// For every row i whose adapter <c>a = leases[rowLease[i]]</c> has a LoRA layer <paramref name="module"/>:
        /// <c>y[i] += scaling_a * (x[i] A_a^T) B_a^T</c> (plus <c>scaling_a * lora_B.bias_a</c> with lora_bias), in F32
        /// and rounded once into <paramref name="yDtype"/>, as PEFT's mixed-batch forward. <paramref name="x"/> is
        /// <paramref name="rows"/> x <paramref name="inFeatures"/> and <paramref name="y"/> is <paramref name="rows"/> x
        /// <paramref name="outFeatures"/>, row-major, of F32, BF16 or F16. <paramref name="rowLease"/> holds one index
        /// into <paramref name="leases"/> per row, or -1 for no adapter; null when every row uses <c>leases[0]</c>.
        /// Thread-safe: calls writing different outputs may run at once with the same leases.
        /// </summary>
        /// <exception cref="PeftException">ShapeMismatch naming the adapter whose layer has other features; Unsupported
        /// for DoRA, embedding and Conv2d layers; InvalidArgument for an index out of range. <paramref name="y"/> is
        /// unchanged on failure.</exception>
        public static unsafe void LoraApply(string module, IList<Lease> leases, int[] rowLease, ReadOnlySpan<byte> x, DType xDtype,
                                            long rows, long inFeatures, Span<byte> y, DType yDtype, long outFeatures)
        {
            byte[] m = Utf8.Required(module, "module");
            if (leases == null) throw new ArgumentNullException("leases");
            if (rows < 0) throw new ArgumentOutOfRangeException("rows", rows, "negative");
            if (inFeatures < 0) throw new ArgumentOutOfRangeException("inFeatures", inFeatures, "negative");
            if (outFeatures < 0) throw new ArgumentOutOfRangeException("outFeatures", outFeatures, "negative");
            RequireFloatDType(xDtype, "xDtype");
            RequireFloatDType(yDtype, "yDtype");
            RequireBytes(x.Length, Peft.ByteSize(xDtype, checked(rows * inFeatures)), "x", rows + " x " + inFeatures, xDtype);
            RequireBytes(y.Length, Peft.ByteSize(yDtype, checked(rows * outFeatures)), "y", rows + " x " + outFeatures, yDtype);
            if (rowLease != null && rowLease.Length != rows)
                throw new ArgumentException("rowLease has " + rowLease.Length + " entries for " + rows + " rows", "rowLease");

            int count = leases.Count;
            var handles = new LeaseHandle[count];
            var pointers = new IntPtr[Math.Max(count, 1)];
            var added = new bool[count];
            try
            {
                // The leases' handles are referenced by hand: they travel inside an array the marshaller does not see.
                for (int i = 0; i < count; i++)
                {
                    if (leases[i] == null) throw new ArgumentNullException("leases", "lease " + i + " is null");
                    handles[i] = leases[i].Handle;
                    handles[i].DangerousAddRef(ref added[i]);
                    pointers[i] = handles[i].DangerousGetHandle();
                }
                fixed (IntPtr* p = pointers)
                fixed (int* r = rowLease)
                fixed (byte* xp = &MemoryMarshal.GetReference(x))
                fixed (byte* yp = &MemoryMarshal.GetReference(y))
                {
                    PeftException.Check(Native.peft_lora_apply(m, p, (UIntPtr)count, r, xp, (int)xDtype, (ulong)rows, (ulong)inFeatures,
                                                               yp, (int)yDtype, (ulong)outFeatures));
                }
            }
            finally
            {
                for (int i = 0; i < count; i++)
                    if (added[i]) handles[i].DangerousRelease();
            }
        }

        /// <summary>LoraApply on F32 activations and outputs.</summary>
        public static void LoraApply(string module, IList<Lease> leases, int[] rowLease, ReadOnlySpan<float> x, long rows, long inFeatures,
                                     Span<float> y, long outFeatures)
        {
            LoraApply(module, leases, rowLease, MemoryMarshal.AsBytes(x), DType.F32, rows, inFeatures, MemoryMarshal.AsBytes(y), DType.F32,
                      outFeatures);
        }

        /// <summary>LoraApply of one adapter to every row, on F32 activations and outputs.</summary>
        public static void LoraApply(string module, Lease lease, ReadOnlySpan<float> x, long rows, long inFeatures, Span<float> y,
                                     long outFeatures)
        {
            if (lease == null) throw new ArgumentNullException("lease");
            LoraApply(module, new[] { lease }, null, x, rows, inFeatures, y, outFeatures);
        }

        /// <summary>The dtypes of host buffers (activations, outputs, weights, biases): F32, BF16 and F16.</summary>
        internal static void RequireFloatDType(DType dtype, string what)
        {
            if (dtype != DType.F32 && dtype != DType.BF16 && dtype != DType.F16)
                throw new PeftException(ErrorCode.Unsupported, what + " must be F32, BF16 or F16, not " + Peft.DTypeName(dtype));
        }

        internal static void RequireBytes(long have, long need, string what, string shape, DType dtype)
        {
            if (have != need)
                throw new ArgumentException(what + " has " + have + " bytes; " + shape + " " + Peft.DTypeName(dtype) + " elements take " + need, what);
        }
    }

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
        /// [num, dim] for embeddings, [out, in, kh, kw] for Conv2d) and its layer's bias (needed by adapters with
        /// lora_bias; its output features: shape[0], or shape[1] for Conv1D). Both arrays are pinned until the host
        /// model is released. The library is told the bias's length and never writes past it: a <see cref="Swap"/>
        /// of an adapter whose layer has another number of output features throws ShapeMismatch.</summary>
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
}
