// Whole-model task arithmetic (Merge.CombineModels) compared with `peftc model combine` (PEFTC, else the repository's
// build/peftc) byte for byte, on two "fine-tuned" copies of the llama fixture that the binding's Writer writes; the
// base combined with itself; and the refusals, which write nothing. Also a merge of two adapters combined on their
// deltas (MergeOptions.SetCombine) compared with `peftc merge --combine`.
using System;
using System.IO;
using System.Linq;

namespace PeftC.Tests
{
    public class CombineModelsTests
    {
        // A copy of the llama fixture in dir with every F32 tensor moved by small deterministic noise (phase chooses
        // it); config.json is copied.
        private static void FineTune(string dir, double phase)
        {
            string baseDir = Fixtures.Model("llama");
            Directory.CreateDirectory(dir);
            File.Copy(Path.Combine(baseDir, "config.json"), Path.Combine(dir, "config.json"));
            using (Checkpoint source = Checkpoint.Open(Path.Combine(baseDir, "model.safetensors")))
            using (Writer writer = Writer.Create(Path.Combine(dir, "model.safetensors")))
            {
                TensorInfo[] infos = source.Tensors();
                foreach (TensorInfo info in infos)
                    writer.AddTensor(info.Name, info.DType.Value, info.Shape);
                writer.SetMetadataPresent(true);
                writer.SetMetadata("format", "pt");
                writer.Start();
                foreach (string name in writer.WriteOrder())
                {
                    int t = Array.FindIndex(infos, i => i.Name == name);
                    TensorInfo info = infos[t];
                    if (info.DType == DType.F32)
                    {
                        float[] values = source.ReadSingle(info.Index);
                        for (int j = 0; j < values.Length; j++)
                            values[j] += (float)(0.02 * Math.Sin(phase + t * 1.7 + j * 0.61));
                        writer.WriteTensor(name, values);
                    }
                    else
                    {
                        writer.WriteTensor(name, info.DType.Value, source.ReadBytes(info.Index, info.DType.Value));
                    }
                }
                writer.Finish();
            }
        }

        private static byte[] Bytes(string dir)
        {
            return File.ReadAllBytes(Path.Combine(dir, "model.safetensors"));
        }

        [Test]
        public void DareTiesOfTwoFineTunedModelsMatchesPeftc()
        {
            using (var tmp = new TempDir())
            using (var combine = new ExportOptions())
            {
                string baseDir = Fixtures.Model("llama");
                FineTune(tmp["a"], 0.3);
                FineTune(tmp["b"], 2.1);
                combine.SetCombineDensity(0.5).SetCombineSeed(5).SetCombineMajoritySign(MajoritySign.Frequency);
                MergeResult result = Merge.CombineModels(baseDir, new[] { tmp["a"], tmp["b"] }, new[] { 0.7, -0.4 },
                                                         CombineMethod.DareTies, tmp["dare_ties"], combine);
                Assert.True(result.Merged > 0, "combined tensors: " + result.Merged);
                Assert.True(result.Files.Contains("model.safetensors"), "model.safetensors among the files");
                Assert.False(Bytes(tmp["dare_ties"]).SequenceEqual(Bytes(baseDir)), "the combination differs from the base");
                LowRankTests.Peftc("model", "combine", "--base", baseDir, "--model", tmp["a"] + ":0.7", "--model",
                                   tmp["b"] + ":-0.4", "--method", "dare_ties", "--density", "0.5", "--seed", "5",
                                   "--majority-sign", "frequency", "--out", tmp["dare_ties-peftc"]);
                Assert.True(Bytes(tmp["dare_ties"]).SequenceEqual(Bytes(tmp["dare_ties-peftc"])),
                            "model.safetensors is the same as peftc's");

                // With progress: the last call has done == total.
                long lastDone = -1, lastTotal = -2;
                Merge.CombineModels(baseDir, new[] { tmp["a"], tmp["b"] }, new[] { 0.7, -0.4 }, CombineMethod.DareTies,
                                    tmp["again"], combine, null, (done, total) =>
                                    {
                                        lastDone = done;
                                        lastTotal = total;
                                        return true;
                                    });
                Assert.Equal(lastTotal, lastDone, "progress ends at the total");
                Assert.True(Bytes(tmp["again"]).SequenceEqual(Bytes(tmp["dare_ties"])), "the same bytes with progress");
            }
        }

        [Test]
        public void TheBaseWithItselfIsTheBase()
        {
            using (var tmp = new TempDir())
            {
                string baseDir = Fixtures.Model("llama");
                MergeResult result = Merge.CombineModels(baseDir, new[] { baseDir, baseDir }, new[] { 0.5, 1.5 },
                                                         CombineMethod.Linear, tmp["same"]);
                Assert.True(result.Merged > 0, "combined tensors: " + result.Merged);
                Assert.True(Bytes(tmp["same"]).SequenceEqual(Bytes(baseDir)), "the base's own bytes");
            }
        }

