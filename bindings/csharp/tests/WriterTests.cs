using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Runtime.InteropServices;
using System.Text;

namespace PeftC.Tests
{
    public class WriterTests
    {
        // Rewrites a checkpoint through the writer: same tensors, same metadata.
        internal static void Rewrite(Checkpoint source, string path)
        {
            using (var w = Writer.Create(path))
            {
                var metadata = source.Metadata();
                if (metadata != null)
                {
                    w.SetMetadataPresent(true);
                    foreach (var kv in metadata) w.SetMetadata(kv.Key, kv.Value);
                }
                foreach (TensorInfo t in source.Tensors()) w.AddTensor(t.Name, t.DType.Value, t.Shape);
                w.Start();
                for (int p = 0; p < w.TensorCount; p++)
                    w.WriteFromCheckpoint(null, source, source.Find(w.TensorName(p)));
                w.Finish();
            }
        }

        // Files the reference wrote with at most one metadata key come back byte for byte (the reference sorts
        // tensors the same way; with several keys its order is random, so the files are compared as tensors).
        [Test]
        public void RewritingReferenceFilesIsByteIdentical()
        {
            int identical = 0;
            using (var tmp = new TempDir())
            {
                foreach (string name in new[] { "all_dtypes", "dtype_bf16", "dtype_f4", "dtype_f32", "dtype_u64", "metadata_one",
                                                "metadata_empty", "no_metadata", "only_zero_size", "escaped_names" })
                {
                    string file = Fixtures.Safetensors(name + ".safetensors");
                    using (var source = Checkpoint.Open(file)) Rewrite(source, tmp[name]);
                    Assert.SequenceEqual(File.ReadAllBytes(file), File.ReadAllBytes(tmp[name]), name);
                    identical++;
                }
            }
            Assert.Equal(10, identical);
        }

        [Test]
        public void NonAsciiNamesAndMetadataRoundTrip()
        {
            using (var tmp = new TempDir())
            {
                string path = tmp["ünïcødé 名前.safetensors"];
                using (var w = Writer.Create(path))
                {
                    w.AddTensor("重み.é", DType.F16, 2, 2);
                    w.AddTensor("nul\0inside", DType.I32);
                    w.SetMetadata("ключ", "значение ✓");
                    var order = w.WriteOrder();
                    Assert.SequenceEqual(new[] { "nul\0inside", "重み.é" }, order, "order: I32 before F16, then by name");
                    Assert.Equal(1, w.TensorDeclaration(0), "declaration index");
                    w.WriteTensor(null, DType.I32, BitConverter.GetBytes(42));
                    w.WriteTensor("重み.é", new float[] { 1, 2, 3, 0.5f });
                    Assert.Equal(path, w.FilePath(0));
                    w.Finish();
                }
                Assert.True(File.Exists(path), "the file exists under its UTF-8 name");
                using (var ckpt = Checkpoint.Open(path))
                {
                    Assert.SequenceEqual(new float[] { 1, 2, 3, 0.5f }, ckpt.ReadSingle("重み.é"));
                    Assert.Equal(DType.F16, ckpt.Info("重み.é").DType);
                    Assert.Equal(42.0f, ckpt.ReadSingle("nul\0inside")[0]);
                    Assert.Equal(0, ckpt.Info("nul\0inside").Shape.Length, "scalar");
                    Assert.SequenceEqual(new[] { new KeyValuePair<string, string>("ключ", "значение ✓") }, ckpt.Metadata());
                }
                // The raw header holds the UTF-8 bytes of the names.
                byte[] bytes = File.ReadAllBytes(path);
                Assert.True(Encoding.UTF8.GetString(bytes, 8, (int)BitConverter.ToUInt64(bytes, 0)).Contains("重み.é"), "UTF-8 header");
            }
        }

        [Test]
        public void ChunkedAndCallbackWritesEqualWholeWrites()
        {
            var data = Enumerable.Range(0, 1000).Select(i => (float)Math.Sin(i)).ToArray();
            byte[] bytes = MemoryMarshal.AsBytes(data.AsSpan()).ToArray();
            using (var tmp = new TempDir())
            {
                foreach (string mode in new[] { "whole", "chunks", "callback" })
                {
                    using (var w = Writer.Create(tmp[mode]))
                    {
                        w.AddTensor("a", DType.BF16, 10, 100);
                        w.AddTensor("b", DType.F32, 1000);
                        foreach (string name in w.WriteOrder())
                        {
                            if (mode == "whole")
                            {
                                w.WriteTensor(name, DType.F32, bytes);
                            }
                            else if (mode == "chunks")
                            {
                                w.BeginTensor(name, DType.F32);
                                for (int off = 0; off < bytes.Length; off += 400) w.Write(bytes.AsSpan(off, Math.Min(400, bytes.Length - off)));
                            }
                            else
                            {
                                long seen = 0;
                                w.WriteFromCallback(name, DType.F32, (offset, dst) =>
                                {
                                    Assert.Equal(seen, offset, "contiguous offsets");
                                    bytes.AsSpan((int)offset, dst.Length).CopyTo(dst);
                                    seen += dst.Length;
                                    return true;
                                });
                            }
                        }
                        w.Finish();
                    }
                }
                Assert.SequenceEqual(File.ReadAllBytes(tmp["whole"]), File.ReadAllBytes(tmp["chunks"]), "chunks");
                Assert.SequenceEqual(File.ReadAllBytes(tmp["whole"]), File.ReadAllBytes(tmp["callback"]), "callback");
                using (var ckpt = Checkpoint.Open(tmp["whole"]))
                {
                    Assert.SequenceEqual(data, ckpt.ReadSingle("b"));
                    float[] a = ckpt.ReadSingle("a");
                    byte[] bf16 = new byte[2000];
                    Peft.Convert(DType.F32, bytes, DType.BF16, bf16, 1000);
                    Assert.SequenceEqual(Peft.ToSingle(DType.BF16, bf16), a, "converted while writing as peft_convert does");
                }
            }
        }

