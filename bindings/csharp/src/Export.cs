// Export and combination: adapters written as PEFT's save_pretrained writes them.
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
    }

    /// <summary>Options of export and combination: output dtype and target PEFT version. One thread at a time.</summary>
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

        internal static ExportOptionsHandle HandleOf(ExportOptions options)
        {
            return options == null ? PeftHandle.Null<ExportOptionsHandle>() : options.Handle;
        }
    }

    /// <summary>Writing adapters as PEFT adapter folders (adapter_model.safetensors + adapter_config.json,
    /// atomically). Only reads the adapters: may run concurrently on the same adapters.</summary>
    public static class Export
    {
        /// <summary>Writes <paramref name="adapter"/> into <paramref name="outDir"/> (created if needed).</summary>
        public static void Save(Adapter adapter, string outDir, ExportOptions options = null)
        {
            if (adapter == null) throw new ArgumentNullException("adapter");
            PeftException.Check(Native.peft_adapter_export(adapter.Handle, Utf8.Required(outDir, "outDir"), ExportOptions.HandleOf(options)));
        }

        /// <summary>Combines adapters with weights into a new adapter folder as PEFT's add_weighted_adapter does.</summary>
        public static unsafe void Combine(IList<Adapter> adapters, IList<double> weights, CombineMethod method, string outDir,
                                          ExportOptions options = null)
        {
            if (adapters == null) throw new ArgumentNullException("adapters");
            if (weights == null) throw new ArgumentNullException("weights");
            if (adapters.Count != weights.Count)
                throw new ArgumentException(adapters.Count + " adapters but " + weights.Count + " weights", "weights");
            byte[] o = Utf8.Required(outDir, "outDir");
            int count = adapters.Count;
            var handles = new AdapterHandle[count];
            var pointers = new IntPtr[Math.Max(count, 1)];
            var w = new double[Math.Max(count, 1)];
            var added = new bool[count];
            try
            {
                // The adapters' handles are referenced by hand: they travel inside an array the marshaller does not see.
                for (int i = 0; i < count; i++)
                {
                    if (adapters[i] == null) throw new ArgumentNullException("adapters", "adapter " + i + " is null");
                    handles[i] = adapters[i].Handle;
                    handles[i].DangerousAddRef(ref added[i]);
                    pointers[i] = handles[i].DangerousGetHandle();
                    w[i] = weights[i];
                }
                fixed (IntPtr* p = pointers)
                {
                    PeftException.Check(Native.peft_adapter_combine(p, w, (UIntPtr)count, (int)method, o, ExportOptions.HandleOf(options)));
                }
            }
            finally
            {
                for (int i = 0; i < count; i++)
                    if (added[i]) handles[i].DangerousRelease();
            }
        }
    }
}
