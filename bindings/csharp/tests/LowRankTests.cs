// The recent C API through the binding, compared with peftc (PEFTC, else the repository's build/peftc) byte for
// byte: LoRA extraction and conversion (LowRank), a merge into a block-quantized GGUF base with an output type and
// the store report (MergeOptions.SetQuant/SetReport), DoRA in unmerged apply with the host's base weight
// (Registry.SetBaseWeight/BaseWeightsChanged), the pruning combinations (Export.Combine with ties and dare_linear),
// the SVD combinations (svd, ties_svd, dare_ties_svd), the combination in delta space (LowRank.CombineDeltas) and the
// ggml merge arithmetic (MergeOptions.SetArithmetic).
using System;
using System.Diagnostics;
using System.IO;
using System.Linq;

namespace PeftC.Tests
{
    public class LowRankTests
    {
        private static readonly string[] AdapterFiles = { "adapter_model.safetensors", "adapter_config.json" };

        // Runs peftc; a test without one is skipped (bindings/csharp/test.sh always has it).
        internal static void Peftc(params string[] args)
        {
            string bin = Environment.GetEnvironmentVariable("PEFTC");
            if (string.IsNullOrEmpty(bin)) bin = Path.Combine(Directory.GetCurrentDirectory(), "build", "peftc");
            if (!File.Exists(bin)) throw new SkipException("no peftc at " + bin + " (set PEFTC)");
            var info = new ProcessStartInfo(bin, string.Join(" ", args.Select(a => "\"" + a + "\"")))
            {
                UseShellExecute = false, RedirectStandardOutput = true, RedirectStandardError = true,
            };
            using (Process p = Process.Start(info))
            {
                p.StandardOutput.ReadToEnd();
                string err = p.StandardError.ReadToEnd();
                p.WaitForExit();
                Assert.Equal(0, p.ExitCode, "peftc " + string.Join(" ", args) + ": " + err);
            }
        }

        private static void SameFiles(string a, string b, params string[] names)
        {
            foreach (string name in names)
            {
                byte[] x = File.ReadAllBytes(Path.Combine(a, name)), y = File.ReadAllBytes(Path.Combine(b, name));
                Assert.True(x.Length > 0 && x.SequenceEqual(y), name + " is the same in " + a + " and " + b);
            }
        }

