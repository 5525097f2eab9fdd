// GGUF files through the binding: file format and version, typed metadata, ggml types, tensors (shape outermost
// first, F16 converted on read, a Q8_0 tensor readable only as bytes). The file is
// tests/fixtures/gguf/bindings_sample.gguf (written by bindings_sample.py next to it, in the byte layout of
// tests/capi/test_gguf.c); the expected values below are the ones that script packs.
using System;
using System.IO;
using System.Linq;

namespace PeftC.Tests
{
    public class GgufTests
    {
        private static string Sample { get { return Fixtures.Path_("gguf", "bindings_sample.gguf"); } }

        private static Checkpoint[] OpenEveryWay()
        {
            return new[]
            {
                Checkpoint.Open(Sample), Checkpoint.Open(Sample, new OpenOptions { UsePread = true }),
                Checkpoint.FromBytes(File.ReadAllBytes(Sample)),
            };
        }

        [Test]
        public void FormatVersionAndMetadata()
        {
            var expected = new object[]
            {
                "general.architecture", GgufType.String, "llama",
                "general.alignment", GgufType.U32, 64u,
                "a.u8", GgufType.U8, (byte)200,
                "a.i8", GgufType.I8, (sbyte)-2,
                "a.u16", GgufType.U16, (ushort)0x1234,
                "a.i16", GgufType.I16, (short)-1,
                "a.i32", GgufType.I32, -7,
                "a.f32", GgufType.F32, 1.5f,
                "a.bool", GgufType.Bool, true,
                "a.u64", GgufType.U64, ulong.MaxValue,
                "a.i64", GgufType.I64, -5L,
                "a.f64", GgufType.F64, Math.PI,
            };
            foreach (Checkpoint ckpt in OpenEveryWay())
            {
                using (ckpt)
                {
                    Assert.Equal(FileFormat.Gguf, ckpt.FileFormat(), "format");
                    Assert.Equal(3, ckpt.GgufVersion().Value, "version");
                    Assert.Throws<ArgumentOutOfRangeException>(() => ckpt.FileFormat(1), "file 1");
                    var meta = ckpt.GgufMetadata();
                    Assert.Equal(14, meta.Length, "entries");
                    for (int i = 0; i < expected.Length / 3; i++)
                    {
                        string key = (string)expected[3 * i];
                        Assert.Equal(key, meta[i].Key, "key " + i);
                        Assert.Equal((GgufType)expected[3 * i + 1], meta[i].Value.Type, key + " type");
                        Assert.Equal(expected[3 * i + 2], meta[i].Value.Value, key + " value");
                        Assert.Equal(expected[3 * i + 2].GetType(), meta[i].Value.Value.GetType(), key + " CLR type");
                        Assert.True(meta[i].Value.Items == null && meta[i].Value.ElementType == null, key + " is a scalar");
                    }
                    GgufValue tokens = meta[12].Value, ids = meta[13].Value;
                    Assert.Equal("a.tokens", meta[12].Key, "key 12");
                    Assert.Equal(GgufType.Array, tokens.Type, "a.tokens type");
                    Assert.Equal(GgufType.String, tokens.ElementType.Value, "a.tokens element type");
                    Assert.SequenceEqual(new[] { "<s>", "", "hello" }, tokens.Items.Select(v => v.AsString()), "a.tokens");
                    Assert.Equal("a.ids", meta[13].Key, "key 13");
                    Assert.Equal(GgufType.I32, ids.ElementType.Value, "a.ids element type");
                    Assert.SequenceEqual(new object[] { 10, -20 }, ids.Items.Select(v => v.Value), "a.ids");
                    Assert.True(tokens.Value == null, "an array has no scalar value");
                    // The safetensors metadata is absent from a GGUF file.
                    Assert.True(ckpt.Metadata() == null, "safetensors metadata");
                }
            }
        }

        [Test]
        public void ValueAccessorsAndErrors()
        {
            using (Checkpoint ckpt = Checkpoint.Open(Sample))
            {
                Assert.Equal(ulong.MaxValue, ckpt.GetGgufValue("a.u64").AsUInt64(), "a.u64");
                Assert.Throws<InvalidCastException>(() => ckpt.GetGgufValue("a.u64").AsInt64(), "a.u64 as long");
                Assert.Equal(-7L, ckpt.GetGgufValue("a.i32").AsInt64(), "a.i32");
                Assert.Throws<InvalidCastException>(() => ckpt.GetGgufValue("a.i32").AsUInt64(), "a.i32 as ulong");
                Assert.Equal(200L, ckpt.GetGgufValue("a.u8").AsInt64(), "a.u8");
                Assert.Equal(1.5, ckpt.GetGgufValue("a.f32").AsDouble(), "a.f32");
                Assert.Throws<InvalidCastException>(() => ckpt.GetGgufValue("a.f32").AsInt64(), "a.f32 as long");
                Assert.True(ckpt.GetGgufValue("a.bool").AsBoolean(), "a.bool");
                Assert.Equal("llama", ckpt.GetGgufValue("general.architecture").AsString(), "architecture");
                Assert.Throws<InvalidCastException>(() => ckpt.GetGgufValue("a.u8").AsString(), "a.u8 as string");
                Assert.Equal("[<s>, , hello]", ckpt.GetGgufValue("a.tokens").ToString(), "a.tokens text");

                PeftException e = Assert.ThrowsPeft(ErrorCode.NotFound, () => ckpt.GetGgufValue("no.such.key"), "missing key");
                Assert.True(e.Message.Contains("no.such.key"), "the error names the key: " + e.Message);
                Assert.Throws<ArgumentOutOfRangeException>(() => ckpt.GetGgufValue("a.u8", 1), "file 1");
                Assert.Throws<ArgumentNullException>(() => ckpt.GetGgufValue(null), "null key");
            }
        }

