using System;
using System.IO;
using System.Json;
using System.Linq;

namespace PeftC.Tests
{
    public class ExportTests
    {
        // Re-exporting an adapter PEFT wrote reproduces both files byte for byte.
        [Test]
        public void ExportReproducesPeftsFiles()
        {
            string dir = Fixtures.AdapterDir("llama_lora");
            using (var tmp = new TempDir())
            using (var adapter = Adapter.Open(dir))
            {
                adapter.Export(tmp["out"]);
                foreach (string f in new[] { "adapter_model.safetensors", "adapter_config.json" })
                    Assert.SequenceEqual(File.ReadAllBytes(Path.Combine(dir, f)), File.ReadAllBytes(Path.Combine(tmp["out"], f)), f);
                using (var options = new ExportOptions().SetDType(DType.BF16))
                {
                    Export.Save(adapter, tmp["bf16"], options);
                    using (var c = Checkpoint.Open(Path.Combine(tmp["bf16"], "adapter_model.safetensors")))
                        Assert.True(c.Tensors().All(t => t.DType == DType.BF16), "bf16 tensors");
                }
                using (var options = new ExportOptions().SetPeftVersion("0.13"))
                {
                    adapter.Export(tmp["old"], options);
                    var config = (JsonObject)JsonValue.Parse(File.ReadAllText(Path.Combine(tmp["old"], "adapter_config.json")));
                    Assert.False(config.ContainsKey("eva_config"), "a field 0.13 does not know is left out");
                }
                Assert.ThrowsPeft(ErrorCode.Unsupported, () => new ExportOptions().SetPeftVersion("0.5"), "before 0.13");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => new ExportOptions().SetPeftVersion("x.y"), "malformed");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => new ExportOptions().SetDType(DType.I8), "I8");
                File.WriteAllText(tmp["file"], "x");
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => adapter.Export(tmp["file"]), "a file, not a folder");
            }
            using (var withBias = Adapter.Open(Fixtures.AdapterDir("qwen2_lora_bias")))
            using (var tmp = new TempDir())
            {
                PeftException e = Assert.ThrowsPeft(ErrorCode.Unsupported,
                    () => withBias.Export(tmp["out"], new ExportOptions().SetPeftVersion("0.13")), "lora_bias in 0.13");
                Assert.True(e.Message.Contains("lora_bias"), "names the field: " + e.Message);
                Assert.False(Directory.Exists(tmp["out"]) && Directory.GetFiles(tmp["out"]).Length > 0, "nothing written");
            }
        }

        [Test]
        public void CombineCatIsTheWeightedSumOfDeltas()
        {
            using (var tmp = new TempDir())
            using (var a = Adapter.Open(Fixtures.AdapterDir("llama_lora")))
            using (var b = Adapter.Open(Fixtures.AdapterDir("llama_lora_second")))
            {
                Export.Combine(new[] { a, b }, new[] { 1.0, -0.5 }, CombineMethod.Cat, tmp["cat"]);
                using (var c = Adapter.Open(tmp["cat"]))
                {
                    Assert.Equal(a.R + b.R, c.R, "rank of cat");
                    string name = "model.layers.0.self_attn.q_proj";
                    double[] want = Delta(a.Module(name), 1.0).Zip(Delta(b.Module(name), -0.5), (x, y) => x + y).ToArray();
                    double[] got = Delta(c.Module(name), 1.0);
                    for (int i = 0; i < want.Length; i++)
                        Assert.True(Math.Abs(want[i] - got[i]) < 1e-5, "delta element " + i + ": " + want[i] + " vs " + got[i]);
                }
                Export.Combine(new[] { a }, new[] { 2.0 }, CombineMethod.Linear, tmp["linear"], new ExportOptions().SetDType(DType.F16));
                using (var c = Adapter.Open(tmp["linear"])) Assert.Equal(DType.F16, c.Module(0).Tensor(0).DType);
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Export.Combine(new Adapter[0], new double[0], CombineMethod.Cat, tmp["none"]));
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Export.Combine(new[] { a }, new[] { double.NaN }, CombineMethod.Cat, tmp["nan"]));
                Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Export.Combine(new[] { a, b }, new[] { 1.0, 1.0 }, (CombineMethod)99, tmp["m"]));
                Assert.Throws<ArgumentException>(() => Export.Combine(new[] { a, b }, new[] { 1.0 }, CombineMethod.Cat, tmp["w"]));
                Assert.False(Directory.Exists(tmp["none"]) || Directory.Exists(tmp["nan"]), "nothing written on failure");
            }
        }

        // scaling * B @ A of a module, row-major [out, in].
        private static double[] Delta(AdapterModule m, double weight)
        {
            AdapterTensor a = m.Tensor("lora_A.weight"), b = m.Tensor("lora_B.weight");
            float[] av = a.ReadSingle(), bv = b.ReadSingle();
            long rank = a.Shape[0], cols = a.Shape[1], rows = b.Shape[0];
            var d = new double[rows * cols];
            for (long i = 0; i < rows; i++)
                for (long j = 0; j < cols; j++)
                {
                    double s = 0;
                    for (long k = 0; k < rank; k++) s += (double)bv[i * rank + k] * av[k * cols + j];
                    d[i * cols + j] = weight * m.Scaling * s;
                }
            return d;
        }
    }
}