        [Test]
        public void ExtractionAndConversionWriteWhatPeftcWrites()
        {
            using (var tmp = new TempDir())
            using (var merge = new MergeOptions())
            using (var rank2 = new LowRankOptions())
            using (var energy = new LowRankOptions())
            using (var lora = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var dora = Adapter.Open(Fixtures.AdapterDir("llama_dora")))
            {
                string baseDir = Fixtures.Model("llama"), loraDir = Fixtures.AdapterDir("llama_lora"), tuned = tmp["tuned"];
                Merge.Checkpoint(baseDir, tuned, merge.AddAdapterDir(loraDir));

                rank2.SetRank(2).SetThreads(2).SetModules("q_proj", "v_proj");
                LowRankModule[] report = LowRank.Extract(baseDir, tuned, tmp["extracted"], rank2);
                Assert.True(report.Length > 0, "modules extracted");
                foreach (LowRankModule m in report)
                {
                    Assert.Equal(2L, m.Rank, m.Name);
                    Assert.True(m.Error >= 0 && m.Error < 1, m.ToString());
                    Assert.True(m.Name.EndsWith(".q_proj") || m.Name.EndsWith(".v_proj"), m.Name);
                }
                Peftc("adapter", "extract", "--base", baseDir, "--tuned", tuned, "--out", tmp["extracted-peftc"], "--rank", "2",
                      "--threads", "2", "--modules", "q_proj,v_proj");
                SameFiles(tmp["extracted"], tmp["extracted-peftc"], AdapterFiles);

                energy.SetEnergy(0.9).SetDType(DType.BF16).SetSvd(SvdMethod.Randomized);
                Assert.True(LowRank.Extract(baseDir, tuned, tmp["energy"], energy).All(m => m.Rank >= 1), "energy ranks");
                Peftc("adapter", "extract", "--base", baseDir, "--tuned", tuned, "--out", tmp["energy-peftc"], "--energy", "0.9",
                      "--dtype", "bf16", "--svd", "randomized");
                SameFiles(tmp["energy"], tmp["energy-peftc"], AdapterFiles);

                rank2.SetModules(); // the default again; not used by the conversion anyway
                LowRankModule[] converted = LowRank.ConvertToLora(lora, tmp["r2"], rank2);
                Assert.Equal(lora.ModuleCount, converted.Length, "modules converted");
                Assert.True(converted.All(m => m.Rank == 2), "rank 2");
                Peftc("adapter", "convert", loraDir, tmp["r2-peftc"], "--to", "lora", "--rank", "2");
                SameFiles(tmp["r2"], tmp["r2-peftc"], AdapterFiles);

                LowRank.ConvertInitial(loraDir, loraDir, tmp["doubled"]);
                Peftc("adapter", "convert", loraDir, tmp["doubled-peftc"], "--to", "lora", "--initial", loraDir);
                SameFiles(tmp["doubled"], tmp["doubled-peftc"], AdapterFiles);
                using (var doubled = Adapter.Open(tmp["doubled"]))
                    Assert.Equal(lora.ModuleCount, doubled.ModuleCount, "modules after the initial conversion");

                using (var none = new LowRankOptions())
                {
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => LowRank.ConvertToLora(lora, tmp["none"], none), "no rank");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => none.SetEnergy(1.5), "energy 1.5");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => none.SetRank(0), "rank 0");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => none.SetModules(""), "an empty module name");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => none.SetSvd((SvdMethod)7), "svd 7");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => none.SetRank(100000).SetDType(DType.F64), "F64 factors");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => LowRank.ConvertToLora(lora, tmp["big"], none), "rank too big");
                }
                Assert.ThrowsPeft(ErrorCode.Unsupported, () => LowRank.ConvertToLora(dora, tmp["dora"], rank2), "DoRA");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => LowRank.Extract(baseDir, baseDir, tmp["same"], rank2), "nothing changed");
                Assert.ThrowsPeft(ErrorCode.Unsupported, () => LowRank.ConvertInitial(loraDir, Fixtures.AdapterDir("llama_dora"), tmp["mixed"]),
                                  "LoRA against DoRA");
                Assert.ThrowsPeft(ErrorCode.Io, () => LowRank.ConvertInitial(loraDir, tmp.Path, tmp["z"]), "no adapter");
                lora.Dispose();
                Assert.Throws<ObjectDisposedException>(() => LowRank.ConvertToLora(lora, tmp["closed"], rank2), "disposed adapter");
            }
        }

        // An IA3 adapter on the llama fixture's layer-0 k_proj (8 x 16), ia3_l = 1 + i / 16, as
        // tests/capi/test_lowrank.c writes it: multiplicative, so it converts against a base only.
        private static void WriteIa3Adapter(string dir)
        {
            Directory.CreateDirectory(dir);
            File.WriteAllText(Path.Combine(dir, "adapter_config.json"),
                "{\"peft_type\": \"IA3\", \"target_modules\": [\"k_proj\"], \"feedforward_modules\": [], \"task_type\": \"CAUSAL_LM\"}");
            byte[] header = System.Text.Encoding.ASCII.GetBytes(
                "{\"base_model.model.model.layers.0.self_attn.k_proj.ia3_l\": {\"dtype\": \"F32\", \"shape\": [8, 1], \"data_offsets\": [0, 32]}}");
            using (var stream = new MemoryStream())
            using (var writer = new BinaryWriter(stream)) // little-endian
            {
                writer.Write((ulong)header.Length);
                writer.Write(header);
                for (int i = 0; i < 8; i++) writer.Write(1.0f + i / 16.0f);
                writer.Flush();
                File.WriteAllBytes(Path.Combine(dir, "adapter_model.safetensors"), stream.ToArray());
            }
        }

        [Test]
        public void ConversionAgainstABaseWritesWhatPeftcWrites()
        {
            using (var tmp = new TempDir())
            using (var options = new LowRankOptions())
            {
                string ia3Dir = tmp["ia3"], baseDir = Fixtures.Model("llama");
                WriteIa3Adapter(ia3Dir);
                using (var ia3 = Adapter.Open(ia3Dir))
                {
                    options.SetRank(2);
                    PeftException e = Assert.ThrowsPeft(ErrorCode.Unsupported, () => LowRank.ConvertToLora(ia3, tmp["nobase"], options),
                                                        "IA3 without a base");
                    Assert.True(e.Message.Contains("IA3") && e.Message.Contains("base"), e.Message);
                    LowRankModule[] report = LowRank.ConvertToLora(ia3, tmp["r2"], options.SetBase(baseDir));
                    Assert.Equal(1, report.Length, "modules converted");
                    Assert.Equal("model.layers.0.self_attn.k_proj", report[0].Name, "module");
                    Assert.Equal(2L, report[0].Rank, "rank");
                    // dW = diag(l - 1) W is full rank: rank 2 loses some.
                    Assert.True(report[0].Error > 0 && report[0].Error < 1, report[0].ToString());
                    Peftc("adapter", "convert", ia3Dir, tmp["r2-peftc"], "--to", "lora", "--rank", "2", "--base", baseDir);
                    SameFiles(tmp["r2"], tmp["r2-peftc"], AdapterFiles);

                    options.SetBase(Fixtures.Model("gpt2")); // no k_proj there
                    Assert.ThrowsPeft(ErrorCode.NotFound, () => LowRank.ConvertToLora(ia3, tmp["gpt2"], options), "gpt2 base");
                    options.SetBase(null); // no base again
                    Assert.ThrowsPeft(ErrorCode.Unsupported, () => LowRank.ConvertToLora(ia3, tmp["cleared"], options), "base cleared");
                    Assert.Throws<ArgumentException>(() => options.SetBase("a\0b"), "a NUL in the base");
                }
            }
        }

        [Test]
        public void QuantizedGgufMergeWithOutputTypeAndStoreReport()
        {
            string baseFile = Fixtures.Path_("gguf", "bindings_q8_0.gguf"), adapter = Fixtures.Path_("gguf", "bindings_q8_0_lora");
            using (var tmp = new TempDir())
            {
                foreach (string quant in new[] { "Q4_0", "Q8_0", "F16" })
                {
                    string out_ = tmp[quant + ".gguf"];
                    MergeResult result;
                    using (var options = new MergeOptions())
                        result = Merge.Checkpoint(baseFile, out_, options.AddAdapterDir(adapter).SetQuant(Ggml.ParseType(quant)).SetReport(true));
                    Assert.Equal(1L, result.Merged, quant + " merged");
                    Assert.Equal(1, result.StoreReport.Length, quant + " report entries");
                    StoreReportEntry e = result.StoreReport[0];
                    Assert.Equal("blk.0.ffn_down.weight", e.Tensor, "tensor");
                    Assert.Equal("Q8_0", e.BaseType, "base type");
                    Assert.Equal(quant, e.Type, "type");
                    Assert.Equal(512L, e.Values, "values");
                    Assert.True(e.Rms > 0 && e.Rms <= e.Max && e.BaseRms >= 0 && e.BaseRms <= e.BaseMax, e.ToString());
                    Assert.True(result.StoreReportJson.StartsWith("[") && result.StoreReportJson.Contains("\"base_rms\""), "the JSON");
                    using (var ckpt = Checkpoint.Open(out_))
                        Assert.Equal<int?>(Ggml.ParseType(quant), ckpt.Info("blk.0.ffn_down.weight").GgmlType, "stored type");
                    Peftc("merge", "--base", baseFile, "--adapter", adapter, "--out", tmp["peftc-" + quant + ".gguf"], "--quant", quant, "--report");
                    Assert.True(File.ReadAllBytes(out_).SequenceEqual(File.ReadAllBytes(tmp["peftc-" + quant + ".gguf"])),
                                quant + ": the same file as peftc merge --quant");
                }
                using (var options = new MergeOptions())
                {
                    MergeResult plain = Merge.Checkpoint(baseFile, tmp["kept.gguf"], options.AddAdapterDir(adapter));
                    Assert.Equal(0, plain.StoreReport.Length, "no report unless asked");
                    Assert.Equal("[]", plain.StoreReportJson, "no report unless asked");
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetQuant(999), "type 999");
                    Assert.ThrowsPeft(ErrorCode.Unsupported, () => options.SetQuant(Ggml.ParseType("IQ2_XS")), "IQ2_XS");
                    options.SetQuant(Ggml.ParseType("Q8_0")).SetDType(DType.F16);
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Merge.Checkpoint(baseFile, tmp["x.gguf"], options), "quant and dtype");
                    Assert.False(File.Exists(tmp["x.gguf"]), "nothing written");
                }
            }
        }

        [Test]
        public void PruningCombinationsWriteWhatPeftcWrites()
        {
            string first = Fixtures.Path_("adapters", "llama_lora"), second = Fixtures.Path_("adapters", "llama_lora_second");
            using (var tmp = new TempDir())
            using (var a = Adapter.Open(first))
            using (var b = Adapter.Open(second))
            using (var ties = new ExportOptions())
            using (var dare = new ExportOptions())
            using (var bad = new ExportOptions())
            {
                Assert.Equal(a.R, b.R, "equal ranks");
                var adapters = new[] { a, b };
                var weights = new[] { 1.0, 0.5 };
                Export.Combine(adapters, weights, CombineMethod.Ties, tmp["ties"],
                               ties.SetCombineDensity(0.5).SetCombineMajoritySign(MajoritySign.Frequency));
                Peftc("adapter", "combine", "--adapter", first + ":1", "--adapter", second + ":0.5", "--method", "ties",
                      "--density", "0.5", "--majority-sign", "frequency", "--out", tmp["ties-peftc"]);
                SameFiles(tmp["ties"], tmp["ties-peftc"], AdapterFiles);

                Export.Combine(adapters, weights, CombineMethod.DareLinear, tmp["dare"], dare.SetCombineDensity(0.5).SetCombineSeed(7));
                Peftc("adapter", "combine", "--adapter", first + ":1", "--adapter", second + ":0.5", "--method", "dare_linear",
                      "--density", "0.5", "--seed", "7", "--out", tmp["dare-peftc"]);
                SameFiles(tmp["dare"], tmp["dare-peftc"], AdapterFiles);
                Export.Combine(adapters, weights, CombineMethod.DareLinear, tmp["dare8"], dare.SetCombineSeed(8));
                Assert.False(File.ReadAllBytes(Path.Combine(tmp["dare"], "adapter_model.safetensors"))
                                 .SequenceEqual(File.ReadAllBytes(Path.Combine(tmp["dare8"], "adapter_model.safetensors"))),
                             "seeds 7 and 8 give other masks");
                Assert.Equal("2 3 4 5", string.Join(" ", new[] { CombineMethod.Ties, CombineMethod.DareLinear, CombineMethod.DareTies,
                                                                 CombineMethod.MagnitudePrune }.Select(m => (int)m)), "PEFT_COMBINE_* values");

                foreach (double density in new[] { -0.1, 1.5, double.NaN })
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => bad.SetCombineDensity(density), "density " + density);
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => bad.SetCombineMajoritySign((MajoritySign)2), "majority sign 2");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument,
                                  () => Export.Combine(adapters, weights, CombineMethod.DareTies, tmp["nodensity"]), "no density");
                Assert.False(File.Exists(Path.Combine(tmp["nodensity"], "adapter_config.json")), "nothing written");
            }
        }

        [Test]
        public void SvdCombinationsWriteWhatPeftcWrites()
        {
            string pattern = Fixtures.Path_("adapters", "llama_rank_alpha_pattern");
            string first = Fixtures.Path_("adapters", "llama_lora"), second = Fixtures.Path_("adapters", "llama_lora_second");
            using (var tmp = new TempDir())
            using (var p = Adapter.Open(pattern))
            using (var a = Adapter.Open(first))
            using (var b = Adapter.Open(second))
            using (var ties = new ExportOptions())
            using (var dare = new ExportOptions())
            using (var bad = new ExportOptions())
            {
                var weights = new[] { 1.0, 0.5 };
                // svd: the ranks may differ (llama_rank_alpha_pattern has r = 4 and rank_pattern values 2 and 8); the new
                // rank is the largest of them.
                Export.Combine(new[] { p, a }, weights, CombineMethod.Svd, tmp["svd"]);
                using (var c = Adapter.Open(tmp["svd"])) Assert.Equal(8L, c.R, "svd rank");
                Peftc("adapter", "combine", "--adapter", pattern + ":1", "--adapter", first + ":0.5", "--method", "svd",
                      "--out", tmp["svd-peftc"]);
                SameFiles(tmp["svd"], tmp["svd-peftc"], AdapterFiles);

                var adapters = new[] { a, b };
                Export.Combine(adapters, weights, CombineMethod.TiesSvd, tmp["ties_svd"],
                               ties.SetCombineDensity(0.5).SetCombineSvdRank(2).SetCombineSvdClamp(0.95));
                using (var c = Adapter.Open(tmp["ties_svd"])) Assert.Equal(2L, c.R, "ties_svd rank");
                Peftc("adapter", "combine", "--adapter", first + ":1", "--adapter", second + ":0.5", "--method", "ties_svd",
                      "--density", "0.5", "--svd-rank", "2", "--svd-clamp", "0.95", "--out", tmp["ties_svd-peftc"]);
                SameFiles(tmp["ties_svd"], tmp["ties_svd-peftc"], AdapterFiles);

                Export.Combine(adapters, weights, CombineMethod.DareTiesSvd, tmp["dare_ties_svd"], dare.SetCombineDensity(0.4).SetCombineSeed(7));
                Peftc("adapter", "combine", "--adapter", first + ":1", "--adapter", second + ":0.5", "--method", "dare_ties_svd",
                      "--density", "0.4", "--seed", "7", "--out", tmp["dare_ties_svd-peftc"]);
                SameFiles(tmp["dare_ties_svd"], tmp["dare_ties_svd-peftc"], AdapterFiles);
                // A rank of 0 is the default, and null clears a clamp.
                Export.Combine(adapters, weights, CombineMethod.DareTiesSvd, tmp["again"],
                               dare.SetCombineSvdRank(0).SetCombineSvdClamp(0.5).SetCombineSvdClamp(null));
                SameFiles(tmp["dare_ties_svd"], tmp["again"], AdapterFiles);
                Assert.Equal("6 7 8 9 10", string.Join(" ", new[] { CombineMethod.Svd, CombineMethod.TiesSvd, CombineMethod.DareLinearSvd,
                                                                    CombineMethod.DareTiesSvd, CombineMethod.MagnitudePruneSvd }.Select(m => (int)m)),
                             "PEFT_COMBINE_*_SVD values");

                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => bad.SetCombineSvdRank(-1), "svd rank -1");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => bad.SetCombineSvdClamp(1.5), "svd clamp 1.5");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument,
                                  () => Export.Combine(adapters, weights, CombineMethod.MagnitudePruneSvd, tmp["nodensity"]), "no density");
                Assert.False(File.Exists(Path.Combine(tmp["nodensity"], "adapter_config.json")), "nothing written");
            }
        }

        [Test]
        public void GgmlArithmeticGgufMergeWritesWhatPeftcWrites()
        {
            string baseFile = Fixtures.Path_("gguf", "bindings_q8_0.gguf"), adapter = Fixtures.Path_("gguf", "bindings_q8_0_lora");
            using (var tmp = new TempDir())
            {
                // Written F32 (Q8_0 rounds the two orders' last bits away on this fixture).
                using (var options = new MergeOptions())
                    Assert.Equal(1L, Merge.Checkpoint(baseFile, tmp["ggml.gguf"], options.AddAdapterDir(adapter, 0.5)
                                                          .SetArithmetic(Arithmetic.Ggml).SetQuant(Ggml.F32)).Merged, "merged");
                using (var options = new MergeOptions())
                    Merge.Checkpoint(baseFile, tmp["peft-f32.gguf"], options.AddAdapterDir(adapter, 0.5).SetQuant(Ggml.F32));
                Assert.False(File.ReadAllBytes(tmp["ggml.gguf"]).SequenceEqual(File.ReadAllBytes(tmp["peft-f32.gguf"])),
                             "the orders write other F32 merges");
                Peftc("merge", "--base", baseFile, "--adapter", adapter + ":0.5", "--out", tmp["peftc-ggml.gguf"], "--arithmetic", "ggml",
                      "--quant", "F32");
                Assert.True(File.ReadAllBytes(tmp["ggml.gguf"]).SequenceEqual(File.ReadAllBytes(tmp["peftc-ggml.gguf"])),
                            "the same file as peftc merge --arithmetic ggml");
                // PEFT's order (the default) and SetJoinSplit on a base of one file: peftc merge's file.
                MergeResult peft;
                using (var options = new MergeOptions())
                    peft = Merge.Checkpoint(baseFile, tmp["peft.gguf"],
                                            options.AddAdapterDir(adapter, 0.5).SetArithmetic(Arithmetic.Peft).SetJoinSplit(true));
                Assert.Equal(1, peft.Files.Length, "one file");
                Peftc("merge", "--base", baseFile, "--adapter", adapter + ":0.5", "--out", tmp["peftc-peft.gguf"]);
                Assert.True(File.ReadAllBytes(tmp["peft.gguf"]).SequenceEqual(File.ReadAllBytes(tmp["peftc-peft.gguf"])),
                            "the same file as peftc merge");
                using (var options = new MergeOptions())
                {
                    Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => options.SetArithmetic((Arithmetic)2), "arithmetic 2");
                    options.AddAdapterDir(Fixtures.Path_("adapters", "llama_dora")).SetArithmetic(Arithmetic.Ggml);
                    Assert.ThrowsPeft(ErrorCode.Unsupported, () => Merge.Checkpoint(Fixtures.Path_("models", "llama"), tmp["dora"], options),
                                      "DoRA in the ggml order");
                    Assert.False(Directory.Exists(tmp["dora"]), "nothing written");
                }
            }
        }

        // Writes a GGUF file of F32 2 x 2 tensors (values first, first + 0.25, ...); metadata values are ushort (GGUF
        // type 2), int (5), float (6) or string (8).
        private static void WriteTinyGguf(string path, object[][] kvs, string[] names, float first)
        {
            using (var w = new BinaryWriter(File.Create(path)))
            {
                Action<string> text = s => { byte[] b = System.Text.Encoding.UTF8.GetBytes(s); w.Write((ulong)b.Length); w.Write(b); };
                w.Write(System.Text.Encoding.ASCII.GetBytes("GGUF"));
                w.Write(3u);
                w.Write((ulong)names.Length);
                w.Write((ulong)kvs.Length);
                foreach (object[] kv in kvs)
                {
                    text((string)kv[0]);
                    object v = kv[1];
                    if (v is ushort) { w.Write(2u); w.Write((ushort)v); }
                    else if (v is int) { w.Write(5u); w.Write((int)v); }
                    else if (v is float) { w.Write(6u); w.Write((float)v); }
                    else { w.Write(8u); text((string)v); }
                }
                for (int i = 0; i < names.Length; i++)
                {
                    text(names[i]);
                    w.Write(2u); w.Write(2UL); w.Write(2UL); w.Write(0u); w.Write((ulong)(32 * i));
                }
                w.Flush();
                while (w.BaseStream.Position % 32 != 0) w.Write((byte)0);
                for (int i = 0; i < names.Length; i++)
                {
                    for (int k = 0; k < 4; k++) w.Write(first + (4 * i + k) * 0.25f);
                    w.Write(new byte[16]);
                }
            }
        }

        [Test]
        public void JoinSplitMergesASplitGgufBaseIntoOneFile()
        {
            using (var tmp = new TempDir())
            {
                string[] tensors = { "blk.0.attn_v.weight", "blk.0.ffn_down.weight" };
                for (int no = 0; no < 2; no++)
                {
                    var kvs = new System.Collections.Generic.List<object[]>();
                    if (no == 0) kvs.Add(new object[] { "general.architecture", "llama" });
                    kvs.Add(new object[] { "split.no", (ushort)no });
                    kvs.Add(new object[] { "split.tensors.count", 2 });
                    kvs.Add(new object[] { "split.count", (ushort)2 });
                    WriteTinyGguf(tmp["model-0000" + (no + 1) + "-of-00002.gguf"], kvs.ToArray(), new[] { tensors[no] }, 1f - 2 * no);
                }
                string lora = tmp["lora.gguf"], baseFile = tmp["model-00002-of-00002.gguf"];
                WriteTinyGguf(lora, new[] { new object[] { "general.architecture", "llama" }, new object[] { "general.type", "adapter" },
                                            new object[] { "adapter.type", "lora" }, new object[] { "adapter.lora.alpha", 2f } },
                              new[] { "blk.0.ffn_down.weight.lora_a", "blk.0.ffn_down.weight.lora_b" }, 0.5f);
                using (var options = new MergeOptions())
                {
                    options.AddAdapterDir(lora);
                    MergeResult parts = Merge.Checkpoint(baseFile, tmp["out.gguf"], options);
                    Assert.Equal("out-00001-of-00002.gguf,out-00002-of-00002.gguf", string.Join(",", parts.Files), "parts");
                    MergeResult joined = Merge.Checkpoint(baseFile, tmp["joined.gguf"], options.SetJoinSplit(true));
                    Assert.Equal("joined.gguf", string.Join(",", joined.Files), "joined");
                }
                Peftc("merge", "--base", baseFile, "--adapter", lora, "--out", tmp["peftc.gguf"], "--join-split");
                Assert.True(File.ReadAllBytes(tmp["joined.gguf"]).SequenceEqual(File.ReadAllBytes(tmp["peftc.gguf"])),
                            "the same file as peftc merge --join-split");
            }
        }

        // x [rows, n] times w [n, n] transposed, in double.
        private static double[] MatMulT(float[] x, float[] w, int n)
        {
            var y = new double[x.Length];
            for (int i = 0; i < x.Length / n; i++)
                for (int o = 0; o < n; o++)
                {
                    double s = 0;
                    for (int k = 0; k < n; k++) s += (double)x[i * n + k] * w[o * n + k];
                    y[i * n + o] = s;
                }
            return y;
        }

        private static float[] Single(double[] v) { return v.Select(d => (float)d).ToArray(); }

        [Test]
        public void DoraApplyWithTheBaseWeightGivesTheMergedWeight()
        {
            const string module = "model.layers.0.self_attn.q_proj";
            const int n = 16, rows = 4;
            string doraDir = Fixtures.AdapterDir("llama_dora");
            using (var tmp = new TempDir())
            using (var merge = new MergeOptions())
            {
                Merge.Checkpoint(Fixtures.Model("llama"), tmp["merged"], merge.AddAdapterDir(doraDir));
                float[] w, merged;
                using (var b = Checkpoint.Open(Fixtures.Model("llama"))) w = b.ReadSingle(module + ".weight");
                using (var m = Checkpoint.Open(tmp["merged"])) merged = m.ReadSingle(module + ".weight");
                float[] x = Enumerable.Range(0, rows * n).Select(i => ((i * 37 % 23) - 11f) / 7f).ToArray();
                float[] y0 = Single(MatMulT(x, w, n));
                double[] want = MatMulT(x, merged, n);

                using (var registry = new Registry(DType.F32, 1 << 20))
                using (var other = new Registry(DType.F32, 1 << 20))
                {
                    registry.Register("dora", doraDir);
                    other.Register("dora", doraDir);
                    using (Lease lease = registry.Acquire("dora"))
                    {
                        Func<Lease, float[], float[]> apply = (l, start) =>
                        {
                            float[] y = (float[])start.Clone();
                            Serving.LoraApply(module, l, x, rows, n, y, n);
                            return y;
                        };
                        Assert.ThrowsPeft(ErrorCode.NotFound, () => apply(lease, y0), "no base weight yet");
                        registry.SetBaseWeight(module, w, new long[] { n, n });
                        float[] got = apply(lease, y0);
                        for (int i = 0; i < got.Length; i++)
                            Assert.True(Math.Abs(got[i] - want[i]) <= 1e-5 * (1 + Math.Abs(want[i])),
                                        "element " + i + ": " + got[i] + ", x W_merged^T = " + want[i]);

                        // The host doubles its weight in place; the kept scale stays until BaseWeightsChanged.
                        for (int i = 0; i < w.Length; i++) w[i] *= 2;
                        float[] y2 = Single(MatMulT(x, w, n));
                        float[] stale = apply(lease, y2);
                        registry.BaseWeightsChanged();
                        float[] fresh = apply(lease, y2);
                        Assert.False(stale.SequenceEqual(fresh), "BaseWeightsChanged changes the DoRA output");
                        other.SetBaseWeight(module + ".weight", (float[])w.Clone(), new long[] { n, n }, new float[n]);
                        using (Lease otherLease = other.Acquire("dora"))
                            Assert.SequenceEqual(fresh, apply(otherLease, y2), "the same as a registry given the new weight (zero bias)");

                        Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => registry.SetBaseWeight(module, w, new long[] { 2, 8, 16 }), "3-D");
                        Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => registry.SetBaseWeight(module, w, new long[] { n, n }, new float[0]), "empty bias");
                        Assert.Throws<ArgumentException>(() => registry.SetBaseWeight(module, w, new long[] { 8, 8 }), "length not the shape's");
                        Assert.Throws<ArgumentException>(() => registry.SetBaseWeight("a\0b", w, new long[] { n, n }), "NUL in the name");
                        Assert.ThrowsPeft(ErrorCode.Unsupported, () => registry.SetBaseWeight(module, new byte[n * n * 8], DType.F64, new long[] { n, n }), "F64");
                        // A shape that does not fit the DoRA layer is refused by the apply.
                        registry.SetBaseWeight(module, new float[8 * n], new long[] { 8, n });
                        Assert.ThrowsPeft(ErrorCode.ShapeMismatch, () => apply(lease, y2), "8 x 16 for a 16 x 16 layer");
                    }
                    registry.Dispose();
                    Assert.Throws<ObjectDisposedException>(() => registry.BaseWeightsChanged(), "disposed registry");
                }
            }
        }

        // LowRank.CombineDeltas of llama_lora (0.7) and llama_rank_alpha_pattern (-1.3): exact with Linear (every
        // module's error 0) and Ties at rank 4 write the files `peftc adapter combine --deltas` writes with the same
        // settings; the refused combinations write nothing.
        [Test]
        public void DeltaCombinationsMatchPeftc()
        {
            using (var tmp = new TempDir())
            using (var density = new ExportOptions())
            using (var rank4 = new LowRankOptions())
            using (var lora = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var pattern = Adapter.Open(Fixtures.AdapterDir("llama_rank_alpha_pattern")))
            using (var dora = Adapter.Open(Fixtures.AdapterDir("llama_dora")))
            {
                string loraDir = Fixtures.AdapterDir("llama_lora"), patternDir = Fixtures.AdapterDir("llama_rank_alpha_pattern");
                var pair = new[] { lora, pattern };
                var weights = new[] { 0.7, -1.3 };
                Func<string, string, string[], string[]> peftcArgs = (out_, method, extra) =>
                    new[] { "adapter", "combine", "--deltas", "--adapter", loraDir + ":0.7", "--adapter", patternDir + ":-1.3",
                            "--method", method, "--out", out_ }.Concat(extra).ToArray();

                // Exact: no options; each module's rank is the sum of the adapters' ranks, its error 0.
                LowRankModule[] exact = LowRank.CombineDeltas(pair, weights, CombineMethod.Linear, tmp["exact"]);
                Assert.True(exact.Length > 0, "modules combined");
                foreach (LowRankModule m in exact)
                    Assert.True(m.Error == 0 && m.Rank >= 1 && m.Name.Length > 0, "exact: " + m);
                Peftc(peftcArgs(tmp["exact-peftc"], "linear", new string[0]));
                SameFiles(tmp["exact"], tmp["exact-peftc"], AdapterFiles);

                // TIES on the deltas, truncated to rank 4.
                density.SetCombineDensity(0.5);
                rank4.SetRank(4);
                LowRankModule[] ties = LowRank.CombineDeltas(pair, weights, CombineMethod.Ties, tmp["ties"], density, rank4);
                Assert.True(ties.Length > 0, "modules combined");
                foreach (LowRankModule m in ties)
                    Assert.True(m.Rank == 4 && m.Error >= 0 && m.Error < 1, "ties: " + m);
                Peftc(peftcArgs(tmp["ties-peftc"], "ties", new[] { "--density", "0.5", "--rank", "4" }));
                SameFiles(tmp["ties"], tmp["ties-peftc"], AdapterFiles);

                // Refused, writing nothing.
                Action<string, ErrorCode, Action> refused = (name, code, call) =>
                {
                    Assert.ThrowsPeft(code, call, name);
                    Assert.False(Directory.Exists(tmp[name]) || File.Exists(tmp[name]), name + " not written");
                };
                refused("nodensity", ErrorCode.InvalidArgument,
                        () => LowRank.CombineDeltas(pair, weights, CombineMethod.Ties, tmp["nodensity"], null, rank4));
                refused("exact-ties", ErrorCode.InvalidArgument,
                        () => LowRank.CombineDeltas(pair, weights, CombineMethod.Ties, tmp["exact-ties"], density));
                refused("dora", ErrorCode.Unsupported,
                        () => LowRank.CombineDeltas(new[] { lora, dora }, weights, CombineMethod.Linear, tmp["dora"]));
                refused("svd", ErrorCode.InvalidArgument,
                        () => LowRank.CombineDeltas(pair, weights, CombineMethod.Svd, tmp["svd"], null, rank4));
                Assert.Throws<ArgumentException>(() => LowRank.CombineDeltas(pair, new[] { 1.0 }, CombineMethod.Linear, tmp["count"]),
                                                 "count mismatch");
                Assert.False(Directory.Exists(tmp["count"]), "count not written");
            }
        }
    }
}
