using System;
using System.Linq;
using System.Runtime.InteropServices;
using System.Text;

namespace PeftC.Tests
{
    public class BasicsTests
    {
        [Test]
        public void VersionsAgree()
        {
            string[] parts = Peft.Version.Split('.');
            Assert.Equal(3, parts.Length, "version parts");
            Assert.Equal(int.Parse(parts[0]) * 10000 + int.Parse(parts[1]) * 100 + int.Parse(parts[2]), Peft.VersionNumber);
            Assert.Equal(Peft.CompiledAbiVersion, Peft.AbiVersion, "ABI version");
        }

        [Test]
        public void KernelTableIsNamed()
        {
            string kernels = Peft.Kernels;
            Assert.True(kernels == "portable" || kernels == "avx2" || kernels == "avx512", "kernel table " + kernels);
            if (System.Environment.GetEnvironmentVariable("PEFT_C_KERNELS") == "portable")
                Assert.Equal("portable", kernels, "PEFT_C_KERNELS=portable");
        }

        // The enum mirrors the C codes: every member's name, spelled in C style, is the library's name of its value.
        [Test]
        public void ErrorCodesMirrorTheHeader()
        {
            foreach (ErrorCode code in Enum.GetValues(typeof(ErrorCode)))
            {
                string cName = string.Concat(code.ToString().Select((c, i) =>
                    i > 0 && char.IsUpper(c) && !char.IsDigit(code.ToString()[i - 1]) ? "_" + c : c.ToString())).ToUpperInvariant();
                if (code == ErrorCode.InvalidHeaderUtf8) cName = "INVALID_HEADER_UTF8";
                Assert.Equal(cName, Peft.ErrorCodeName(code), "name of " + (int)code);
            }
            Assert.Equal("UNKNOWN", Peft.ErrorCodeName((ErrorCode)12345));
        }

        [Test]
        public void DTypesMirrorTheHeader()
        {
            var names = new[] { "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
                                "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64" };
            Assert.Equal(Peft.DTypeCount, names.Length);
            Assert.Equal(Peft.DTypeCount, Enum.GetValues(typeof(DType)).Length);
            for (int i = 0; i < names.Length; i++)
            {
                Assert.Equal(names[i], Peft.DTypeName((DType)i));
                Assert.Equal((DType)i, Peft.ParseDType(names[i]));
            }
            Assert.Equal(4, Peft.DTypeBits(DType.F4));
            Assert.Equal(6, Peft.DTypeBits(DType.F6E2M3));
            Assert.Equal(16, Peft.DTypeBits(DType.BF16));
            Assert.Equal(64, Peft.DTypeBits(DType.C64));
            DType ignored;
            Assert.False(Peft.TryParseDType("f32", out ignored), "lowercase");
            Assert.False(Peft.TryParseDType(null, out ignored), "null");
            Assert.Throws<ArgumentException>(() => Peft.ParseDType("F33"));
            Assert.Throws<ArgumentOutOfRangeException>(() => Peft.DTypeName((DType)22));
            Assert.Throws<ArgumentOutOfRangeException>(() => Peft.DTypeBits((DType)(-1)));
        }

        [Test]
        public void ConvertRoundsToNearestEven()
        {
            // 1 + 2^-8 lies halfway between two BF16 values: ties go to the even one (1.0); 1 + 3 * 2^-8 goes up.
            float[] src = { 1.0f, 1.00390625f, 1.01171875f, -2.5f, float.PositiveInfinity };
            var bf16 = new byte[src.Length * 2];
            Peft.Convert(DType.F32, MemoryMarshal.AsBytes(src.AsSpan()), DType.BF16, bf16, src.Length);
            ushort[] bits = MemoryMarshal.Cast<byte, ushort>(bf16.AsSpan()).ToArray();
            Assert.SequenceEqual(new ushort[] { 0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80 }, bits, "bf16 bits");
            float[] back = Peft.ToSingle(DType.BF16, bf16);
            Assert.SequenceEqual(new[] { 1.0f, 1.0f, 1.015625f, -2.5f, float.PositiveInfinity }, back, "back to f32");
        }

        [Test]
        public void ConvertErrors()
        {
            var src = new byte[8];
            var dst = new byte[8];
            Assert.ThrowsPeft(ErrorCode.Unsupported, () => Peft.Convert(DType.F32, src, DType.I32, dst, 2), "F32 -> I32");
            Assert.Throws<ArgumentException>(() => Peft.Convert(DType.F32, src, DType.F64, dst, 2), "dst too small");
            Assert.Throws<ArgumentException>(() => Peft.Convert(DType.F32, src, DType.F32, dst, 3), "src too small");
            Assert.Throws<ArgumentOutOfRangeException>(() => Peft.Convert(DType.F32, src, DType.F32, dst, -1));
            Assert.Throws<ArgumentException>(() => Peft.ToSingle(DType.F32, new byte[3]));
            Peft.Convert(DType.F32, Span<byte>.Empty, DType.F16, Span<byte>.Empty, 0);  // nothing to do: no error
        }

        [Test]
        public void PeftExceptionCarriesCodeAndName()
        {
            PeftException e = Assert.ThrowsPeft(ErrorCode.Io, () => Checkpoint.Open("/nonexistent/peft_c/file.safetensors"));
            Assert.Equal("IO", e.CodeName);
            Assert.True(e.Message.Contains("/nonexistent/peft_c/file.safetensors"), "the message names the file: " + e.Message);
            Assert.True(e.ToString().Contains("IO"), "ToString names the code");
        }

        [Test]
        public void StringsWithNulOrLoneSurrogatesAreRefused()
        {
            Assert.Throws<ArgumentException>(() => Checkpoint.Open("a\0b"));
            Assert.Throws<ArgumentException>(() => Checkpoint.Open("a\ud800b"));
            Assert.Throws<ArgumentNullException>(() => Checkpoint.Open(null));
        }
    }
}