        [Test]
        public void CallbackCancellationAndExceptionsDiscardTheOutput()
        {
            using (var tmp = new TempDir())
            {
                using (var w = Writer.Create(tmp["cancelled"]))
                {
                    w.AddTensor("a", DType.F32, 4);
                    Assert.ThrowsPeft(ErrorCode.Cancelled, () => w.WriteFromCallback("a", DType.F32, (o, d) => false));
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.Finish(), "a cancelled writer only frees");
                }
                using (var w = Writer.Create(tmp["thrown"]))
                {
                    w.AddTensor("a", DType.F32, 4);
                    PeftException e = Assert.ThrowsPeft(ErrorCode.Cancelled,
                        () => w.WriteFromCallback("a", DType.F32, (o, d) => { throw new InvalidOperationException("boom"); }));
                    Assert.True(e.InnerException is InvalidOperationException && e.InnerException.Message == "boom", "inner exception");
                }
                Assert.Equal(0, Directory.GetFileSystemEntries(tmp.Path).Length, "nothing left, temporaries removed");
            }
        }

        [Test]
        public void OrderAndDeclarationErrors()
        {
            using (var tmp = new TempDir())
            using (var w = Writer.Create(tmp["f"]))
            {
                w.AddTensor("a", DType.F32, 1);
                w.AddTensor("b", DType.F32, 1);
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.AddTensor("a", DType.F32, 1), "duplicate");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.AddTensor("__metadata__", DType.F32, 1), "reserved");
                Assert.ThrowsPeft(ErrorCode.MisalignedSlice, () => w.AddTensor("f4", DType.F4, 3), "odd F4");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.AddTensor("x", (DType)99, 1), "unknown dtype");
                Assert.Throws<ArgumentOutOfRangeException>(() => w.AddTensor("neg", DType.F32, -1));
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.BreakShard(), "one-file writer");
                Assert.Throws<InvalidOperationException>(() => w.TensorName(0), "before start");
                Assert.Throws<ArgumentException>(() => w.WriteTensor("a\0", DType.F32, new byte[4]), "NUL in a write name");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.WriteTensor("b", DType.F32, new byte[4]), "out of order");
                Assert.ThrowsPeft(ErrorCode.TensorInvalidInfo, () => w.WriteTensor("a", DType.F32, new byte[8]), "wrong size");
                Assert.ThrowsPeft(ErrorCode.Unsupported, () => w.WriteTensor("a", DType.C64, new byte[8]), "C64 -> F32");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.SetMetadata("k", "v"), "after start");
                w.WriteTensor("a", DType.F32, new byte[4]);
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => w.Finish(), "b missing");
                w.WriteTensor("b", DType.F32, new byte[4]);
                w.Finish();
                Assert.True(File.Exists(tmp["f"]), "written after the errors");
            }
        }

        [Test]
        public void UnfinishedWriterLeavesTheOldTarget()
        {
            using (var tmp = new TempDir())
            {
                File.WriteAllText(tmp["f"], "old");
                using (var w = Writer.Create(tmp["f"]))
                {
                    w.AddTensor("a", DType.F32, 1);
                    w.WriteTensor("a", DType.F32, new byte[4]);
                }
                Assert.Equal("old", File.ReadAllText(tmp["f"]));
                Assert.Equal(1, Directory.GetFiles(tmp.Path).Length, "no temporary left");
            }
        }

        [Test]
        public void CheckpointWriterBreaksShardsAndMetadataPresence()
        {
            using (var tmp = new TempDir())
            {
                using (var w = Writer.CreateCheckpoint(tmp.Path))
                {
                    w.AddTensor("a", DType.F32, 1);
                    w.BreakShard();
                    w.AddTensor("b", DType.F32, 1);
                    w.Start();
                    Assert.Equal(2, w.FileCount);
                    Assert.Equal(Path.Combine(tmp.Path, "model-00001-of-00002.safetensors"), w.FilePath(0));
                    w.WriteTensor("a", new float[] { 1 });
                    w.WriteTensor("b", new float[] { 2 });
                    w.Finish();
                }
                Assert.True(File.Exists(tmp["model.safetensors.index.json"]), "index");
                using (var w = Writer.Create(tmp["nometa"]))
                {
                    w.SetMetadata("k", "v");
                    w.SetMetadataPresent(false);
                    w.Finish();
                }
                using (var c = Checkpoint.Open(tmp["nometa"])) Assert.False(c.HasMetadata(), "metadata removed");
                using (var w = Writer.Create(tmp["emptymeta"]))
                {
                    w.SetMetadataPresent(true);
                    w.Finish();
                }
                using (var c = Checkpoint.Open(tmp["emptymeta"]))
                {
                    Assert.True(c.HasMetadata(), "empty metadata present");
                    Assert.Equal(0, c.Metadata().Length);
                }
                Assert.Throws<ArgumentOutOfRangeException>(() => Writer.CreateCheckpoint(tmp.Path, -1));
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Writer.Create(""), "empty path");
            }
        }
    }
}
