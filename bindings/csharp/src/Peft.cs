// Library-wide functions: versions, dtypes, error code names and conversions.
using System;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>The safetensors dtypes (the PEFT_DTYPE_* values, in the reference's order).</summary>
    public enum DType
    {
        Bool = 0,
        F4 = 1,
        F6E2M3 = 2,
        F6E3M2 = 3,
        U8 = 4,
        I8 = 5,
        F8E5M2 = 6,
        F8E4M3 = 7,
        F8E8M0 = 8,
        F8E4M3Fnuz = 9,
        F8E5M2Fnuz = 10,
        I16 = 11,
        U16 = 12,
        F16 = 13,
        BF16 = 14,
        I32 = 15,
        U32 = 16,
        F32 = 17,
        C64 = 18,
        F64 = 19,
        I64 = 20,
        U64 = 21,
    }

    /// <summary>Versions, dtype facts and conversions of the loaded peft_c library.</summary>
    public static class Peft
    {
        /// <summary>The ABI version this binding was written for; the library's SONAME number.</summary>
        public const int CompiledAbiVersion = 1;

        /// <summary>Number of dtypes (valid DType values are 0 .. DTypeCount - 1).</summary>
        public const int DTypeCount = 22;

        /// <summary>The library's version string, e.g. "0.1.0".</summary>
        public static string Version { get { return Utf8.Decode(Native.peft_version()); } }

        /// <summary>The library's version as major * 10000 + minor * 100 + patch.</summary>
        public static int VersionNumber { get { return checked((int)Native.peft_version_number()); } }

        /// <summary>The ABI version of the library that is loaded.</summary>
        public static int AbiVersion { get { return checked((int)Native.peft_abi_version()); } }

        /// <summary>The kernel table the library computes with: "avx512", "avx2" or "portable", chosen once per
        /// process (the PEFT_C_KERNELS environment variable can lower it; see peft_kernels in the header).</summary>
        public static string Kernels { get { return Utf8.Decode(Native.peft_kernels()); } }

        /// <summary>The name of an error code, e.g. "INVALID_OFFSET"; "UNKNOWN" for a value that is no code.</summary>
        public static string ErrorCodeName(ErrorCode code)
        {
            return Utf8.Decode(Native.peft_error_code_name((int)code));
        }

        /// <summary>The safetensors name of a dtype, e.g. "BF16".</summary>
        /// <exception cref="ArgumentOutOfRangeException">For a value that is no dtype.</exception>
        public static string DTypeName(DType dtype)
        {
            string name = Utf8.Decode(Native.peft_dtype_name((int)dtype));
            if (name == null) throw new ArgumentOutOfRangeException("dtype", dtype, "not a dtype");
            return name;
        }

        /// <summary>The dtype of a safetensors name (exact and case-sensitive, as the reference reads it).</summary>
        /// <returns>False when the name is no dtype name.</returns>
        public static bool TryParseDType(string name, out DType dtype)
        {
            dtype = 0;
            if (name == null || name.IndexOf('\0') >= 0) return false;
            int value = Native.peft_dtype_from_name(Utf8.Encode(name, "name"));
            if (value < 0) return false;
            dtype = (DType)value;
            return true;
        }

        /// <summary>The dtype of a safetensors name.</summary>
        /// <exception cref="ArgumentException">When the name is no dtype name.</exception>
        public static DType ParseDType(string name)
        {
            DType dtype;
            if (!TryParseDType(name, out dtype)) throw new ArgumentException("not a dtype name: " + name, "name");
            return dtype;
        }

        /// <summary>Size of one element in bits (4 for F4, 6 for the F6 types).</summary>
        public static int DTypeBits(DType dtype)
        {
            uint bits = Native.peft_dtype_bits((int)dtype);
            if (bits == 0) throw new ArgumentOutOfRangeException("dtype", dtype, "not a dtype");
            return (int)bits;
        }

        /// <summary>Bytes taken by <paramref name="count"/> elements of a dtype of whole bytes.</summary>
        internal static long ByteSize(DType dtype, long count)
        {
            int bits = DTypeBits(dtype);
            if (bits % 8 != 0) throw new ArgumentException(DTypeName(dtype) + " is not a whole-byte dtype", "dtype");
            return checked(count * (bits / 8));
        }

        /// <summary>Converts <paramref name="count"/> elements from one dtype to another (round to nearest even;
        /// see peft_convert in peft_c.h for the pairs supported).</summary>
        /// <exception cref="PeftException">Unsupported for a pair that is not converted.</exception>
        public static unsafe void Convert(DType srcDtype, ReadOnlySpan<byte> src, DType dstDtype, Span<byte> dst, long count)
        {
            if (count < 0) throw new ArgumentOutOfRangeException("count");
            CheckRoom(srcDtype, src.Length, count, "src");
            CheckRoom(dstDtype, dst.Length, count, "dst");
            fixed (byte* s = &MemoryMarshal.GetReference(src))
            fixed (byte* d = &MemoryMarshal.GetReference(dst))
            {
                PeftException.Check(Native.peft_convert((int)srcDtype, s, (int)dstDtype, d, (ulong)count));
            }
        }

        /// <summary>Converts a whole buffer of <paramref name="srcDtype"/> elements into a new float array.</summary>
        public static float[] ToSingle(DType srcDtype, ReadOnlySpan<byte> src)
        {
            long bits = DTypeBits(srcDtype);
            if (bits % 8 != 0 || src.Length % (bits / 8) != 0)
                throw new ArgumentException("src is not whole " + DTypeName(srcDtype) + " elements", "src");
            var result = new float[src.Length / (bits / 8)];
            Convert(srcDtype, src, DType.F32, MemoryMarshal.AsBytes(result.AsSpan()), result.Length);
            return result;
        }

        // Refuses a buffer smaller than count elements, so that C never reads or writes past a span.
        private static void CheckRoom(DType dtype, int length, long count, string what)
        {
            long bits = DTypeBits(dtype);
            long needed = checked((count * bits + 7) / 8);
            if (length < needed)
                throw new ArgumentException(what + " holds " + length + " bytes; " + count + " " + DTypeName(dtype) +
                                            " elements need " + needed, what);
        }
    }
}
