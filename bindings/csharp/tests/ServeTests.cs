using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Runtime.InteropServices;
using System.Threading;

namespace PeftC.Tests
{
    public class ServeTests
    {
        private const long MiB = 1 << 20;
        private const string Q0 = "model.layers.0.self_attn.q_proj";

        // Bytes an adapter's LoRA tensors take in a storage dtype: what a lease counts against the budget. The
        // fixtures used here hold only lora_A / lora_B tensors.
        private static long LoraBytes(string adapterName, DType storage)
        {
            using (var adapter = Adapter.Open(Fixtures.AdapterDir(adapterName)))
                return adapter.Modules().SelectMany(m => m.Tensors()).Sum(t => t.ElementCount) * (Peft.DTypeBits(storage) / 8);
        }

        private static float[] RandomFloats(Random random, long count)
        {
            var result = new float[count];
            for (long i = 0; i < count; i++) result[i] = (float)(random.NextDouble() * 2 - 1);
            return result;
        }

        // One LoRA layer's factors read from the adapter (optionally rounded to a storage dtype, as the registry keeps
        // them), for products computed here.
        private sealed class Layer
        {
            public float[] A, B;
            public long Rank, In, Out;
            public double Scaling;

            public Layer(AdapterModule m, DType storage = DType.F32)
            {
                AdapterTensor a = m.Tensor("lora_A.weight"), b = m.Tensor("lora_B.weight");
                A = Round(a.ReadSingle(), storage);
                B = Round(b.ReadSingle(), storage);
                Rank = a.Shape[0];
                In = a.Shape[1];
                Out = b.Shape[0];
                Scaling = m.Scaling;
            }

            private static float[] Round(float[] values, DType storage)
            {
                if (storage == DType.F32) return values;
                var stored = new byte[values.Length * 2];
                Peft.Convert(DType.F32, MemoryMarshal.AsBytes(values.AsSpan()), storage, stored, values.Length);
                return Peft.ToSingle(storage, stored);
            }

            // y[row] + scaling * (x[row] A^T) B^T in double.
            public double[] AddTo(float[] y, float[] x, long row)
            {
                var result = new double[Out];
                var xa = new double[Rank];
                for (long k = 0; k < Rank; k++)
                    for (long j = 0; j < In; j++) xa[k] += (double)x[row * In + j] * A[k * In + j];
                for (long o = 0; o < Out; o++)
                {
                    double sum = 0;
                    for (long k = 0; k < Rank; k++) sum += (double)B[o * Rank + k] * xa[k];
                    result[o] = y[row * Out + o] + Scaling * sum;
                }
                return result;
            }
        }

        private static void Close(double[] want, float[] got, long row, double tolerance, string what)
        {
            for (long o = 0; o < want.Length; o++)
            {
                double g = got[row * want.Length + o];
                if (Math.Abs(g - want[o]) > tolerance * Math.Max(1, Math.Abs(want[o])))
                    throw new Exception(what + " row " + row + " column " + o + ": " + g + " vs " + want[o]);
            }
        }

        private static void SameRow(float[] want, float[] got, long row, long width, string what)
        {
            for (long o = 0; o < width; o++)
                if (BitConverter.ToInt32(BitConverter.GetBytes(want[row * width + o]), 0) != BitConverter.ToInt32(BitConverter.GetBytes(got[row * width + o]), 0))
                    throw new Exception(what + " row " + row + " column " + o + " changed: " + got[row * width + o] + " vs " + want[row * width + o]);
        }

        private static Registry LlamaRegistry(DType storage = DType.F32, long budget = MiB, Translator translator = null)
        {
            return new Registry(storage, budget, translator)
                .Register("a", Fixtures.AdapterDir("llama_lora"))
                .Register("b", Fixtures.AdapterDir("llama_lora_second"));
        }

        [Test]
        public void RegistryRegistersAcquiresReleasesAndCounts()
        {
            long size = LoraBytes("llama_lora", DType.F32);
            using (Registry registry = LlamaRegistry())
            {
                Assert.SequenceEqual(new[] { "a", "b" }, registry.Names(), "names");
                RegistryStats s = registry.Stats;
                Assert.Equal(MiB, s.BudgetBytes, "budget");
                Assert.Equal(2L, s.Registered, "registered");
                Assert.Equal(0L, s.Loaded + s.LoadedBytes + s.Loads, "nothing loaded by registering");

                using (Lease a = registry.Acquire("a"))
                {
                    Assert.Equal("a", a.Name);
                    Assert.Equal(1L, a.Version, "first registration");
                    Assert.Equal(size, a.Bytes, "lease bytes = the adapter's lora_A/lora_B in F32");
                    Assert.True(a.HasModule(Q0), "module path");
                    Assert.True(a.HasModule(Q0 + ".weight"), "weight name");
                    Assert.True(a.HasModule("base_model.model." + Q0), "with base_model.model.");
                    Assert.False(a.HasModule("model.layers.0.self_attn.nothing"), "no such layer");
                    Assert.False(a.HasModule("model.embed_tokens"), "a base tensor without LoRA");
                    s = registry.Stats;
                    Assert.Equal(1L, s.Loads, "loads");
                    Assert.Equal(0L, s.Hits, "hits");
                    Assert.Equal(1L, s.Loaded, "loaded");
                    Assert.Equal(1L, s.Pinned, "pinned");
                    Assert.Equal(size, s.LoadedBytes, "loaded bytes");
                    using (Lease again = registry.Acquire("a"))
                    {
                        Assert.Equal(1L, again.Version, "same version");
                        s = registry.Stats;
                        Assert.Equal(1L, s.Hits, "a hit");
                        Assert.Equal(1L, s.Loads, "not loaded twice");
                        Assert.Equal(1L, s.Pinned, "one version pinned by two leases");
                    }
                    Assert.Equal(1L, registry.Stats.Pinned, "still pinned by the first lease");
                }
                s = registry.Stats;
                Assert.Equal(0L, s.Pinned, "released");
                Assert.Equal(1L, s.Loaded, "stays loaded after release");
                registry.Trim();
                s = registry.Stats;
                Assert.Equal(0L, s.Loaded + s.LoadedBytes, "trimmed");
                Assert.Equal(1L, s.Evictions, "one eviction");
                Assert.Equal(size, s.PeakLoadedBytes, "peak");
                using (registry.Acquire("a")) Assert.Equal(2L, registry.Stats.Loads, "loaded again after the trim");

                // Replacing a name: new acquisitions get the new version, the old lease keeps the old one.
                using (Lease old = registry.Acquire("a"))
                {
                    registry.Register("a", Fixtures.AdapterDir("llama_lora_second"));
                    using (Lease replaced = registry.Acquire("a"))
                    {
                        Assert.True(replaced.Version > old.Version, "versions " + old.Version + " then " + replaced.Version);
                        Assert.Equal(1L, old.Version, "the old lease keeps its version");
                        Assert.True(old.HasModule(Q0), "the old version is usable");
                        s = registry.Stats;
                        Assert.Equal(2L, s.Registered, "still two names");
                        Assert.Equal(2L, s.Loaded, "both versions in memory while the old one is leased");
                    }
                }
                Assert.SequenceEqual(new[] { "a", "b" }, registry.Names(), "order of first registration");

                registry.Unregister("b");
                Assert.SequenceEqual(new[] { "a" }, registry.Names(), "unregistered");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => registry.Unregister("b"), "unregister twice");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => registry.Acquire("b"), "acquire unregistered");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => registry.Acquire("nothing"), "acquire unknown");

