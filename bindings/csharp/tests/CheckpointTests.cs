using System;
using System.Collections.Generic;
using System.IO;
using System.Json;
using System.Linq;
using System.Runtime.InteropServices;
using System.Security.Cryptography;

namespace PeftC.Tests
{
    public class CheckpointTests
    {
        internal static string Sha256(ReadOnlySpan<byte> bytes)
        {
            using (var sha = SHA256.Create())
                return string.Concat(sha.ComputeHash(bytes.ToArray()).Select(b => b.ToString("x2")));
        }

        private static IEnumerable<string> FixtureFiles()
        {
            string dir = Fixtures.Path_("safetensors");
            var files = Directory.GetFiles(dir, "*.safetensors").OrderBy(f => f, StringComparer.Ordinal).ToList();
            if (files.Count == 0) throw new SkipException("no safetensors fixtures in " + dir);
            return files;
        }

        // Everything the reference reports about each valid fixture (names, dtypes, shapes, offsets, data hashes,
        // metadata) comes out of every way of opening it.
        [Test]
        public void EveryFixtureMatchesTheReference()
        {
            int checkedFiles = 0;
            foreach (string file in FixtureFiles())
            {
                var expected = JsonValue.Parse(File.ReadAllText(Path.ChangeExtension(file, ".json")));
                var opened = new[]
                {
                    Checkpoint.Open(file), Checkpoint.Open(file, new OpenOptions { UsePread = true }),
                    Checkpoint.FromBytes(File.ReadAllBytes(file)),
                };
                foreach (Checkpoint ckpt in opened)
                {
                    using (ckpt)
                    {
                        string what = Path.GetFileName(file);
                        JsonArray tensors = (JsonArray)expected["tensors"];
                        Assert.Equal(tensors.Count, ckpt.TensorCount, what + " tensor count");
                        Assert.Equal(1, ckpt.FileCount, what + " file count");
                        var byName = new Dictionary<string, JsonValue>();
                        foreach (JsonValue t in tensors) byName[(string)t["name"]] = t;
                        for (int i = 0; i < ckpt.TensorCount; i++)
                        {
                            TensorInfo info = ckpt.Info(i);
                            JsonValue t = byName[info.Name];
                            Assert.Equal(i, ckpt.Find(info.Name), what + " find " + info.Name);
                            Assert.Equal((string)t["dtype"], Peft.DTypeName(info.DType.Value), what + " dtype");
                            Assert.SequenceEqual(((JsonArray)t["shape"]).Select(d => (long)d), info.Shape, what + " shape");
                            Assert.Equal((long)t["data_offsets"][0], info.DataBegin, what + " begin");
                            Assert.Equal((long)t["data_offsets"][1], info.DataEnd, what + " end");
                            Assert.Equal((string)t["sha256"], Sha256(ckpt.View(i)), what + " data of " + info.Name);
                        }
                        JsonValue metadata = expected["metadata"];
                        var actual = ckpt.Metadata();
                        if (metadata == null)
                        {
                            Assert.True(actual == null || actual.Length == 0, what + " has no metadata");
                        }
                        else
                        {
                            var keys = ((JsonObject)metadata).Keys.OrderBy(k => k, StringComparer.Ordinal).ToList();
                            Assert.SequenceEqual(keys, actual.Select(kv => kv.Key), what + " metadata keys");
                            foreach (var kv in actual) Assert.Equal((string)metadata[kv.Key], kv.Value, what + " metadata " + kv.Key);
                        }
                    }
                }
                checkedFiles++;
            }
            Assert.True(checkedFiles > 20, "fixtures checked: " + checkedFiles);
        }

        [Test]
        public void ConvertedReadsMatchTheReferenceValues()
        {
            string file = Fixtures.Safetensors("dtype_bf16.safetensors");
            var expected = JsonValue.Parse(File.ReadAllText(Path.ChangeExtension(file, ".json")));
            using (var ckpt = Checkpoint.Open(file))
            {
                foreach (JsonValue t in (JsonArray)expected["tensors"])
                {
                    double[] values = ckpt.ReadDouble(ckpt.Find((string)t["name"]));
                    float[] singles = ckpt.ReadSingle((string)t["name"]);
                    var want = ((JsonArray)t["f64"]).Select(v => v.JsonType == JsonType.String ? ParseSpecial((string)v) : (double)v).ToList();
                    Assert.Equal(want.Count, values.Length, "element count");
                    for (int i = 0; i < want.Count; i++)
                    {
                        Assert.True(want[i].Equals(values[i]), "f64 value " + i + ": " + want[i] + " vs " + values[i]);
                        Assert.True(((float)want[i]).Equals(singles[i]), "f32 value " + i);
                    }
                    byte[] raw = ckpt.ReadBytes(ckpt.Find((string)t["name"]), DType.BF16);
                    Assert.True(ckpt.View(ckpt.Find((string)t["name"])).SequenceEqual(raw), "same-dtype read is a copy");
                }
            }
        }

        private static double ParseSpecial(string s)
        {
            switch (s)
            {
                case "inf": return double.PositiveInfinity;
                case "-inf": return double.NegativeInfinity;
                case "nan": return double.NaN;
                default: throw new Exception("unexpected " + s);
            }
        }

