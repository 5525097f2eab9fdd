// GGUF LoRA adapters through the binding: the fixture adapter exported against the fixture base
// (tests/fixtures/models/llama), read back as a GGUF checkpoint (a .lora_a/.lora_b pair per module,
// adapter.lora.alpha), imported back to a PEFT adapter folder with the same modules; bad input.
using System;
using System.IO;
using System.Linq;

namespace PeftC.Tests
{
    public class ExportGgufTests
    {
        private static string[] ModuleNames(Adapter adapter)
        {
            return adapter.Modules().Select(m => m.Name).OrderBy(n => n, StringComparer.Ordinal).ToArray();
        }

        [Test]
        public void ExportGgufRoundTrip()
        {
            string baseDir = Fixtures.Model("llama");
            using (var tmp = new TempDir())
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            {
                foreach (int type in new[] { Ggml.F32, Ggml.F16, Ggml.BF16 })
                {
                    string name = Ggml.TypeName(type);
                    string output = tmp[name + ".gguf"];
                    adapter.ExportGguf(output, baseDir, type);
                    using (var ckpt = Checkpoint.Open(output))
                    {
                        Assert.Equal(FileFormat.Gguf, ckpt.FileFormat(), name + ": format");
                        Assert.Equal("llama", ckpt.GetGgufValue("general.architecture").AsString(), name + ": architecture");
                        Assert.Equal("adapter", ckpt.GetGgufValue("general.type").AsString(), name + ": general.type");
                        Assert.Equal("lora", ckpt.GetGgufValue("adapter.type").AsString(), name + ": adapter.type");
                        GgufValue alpha = ckpt.GetGgufValue("adapter.lora.alpha");
                        Assert.Equal(GgufType.F32, alpha.Type, name + ": alpha type");
                        Assert.Equal(adapter.LoraAlpha, alpha.AsDouble(), name + ": adapter.lora.alpha");
                        TensorInfo[] tensors = ckpt.Tensors();
                        Assert.Equal(2 * adapter.ModuleCount, tensors.Length, name + ": tensor count");
                        foreach (TensorInfo t in tensors)
                        {
                            Assert.True(t.Name.StartsWith("blk.", StringComparison.Ordinal) &&
                                        (t.Name.EndsWith(".weight.lora_a", StringComparison.Ordinal) ||
                                         t.Name.EndsWith(".weight.lora_b", StringComparison.Ordinal)), t.Name + " is a GGUF LoRA factor");
                            Assert.Equal(type, t.GgmlType.Value, t.Name + " type");
                        }
                        foreach (TensorInfo a in tensors.Where(t => t.Name.EndsWith("lora_a", StringComparison.Ordinal)))
                            Assert.True(ckpt.Contains(a.Name.Substring(0, a.Name.Length - 1) + "b"), a.Name + " has its lora_b");
                        Assert.SequenceEqual(new[] { adapter.R, 16L }, ckpt.Info("blk.0.attn_q.weight.lora_a").Shape, "lora_a shape");
                    }

                    string back = Path.Combine(tmp[name + "-peft"], "nested");
                    Export.ImportGguf(output, back, baseDir);
                    using (var imported = Adapter.Open(back))
                    {
                        Assert.Equal(adapter.ModuleCount, imported.ModuleCount, name + ": module count");
                        Assert.SequenceEqual(ModuleNames(adapter), ModuleNames(imported), name + ": modules");
                        Assert.Equal(adapter.R, imported.R, name + ": r");
                        Assert.Equal(adapter.LoraAlpha, imported.LoraAlpha, name + ": lora_alpha");
                        Assert.Equal(baseDir, imported.BaseModelNameOrPath, name + ": base_model_name_or_path");
                        if (type != Ggml.F32) continue;
                        // F32 factors come back exactly, the LLaMA row order of q/k undone.
                        foreach (AdapterModule m in adapter.Modules())
                            foreach (string role in new[] { "lora_A.weight", "lora_B.weight" })
                                Assert.SequenceEqual(m.Tensor(role).ReadSingle(), imported.Module(m.Name).Tensor(role).ReadSingle(),
                                                     m.Name + " " + role);
                    }
                }
            }
        }

        [Test]
        public void ExportGgufBadInput()
        {
            string baseDir = Fixtures.Model("llama");
            using (var tmp = new TempDir())
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            {
                string output = tmp["out.gguf"];
                // A base folder without config.json has no architecture.
                Directory.CreateDirectory(tmp["empty_base"]);
                Assert.ThrowsPeft(ErrorCode.InvalidConfig, () => adapter.ExportGguf(output, tmp["empty_base"]), "a base without config.json");
                // A type other than F32, F16, BF16 and Q8_0.
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => adapter.ExportGguf(output, baseDir, 2), "Q4_1");
                Assert.Throws<ArgumentNullException>(() => adapter.ExportGguf(null, baseDir), "null output path");
                Assert.Throws<ArgumentNullException>(() => Export.SaveGguf(null, output, baseDir), "null adapter");
                Assert.False(File.Exists(output), "a failed export writes nothing");

                adapter.ExportGguf(output, baseDir);
                string back = tmp["peft"];
                // The base is required.
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Export.ImportGguf(output, back, ""), "an empty base");
                Assert.Throws<ArgumentNullException>(() => Export.ImportGguf(output, back, null), "a null base");
                // A GGUF file that is not an adapter.
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Export.ImportGguf(Fixtures.Path_("gguf", "bindings_sample.gguf"), back, baseDir),
                                  "not an adapter");
                Assert.ThrowsPeft(ErrorCode.Io, () => Export.ImportGguf(tmp["absent.gguf"], back, baseDir), "a missing file");
                Assert.False(Directory.Exists(back), "a failed import writes nothing");
            }
        }
    }
}
