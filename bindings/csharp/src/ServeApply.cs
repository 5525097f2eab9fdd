// Serving, unmerged LoRA on activations (peft_c.h, section "serving"; src/capi/serve_apply_api.cpp):
// Serving.LoraApply.
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;

namespace PeftC
{
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
        /// <exception cref="PeftException">ShapeMismatch naming the adapter whose layer has other features; NotFound for
        /// a DoRA layer whose base weight was not given with <see cref="Registry.SetBaseWeight(string, float[], long[], float[])"/>
        /// (for DoRA, <paramref name="y"/> is the base output with its bias); Unsupported for embedding and Conv2d
        /// layers; InvalidArgument for an index out of range. <paramref name="y"/> is
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
}