                // From memory: the same adapter, the same bytes.
                string dir = Fixtures.AdapterDir("llama_lora");
                registry.RegisterMemory("memory", File.ReadAllText(Path.Combine(dir, "adapter_config.json")),
                                        File.ReadAllBytes(Path.Combine(dir, "adapter_model.safetensors")), Fixtures.Model("llama"));
                using (Lease m = registry.Acquire("memory"))
                {
                    Assert.Equal(size, m.Bytes, "bytes from memory");
                    Assert.True(m.HasModule(Q0), "module from memory");
                }

                // Failed registrations leave the registry as it was.
                Assert.ThrowsPeft(ErrorCode.NotFound, () => registry.Register("x", "/nonexistent/adapter"), "missing folder");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => registry.Register("", dir), "empty name");
                byte[] weightBytes = File.ReadAllBytes(Path.Combine(dir, "adapter_model.safetensors"));
                Assert.ThrowsPeft(ErrorCode.InvalidConfig, () => registry.RegisterMemory("y", "{not json", weightBytes), "bad config");
                Assert.Throws<PeftException>(() => registry.RegisterMemory("y", File.ReadAllText(Path.Combine(dir, "adapter_config.json")), new byte[8]),
                                             "bytes that are no safetensors file");
                Assert.Throws<PeftException>(() => registry.Register("z", dir, Fixtures.Model("gpt2")), "wrong base model");
                Assert.Throws<ArgumentNullException>(() => registry.Register(null, dir));
                Assert.Throws<ArgumentException>(() => registry.Register("a\0b", dir), "NUL in a name");
                Assert.SequenceEqual(new[] { "a", "memory" }, registry.Names(), "unchanged by the failures");
            }

            Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => new Registry(DType.I32, MiB), "I32 storage");
            Assert.Throws<ArgumentOutOfRangeException>(() => new Registry(DType.F32, -1));
            using (Registry bf16 = LlamaRegistry(DType.BF16))
            using (Lease a = bf16.Acquire("a"))
                Assert.Equal(size / 2, a.Bytes, "BF16 storage takes half");
        }

        [Test]
        public void BudgetEvictsLeastRecentlyUsedAndRefusesWhatCannotFit()
        {
            long size = LoraBytes("llama_lora", DType.F32);
            Assert.Equal(size, LoraBytes("llama_lora_second", DType.F32), "the fixtures are the same size");
            using (Registry registry = LlamaRegistry(DType.F32, size + size / 2))
            {
                using (registry.Acquire("a"))
                {
                    PeftException e = Assert.ThrowsPeft(ErrorCode.OverBudget, () => registry.Acquire("b"), "b beside pinned a");
                    Assert.Equal("OVER_BUDGET", e.CodeName);
                    Assert.Equal(1L, registry.Stats.Loaded, "the failed load left nothing");
                    Assert.ThrowsPeft(ErrorCode.OverBudget, () => registry.SetBudget(size - 1), "budget below the pinned bytes");
                    Assert.Equal(size + size / 2, registry.Stats.BudgetBytes, "budget unchanged");
                }
                using (registry.Acquire("b"))
                {
                    RegistryStats s = registry.Stats;
                    Assert.Equal(1L, s.Evictions, "a evicted for b");
                    Assert.Equal(size, s.LoadedBytes, "only b");
                    Assert.True(s.PeakLoadedBytes <= s.BudgetBytes, "peak within the budget");
                }
            }

            // Least recently used first: with room for two, c evicts b (used before a's last use), not a.
            using (Registry registry = LlamaRegistry(DType.F32, 2 * size + size / 2))
            {
                registry.Register("c", Fixtures.AdapterDir("llama_lora"));
                registry.Acquire("a").Dispose();
                registry.Acquire("b").Dispose();
                registry.Acquire("a").Dispose();
                registry.Acquire("c").Dispose();
                RegistryStats s = registry.Stats;
                Assert.Equal(1L, s.Evictions, "one eviction");
                Assert.Equal(3L, s.Loads, "three loads");
                registry.Acquire("a").Dispose();
                Assert.Equal(3L, registry.Stats.Loads, "a stayed loaded");
                Assert.Equal(2L, registry.Stats.Hits, "a hit twice");
                registry.Acquire("b").Dispose();
                Assert.Equal(4L, registry.Stats.Loads, "b was the one evicted");

                // A smaller budget evicts the unpinned ones until the loaded bytes fit.
                using (registry.Acquire("b"))
                {
                    registry.SetBudget(size);
                    s = registry.Stats;
                    Assert.Equal(size, s.BudgetBytes, "new budget");
                    Assert.Equal(1L, s.Loaded, "only the pinned one stays");
                }
                Assert.Throws<ArgumentOutOfRangeException>(() => registry.SetBudget(-5));
            }

            using (Registry empty = LlamaRegistry(DType.F32, 0))
            {
                Assert.ThrowsPeft(ErrorCode.OverBudget, () => empty.Acquire("a"), "zero budget");
                Assert.Equal(0L, empty.Stats.Loaded, "nothing loaded");
            }
        }

        [Test]
        public void LoraApplyAddsTheProductOfTheAdapterTensors()
        {
            var random = new Random(7);
            using (Registry registry = LlamaRegistry())
            using (Lease a = registry.Acquire("a"))
            using (Lease b = registry.Acquire("b"))
            using (Adapter adapterA = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (Adapter adapterB = Adapter.Open(Fixtures.AdapterDir("llama_lora_second")))
            {
                const long rows = 5;
                foreach (AdapterModule m in adapterA.Modules())
                {
                    var la = new Layer(m);
                    var lb = new Layer(adapterB.Module(m.Name));
                    float[] x = RandomFloats(random, rows * la.In);
                    float[] y0 = RandomFloats(random, rows * la.Out);

                    // Every row with one adapter.
                    float[] y = (float[])y0.Clone();
                    Serving.LoraApply(m.Name, a, x, rows, la.In, y, la.Out);
                    for (long r = 0; r < rows; r++) Close(la.AddTo(y0, x, r), y, r, 1e-5, m.Name);

                    // A mixed batch: rows of a, of b, and without an adapter.
                    var rowLease = new[] { 0, 1, -1, 1, 0 };
                    float[] mixed = (float[])y0.Clone();
                    Serving.LoraApply(m.Name + ".weight", new[] { a, b }, rowLease, x, rows, la.In, mixed, la.Out);
                    for (long r = 0; r < rows; r++)
                    {
                        if (rowLease[r] < 0) SameRow(y0, mixed, r, la.Out, m.Name + " without adapter");
                        else Close((rowLease[r] == 0 ? la : lb).AddTo(y0, x, r), mixed, r, 1e-5, m.Name + " mixed");
                    }

                    float[] prefixed = (float[])y0.Clone();
                    Serving.LoraApply("base_model.model." + m.Name, a, x, rows, la.In, prefixed, la.Out);
                    for (long r = 0; r < rows; r++) SameRow(y, prefixed, r, la.Out, m.Name + " with base_model.model.");
                }

                // Rows whose adapter has no such layer are left alone (llama_layers_to_transform adapts layer 1 only).
                registry.Register("layer1", Fixtures.AdapterDir("llama_layers_to_transform"));
                using (Lease layer1 = registry.Acquire("layer1"))
                {
                    Assert.False(layer1.HasModule(Q0), "layer 0 not adapted");
                    var q = new Layer(adapterA.Module(Q0));
                    float[] x = RandomFloats(random, 2 * q.In);
                    float[] y0 = RandomFloats(random, 2 * q.Out);
                    float[] y = (float[])y0.Clone();
                    Serving.LoraApply(Q0, new[] { layer1, a }, new[] { 0, 1 }, x, 2, q.In, y, q.Out);
                    SameRow(y0, y, 0, q.Out, "row of an adapter without the layer");
                    Close(q.AddTo(y0, x, 1), y, 1, 1e-5, "row of a");
                }

                // BF16 activations and outputs: computed in F32 and rounded once into BF16.
                {
                    var q = new Layer(adapterA.Module(Q0));
                    float[] x = RandomFloats(random, rows * q.In);
                    float[] y0 = RandomFloats(random, rows * q.Out);
                    byte[] xb = new byte[x.Length * 2], yb = new byte[y0.Length * 2];
                    Peft.Convert(DType.F32, MemoryMarshal.AsBytes(x.AsSpan()), DType.BF16, xb, x.Length);
                    Peft.Convert(DType.F32, MemoryMarshal.AsBytes(y0.AsSpan()), DType.BF16, yb, y0.Length);
                    float[] xr = Peft.ToSingle(DType.BF16, xb), y0r = Peft.ToSingle(DType.BF16, yb);
                    Serving.LoraApply(Q0, new[] { a }, null, xb, DType.BF16, rows, q.In, yb, DType.BF16, q.Out);
                    float[] got = Peft.ToSingle(DType.BF16, yb);
                    for (long r = 0; r < rows; r++) Close(q.AddTo(y0r, xr, r), got, r, 1.0 / 128, "BF16");
                }
            }

            // A registry storing BF16 factors: the product of the rounded factors; host names through its translator.
            using (var translator = Translator.Builtin("llama"))
            using (Registry bf16 = LlamaRegistry(DType.BF16, MiB, translator))
            using (Lease a = bf16.Acquire("a"))
            using (Adapter adapterA = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            {
                string native = translator.ToNative(Q0 + ".weight");
                Assert.True(a.HasModule(native), "native name " + native);
                var q = new Layer(adapterA.Module(Q0), DType.BF16);
                float[] x = RandomFloats(random, 3 * q.In);
                float[] y0 = RandomFloats(random, 3 * q.Out);
                float[] y = (float[])y0.Clone();
                Serving.LoraApply(native, a, x, 3, q.In, y, q.Out);
                for (long r = 0; r < 3; r++) Close(q.AddTo(y0, x, r), y, r, 1e-5, "BF16 storage");
            }
        }

        [Test]
        public void LoraApplyErrorsLeaveTheOutputUnchanged()
        {
            using (var registry = new Registry(DType.F32, MiB))
            {
                registry.Register("support-bot", Fixtures.AdapterDir("llama_lora")).Register("dora", Fixtures.AdapterDir("llama_dora"));
                using (Lease a = registry.Acquire("support-bot"))
                using (Lease dora = registry.Acquire("dora"))
                {
                    const long rows = 3, inF = 16, outF = 16;
                    var random = new Random(3);
                    float[] x = RandomFloats(random, rows * inF);
                    float[] y0 = RandomFloats(random, rows * outF);
                    float[] y = (float[])y0.Clone();

                    PeftException e = Assert.ThrowsPeft(ErrorCode.ShapeMismatch,
                        () => Serving.LoraApply(Q0, a, RandomFloats(random, rows * 8), rows, 8, y, outF), "in_features 8");
                    Assert.True(e.Message.Contains("support-bot"), "the message names the adapter: " + e.Message);
                    Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => Serving.LoraApply(Q0, a, x, rows, inF, new float[rows * 8], 8), "out_features 8");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Serving.LoraApply(Q0, new[] { a }, new[] { 0, 1, 0 }, x, rows, inF, y, outF),
                                      "index past the leases");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Serving.LoraApply(Q0, new[] { a }, new[] { 0, -2, 0 }, x, rows, inF, y, outF),
                                      "index -2");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Serving.LoraApply(Q0, new Lease[0], null, x, rows, inF, y, outF), "no leases");
                    Assert.ThrowsPeft(ErrorCode.NotFound, () => Serving.LoraApply(Q0, dora, x, rows, inF, y, outF), "DoRA without its base weight");
                    Assert.ThrowsPeft(ErrorCode.NotFound, () => Serving.LoraApply(Q0, new[] { a, dora }, new[] { 0, 0, 1 }, x, rows, inF, y, outF),
                                      "DoRA without its base weight in a mixed batch");
                    Assert.ThrowsPeft(ErrorCode.Unsupported, () => Serving.LoraApply(Q0, new[] { a }, null, new byte[rows * inF * 8], DType.F64, rows, inF,
                                                                                      MemoryMarshal.AsBytes(y.AsSpan()), DType.F32, outF), "F64 x");
                    Assert.SequenceEqual(y0, y, "unchanged after the C errors");

                    Assert.Throws<ArgumentException>(() => Serving.LoraApply(Q0, a, x.AsSpan(1), rows, inF, y, outF), "short x");
                    Assert.Throws<ArgumentException>(() => Serving.LoraApply(Q0, a, x, rows, inF, y.AsSpan(0, 5), outF), "short y");
                    Assert.Throws<ArgumentException>(() => Serving.LoraApply(Q0, new[] { a }, new[] { 0 }, x, rows, inF, y, outF), "rowLease too short");
                    Assert.Throws<ArgumentNullException>(() => Serving.LoraApply(Q0, new Lease[] { a, null }, null, x, rows, inF, y, outF), "null lease");
                    Assert.Throws<ArgumentNullException>(() => Serving.LoraApply(null, a, x, rows, inF, y, outF), "null module");
                    Assert.Throws<ArgumentOutOfRangeException>(() => Serving.LoraApply(Q0, a, x, -1, inF, y, outF), "negative rows");
                    Assert.SequenceEqual(y0, y, "unchanged after the argument errors");

                    // Zero rows do nothing; a layer the adapter does not have leaves every row alone.
                    Serving.LoraApply(Q0, a, new float[0], 0, inF, new float[0], outF);
                    Serving.LoraApply("model.layers.0.mlp.nothing", a, x, rows, inF, y, outF);
                    Assert.SequenceEqual(y0, y, "no such layer");
                }
            }
        }

        // One lease used by many threads at once, and leases of the same adapters acquired and released meanwhile.
        [Test]
        public void LeasesAreSharedByThreads()
        {
            using (Registry registry = LlamaRegistry())
            using (Lease a = registry.Acquire("a"))
            using (Lease b = registry.Acquire("b"))
            using (Adapter adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            {
                const long rows = 6;
                var leases = new[] { a, b };
                var rowLease = new[] { 0, 1, 1, -1, 0, 1 };
                var random = new Random(11);
                var modules = adapter.Modules().Select(m => new { m.Name, Layer = new Layer(m) }).ToArray();
                var inputs = modules.Select(m => RandomFloats(random, rows * m.Layer.In)).ToArray();
                var outputs = modules.Select(m => RandomFloats(random, rows * m.Layer.Out)).ToArray();
                var expected = modules.Select((m, i) =>
                {
                    float[] y = (float[])outputs[i].Clone();
                    Serving.LoraApply(m.Name, leases, rowLease, inputs[i], rows, m.Layer.In, y, m.Layer.Out);
                    return y;
                }).ToArray();

                var errors = new List<string>();
                var start = new Barrier(8);
                var threads = Enumerable.Range(0, 8).Select(k => new Thread(() =>
                {
                    try
                    {
                        start.SignalAndWait();
                        for (int round = 0; round < 25; round++)
                        {
                            int i = (k + round) % modules.Length;
                            float[] y = (float[])outputs[i].Clone();
                            Serving.LoraApply(modules[i].Name, leases, rowLease, inputs[i], rows, modules[i].Layer.In, y, modules[i].Layer.Out);
                            if (!y.SequenceEqual(expected[i])) throw new Exception(modules[i].Name + " differs on thread " + k);
                            using (Lease own = registry.Acquire(k % 2 == 0 ? "a" : "b"))
                                if (!own.HasModule(modules[i].Name) || !a.HasModule(modules[i].Name)) throw new Exception("HasModule");
                        }
                    }
                    catch (Exception e)
                    {
                        lock (errors) errors.Add(e.GetType().Name + ": " + e.Message);
                    }
                })).ToList();
                threads.ForEach(t => t.Start());
                threads.ForEach(t => t.Join());
                Assert.Equal(0, errors.Count, "thread errors: " + string.Join("; ", errors));
                RegistryStats s = registry.Stats;
                Assert.Equal(2L, s.Loads, "each adapter loaded once");
                Assert.Equal(2L, s.Pinned, "only the two outer leases pin");
            }

            // Threads acquiring an adapter that is not loaded yet share one load.
            using (Registry registry = LlamaRegistry())
            {
                var leases = new Lease[8];
                var start = new Barrier(8);
                var threads = Enumerable.Range(0, 8).Select(k => new Thread(() =>
                {
                    start.SignalAndWait();
                    leases[k] = registry.Acquire("a");
                })).ToList();
                threads.ForEach(t => t.Start());
                threads.ForEach(t => t.Join());
                RegistryStats s = registry.Stats;
                Assert.Equal(1L, s.Loads, "one load");
                Assert.Equal(7L, s.Hits, "seven hits");
                Assert.True(leases.All(l => l != null && l.Version == 1), "every thread has a lease");
                foreach (Lease l in leases) l.Dispose();
                Assert.Equal(0L, registry.Stats.Pinned, "all released");
            }
        }

        // The base weights of an adapter's layers, read from the fixture model.
        private static Dictionary<string, float[]> BaseWeights(Adapter adapter, Checkpoint base_, out Dictionary<string, long[]> shapes)
        {
            var weights = new Dictionary<string, float[]>();
            shapes = new Dictionary<string, long[]>();
            foreach (AdapterModule m in adapter.Modules())
            {
                TensorInfo info = base_.Info(m.Name + ".weight");
                weights[m.Name] = base_.ReadSingle(info.Index);
                shapes[m.Name] = info.Shape;
            }
            return weights;
        }

        // What peft_merge_buffer_apply makes of a copy of the base weight: the arithmetic a swap must reproduce.
        private static float[] BufferMerged(Adapter adapter, string module, float[] original, long[] shape, double weight)
        {
            float[] w = (float[])original.Clone();
            using (var options = new MergeBufferOptions().SetWeight(weight))
            using (MergeBuffer.Apply(adapter, module, w.AsSpan(), shape, options)) { }
            return w;
        }

        // LoRA on fused MoE experts (target_parameters): Mixtral's experts held fused, as transformers 5 holds them
        // ([experts, out, in] under the parameter's name), swap in as the buffer merge writes them and out bit for
        // bit; unmerged apply refuses the layers they adapt.
        [Test]
        public void HostModelSwapsLoraOnFusedExperts()
        {
            const int experts = 2;
            using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("mixtral")))
            using (Adapter adapter = Adapter.Open(Fixtures.AdapterDir("mixtral_target_parameters")))
            using (Registry registry = new Registry(DType.F32, 1L << 30).Register("experts", Fixtures.AdapterDir("mixtral_target_parameters")))
            using (var host = new HostModel())
            {
                var original = new Dictionary<string, float[]>();
                var shapes = new Dictionary<string, long[]>();
                for (int layer = 0; layer < 2; layer++)
                {
                    foreach (var p in new[] { new { Param = "gate_up_proj", Parts = new[] { "w1", "w3" } },
                                              new { Param = "down_proj", Parts = new[] { "w2" } } })
                    {
                        var values = new List<float>();
                        long rows = 0, cols = 0;
                        for (int e = 0; e < experts; e++)
                        {
                            rows = 0;  // each expert's saved tensors one after another: gate, then up
                            foreach (string part in p.Parts)
                            {
                                TensorInfo info = base_.Info("model.layers." + layer + ".block_sparse_moe.experts." + e + "." + part + ".weight");
                                rows += info.Shape[0];
                                cols = info.Shape[1];
                                values.AddRange(base_.ReadSingle(info.Index));
                            }
                        }
                        string name = "model.layers." + layer + ".mlp.experts." + p.Param;
                        original[name] = values.ToArray();
                        shapes[name] = new long[] { experts, rows, cols };
                    }
                    string q = "model.layers." + layer + ".self_attn.q_proj.weight";
                    TensorInfo qInfo = base_.Info(q);
                    original[q] = base_.ReadSingle(qInfo.Index);
                    shapes[q] = qInfo.Shape;
                }
                var buffers = new Dictionary<string, float[]>();
                foreach (var kv in original)
                {
                    buffers[kv.Key] = (float[])kv.Value.Clone();
                    host.AddWeight(kv.Key, buffers[kv.Key], shapes[kv.Key]);
                }
                using (Lease lease = registry.Acquire("experts"))
                {
                    SwapStats s = host.Swap(lease);
                    Assert.Equal((long)original.Count, s.LayersMerged, "layers merged");
                    foreach (string name in original.Keys)
                    {
                        float[] want = BufferMerged(adapter, name, original[name], shapes[name], 1.0);
                        Assert.SequenceEqual(want, (float[])buffers[name].Clone(), name + " merged");
                        Assert.True(!want.SequenceEqual(original[name]), name + " changed");
                    }
                    PeftException e = Assert.ThrowsPeft(ErrorCode.Unsupported,
                        () => Serving.LoraApply("model.layers.0.block_sparse_moe.experts.0.w1", lease, new float[16], 1, 16, new float[32], 32),
                        "unmerged apply on an expert layer");
                    Assert.True(e.Message.Contains("target_parameters"), e.Message);
                }
                host.Swap(null);
                foreach (string name in original.Keys) Assert.SequenceEqual(original[name], (float[])buffers[name].Clone(), name + " restored");
            }
        }

        // Weights in pinned managed arrays and in unmanaged memory: a swap merges as a buffer merge does, a second
        // swap replaces it, and a swap to none restores every weight bit for bit.
        [Test]
        public void HostModelSwapsAndRestoresBitForBit()
        {
            var unmanaged = new Dictionary<string, IntPtr>();
            try
            {
                using (Registry registry = LlamaRegistry())
                using (Adapter adapterA = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
                using (Adapter adapterB = Adapter.Open(Fixtures.AdapterDir("llama_lora_second")))
                using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("llama")))
                using (var host = new HostModel())
                {
                    Dictionary<string, long[]> shapes;
                    Dictionary<string, float[]> original = BaseWeights(adapterA, base_, out shapes);
                    var managed = new Dictionary<string, float[]>();
                    int n = 0;
                    foreach (var kv in original)
                    {
                        if (n++ % 2 == 0)
                        {
                            managed[kv.Key] = (float[])kv.Value.Clone();
                            host.AddWeight(kv.Key + ".weight", managed[kv.Key], shapes[kv.Key]);
                        }
                        else
                        {
                            IntPtr p = Marshal.AllocHGlobal(kv.Value.Length * 4);
                            unmanaged[kv.Key] = p;
                            Marshal.Copy(kv.Value, 0, p, kv.Value.Length);
                            host.AddWeight(kv.Key, p, DType.F32, shapes[kv.Key]);
                        }
                    }
                    Func<string, float[]> current = name =>
                    {
                        if (managed.ContainsKey(name)) return (float[])managed[name].Clone();
                        var values = new float[original[name].Length];
                        Marshal.Copy(unmanaged[name], values, 0, values.Length);
                        return values;
                    };
                    Assert.Equal(null, host.Current, "nothing merged yet");

                    SwapStats s;
                    using (Lease a = registry.Acquire("a"))
                    {
                        s = host.Swap(a);
                        Assert.Equal("a", host.Current);
                    }
                    Assert.Equal(14L, s.LayersMerged, "layers merged");
                    Assert.Equal(0L, s.LayersRemoved, "nothing to remove");
                    Assert.True(s.SavedBytes > 0, "original weights kept (exact by default)");
                    Assert.True(s.MergeSeconds >= 0 && s.RemoveSeconds >= 0, "times");
                    Assert.Equal(1L, registry.Stats.Pinned, "the host model holds a after the lease's Dispose");
                    foreach (string name in original.Keys)
                        Assert.SequenceEqual(BufferMerged(adapterA, name, original[name], shapes[name], 1.0), current(name), name + " merged with a");

                    using (Lease b = registry.Acquire("b")) s = host.Swap(b, 0.5);
                    Assert.Equal(14L, s.LayersRemoved, "a removed");
                    Assert.Equal(14L, s.LayersMerged, "b merged");
                    Assert.Equal("b", host.Current);
                    Assert.Equal(1L, registry.Stats.Pinned, "a released by the swap");
                    foreach (string name in original.Keys)
                        Assert.SequenceEqual(BufferMerged(adapterB, name, original[name], shapes[name], 0.5), current(name), name + " merged with b");

                    s = host.Swap(null);
                    Assert.Equal(14L, s.LayersRemoved, "b removed");
                    Assert.Equal(0L, s.LayersMerged, "nothing merged");
                    Assert.Equal(null, host.Current, "none");
                    Assert.Equal(0L, registry.Stats.Pinned, "nothing pinned");
                    foreach (string name in original.Keys) Assert.SequenceEqual(original[name], current(name), name + " restored");

                    // And once more, swap after swap: still bit for bit.
                    using (Lease a = registry.Acquire("a")) host.Swap(a);
                    using (Lease b = registry.Acquire("b")) host.Swap(b);
                    host.Swap(null);
                    foreach (string name in original.Keys) Assert.SequenceEqual(original[name], current(name), name + " restored again");
                }
            }
            finally
            {
                // Only after the host model is disposed: it keeps these addresses while it lives.
                foreach (IntPtr p in unmanaged.Values) Marshal.FreeHGlobal(p);
            }
        }

        [Test]
        public void HostModelBf16BuffersNativeNamesAndBiases()
        {
            using (Registry registry = LlamaRegistry())
            using (Adapter adapterA = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("llama")))
            using (Translator translator = Translator.Builtin("llama"))
            {
                // BF16 buffers given as Memory<byte>, under the host's native names.
                var original = new Dictionary<string, byte[]>();
                var buffers = new Dictionary<string, byte[]>();
                var shapes = new Dictionary<string, long[]>();
                using (var host = new HostModel().SetTranslator(translator))
                {
                    foreach (AdapterModule m in adapterA.Modules())
                    {
                        TensorInfo info = base_.Info(m.Name + ".weight");
                        original[m.Name] = base_.ReadBytes(info.Index, DType.BF16);
                        buffers[m.Name] = (byte[])original[m.Name].Clone();
                        shapes[m.Name] = info.Shape;
                        host.AddWeight(translator.ToNative(info.Name), buffers[m.Name], DType.BF16, info.Shape);
                    }
                    using (Lease a = registry.Acquire("a")) host.Swap(a);
                    foreach (string name in original.Keys)
                    {
                        byte[] want = (byte[])original[name].Clone();
                        using (MergeBuffer.Apply(adapterA, name, want, DType.BF16, shapes[name])) { }
                        Assert.SequenceEqual(want, buffers[name], name + " BF16 merged as a buffer merge");
                    }
                    host.Swap(null);
                    foreach (string name in original.Keys) Assert.SequenceEqual(original[name], buffers[name], name + " BF16 restored bit for bit");

                    // Not exact: PEFT's arithmetic unmerge; the copies the exact swaps took (every weight's bytes) are kept.
                    host.SetExact(false);
                    using (Lease a = registry.Acquire("a"))
                        Assert.Equal(original.Values.Sum(b => (long)b.Length), host.Swap(a).SavedBytes, "the exact swaps' copies kept");
                    var merged = buffers.ToDictionary(kv => kv.Key, kv => Peft.ToSingle(DType.BF16, kv.Value));
                    Assert.Equal(14L, host.Swap(null).LayersRemoved, "removed arithmetically");
                    foreach (string name in original.Keys)
                    {
                        // Two BF16 roundings (merge, unmerge): within an ulp of the larger of the two values each.
                        float[] want = Peft.ToSingle(DType.BF16, original[name]), got = Peft.ToSingle(DType.BF16, buffers[name]);
                        for (int i = 0; i < want.Length; i++)
                            Assert.True(Math.Abs(want[i] - got[i]) <= (Math.Abs(want[i]) + Math.Abs(merged[name][i])) / 128 + 1e-6,
                                        name + " element " + i + " near the original: " + got[i] + " vs " + want[i]);
                    }
                }
            }

            // lora_bias: the layer's bias takes scaling * lora_B.bias and gives it back.
            using (var registry = new Registry(DType.F32, MiB).Register("bias", Fixtures.AdapterDir("qwen2_lora_bias")))
            using (Adapter adapter = Adapter.Open(Fixtures.AdapterDir("qwen2_lora_bias")))
            using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("qwen2")))
            using (var host = new HostModel())
            {
                var weights = new Dictionary<string, float[]>();
                var biases = new Dictionary<string, float[]>();
                foreach (AdapterModule m in adapter.Modules())
                {
                    TensorInfo info = base_.Info(m.Name + ".weight");
                    weights[m.Name] = base_.ReadSingle(info.Index);
                    biases[m.Name] = base_.ReadSingle(m.Name + ".bias");
                    host.AddWeight(m.Name, weights[m.Name], info.Shape, biases[m.Name]);
                }
                using (Lease l = registry.Acquire("bias")) host.Swap(l);
                foreach (AdapterModule m in adapter.Modules())
                {
                    float[] before = base_.ReadSingle(m.Name + ".bias");
                    float[] delta = m.Tensor("lora_B.bias").ReadSingle();
                    for (int i = 0; i < before.Length; i++)
                        Assert.True(Math.Abs(biases[m.Name][i] - (before[i] + delta[i] * m.Scaling)) < 1e-6, m.Name + " bias element " + i);
                }
                host.Swap(null);
                foreach (AdapterModule m in adapter.Modules())
                {
                    Assert.SequenceEqual(base_.ReadSingle(m.Name + ".bias"), biases[m.Name], m.Name + " bias restored");
                    Assert.SequenceEqual(base_.ReadSingle(m.Name + ".weight"), weights[m.Name], m.Name + " weight restored");
                }
            }
        }

        [Test]
        public void HostModelErrorsLeaveTheBuffersUnchanged()
        {
            using (Registry registry = LlamaRegistry())
            using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("llama")))
            using (Lease a = registry.Acquire("a"))
            {
                TensorInfo q = base_.Info(Q0 + ".weight");
                TensorInfo k = base_.Info("model.layers.0.self_attn.k_proj.weight");
                float[] wq = base_.ReadSingle(q.Index), wk = base_.ReadSingle(k.Index);
                float[] q0 = (float[])wq.Clone(), k0 = (float[])wk.Clone();

                using (var host = new HostModel())
                {
                    host.AddWeight(q.Name, wq, q.Shape);
                    PeftException e = Assert.ThrowsPeft(ErrorCode.UnresolvedKey, () => host.Swap(a), "layers without weights");
                    Assert.True(e.Message.Contains("k_proj"), "the message lists the missing layers: " + e.Message);
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => host.AddWeight(q.Name, new float[wq.Length], q.Shape), "a layer twice");
                    using (Translator t = Translator.Builtin("llama"))
                        Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => host.SetTranslator(t), "translator after weights");
                    Assert.Equal(null, host.Current, "nothing merged");
                }
                Assert.SequenceEqual(q0, wq, "q unchanged");

                // A weight whose shape does not fit: k_proj [8, 16] given as [4, 32] (as [16, 8] it would be read as a
                // GPT-2 Conv1D weight [in, out], which fits).
                using (var host = new HostModel())
                using (Adapter adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
                {
                    Dictionary<string, long[]> shapes;
                    Dictionary<string, float[]> weights = BaseWeights(adapter, base_, out shapes);
                    Dictionary<string, float[]> before = weights.ToDictionary(kv => kv.Key, kv => (float[])kv.Value.Clone());
                    foreach (var kv in weights)
                    {
                        long[] shape = shapes[kv.Key];
                        if (kv.Key == "model.layers.0.self_attn.k_proj") shape = new[] { shape[0] / 2, shape[1] * 2 };
                        host.AddWeight(kv.Key, kv.Value, shape);
                    }
                    PeftException e = Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => host.Swap(a), "k_proj as [4, 32]");
                    Assert.True(e.Message.Contains("k_proj"), "names the layer: " + e.Message);
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => host.Swap(a, double.NaN), "NaN weight");
                    foreach (var kv in weights) Assert.SequenceEqual(before[kv.Key], kv.Value, kv.Key + " unchanged");
                }

                // Added while merged, and a buffer written behind an exact host model's back (which owns their contents).
                using (var host = new HostModel())
                using (Adapter adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
                {
                    Dictionary<string, long[]> shapes;
                    Dictionary<string, float[]> weights = BaseWeights(adapter, base_, out shapes);
                    foreach (var kv in weights) host.AddWeight(kv.Key, kv.Value, shapes[kv.Key]);
                    host.Swap(a);
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => host.AddWeight("model.layers.0.mlp.extra", new float[4], new[] { 2L, 2L }),
                                      "a weight added while merged");
                    weights[Q0][0] += 1;
                    host.Swap(null);
                    Assert.Equal(null, host.Current, "removed");
                    Assert.SequenceEqual(base_.ReadSingle(Q0 + ".weight"), weights[Q0], "the original written back over the write");
                }

                // Adapters a swap cannot do, and a missing bias.
                registry.Register("tokens", Fixtures.AdapterDir("llama_trainable_tokens"));
                using (Lease tokens = registry.Acquire("tokens"))
                using (var host = new HostModel())
                {
                    TensorInfo embed = base_.Info("model.embed_tokens.weight");
                    float[] we = base_.ReadSingle(embed.Index);
                    float[] e0 = (float[])we.Clone();
                    foreach (string layer in new[] { "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj" })
                        host.AddWeight(layer, base_.ReadSingle(layer + ".weight"), base_.Info(layer + ".weight").Shape);
                    host.AddWeight(embed.Name, we, embed.Shape);
                    Assert.ThrowsPeft(ErrorCode.Unsupported, () => host.Swap(tokens), "trainable tokens");
                    Assert.SequenceEqual(e0, we, "embedding unchanged");
                }
                using (var biasRegistry = new Registry(DType.F32, MiB).Register("bias", Fixtures.AdapterDir("qwen2_lora_bias")))
                using (Adapter adapter = Adapter.Open(Fixtures.AdapterDir("qwen2_lora_bias")))
                using (Checkpoint qwen = Checkpoint.Open(Fixtures.Model("qwen2")))
                using (Lease l = biasRegistry.Acquire("bias"))
                {
                    using (var host = new HostModel())
                    {
                        foreach (AdapterModule m in adapter.Modules())
                            host.AddWeight(m.Name, qwen.ReadSingle(m.Name + ".weight"), qwen.Info(m.Name + ".weight").Shape);
                        Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => host.Swap(l), "lora_bias without bias buffers");
                    }
                    // A bias one element shorter or longer than v_proj's 8 output features, given as managed bytes or as
                    // unmanaged memory with its count, both the front of 9 elements: the swap names the layer and changes
                    // nothing, not even the element past the shorter bias.
                    const string vProj = "model.layers.0.self_attn.v_proj";
                    foreach (bool unmanaged in new[] { false, true })
                        foreach (int length in new[] { 7, 9 })
                        {
                            Dictionary<string, float[]> weights = adapter.Modules().ToDictionary(m => m.Name, m => qwen.ReadSingle(m.Name + ".weight"));
                            Dictionary<string, float[]> biases = adapter.Modules().ToDictionary(m => m.Name, m => qwen.ReadSingle(m.Name + ".bias"));
                            Assert.Equal(8, biases[vProj].Length, "v_proj's bias");
                            var vBias = new float[9];  // v_proj's 8 values, then one that the 7-element bias does not own
                            Array.Copy(biases[vProj], vBias, 8);
                            vBias[8] = 0.5f;
                            var vBiasBytes = new byte[9 * 4];
                            System.Buffer.BlockCopy(vBias, 0, vBiasBytes, 0, vBiasBytes.Length);
                            byte[] vBiasBefore = (byte[])vBiasBytes.Clone();
                            float[] vWeight = weights[vProj];
                            var vWeightBytes = new byte[vWeight.Length * 4];
                            System.Buffer.BlockCopy(vWeight, 0, vWeightBytes, 0, vWeightBytes.Length);
                            byte[] vWeightBefore = (byte[])vWeightBytes.Clone();
                            IntPtr uWeight = Marshal.AllocHGlobal(vWeight.Length * 4), uBias = Marshal.AllocHGlobal(vBiasBytes.Length);
                            try
                            {
                                Marshal.Copy(vWeight, 0, uWeight, vWeight.Length);
                                Marshal.Copy(vBiasBytes, 0, uBias, vBiasBytes.Length);
                                using (var host = new HostModel())
                                {
                                    foreach (AdapterModule m in adapter.Modules())
                                    {
                                        long[] shape = qwen.Info(m.Name + ".weight").Shape;
                                        if (m.Name != vProj)
                                            host.AddWeight(m.Name, weights[m.Name], shape, biases[m.Name]);
                                        else if (unmanaged)
                                            host.AddWeight(m.Name, uWeight, DType.F32, shape, uBias, length);
                                        else
                                            host.AddWeight(m.Name, vWeightBytes, DType.F32, shape, new Memory<byte>(vBiasBytes, 0, length * 4));
                                    }
                                    PeftException e = Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => host.Swap(l),
                                                                        "a bias of " + length + (unmanaged ? " (unmanaged)" : ""));
                                    Assert.True(e.Message.Contains("v_proj"), "names the layer: " + e.Message);
                                    Assert.Equal(null, host.Current, "nothing merged");
                                }
                                foreach (AdapterModule m in adapter.Modules())
                                {
                                    Assert.SequenceEqual(qwen.ReadSingle(m.Name + ".weight"), weights[m.Name], m.Name + " weight unchanged");
                                    Assert.SequenceEqual(qwen.ReadSingle(m.Name + ".bias"), biases[m.Name], m.Name + " bias unchanged");
                                }
                                var unmanagedWeight = new float[vWeight.Length];
                                Marshal.Copy(uWeight, unmanagedWeight, 0, unmanagedWeight.Length);
                                var unmanagedBias = new byte[vBiasBytes.Length];
                                Marshal.Copy(uBias, unmanagedBias, 0, unmanagedBias.Length);
                                if (unmanaged) Assert.SequenceEqual(vWeight, unmanagedWeight, "v_proj weight unchanged");
                                else Assert.SequenceEqual(vWeightBefore, vWeightBytes, "v_proj weight unchanged");
                                Assert.SequenceEqual(vBiasBefore, unmanaged ? unmanagedBias : vBiasBytes, "v_proj bias (9 elements) unchanged");
                            }
                            finally
                            {
                                Marshal.FreeHGlobal(uWeight);
                                Marshal.FreeHGlobal(uBias);
                            }
                        }
                }

                // What the binding refuses before C.
                using (var host = new HostModel())
                {
                    Assert.Throws<ArgumentException>(() => host.AddWeight(q.Name, new float[wq.Length - 1], q.Shape), "short weight");
                    Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => host.AddWeight(q.Name, wq, q.Shape, new float[0]), "an empty bias (refused by C)");
                    Assert.Throws<ArgumentException>(() => host.AddWeight(q.Name, new byte[wq.Length * 4], DType.F32, q.Shape, new byte[6]),
                                                     "a bias of no whole F32 elements");
                    Assert.Throws<ArgumentOutOfRangeException>(() => host.AddWeight(q.Name, (IntPtr)16, DType.F32, q.Shape, (IntPtr)16, -1),
                                                               "a negative bias count");
                    Assert.Throws<ArgumentOutOfRangeException>(() => host.AddWeight(q.Name, wq, new[] { -16L, -16L }), "negative dimensions");
                    Assert.ThrowsPeft(ErrorCode.Unsupported, () => host.AddWeight(q.Name, new byte[wq.Length * 4], DType.I32, q.Shape), "I32 weight");
                    Assert.Throws<ArgumentNullException>(() => host.AddWeight(q.Name, (float[])null, q.Shape));
                    using (Translator t = Translator.Builtin("llama"))
                    using (HostModel native = new HostModel().SetTranslator(t))
                        Assert.ThrowsPeft(ErrorCode.UnresolvedKey, () => native.AddWeight("not/a/native/name", wq, q.Shape), "a name the translator does not resolve");
                    host.AddWeight(k.Name, wk, k.Shape);
                }
                Assert.SequenceEqual(k0, wk, "k unchanged");
            }
        }

        // Managed buffers are pinned while the host model lives (a buffer AddWeight refused is not kept), and
        // unpinned when it is released, by Dispose or by its finalizer, which also drops its hold on the adapter.
        [Test]
        public void HostModelPinsManagedBuffersUntilReleased()
        {
            using (Registry registry = LlamaRegistry())
            using (Adapter adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("llama")))
            {
                TensorInfo q = base_.Info(Q0 + ".weight");
                var host = new HostModel();
                WeakReference kept = null, refused = null;
                // The arrays are made on a thread that ends, so that no stack refers to them (Mono scans stacks
                // conservatively) and only the host model's pins can keep them.
                RunOnThread(() =>
                {
                    float[] w = base_.ReadSingle(q.Index);
                    host.AddWeight(q.Name, w, q.Shape);
                    kept = new WeakReference(w);
                    var bad = new float[w.Length];
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => host.AddWeight(q.Name, bad, q.Shape), "twice");
                    refused = new WeakReference(bad);
                });
                CollectGarbage();
                Assert.True(kept.IsAlive, "pinned while the host model lives");
                Assert.False(refused.IsAlive, "a refused buffer is not kept");
                host.Dispose();
                CollectGarbage();
                Assert.False(kept.IsAlive, "unpinned by Dispose");

                // Abandoned with an adapter merged: the finalizer frees the host model, its hold and its pins.
                WeakReference abandoned = null;
                RunOnThread(() =>
                {
                    var h = new HostModel();
                    Dictionary<string, long[]> shapes;
                    foreach (var kv in BaseWeights(adapter, base_, out shapes)) h.AddWeight(kv.Key, kv.Value, shapes[kv.Key]);
                    using (Lease l = registry.Acquire("a")) h.Swap(l);
                    Assert.Equal(1L, registry.Stats.Pinned, "the host model holds a");
                    abandoned = new WeakReference(h);
                });
                CollectGarbage();
                Assert.False(abandoned.IsAlive, "the host model was collected");
                Assert.Equal(0L, registry.Stats.Pinned, "its finalizer released the adapter");
            }
        }

        private static void RunOnThread(Action action)
        {
            Exception error = null;
            var t = new Thread(() =>
            {
                try { action(); }
                catch (Exception e) { error = e; }
            });
            t.Start();
            t.Join();
            if (error != null) throw new Exception("on the thread: " + error.Message, error);
        }

        private static void CollectGarbage()
        {
            for (int i = 0; i < 3; i++)
            {
                GC.Collect();
                GC.WaitForPendingFinalizers();
            }
        }

        [Test]
        public void DisposeTwiceAndUseAfterDispose()
        {
            using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("llama")))
            {
                TensorInfo q = base_.Info(Q0 + ".weight");
                Registry registry = LlamaRegistry();
                Lease lease = registry.Acquire("a");
                var host = new HostModel();
                var uses = new Dictionary<NativeObject, Action>
                {
                    { registry, () => registry.Acquire("a").Dispose() },
                    { lease, () => lease.HasModule(Q0) },
                    { host, () => { var unused = host.Current; } },
                };
                foreach (var use in uses)
                {
                    use.Value();
                    Assert.False(use.Key.IsDisposed, use.Key.GetType().Name);
                }
                lease.Dispose();
                lease.Dispose();
                registry.Dispose();
                registry.Dispose();
                host.Dispose();
                host.Dispose();
                foreach (var use in uses)
                {
                    Assert.True(use.Key.IsDisposed, use.Key.GetType().Name);
                    var e = Assert.Throws<ObjectDisposedException>(use.Value, use.Key.GetType().Name);
                    Assert.Equal(use.Key.GetType().Name, e.ObjectName);
                }
                Assert.Throws<ObjectDisposedException>(() => { var unused = lease.Name; }, "Name");
                Assert.Throws<ObjectDisposedException>(() => { var unused = registry.Stats; }, "Stats");
                Assert.Throws<ObjectDisposedException>(() => host.AddWeight(q.Name, new float[q.ElementCount], q.Shape), "AddWeight");

                // A disposed lease handed to calls.
                float[] x = new float[16], y = new float[16];
                Assert.Throws<ObjectDisposedException>(() => Serving.LoraApply(Q0, lease, x, 1, 16, y, 16), "LoraApply");
                using (var other = new HostModel()) Assert.Throws<ObjectDisposedException>(() => other.Swap(lease), "Swap");
            }
        }

        // Leases, and the adapter a host model holds, stay usable after the registry is disposed.
        [Test]
        public void LeasesOutliveTheRegistry()
        {
            using (Checkpoint base_ = Checkpoint.Open(Fixtures.Model("llama")))
            using (Adapter adapterA = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (Adapter adapterB = Adapter.Open(Fixtures.AdapterDir("llama_lora_second")))
            using (var host = new HostModel())
            {
                Dictionary<string, long[]> shapes;
                Dictionary<string, float[]> weights = BaseWeights(adapterA, base_, out shapes);
                Dictionary<string, float[]> original = weights.ToDictionary(kv => kv.Key, kv => (float[])kv.Value.Clone());
                foreach (var kv in weights) host.AddWeight(kv.Key, kv.Value, shapes[kv.Key]);

                Registry registry = LlamaRegistry();
                Lease a = registry.Acquire("a");
                Lease b = registry.Acquire("b");
                var layer = new Layer(adapterA.Module(Q0));
                var random = new Random(5);
                float[] x = RandomFloats(random, 2 * layer.In), y0 = RandomFloats(random, 2 * layer.Out);
                float[] before = (float[])y0.Clone();
                Serving.LoraApply(Q0, a, x, 2, layer.In, before, layer.Out);
                host.Swap(a);
                registry.Dispose();

                Assert.Equal("a", a.Name);
                Assert.True(a.HasModule(Q0), "HasModule after the registry's Dispose");
                float[] after = (float[])y0.Clone();
                Serving.LoraApply(Q0, a, x, 2, layer.In, after, layer.Out);
                Assert.SequenceEqual(before, after, "the same product after the registry's Dispose");
                a.Dispose();

                host.Swap(b);
                b.Dispose();
                Assert.Equal("b", host.Current, "swapped after the registry's Dispose");
                foreach (var kv in weights)
                    Assert.SequenceEqual(BufferMerged(adapterB, kv.Key, original[kv.Key], shapes[kv.Key], 1.0), kv.Value, kv.Key + " merged with b");
                host.Swap(null);
                foreach (var kv in weights) Assert.SequenceEqual(original[kv.Key], kv.Value, kv.Key + " restored");
            }
        }
    }
}
