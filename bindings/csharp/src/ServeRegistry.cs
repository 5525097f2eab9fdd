// Serving, the registry part (peft_c.h, section "serving"; src/capi/serve_registry_api.cpp): adapters
// registered under names and loaded under a byte budget (Registry, RegistryStats), and the leases that pin them.
using System;
using System.Collections.Generic;
using System.Buffers;
using System.Runtime.InteropServices;

namespace PeftC
{
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
        /// safetensors header only. <paramref name="baseDir"/>, <paramref name="translator"/> and <paramref name="lenient"/> are as for
        /// <see cref="Adapter.Open"/>.</summary>
        /// <exception cref="PeftException">The errors of <see cref="Adapter.Open"/>; Unsupported for tensors that are
        /// not F64/F32/F16/BF16. The registry is unchanged on failure.</exception>
        public Registry Register(string name, string dir, string baseDir = null, Translator translator = null,
                                 bool lenient = false)
        {
            byte[] n = Utf8.Required(name, "name");
            byte[] d = Utf8.Required(dir, "dir");
            using (AdapterOptionsHandle o = AdapterOptions(baseDir, translator, lenient))
            {
                PeftException.Check(Native.peft_registry_register(Handle, n, d, o));
            }
            return this;
        }

        /// <summary>As <see cref="Register"/>, from the text of adapter_config.json and the bytes of
        /// adapter_model.safetensors (both copied).</summary>
        public unsafe Registry RegisterMemory(string name, string configJson, ReadOnlySpan<byte> weights, string baseDir = null,
                                              Translator translator = null, bool lenient = false)
        {
            byte[] n = Utf8.Required(name, "name");
            byte[] c = Utf8.Required(configJson, "configJson");
            using (AdapterOptionsHandle o = AdapterOptions(baseDir, translator, lenient))
            fixed (byte* w = &MemoryMarshal.GetReference(weights))
            {
                PeftException.Check(Native.peft_registry_register_memory(Handle, n, c, w, (UIntPtr)weights.Length, o));
            }
            return this;
        }