        [Test]
        public void NamesWithEscapesNulAndNonAscii()
        {
            using (var ckpt = Checkpoint.Open(Fixtures.Safetensors("escaped_names.safetensors")))
            {
                string[] names = ckpt.TensorNames();
                Assert.True(names.Contains("mixé\"\\\n"), "non-ASCII name read as UTF-8");
                Assert.True(names.Contains("ctl\0\u0001\u001f"), "name with a NUL read whole");
                Assert.Equal(7.0f, ckpt.ReadSingle("mixé\"\\\n")[0], "value of the non-ASCII name");
                Assert.Equal(2.0f, ckpt.ReadSingle("ctl\0\u0001\u001f")[0], "value of the NUL name");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => ckpt.Find("ctl"), "prefix before the NUL");
            }
        }

        [Test]
        public void LookupErrors()
        {
            using (var ckpt = Checkpoint.Open(Fixtures.Safetensors("dtype_f32.safetensors")))
            {
                PeftException e = Assert.ThrowsPeft(ErrorCode.NotFound, () => ckpt.Find("missing"));
                Assert.True(e.Message.Contains("missing"), "names the tensor");
                int index;
                Assert.False(ckpt.TryFind("missing", out index), "TryFind");
                Assert.Equal(-1, index);
                Assert.True(ckpt.Contains("values"), "Contains");
                Assert.Throws<ArgumentOutOfRangeException>(() => ckpt.Info(ckpt.TensorCount));
                Assert.Throws<ArgumentOutOfRangeException>(() => ckpt.View(-1));
                Assert.Throws<ArgumentOutOfRangeException>(() => ckpt.FilePath(1));
                Assert.Throws<ArgumentOutOfRangeException>(() => ckpt.HasMetadata(1));
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => ckpt.Read(ckpt.Find("values"), DType.F32, new byte[5]), "wrong size");
                Assert.ThrowsPeft(ErrorCode.Unsupported, () => ckpt.Read(ckpt.Find("values"), DType.I32, new byte[48]), "F32 -> I32");
                Assert.Equal(Fixtures.Safetensors("dtype_f32.safetensors"), ckpt.FilePath(0));
            }
        }

        [Test]
        public void MemoryAndStreamViewsShareTheMapping()
        {
            var ckpt = Checkpoint.Open(Fixtures.Safetensors("dtype_f32.safetensors"));
            int i = ckpt.Find("values");
            byte[] expected = ckpt.View(i).ToArray();
            TensorMemory memory = ckpt.ViewMemory(i);
            Stream stream = ckpt.ViewStream(i);
            unsafe
            {
                fixed (byte* a = &MemoryMarshal.GetReference(ckpt.View(i)))
                fixed (byte* b = &MemoryMarshal.GetReference(memory.Span))
                    Assert.True(a == b, "ViewMemory does not copy");
            }
            ckpt.Dispose();  // the views hold the files open by themselves
            Assert.True(memory.ReadOnlyMemory.Span.SequenceEqual(expected), "memory after the checkpoint's Dispose");
            var copy = new MemoryStream();
            stream.CopyTo(copy);
            Assert.SequenceEqual(expected, copy.ToArray(), "stream after the checkpoint's Dispose");
            Assert.False(stream.CanWrite, "the stream is read-only");
            stream.Dispose();
            ((IDisposable)memory).Dispose();
            Assert.Throws<ObjectDisposedException>(() => memory.GetSpan());
        }

        [Test]
        public void ShardedFolderAndIndexMetadata()
        {
            using (var tmp = new TempDir())
            {
                using (var w = Writer.CreateCheckpoint(tmp.Path, 16))
                {
                    for (int k = 0; k < 4; k++) w.AddTensor("t" + k, DType.F32, 3);
                    w.SetIndexMetadataJson("{\"total_parameters\": 12}");
                    foreach (string name in w.WriteOrder()) w.WriteTensor(name, new float[] { 1, 2, int.Parse(name.Substring(1)) });
                    Assert.Equal(4, w.FileCount, "shards");
                    w.Finish();
                }
                using (var ckpt = Checkpoint.Open(tmp.Path))
                {
                    Assert.Equal(4, ckpt.FileCount);
                    Assert.Equal(4, ckpt.TensorCount);
                    Assert.Equal(3.0f, ckpt.ReadSingle("t3")[2]);
                    Assert.Equal(3, ckpt.Info("t3").File);
                    Assert.True(ckpt.IndexMetadataJson.Contains("\"total_parameters\":12"), ckpt.IndexMetadataJson);
                    Assert.SequenceEqual(new[] { new KeyValuePair<string, string>("format", "pt") }, ckpt.Metadata(2));
                }
            }
        }

        [Test]
        public void HeaderCapOption()
        {
            string file = Fixtures.Safetensors("dtype_f32.safetensors");
            Assert.ThrowsPeft(ErrorCode.HeaderTooLarge, () => Checkpoint.Open(file, new OpenOptions { MaxHeaderSize = 8 }));
            Assert.ThrowsPeft(ErrorCode.HeaderTooLarge, () => Checkpoint.FromBytes(File.ReadAllBytes(file), new OpenOptions { MaxHeaderSize = 8 }));
            Assert.Throws<ArgumentOutOfRangeException>(() => Checkpoint.Open(file, new OpenOptions { MaxHeaderSize = -1 }));
            Assert.ThrowsPeft(ErrorCode.HeaderTooSmall, () => Checkpoint.FromBytes(new byte[0]));
        }
    }
}
