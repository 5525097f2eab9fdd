using System;
using System.IO;
using System.Json;
using System.Linq;

namespace PeftC.Tests
{
    public class AdapterTests
    {
        [Test]
        public void ConfigAndModulesMatchTheFiles()
        {
            string dir = Fixtures.AdapterDir("llama_lora");
            var config = (JsonObject)JsonValue.Parse(File.ReadAllText(Path.Combine(dir, "adapter_config.json")));
            using (var adapter = Adapter.Open(dir))
            using (var file = Checkpoint.Open(Path.Combine(dir, "adapter_model.safetensors")))
            {
                Assert.Equal((long)config["r"], adapter.R, "r");
                Assert.Equal((double)config["lora_alpha"], adapter.LoraAlpha, "lora_alpha");
                Assert.Equal("LORA", adapter.PeftType);
                Assert.Equal("none", adapter.Bias);
                Assert.Equal((string)config["task_type"], adapter.TaskType);
                Assert.Equal("tests/fixtures/models/llama", adapter.BaseModelNameOrPath);
                Assert.Equal("llama", adapter.Family);
                Assert.False(adapter.UseDora || adapter.UseRslora || adapter.LoraBias || adapter.FanInFanOut, "flags");
                Assert.Equal("4", adapter.ConfigField("r"));
                Assert.Equal(null, adapter.ConfigField("no_such_field"));
                var reparsed = (JsonObject)JsonValue.Parse(adapter.ConfigJson);
                Assert.SequenceEqual(config.Keys.OrderBy(k => k, StringComparer.Ordinal), reparsed.Keys.OrderBy(k => k, StringComparer.Ordinal),
                                     "config fields");
                int tensors = 0;
                foreach (AdapterModule m in adapter.Modules())
                {
                    Assert.Equal(LayerKind.Linear, m.Kind, m.Name);
                    Assert.Equal(4L, m.Rank, m.Name);
                    Assert.Equal(2.0, m.Scaling, m.Name + " scaling = alpha / r");
                    Assert.Equal(m.Index, adapter.Module(m.Name).Index, "find " + m.Name);
                    Assert.Equal(0, m.TokenIndices.Length);
                    foreach (AdapterTensor t in m.Tensors())
                    {
                        TensorInfo info = file.Info(t.Key);
                        Assert.Equal(info.DType.Value, t.DType, t.Key);
                        Assert.SequenceEqual(info.Shape, t.Shape, t.Key);
                        Assert.SequenceEqual(file.ReadSingle(info.Index), t.ReadSingle(), t.Key);
                        Assert.True(t.Role == "lora_A.weight" || t.Role == "lora_B.weight", t.Role);
                        Assert.Equal(m.Name + ".weight", t.BaseName, "base name");
                        tensors++;
                    }
                    Assert.True(m.Tensor("lora_A.weight") != null && m.Tensor("nothing") == null, "tensor by role");
                }
                Assert.Equal(file.TensorCount, tensors, "every file tensor belongs to a module");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => adapter.Module("model.layers.9.nothing"));
                Assert.Throws<ArgumentOutOfRangeException>(() => adapter.Module(adapter.ModuleCount));
                Assert.Throws<ArgumentOutOfRangeException>(() => adapter.Module(0).Tensor(5));
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => adapter.Module(0).Tensor(0).Read(DType.F32, new byte[3]), "short buffer");
            }
        }

        [Test]
        public void ValidateAgainstBases()
        {
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            {
                adapter.Validate(Fixtures.Model("llama"));
                PeftException e = Assert.Throws<PeftException>(() => adapter.Validate(Fixtures.Model("gpt2")));
                Assert.True(e.Code == ErrorCode.UnresolvedKey || e.Code == ErrorCode.ShapeMismatch, "code " + e.Code);
                Assert.True(e.Message.Contains("q_proj"), "lists the modules: " + e.Message);
                Assert.Throws<PeftException>(() => adapter.Validate("/nonexistent/base"));
            }
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora"), Fixtures.Model("llama")))
                Assert.Equal(14, adapter.ModuleCount);
            Assert.Throws<PeftException>(() => Adapter.Open(Fixtures.AdapterDir("llama_lora"), Fixtures.Model("gpt2")), "base that does not fit");
        }

        [Test]
        public void OpenErrors()
        {
            Assert.ThrowsPeft(ErrorCode.NotFound, () => Adapter.Open("/nonexistent/adapter"));
            using (var tmp = new TempDir())
            {
                // A valid PEFT adapter of a variant peft_c does not read (QALoRA) is UNSUPPORTED naming the field.
                File.WriteAllText(tmp["adapter_config.json"], "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"], \"use_qalora\": true}");
                File.Copy(Path.Combine(Fixtures.AdapterDir("llama_lora"), "adapter_model.safetensors"), tmp["adapter_model.safetensors"]);
                Assert.ThrowsPeft(ErrorCode.Unsupported, () => Adapter.Open(tmp.Path), "use_qalora");
            }
            using (var tmp = new TempDir())
            {
                File.WriteAllText(tmp["adapter_config.json"], "{not json");
                File.Copy(Path.Combine(Fixtures.AdapterDir("llama_lora"), "adapter_model.safetensors"), tmp["adapter_model.safetensors"]);
                Assert.ThrowsPeft(ErrorCode.InvalidConfig, () => Adapter.Open(tmp.Path), "broken config");
            }
        }

        /// <summary>llama_lora without "down_proj" in target_modules: strict opening refuses it; lenient opening drops
        /// the four down_proj tensors (PEFT's unexpected keys), one warning each; so does a lenient registration.</summary>
        [Test]
        public void LenientLoadingListsWhatItIgnores()
        {
            string src = Fixtures.AdapterDir("llama_lora");
            using (var tmp = new TempDir())
            {
                string config = File.ReadAllText(Path.Combine(src, "adapter_config.json"));
                File.WriteAllText(tmp["adapter_config.json"], config.Replace("\"down_proj\",", ""));
                File.Copy(Path.Combine(src, "adapter_model.safetensors"), tmp["adapter_model.safetensors"]);
                Assert.ThrowsPeft(ErrorCode.InvalidConfig, () => Adapter.Open(tmp.Path), "strict");
                using (var strict = Adapter.Open(src)) Assert.Equal(0, strict.Warnings.Length);
                string[] warnings;
                using (var adapter = Adapter.Open(tmp.Path, Fixtures.Model("llama"), lenient: true))
                {
                    warnings = adapter.Warnings;
                    Assert.Equal(4, adapter.Warnings.Length, "warnings");
                    foreach (string w in adapter.Warnings)
                    {
                        Assert.True(w.StartsWith("unexpected key \"base_model.model.model.layers.", StringComparison.Ordinal), w);
                        Assert.True(w.Contains("mlp.down_proj.lora_"), w);
                    }
                    Assert.Equal(12, adapter.ModuleCount, "modules");
                }
                using (var registry = new Registry(DType.F32, 0))
                {
                    Assert.ThrowsPeft(ErrorCode.InvalidConfig, () => registry.Register("strict", tmp.Path), "strict registration");
                    registry.Register("lenient", tmp.Path, Fixtures.Model("llama"), lenient: true);
                    registry.Register("plain", src);
                    Assert.SequenceEqual(warnings, registry.Warnings("lenient"));
                    Assert.Equal(0, registry.Warnings("plain").Length);
                    Assert.ThrowsPeft(ErrorCode.NotFound, () => registry.Warnings("strict"), "not registered");
                }
            }
        }

        [Test]
        public void TrainableTokensAndLoraBias()
        {
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_trainable_tokens")))
            {
                AdapterModule tokens = adapter.Modules().Single(m => m.Kind == LayerKind.TrainableTokens);
                Assert.SequenceEqual(new long[] { 1, 5, 7 }, tokens.TokenIndices);
                Assert.Equal(0L, tokens.Rank);
            }
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("qwen2_lora_bias")))
            {
                Assert.True(adapter.LoraBias, "lora_bias");
                Assert.True(adapter.Modules().Any(m => m.Tensor("lora_B.bias") != null), "lora_B.bias tensors");
            }
        }

        [Test]
        public void TranslatorsRoundTripEveryKey()
        {
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var fromAdapter = adapter.Translator())
            using (var builtin = Translator.Builtin("llama"))
            using (var detected = Translator.Detect(Fixtures.Model("llama")))
            {
                Assert.Equal("llama", fromAdapter.Family);
                Assert.Equal("llama", detected.Family);
                var keys = adapter.Modules().SelectMany(m => m.Tensors()).Select(t => t.Key).ToList();
                string[] natives = builtin.ToNative(keys);
                string[] back = builtin.ToHf(natives, true);
                Assert.SequenceEqual(keys, back, "HF -> native -> HF");
                for (int i = 0; i < keys.Count; i++)
                {
                    Assert.Equal(natives[i], fromAdapter.ToNative(keys[i]), "one key");
                    Assert.Equal(keys[i], fromAdapter.ToHf(natives[i], true), "one native name");
                    Assert.True(natives[i].Contains("/"), "native names are slash-separated: " + natives[i]);
                }
                Assert.Equal(0, builtin.ToNative(new string[0]).Length, "empty batch");
                PeftException e = Assert.ThrowsPeft(ErrorCode.UnresolvedKey, () => builtin.ToNative(new[] { keys[0], "nope.a", "nope.b" }));
                Assert.True(e.Message.Contains("nope.a") && e.Message.Contains("nope.b"), "lists every key: " + e.Message);
                Assert.ThrowsPeft(ErrorCode.UnresolvedKey, () => builtin.ToHf("no/such/thing"));
            }
            Assert.True(Translator.BuiltinFamilies().Contains("llama"), "families");
            Assert.ThrowsPeft(ErrorCode.NotFound, () => Translator.Builtin("nosuchfamily"));
            Assert.ThrowsPeft(ErrorCode.InvalidConfig, () => Translator.FromJson("{\"bad\": 1}"));
            Assert.Throws<PeftException>(() => Translator.FromFile("/nonexistent/table.json"));
            Assert.ThrowsPeft(ErrorCode.NotFound, () => Translator.Detect(null, "unknown/model-name"));
            using (var t = Translator.FromFile(Path.Combine(FindArchDir(), "llama.json"))) Assert.Equal("llama", t.Family);
            using (var t = Translator.FromJson(File.ReadAllText(Path.Combine(FindArchDir(), "llama.json")))) Assert.Equal("llama", t.Family);
            using (var t = Translator.Builtin("llama"))
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora"), null, t))
                Assert.Equal("llama", adapter.Family);
        }

        internal static string FindArchDir()
        {
            string dir = Path.GetFullPath(Path.Combine(Fixtures.Root, "..", "..", "data", "arch"));
            if (!Directory.Exists(dir)) throw new SkipException("no data/arch next to the fixtures");
            return dir;
        }
    }
}
