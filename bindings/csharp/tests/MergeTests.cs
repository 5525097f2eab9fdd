using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;

namespace PeftC.Tests
{
    public class MergeTests
    {
        // W + scaling * B @ A in double, for comparison with the library's f32 arithmetic.
        internal static double[] Expected(float[] w, float[] a, float[] b, long[] shape, long rank, double scaling)
        {
            long rows = shape[0], cols = shape[1];
            var result = new double[w.Length];
            for (long i = 0; i < rows; i++)
                for (long j = 0; j < cols; j++)
                {
                    double sum = 0;
                    for (long k = 0; k < rank; k++) sum += (double)b[i * rank + k] * a[k * cols + j];
                    result[i * cols + j] = w[i * cols + j] + scaling * sum;
                }
            return result;
        }

        // A LoRA on the tied lm_head of the gemma fixture (vocabulary 64, hidden 16).
        private static void WriteLmHeadAdapter(string dir)
        {
            Directory.CreateDirectory(dir);
            File.WriteAllText(Path.Combine(dir, "adapter_config.json"),
                "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": 2, \"lora_alpha\": 2, \"target_modules\": [\"lm_head\"]}");
            var factors = new Dictionary<string, long[]>
            {
                { "base_model.model.lm_head.lora_A.weight", new long[] { 2, 16 } },
                { "base_model.model.lm_head.lora_B.weight", new long[] { 64, 2 } },
            };
            using (var w = Writer.Create(Path.Combine(dir, "adapter_model.safetensors")))
            {
                foreach (var f in factors) w.AddTensor(f.Key, DType.F32, f.Value);
                foreach (string name in w.WriteOrder())
                {
                    var values = new float[factors[name][0] * factors[name][1]];
                    for (int i = 0; i < values.Length; i++) values[i] = (i % 5 - 2) * 0.125f;
                    w.WriteTensor(name, values);
                }
                w.Finish();
            }
        }

        [Test]
        public void TiedEmbeddingsPolicy()
        {
            using (var tmp = new TempDir())
            using (var options = new MergeOptions())
            {
                WriteLmHeadAdapter(tmp["adapter"]);
                options.AddAdapterDir(tmp["adapter"]);
                // The default unties: lm_head.weight added, tie_word_embeddings false.
                MergeResult result = Merge.Checkpoint(Fixtures.Model("gemma"), tmp["untie"], options);
                Assert.True(result.UntiedEmbeddings, "untied by default");
                Assert.Equal(1L, result.Added, "lm_head.weight added");
                Assert.True(File.ReadAllText(Path.Combine(tmp["untie"], "config.json")).Contains("\"tie_word_embeddings\": false"), "config untied");
                // Shared: the change lands in the shared embedding, which stays tied.
                result = Merge.Checkpoint(Fixtures.Model("gemma"), tmp["shared"], options.SetTiedEmbeddings(TiedEmbeddings.Shared));
                Assert.False(result.UntiedEmbeddings, "shared stays tied");
                Assert.Equal(0L, result.Added, "nothing added");
                Assert.Equal(1L, result.Merged, "the shared embedding merged");
                Assert.True(File.ReadAllText(Path.Combine(tmp["shared"], "config.json")).Contains("\"tie_word_embeddings\": true"), "config tied");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetTiedEmbeddings((TiedEmbeddings)2), "policy 2");
            }
        }

