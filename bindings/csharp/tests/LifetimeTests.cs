using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Runtime.CompilerServices;
using System.Threading;

namespace PeftC.Tests
{
    public class LifetimeTests
    {
        private static IEnumerable<NativeObject> EveryWrapper(TempDir tmp)
        {
            yield return Checkpoint.Open(Fixtures.Safetensors("dtype_f32.safetensors"));
            yield return Writer.Create(tmp["w"]);
            yield return Adapter.Open(Fixtures.AdapterDir("llama_lora"));
            yield return Translator.Builtin("llama");
            yield return new MergeOptions();
            yield return new MergeBufferOptions();
            yield return new ExportOptions();
        }

        [Test]
        public void DisposeTwiceAndUseAfterDispose()
        {
            using (var tmp = new TempDir())
            {
                var uses = new Dictionary<Type, Action<NativeObject>>
                {
                    { typeof(Checkpoint), o => ((Checkpoint)o).Find("values") },
                    { typeof(Writer), o => ((Writer)o).Start() },
                    { typeof(Adapter), o => { var unused = ((Adapter)o).R; } },
                    { typeof(Translator), o => ((Translator)o).ToNative("model.layers.0.self_attn.q_proj.weight") },
                    { typeof(MergeOptions), o => ((MergeOptions)o).SetThreads(1) },
                    { typeof(MergeBufferOptions), o => ((MergeBufferOptions)o).SetWeight(1) },
                    { typeof(ExportOptions), o => ((ExportOptions)o).SetDType(null) },
                };
                foreach (NativeObject o in EveryWrapper(tmp))
                {
                    uses[o.GetType()](o);  // works while alive
                    Assert.False(o.IsDisposed, o.GetType().Name);
                    o.Dispose();
                    o.Dispose();
                    Assert.True(o.IsDisposed, o.GetType().Name);
                    var e = Assert.Throws<ObjectDisposedException>(() => uses[o.GetType()](o), o.GetType().Name);
                    Assert.Equal(o.GetType().Name, e.ObjectName);
                }
                // Objects handed to calls are checked too.
                var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora"));
                adapter.Dispose();
                Assert.Throws<ObjectDisposedException>(() => new MergeOptions().AddAdapter(adapter));
                Assert.Throws<ObjectDisposedException>(() => Export.Combine(new[] { adapter }, new[] { 1.0 }, CombineMethod.Cat, tmp["c"]));
                var ckpt = Checkpoint.Open(Fixtures.Safetensors("dtype_f32.safetensors"));
                ckpt.Dispose();
                using (var w = Writer.Create(tmp["x"]))
                {
                    w.AddTensor("a", DType.F32, 1);
                    Assert.Throws<ObjectDisposedException>(() => w.WriteFromCheckpoint(null, ckpt, 0));
                }
                var r = MakeRecord();
                r.Dispose();
                Assert.Throws<ObjectDisposedException>(() => { var unused = r.Active; });
            }
        }

        private static MergeRecord MakeRecord()
        {
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var base_ = Checkpoint.Open(Fixtures.Model("llama")))
            {
                TensorInfo q = base_.Info("model.layers.0.self_attn.q_proj.weight");
                return MergeBuffer.Apply(adapter, "model.layers.0.self_attn.q_proj", base_.ReadSingle(q.Index).AsSpan(), q.Shape);
            }
        }