        private static AdapterOptionsHandle AdapterOptions(string baseDir, Translator translator, bool lenient)
        {
            AdapterOptionsHandle o;
            PeftException.Check(Native.peft_adapter_options_new(out o));
            try
            {
                if (baseDir != null) PeftException.Check(Native.peft_adapter_options_set_base_dir(o, Utf8.Encode(baseDir, "baseDir")));
                if (translator != null) PeftException.Check(Native.peft_adapter_options_set_translator(o, translator.Handle));
                if (lenient) PeftException.Check(Native.peft_adapter_options_set_lenient(o, 1));
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
            IntPtr list;
            PeftException.Check(Native.peft_registry_name_list(Handle, out list));
            return Utf8.TakeList(list);
        }

        /// <summary>What lenient loading ignored when the adapter registered under <paramref name="name"/> now was
        /// registered, as <see cref="Adapter.Warnings"/> gives them; empty for a strict registration.</summary>
        /// <exception cref="PeftException">NotFound for a name not registered.</exception>
        public string[] Warnings(string name)
        {
            IntPtr list;
            PeftException.Check(Native.peft_registry_warning_list(Handle, Utf8.Required(name, "name"), out list));
            return Utf8.TakeList(list);
        }

        /// <summary>The adapter registered under <paramref name="name"/>, loaded if it is not in memory (evicting
        /// unpinned adapters to make room) and pinned until the lease is disposed.</summary>
        /// <exception cref="PeftException">NotFound for a name not registered; OverBudget when it does not fit beside
        /// the pinned adapters; Io or a format error when its files changed since registration.</exception>
        public Lease Acquire(string name)
        {
            byte[] n = Utf8.Required(name, "name");
            RegistryHandle r = Handle;
            LeaseHandle h;
            PeftException.Check(Native.peft_registry_acquire(r, n, out h));
            r.Pins.AddOwner();
            h.Pins = r.Pins;
            return new Lease(h);
        }

        /// <summary>Gives the registry the host's F32 base weight of one layer, which DoRA layers need at
        /// <see cref="Serving.LoraApply(string, IList{Lease}, int[], ReadOnlySpan{float}, long, long, Span{float}, long)"/>
        /// (their weight norm ||W + scaling B A|| per output feature), and the layer's bias, or null for a layer without
        /// one. <paramref name="shape"/> is [out, in] for Linear, [in, out] for GPT-2 Conv1D. For a DoRA layer the
        /// <c>y</c> given to LoraApply is the base output with its bias. <paramref name="name"/> is the weight's name or
        /// its layer's (the registry's translator applies); giving a layer again replaces its buffers.
        /// <para>The library reads the arrays without copying them: they stay pinned until the registry and every lease
        /// of it are released. Change their contents only while no apply runs, then call <see cref="BaseWeightsChanged"/>.</para></summary>
        /// <exception cref="PeftException">ShapeMismatch for a shape that is not two-dimensional, a zero dimension or an
        /// empty bias; UnresolvedKey when the translator does not resolve the name. Whether the shape fits the DoRA
        /// layer is checked by LoraApply (ShapeMismatch).</exception>
        public Registry SetBaseWeight(string name, float[] weight, long[] shape, float[] bias = null)
        {
            if (weight == null) throw new ArgumentNullException("weight");
            if (bias != null && bias.Length == 0) throw new PeftException(ErrorCode.ShapeMismatch, "the bias of \"" + name + "\" has no elements");
            return Pin(name, new Memory<float>(weight).Pin(), weight.Length * 4L, DType.F32, shape,
                       bias == null ? default(MemoryHandle) : new Memory<float>(bias).Pin(), bias == null ? 0 : bias.Length * 4L, DType.F32);
        }

        /// <summary>Gives a base weight of <paramref name="dtype"/> (F32, BF16 or F16) as bytes, and optionally the
        /// layer's bias of <paramref name="biasDtype"/> (whole elements). Both are pinned
        /// (<see cref="Memory{T}.Pin"/>) until the registry and every lease of it are released; otherwise as the
        /// <c>float[]</c> overload.</summary>
        public Registry SetBaseWeight(string name, Memory<byte> weight, DType dtype, long[] shape, Memory<byte> bias = default(Memory<byte>),
                                      DType biasDtype = DType.F32)
        {
            return Pin(name, weight.Pin(), weight.Length, dtype, shape, bias.IsEmpty ? default(MemoryHandle) : bias.Pin(), bias.Length, biasDtype);
        }

        /// <summary>Tells the registry that the contents of the base weights (or biases) it was given changed: every
        /// DoRA layer's scale is computed again, from the buffers as they are then, at its next apply.</summary>
        public void BaseWeightsChanged()
        {
            PeftException.Check(Native.peft_registry_base_weights_changed(Handle));
        }

        // Checks, hands C the pinned addresses, and keeps the pins once C holds them.
        private unsafe Registry Pin(string name, MemoryHandle weight, long weightBytes, DType dtype, long[] shape, MemoryHandle bias,
                                    long biasBytes, DType biasDtype)
        {
            try
            {
                byte[] n = Utf8.Required(name, "name");
                if (shape == null) throw new ArgumentNullException("shape");
                Serving.RequireFloatDType(dtype, "dtype");
                var dims = new ulong[shape.Length];
                long elements = 1;
                for (int i = 0; i < shape.Length; i++)
                {
                    if (shape[i] < 0) throw new ArgumentOutOfRangeException("shape", "dimension " + i + " is negative");
                    dims[i] = (ulong)shape[i];
                    elements = checked(elements * shape[i]);
                }
                Serving.RequireBytes(weightBytes, Peft.ByteSize(dtype, elements), "weight", "[" + string.Join(", ", shape) + "]", dtype);
                ulong biasElements = 0;
                if (bias.Pointer != null)
                {
                    Serving.RequireFloatDType(biasDtype, "biasDtype");
                    long elementBytes = Peft.ByteSize(biasDtype, 1);
                    if (biasBytes % elementBytes != 0)
                        throw new ArgumentException("bias has " + biasBytes + " bytes, not whole " + Peft.DTypeName(biasDtype) + " elements", "bias");
                    biasElements = (ulong)(biasBytes / elementBytes);
                }
                RegistryHandle r = Handle;
                PeftException.Check(Native.peft_registry_set_base_weight(r, n, weight.Pointer, (int)dtype, dims, (UIntPtr)dims.Length, bias.Pointer,
                                                                         (int)biasDtype, biasElements));
                r.Pins.Keep(weight);
                r.Pins.Keep(bias);
                return this;
            }
            catch
            {
                weight.Dispose();
                bias.Dispose();
                throw;
            }
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
}