        [Test]
        public void CheckpointMergeComputesTheLoraDelta()
        {
            using (var tmp = new TempDir())
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var options = new MergeOptions())
            {
                options.AddAdapter(adapter).SetThreads(2);
                var calls = new List<long[]>();
                MergeResult result = Merge.Checkpoint(Fixtures.Model("llama"), tmp["out"], options, (done, total) =>
                {
                    calls.Add(new[] { done, total });
                    Assert.Equal(Thread.CurrentThread.ManagedThreadId, mainThread_, "progress on the calling thread");
                    return true;
                });
                Assert.Equal(14L, result.Merged, "merged");
                Assert.Equal(7L, result.Copied, "copied");
                Assert.Equal(0L, result.Replaced + result.Added, "replaced + added");
                Assert.True(result.Files.Contains("model.safetensors") && result.Files.Contains("config.json"), "files");
                Assert.False(result.UntiedEmbeddings, "untied");
                Assert.True(calls.Count >= 2 && calls[0][0] == 0, "progress starts at 0");
                Assert.Equal(calls.Last()[1], calls.Last()[0], "progress ends at total");
                Assert.Equal(result.Bytes, calls.Last()[1], "total bytes");
                for (int i = 1; i < calls.Count; i++) Assert.True(calls[i][0] >= calls[i - 1][0], "never decreasing");

                using (var base_ = Checkpoint.Open(Fixtures.Model("llama")))
                using (var merged = Checkpoint.Open(tmp["out"]))
                {
                    Assert.SequenceEqual(base_.TensorNames(), merged.TensorNames(), "names and order");
                    AdapterModule m = adapter.Module("model.layers.0.self_attn.q_proj");
                    TensorInfo info = base_.Info(m.Tensor("lora_A.weight").BaseName);
                    double[] want = Expected(base_.ReadSingle(info.Index), m.Tensor("lora_A.weight").ReadSingle(),
                                             m.Tensor("lora_B.weight").ReadSingle(), info.Shape, m.Rank, m.Scaling);
                    float[] got = merged.ReadSingle(info.Name);
                    for (int i = 0; i < got.Length; i++)
                        Assert.True(Math.Abs(got[i] - want[i]) <= 1e-5 * Math.Max(1, Math.Abs(want[i])), "element " + i + ": " + got[i] + " vs " + want[i]);
                    Assert.SequenceEqual(base_.ReadSingle("model.norm.weight"), merged.ReadSingle("model.norm.weight"), "copied tensor");
                }

                // The same options merge again, into another dtype and with the adapter given as a folder.
                using (var again = new MergeOptions())
                {
                    again.AddAdapterDir(Fixtures.AdapterDir("llama_lora"), 0.5).SetDType(DType.BF16).SetMaxShardSize(4096);
                    MergeResult r2 = Merge.Checkpoint(Fixtures.Model("llama"), tmp["bf16"], again);
                    Assert.True(r2.Files.Contains("model.safetensors.index.json"), "resharded: " + string.Join(",", r2.Files));
                    using (var c = Checkpoint.Open(tmp["bf16"])) Assert.True(c.Tensors().All(t => t.DType == DType.BF16), "bf16");
                }
            }
        }

        private readonly int mainThread_ = Thread.CurrentThread.ManagedThreadId;

        [Test]
        public void CancellingLeavesNothing()
        {
            using (var tmp = new TempDir())
            using (var options = new MergeOptions().AddAdapterDir(Fixtures.AdapterDir("llama_lora")))
            {
                int calls = 0;
                Assert.ThrowsPeft(ErrorCode.Cancelled, () => Merge.Checkpoint(Fixtures.Model("llama"), tmp["a"], options, (d, t) => ++calls < 3));
                Assert.False(Directory.Exists(tmp["a"]), "no output after a cancel");

                PeftException e = Assert.ThrowsPeft(ErrorCode.Cancelled,
                    () => Merge.Checkpoint(Fixtures.Model("llama"), tmp["b"], options, (d, t) => { throw new ArgumentException("stop"); }));
                Assert.True(e.InnerException is ArgumentException, "the callback's exception is the inner one");
                Assert.False(Directory.Exists(tmp["b"]), "no output after an exception");

                using (var source = new CancellationTokenSource())
                {
                    source.Cancel();
                    var oce = Assert.Throws<OperationCanceledException>(() => Merge.Checkpoint(Fixtures.Model("llama"), tmp["c"], options, null, source.Token));
                    Assert.True(oce.InnerException is PeftException, "inner PeftException");
                }
                Assert.False(Directory.Exists(tmp["c"]), "no output after a token cancel");

                // The progress callback was removed from the options: a merge without one succeeds.
                Merge.Checkpoint(Fixtures.Model("llama"), tmp["d"], options);
                Assert.True(File.Exists(Path.Combine(tmp["d"], "model.safetensors")), "merged after the cancels");
            }
        }

        [Test]
        public void MergeErrors()
        {
            using (var tmp = new TempDir())
            using (var options = new MergeOptions())
            {
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Merge.Checkpoint(Fixtures.Model("llama"), tmp["x"], options), "no adapters");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.AddAdapterDir(Fixtures.AdapterDir("llama_lora"), double.NaN), "NaN weight");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetDType(DType.I32), "I32 output");
                Assert.Throws<ArgumentOutOfRangeException>(() => options.SetThreads(-1));
                options.AddAdapterDir(Fixtures.AdapterDir("llama_lora"));
                Assert.Throws<PeftException>(() => Merge.Checkpoint(Fixtures.Model("gpt2"), tmp["y"], options), "wrong base");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Merge.Checkpoint(Fixtures.Model("llama"), Fixtures.Model("llama"), options), "out = base");
                Assert.Throws<ArgumentNullException>(() => Merge.Checkpoint(Fixtures.Model("llama"), tmp["z"], null));
            }
        }

        // A base folder without config.json is refused unless the options say it is not required.
        [Test]
        public void RequireConfig()
        {
            using (var tmp = new TempDir())
            using (var options = new MergeOptions().AddAdapterDir(Fixtures.AdapterDir("llama_lora")))
            {
                Directory.CreateDirectory(tmp["base"]);
                File.Copy(Path.Combine(Fixtures.Model("llama"), "model.safetensors"), Path.Combine(tmp["base"], "model.safetensors"));
                PeftException e = Assert.ThrowsPeft(ErrorCode.NotFound, () => Merge.Checkpoint(tmp["base"], tmp["out"], options));
                Assert.True(e.Message.Contains("config.json"), e.Message);
                Assert.False(Directory.Exists(tmp["out"]), "nothing written");
                Merge.Checkpoint(tmp["base"], tmp["out"], options.SetRequireConfig(false));
                Assert.True(File.Exists(Path.Combine(tmp["out"], "model.safetensors")), "merged");
                Assert.False(File.Exists(Path.Combine(tmp["out"], "config.json")), "no config.json");
            }
        }

        // lora_alpha 4e12 overflows F16: refused by default, written as computed when allowed.
        [Test]
        public void AllowNonFinite()
        {
            using (var tmp = new TempDir())
            {
                string source = Fixtures.AdapterDir("llama_lora"), adapter = tmp["adapter"];
                Directory.CreateDirectory(adapter);
                File.Copy(Path.Combine(source, "adapter_model.safetensors"), Path.Combine(adapter, "adapter_model.safetensors"));
                string config = File.ReadAllText(Path.Combine(source, "adapter_config.json"));
                File.WriteAllText(Path.Combine(adapter, "adapter_config.json"),
                                  System.Text.RegularExpressions.Regex.Replace(config, @"""lora_alpha"":\s*[0-9.]+", @"""lora_alpha"": 4e12"));
                using (var options = new MergeOptions().AddAdapterDir(adapter).SetDType(DType.F16))
                {
                    Assert.ThrowsPeft(ErrorCode.NonFinite, () => Merge.Checkpoint(Fixtures.Model("llama"), tmp["out"], options));
                    Assert.False(Directory.Exists(tmp["out"]), "nothing written");
                    Merge.Checkpoint(Fixtures.Model("llama"), tmp["out"], options.SetAllowNonFinite(true));
                    Assert.True(File.Exists(Path.Combine(tmp["out"], "model.safetensors")), "merged");
                }
            }
        }

        // A buffer merge gives the bytes the checkpoint merge writes, and removing it with kept rows restores
        // the buffer bit for bit.
        [Test]
        public void BufferMergeMatchesCheckpointMergeAndRemoves()
        {
            using (var tmp = new TempDir())
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var base_ = Checkpoint.Open(Fixtures.Model("llama")))
            {
                using (var options = new MergeOptions().AddAdapter(adapter)) Merge.Checkpoint(Fixtures.Model("llama"), tmp["out"], options);
                using (var merged = Checkpoint.Open(tmp["out"]))
                using (var bufferOptions = new MergeBufferOptions().SetKeepOriginalRows(true).SetThreads(1))
                {
                    foreach (AdapterModule m in adapter.Modules())
                    {
                        TensorInfo info = base_.Info(m.Name + ".weight");
                        float[] original = base_.ReadSingle(info.Index);
                        float[] w = (float[])original.Clone();
                        using (MergeRecord record = MergeBuffer.Apply(adapter, m.Name, w.AsSpan(), info.Shape, bufferOptions))
                        {
                            Assert.Equal(m.Name, record.Module);
                            Assert.True(record.Active, "active");
                            Assert.True(record.SavedBytes > 0, "rows kept");
                            Assert.SequenceEqual(merged.ReadSingle(info.Name), w, m.Name + " as the checkpoint merge");
                            record.Remove(w.AsSpan());
                            Assert.False(record.Active, "removed");
                            Assert.SequenceEqual(original, w, m.Name + " restored");
                            Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => record.Remove(w.AsSpan()), "spent record");
                        }
                    }
                }
                // BF16 buffers, HF tensor names, translator names, arithmetic removal.
                TensorInfo q = base_.Info("model.layers.0.self_attn.q_proj.weight");
                byte[] bf16 = base_.ReadBytes(q.Index, DType.BF16);
                byte[] before = (byte[])bf16.Clone();
                using (MergeRecord r = MergeBuffer.Apply(adapter, "base_model.model." + q.Name, bf16, DType.BF16, q.Shape))
                {
                    Assert.False(bf16.SequenceEqual(before), "changed");
                    Assert.Equal(0L, r.SavedBytes);
                    r.Remove(bf16);
                }
                using (var t = adapter.Translator())
                using (var opts = new MergeBufferOptions().SetTranslator(t).SetWeight(2.0))
                {
                    float[] w = base_.ReadSingle(q.Index);
                    string native = t.ToNative(q.Name);
                    using (MergeBuffer.Apply(adapter, native, w.AsSpan(), q.Shape, opts)) { }
                    Assert.False(w.SequenceEqual(base_.ReadSingle(q.Index)), "merged through native names");
                }
            }
        }

        [Test]
        public void BufferMergeErrorsLeaveTheBufferUnchanged()
        {
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var base_ = Checkpoint.Open(Fixtures.Model("llama")))
            {
                TensorInfo q = base_.Info("model.layers.0.self_attn.q_proj.weight");
                float[] w = base_.ReadSingle(q.Index);
                float[] copy = (float[])w.Clone();
                Assert.ThrowsPeft(ErrorCode.NotFound, () => MergeBuffer.Apply(adapter, "model.layers.0.nothing", w.AsSpan(), q.Shape));
                Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => MergeBuffer.Apply(adapter, "model.layers.0.self_attn.q_proj", w.AsSpan(),
                                                                                  new[] { q.Shape[0] * q.Shape[1], 1L }));
                Assert.Throws<ArgumentException>(() => MergeBuffer.Apply(adapter, "model.layers.0.self_attn.q_proj", w.AsSpan(0, 3), q.Shape), "short span");
                Assert.ThrowsPeft(ErrorCode.Unsupported, () => MergeBuffer.Apply(adapter, "model.layers.0.self_attn.q_proj", new byte[w.Length * 8],
                                                                                 DType.F64, q.Shape), "F64 buffer");
                using (var t = adapter.Translator())
                using (var opts = new MergeBufferOptions().SetTranslator(t))
                    Assert.ThrowsPeft(ErrorCode.UnresolvedKey, () => MergeBuffer.Apply(adapter, "not/a/native/name", w.AsSpan(), q.Shape, opts));
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => new MergeBufferOptions().SetWeight(double.PositiveInfinity));
                Assert.SequenceEqual(copy, w, "unchanged after the errors");
            }
            // lora_bias: the layer's bias is required and merged.
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("qwen2_lora_bias")))
            using (var base_ = Checkpoint.Open(Fixtures.Model("qwen2")))
            {
                AdapterModule m = adapter.Modules().First(x => x.Tensor("lora_B.bias") != null);
                TensorInfo wi = base_.Info(m.Name + ".weight");
                float[] w = base_.ReadSingle(wi.Index);
                float[] bias = base_.ReadSingle(m.Name + ".bias");
                float[] biasBefore = (float[])bias.Clone();
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => MergeBuffer.Apply(adapter, m.Name, w.AsSpan(), wi.Shape), "bias missing");
                Assert.Throws<ArgumentException>(() => MergeBuffer.Apply(adapter, m.Name, w.AsSpan(), wi.Shape, bias.AsSpan(0, 1)), "bias too short");
                using (MergeRecord r = MergeBuffer.Apply(adapter, m.Name, w.AsSpan(), wi.Shape, bias.AsSpan()))
                {
                    // PEFT: bias += lora_B.bias * scaling.
                    float[] delta = m.Tensor("lora_B.bias").ReadSingle();
                    for (int i = 0; i < bias.Length; i++)
                        Assert.True(Math.Abs(bias[i] - (biasBefore[i] + delta[i] * m.Scaling)) < 1e-6, "bias element " + i);
                    r.Remove(w.AsSpan(), bias.AsSpan());
                }
            }
        }
    }
}