        [Test]
        public void RefusedCombinationsWriteNothing()
        {
            using (var tmp = new TempDir())
            using (var density = new ExportOptions())
            using (var withAdapter = new MergeOptions())
            {
                string baseDir = Fixtures.Model("llama");
                var models = new[] { baseDir, baseDir };
                var weights = new[] { 0.7, -0.4 };
                density.SetCombineDensity(0.5);
                withAdapter.AddAdapterDir(Fixtures.AdapterDir("llama_lora"));
                Action<string, Action> refused = (name, call) =>
                {
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, call, name);
                    Assert.False(Directory.Exists(tmp[name]) || File.Exists(tmp[name]), name + " not written");
                };
                refused("ties-without-density",
                        () => Merge.CombineModels(baseDir, models, weights, CombineMethod.Ties, tmp["ties-without-density"]));
                refused("svd", () => Merge.CombineModels(baseDir, models, weights, CombineMethod.Svd, tmp["svd"], density));
                refused("with-adapter", () => Merge.CombineModels(baseDir, models, weights, CombineMethod.Linear,
                                                                  tmp["with-adapter"], null, withAdapter));
                refused("none", () => Merge.CombineModels(baseDir, new string[0], new double[0], CombineMethod.Linear,
                                                          tmp["none"]));
                Assert.Throws<ArgumentException>(() => Merge.CombineModels(baseDir, models, new[] { 1.0 }, CombineMethod.Linear,
                                                                           tmp["count"]), "count mismatch");
                Assert.False(Directory.Exists(tmp["count"]), "count not written");
            }
        }

        // The llama fixture's merge options with llama_lora (0.9) and llama_rslora (-0.6).
        private static MergeOptions TwoAdapters()
        {
            var options = new MergeOptions();
            options.AddAdapterDir(Fixtures.AdapterDir("llama_lora"), 0.9)
                   .AddAdapterDir(Fixtures.AdapterDir("llama_rslora"), -0.6);
            return options;
        }

        [Test]
        public void MergeCombinedByTiesMatchesPeftc()
        {
            using (var tmp = new TempDir())
            using (var density = new ExportOptions())
            using (MergeOptions options = TwoAdapters())
            using (MergeOptions plainOptions = TwoAdapters())
            {
                string baseDir = Fixtures.Model("llama");
                density.SetCombineDensity(0.5);
                MergeResult result = Merge.Checkpoint(baseDir, tmp["ties"],
                                                      options.SetCombine(CombineMethod.Ties, density));
                Assert.True(result.Merged > 0, "merged tensors: " + result.Merged);
                LowRankTests.Peftc("merge", "--base", baseDir, "--out", tmp["ties-peftc"], "--adapter",
                                   Fixtures.AdapterDir("llama_lora") + ":0.9", "--adapter",
                                   Fixtures.AdapterDir("llama_rslora") + ":-0.6", "--combine", "ties", "--density", "0.5");
                Assert.True(Bytes(tmp["ties"]).SequenceEqual(Bytes(tmp["ties-peftc"])),
                            "model.safetensors is the same as peftc's");

                // Linear is the plain merge, which the ties merge is not.
                Merge.Checkpoint(baseDir, tmp["plain"], plainOptions);
                Assert.False(Bytes(tmp["ties"]).SequenceEqual(Bytes(tmp["plain"])),
                             "the ties merge differs from the plain one");
                Merge.Checkpoint(baseDir, tmp["linear"], options.SetCombine(CombineMethod.Linear));
                Assert.True(Bytes(tmp["linear"]).SequenceEqual(Bytes(tmp["plain"])), "linear is the plain merge");
            }
        }

        [Test]
        public void RefusedMergeCombinations()
        {
            using (var options = new MergeOptions())
            using (var seed = new ExportOptions())
            using (var density = new ExportOptions())
            {
                seed.SetCombineSeed(3);
                density.SetCombineDensity(0.5);
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetCombine(CombineMethod.Ties),
                                  "ties without options");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetCombine(CombineMethod.DareTies, seed),
                                  "dare_ties without a density");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetCombine(CombineMethod.MagnitudePrune, seed),
                                  "magnitude_prune without a density");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetCombine(CombineMethod.Svd, density), "svd");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetCombine(CombineMethod.Cat), "cat");
                options.SetCombine(CombineMethod.DareLinear, density); // a refused setting leaves the options usable
            }
        }
    }
}
