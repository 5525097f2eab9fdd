// Control vectors through the binding (ControlVector, ControlRecord): building and reading back, saving to GGUF and
// safetensors and opening again, llama.cpp's float arithmetic of Add and Apply, the exact removal, error codes.
using System;
using System.Linq;

namespace PeftC.Tests
{
    public class ControlTests
    {
        private static readonly float[] D1 = { 0.1f, -0.25f, 1.5f, 3.0e-3f };
        private static readonly float[] D3 = { -1.0f, 0.7f, 0.0f, 2.5f };

        private static int Bits(float x) { return BitConverter.ToInt32(BitConverter.GetBytes(x), 0); }

        private static ControlVector Sample()
        {
            ControlVector v = ControlVector.Create(4, "test-model");
            v.SetDirection(1, D1);
            v.SetDirection(3, D3);
            return v;
        }

        private static void CheckSample(ControlVector v, string what)
        {
            Assert.Equal(4L, v.NEmbd, what + " n_embd");
            Assert.Equal("test-model", v.ModelHint, what + " model hint");
            Assert.Equal(2, v.LayerCount, what + " layer count");
            Assert.Equal(1L, v.Layer(0), what + " layer 0");
            Assert.Equal(3L, v.Layer(1), what + " layer 1");
            Assert.Throws<ArgumentOutOfRangeException>(() => v.Layer(2), what + " layer 2");
            Assert.SequenceEqual(new long[] { 1, 3 }, v.Layers(), what + " layers");
            Assert.SequenceEqual(D1, v.Direction(1), what + " direction 1");
            Assert.SequenceEqual(D3, v.Direction(3), what + " direction 3");
            Assert.True(v.Direction(2) == null, what + " direction 2 is null");
        }

        [Test]
        public void CreateAndReadBack()
        {
            using (ControlVector v = Sample()) CheckSample(v, "new");
            using (ControlVector w = ControlVector.Create(4))
            {
                Assert.Equal("", w.ModelHint, "no hint");
                Assert.Equal(0, w.Layers().Length, "no layers");
                byte[] raw = new[] { 0.5, -2.0, 1e-3, 8.0 }.SelectMany(x => BitConverter.GetBytes(x)).ToArray();
                w.SetDirection(5, raw, DType.F64);
                Assert.SequenceEqual(new[] { 0.5f, -2.0f, 1e-3f, 8.0f }, w.Direction(5), "F64 direction");
                Assert.Throws<ArgumentException>(() => w.SetDirection(6, new float[3]), "three values");
            }
        }

        [Test]
        public void SaveAndOpenBothFormats()
        {
            using (var dir = new TempDir())
            using (ControlVector v = Sample())
            {
                foreach (var f in new[] { Tuple.Create("cv.gguf", FileFormat.Gguf), Tuple.Create("cv.safetensors", FileFormat.Safetensors) })
                {
                    v.Save(dir[f.Item1], f.Item2);
                    using (ControlVector back = ControlVector.Open(dir[f.Item1])) CheckSample(back, f.Item1);
                }
            }
        }

        [Test]
        public void AddIsFloatArithmetic()
        {
            float[] s3 = { 0.3f, 0.1f, -7.0f, 1e-7f };
            float[] s4 = { 1, 2, 3, 4 };
            using (ControlVector dst = Sample())
            using (ControlVector src = ControlVector.Create(4))
            using (ControlVector other = ControlVector.Create(5))
            {
                src.SetDirection(3, s3);
                src.SetDirection(4, s4);
                dst.Add(src, 0.5);
                float half = 0.5f;
                Assert.SequenceEqual(new long[] { 1, 3, 4 }, dst.Layers(), "layers");
                Assert.SequenceEqual(D1, dst.Direction(1), "layer 1 unchanged");
                Assert.SequenceEqual(Enumerable.Range(0, 4).Select(i => (float)(D3[i] + (float)(s3[i] * half))), dst.Direction(3), "layer 3");
                Assert.SequenceEqual(Enumerable.Range(0, 4).Select(i => (float)(0f + (float)(s4[i] * half))), dst.Direction(4), "layer 4");
                dst.Add(dst, 1.0);  // src may be the vector itself
                Assert.SequenceEqual(s4.Select(x => x * half * 2f), dst.Direction(4), "self add");
                Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => dst.Add(other, 1.0), "other n_embd");
            }
        }

        [Test]
        public void ApplyAndRemoveExactly()
        {
            float[] original = { 1, 2, -3, 0.125f, 10, -0.5f, 0.333f, 7 };
            using (ControlVector v = Sample())
            {
                float[] buf = (float[])original.Clone();
                using (ControlRecord record = v.Apply(3, 2.0, buf))
                {
                    Assert.SequenceEqual(original.Select((x, i) => (float)(x + (float)(D3[i % 4] * 2f))), buf, "applied");
                    record.Remove(buf);
                    Assert.SequenceEqual(original.Select(Bits), buf.Select(Bits), "restored");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => record.Remove(buf), "spent record");
                }

                Assert.True(v.Apply(1, 2.0, buf, false) == null, "no record");
                Assert.SequenceEqual(original.Select((x, i) => (float)(x + (float)(D1[i % 4] * 2f))), buf, "applied without record");

                buf = (float[])original.Clone();
                using (ControlRecord record = v.Apply(2, 2.0, buf))
                {
                    Assert.SequenceEqual(original, buf, "no direction for layer 2");
                    record.Remove(buf);
                }
                Assert.Throws<ArgumentException>(() => v.Apply(3, 1.0, new float[6]), "not whole rows");
            }
        }

        [Test]
        public void ErrorsMapToCodes()
        {
            using (var dir = new TempDir())
            using (ControlVector v = Sample())
            {
                v.SetDirection(0, D1);
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => v.Save(dir["zero.gguf"], FileFormat.Gguf), "layer 0 in GGUF");
                v.Save(dir["zero.safetensors"], FileFormat.Safetensors);
                Assert.ThrowsPeft(ErrorCode.Io, () => ControlVector.Open(dir["missing.gguf"]), "missing file");
                Assert.ThrowsPeft(ErrorCode.NonFinite, () => v.SetDirection(2, new[] { 1f, float.NaN, 0f, 0f }), "NaN");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => v.SetDirection(-1, D1), "negative layer");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => ControlVector.Create(0), "n_embd 0");
                v.Dispose();
                Assert.Throws<ObjectDisposedException>(() => v.Direction(1), "after Dispose");
            }
        }
    }
}