        // Objects never disposed are released by the finalizer thread; the library stays usable.
        [Test]
        public void FinalizersReleaseUndisposedHandles()
        {
            using (var tmp = new TempDir())
            {
                for (int round = 0; round < 3; round++)
                {
                    Abandon(tmp, round);
                    GC.Collect();
                    GC.WaitForPendingFinalizers();
                    GC.Collect();
                }
                Assert.Equal(0, Directory.GetFiles(tmp.Path).Count(f => f.Contains("peft-tmp")), "unfinished writers removed their temporaries");
                Assert.False(File.Exists(tmp["w0"]), "an unfinished writer's target is not created");
                using (var c = Checkpoint.Open(Fixtures.Safetensors("dtype_f32.safetensors"))) Assert.Equal(2, c.TensorCount);
            }
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        private static void Abandon(TempDir tmp, int round)
        {
            foreach (NativeObject o in EveryWrapper(tmp)) GC.KeepAlive(o);
            var w = Writer.Create(tmp["w" + round]);
            w.AddTensor("a", DType.F32, 1000);
            w.BeginTensor("a", DType.F32);
            w.Write(new byte[400]);
            var c = Checkpoint.Open(Fixtures.Safetensors("dtype_f32.safetensors"));
            c.ViewMemory(0);
            c.ViewStream(1);
            MakeRecord();
            var a = Adapter.Open(Fixtures.AdapterDir("llama_lora"));
            a.Translator();
        }

        // Children keep their parents alive in C: disposing the parent first is fine.
        [Test]
        public void ChildrenOutliveTheirParents()
        {
            using (var tmp = new TempDir())
            {
                var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora"));
                Translator t = adapter.Translator();
                var options = new MergeOptions().AddAdapter(adapter);
                adapter.Dispose();
                Assert.Equal("llama", t.Family);
                Merge.Checkpoint(Fixtures.Model("llama"), tmp["out"], options);
                options.Dispose();
                t.Dispose();
                Assert.True(File.Exists(Path.Combine(tmp["out"], "model.safetensors")), "merged with a disposed adapter handle");
            }
        }

        // Read-only handles are shared by threads: every thread reads the same values.
        [Test]
        public void ReadOnlyHandlesAreSharedByThreads()
        {
            using (var ckpt = Checkpoint.Open(Fixtures.Model("llama")))
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var translator = Translator.Builtin("llama"))
            {
                var names = ckpt.TensorNames();
                var expected = names.Select(n => CheckpointTests.Sha256(ckpt.View(ckpt.Find(n)))).ToArray();
                var keys = adapter.Modules().SelectMany(m => m.Tensors()).Select(t => t.Key).ToArray();
                var natives = translator.ToNative(keys);
                var errors = new List<string>();
                var threads = Enumerable.Range(0, 8).Select(k => new Thread(() =>
                {
                    try
                    {
                        for (int round = 0; round < 20; round++)
                        {
                            for (int i = 0; i < names.Length; i++)
                            {
                                int index = ckpt.Find(names[(i + k) % names.Length]);
                                if (CheckpointTests.Sha256(ckpt.View(index)) != expected[(i + k) % names.Length]) throw new Exception("view differs");
                                ckpt.ReadSingle(index);
                            }
                            for (int i = 0; i < keys.Length; i++)
                                if (translator.ToNative(keys[i]) != natives[i]) throw new Exception("translation differs");
                            adapter.Modules()[k % adapter.ModuleCount].Tensor(0).ReadSingle();
                        }
                    }
                    catch (Exception e)
                    {
                        lock (errors) errors.Add(e.Message);
                    }
                })).ToList();
                threads.ForEach(t => t.Start());
                threads.ForEach(t => t.Join());
                Assert.Equal(0, errors.Count, "thread errors: " + string.Join("; ", errors));
            }
        }

        // Buffer merges of different buffers run concurrently with the same adapter.
        [Test]
        public void ConcurrentBufferMerges()
        {
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var ckpt = Checkpoint.Open(Fixtures.Model("llama")))
            {
                TensorInfo q = ckpt.Info("model.layers.0.self_attn.q_proj.weight");
                float[] original = ckpt.ReadSingle(q.Index);
                float[] reference = (float[])original.Clone();
                using (MergeBuffer.Apply(adapter, "model.layers.0.self_attn.q_proj", reference.AsSpan(), q.Shape)) { }
                var results = new float[8][];
                var threads = Enumerable.Range(0, 8).Select(k => new Thread(() =>
                {
                    var w = (float[])original.Clone();
                    using (MergeBuffer.Apply(adapter, "model.layers.0.self_attn.q_proj", w.AsSpan(), q.Shape)) { }
                    results[k] = w;
                })).ToList();
                threads.ForEach(t => t.Start());
                threads.ForEach(t => t.Join());
                foreach (float[] r in results) Assert.SequenceEqual(reference, r, "same result on every thread");
            }
        }
    }
}