        [Test]
        public void Tensors()
        {
            foreach (Checkpoint ckpt in OpenEveryWay())
            {
                using (ckpt)
                {
                    Assert.SequenceEqual(new[] { "w", "q" }, ckpt.TensorNames(), "names");
                    TensorInfo w = ckpt.Info("w"), q = ckpt.Info("q");
                    Assert.Equal(DType.F16, w.DType.Value, "w dtype");
                    Assert.Equal(1, w.GgmlType.Value, "w ggml type");
                    Assert.SequenceEqual(new long[] { 2, 3 }, w.Shape, "w shape");
                    Assert.SequenceEqual(new float[] { 1, 2, 3, 4, 5, 6 }, ckpt.ReadSingle("w"), "w values");

                    Assert.True(q.DType == null, "q has no dtype");
                    Assert.Equal("Q8_0", Ggml.TypeName(q.GgmlType.Value), "q ggml type");
                    Assert.Equal("q Q8_0[1, 32]", q.ToString(), "q text");
                    Assert.SequenceEqual(new long[] { 1, 32 }, q.Shape, "q shape");
                    Assert.Equal(64L, q.DataBegin, "q begin");
                    Assert.Equal(98L, q.DataEnd, "q end");
                    int block, size;
                    Ggml.Geometry(q.GgmlType.Value, out block, out size);
                    Assert.Equal(q.ByteLength, q.ElementCount / block * size, "q bytes from its geometry");
                    byte[] raw = ckpt.View(q.Index).ToArray();
                    Assert.Equal(34, raw.Length, "q view length");
                    Assert.SequenceEqual(new byte[] { 0x00, 0x3C }, raw.Take(2), "q scale 1.0");
                    Assert.SequenceEqual(Enumerable.Range(-16, 32).Select(x => (sbyte)x), raw.Skip(2).Select(b => (sbyte)b), "q quants");
                    PeftException e = Assert.ThrowsPeft(ErrorCode.Unsupported, () => ckpt.ReadSingle("q"), "q read");
                    Assert.True(e.Message.Contains("block-quantized"), "q read error: " + e.Message);
                }
            }
        }

        [Test]
        public void SafetensorsFileHasNoGgufSide()
        {
            using (Checkpoint ckpt = Checkpoint.Open(Fixtures.Safetensors("metadata_one.safetensors")))
            {
                Assert.Equal(FileFormat.Safetensors, ckpt.FileFormat(), "format");
                Assert.True(ckpt.GgufVersion() == null, "no GGUF version");
                Assert.True(ckpt.GgufMetadata() == null, "no GGUF metadata");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => ckpt.GetGgufValue("general.architecture"), "GGUF key");
                Assert.True(ckpt.TensorCount > 0, "tensors");
                Assert.True(ckpt.Tensors().All(t => t.GgmlType == null && t.DType != null), "dtypes, no ggml types");
            }
        }

        [Test]
        public void GgmlTypes()
        {
            Assert.Equal("Q4_K", Ggml.TypeName(12), "12");
            Assert.True(Ggml.TypeName(4) == null, "the removed Q4_2");
            Assert.True(Ggml.TypeName(-1) == null, "-1");
            Assert.Equal(30, Ggml.ParseType("BF16"), "BF16");
            int parsed;
            Assert.False(Ggml.TryParseType("bf16", out parsed), "bf16");
            Assert.Throws<ArgumentException>(() => Ggml.ParseType("bf16"), "bf16");
            int block, size;
            Ggml.Geometry(0, out block, out size);
            Assert.SequenceEqual(new[] { 1, 4 }, new[] { block, size }, "F32 geometry");
            Ggml.Geometry(8, out block, out size);
            Assert.SequenceEqual(new[] { 32, 34 }, new[] { block, size }, "Q8_0 geometry");
            Ggml.Geometry(14, out block, out size);
            Assert.SequenceEqual(new[] { 256, 210 }, new[] { block, size }, "Q6_K geometry");
            Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Ggml.Geometry(31, out block, out size), "31");
        }
    }
}
