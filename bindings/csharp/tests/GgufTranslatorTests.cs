// Translators for GGUF names (Translator.FromGguf, Translator.NewGguf) and Export.SaveGgufSplit of the fixture
// adapter against the fixture base (tests/fixtures/models/llama); bad input.
using System;
using System.IO;

namespace PeftC.Tests
{
    public class GgufTranslatorTests
    {
        private static void CheckGgufNames(Translator translator, string what)
        {
            Assert.Equal("llama", translator.Family, what + ": family");
            Assert.Equal("blk.0.attn_q.weight", translator.ToNative("model.layers.0.self_attn.q_proj.weight"), what + ": to native");
            Assert.Equal("base_model.model.model.layers.0.self_attn.q_proj.weight", translator.ToHf("blk.0.attn_q.weight", true),
                         what + ": to HF");
            // Adapter factor keys are not GGUF tensor names.
            Assert.ThrowsPeft(ErrorCode.UnresolvedKey, () => translator.ToNative("model.layers.0.self_attn.q_proj.lora_A.weight"),
                              what + ": a factor key");
        }

        [Test]
        public void GgufTranslators()
        {
            // The sample has general.architecture "llama" and no head counts: the names still translate.
            Translator fromFile;
            using (var ckpt = Checkpoint.Open(Fixtures.Path_("gguf", "bindings_sample.gguf")))
                fromFile = Translator.FromGguf(ckpt);
            using (fromFile) CheckGgufNames(fromFile, "from the file"); // the checkpoint is disposed
            using (var fromArch = Translator.NewGguf("llama", 4, 2)) CheckGgufNames(fromArch, "from the architecture");
        }

        [Test]
        public void GgufTranslatorsBadInput()
        {
            Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Translator.NewGguf("llama", 0, 2), "head count 0");
            Assert.ThrowsPeft(ErrorCode.Unsupported, () => Translator.NewGguf("nosucharch", 4, 2), "an unknown architecture");
            Assert.Throws<ArgumentNullException>(() => Translator.NewGguf(null, 4, 2), "a null architecture");
            Assert.Throws<ArgumentNullException>(() => Translator.FromGguf(null), "a null checkpoint");
            var ckpt = Checkpoint.Open(Fixtures.Model("llama"));
            using (ckpt) Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Translator.FromGguf(ckpt), "a safetensors checkpoint");
            Assert.Throws<ObjectDisposedException>(() => Translator.FromGguf(ckpt), "a disposed checkpoint");
        }

        [Test]
        public void ExportGgufSplit()
        {
            string baseDir = Fixtures.Model("llama");
            using (var tmp = new TempDir())
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            {
                string output = tmp["out.gguf"], baseOut = tmp["base_out"];
                adapter.ExportGgufSplit(output, baseOut, baseDir);
                using (var ckpt = Checkpoint.Open(output))
                {
                    Assert.Equal(FileFormat.Gguf, ckpt.FileFormat(), "format");
                    Assert.Equal(2 * adapter.ModuleCount, ckpt.Tensors().Length, "tensor count");
                }
                // Nothing in the plain adapter needs merging: the base is copied as it is.
                Assert.SequenceEqual(File.ReadAllBytes(Path.Combine(baseDir, "model.safetensors")),
                                     File.ReadAllBytes(Path.Combine(baseOut, "model.safetensors")), "the base copy");
            }
        }

        [Test]
        public void ExportGgufSplitBadInput()
        {
            string baseDir = Fixtures.Model("llama");
            using (var tmp = new TempDir())
            using (var adapter = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            {
                string output = tmp["out.gguf"];
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => adapter.ExportGgufSplit(output, baseDir, baseDir), "baseOut is the base");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => adapter.ExportGgufSplit(output, output, baseDir), "baseOut is outPath");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => adapter.ExportGgufSplit(output, tmp["base_out"], baseDir, 2), "Q4_1");
                Assert.Throws<ArgumentNullException>(() => adapter.ExportGgufSplit(output, null, baseDir), "a null baseOut");
                Assert.Throws<ArgumentNullException>(() => Export.SaveGgufSplit(null, output, tmp["base_out"], baseDir), "null adapter");
                Assert.Equal(0, Directory.GetFileSystemEntries(tmp.Path).Length, "failed exports write nothing");
            }
        }
    }
}
