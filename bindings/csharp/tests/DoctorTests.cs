using System;
using System.IO;
using System.Json;
using System.Linq;

namespace PeftC.Tests
{
    public class DoctorTests
    {
        // A clean fixture adapter: ok, every module matched; its fix is the adapter byte for byte.
        [Test]
        public void CleanAdapterAndItsFix()
        {
            string dir = Fixtures.AdapterDir("llama_lora"), baseDir = Fixtures.Model("llama");
            string text = Doctor.Check(dir, baseDir);
            var report = (JsonObject)JsonValue.Parse(text);
            Assert.True((bool)report["summary"]["ok"], "ok");
            Assert.Equal(14, (int)report["summary"]["matched_modules"], "matched modules");
            using (var tmp = new TempDir())
            {
                Assert.Equal(text, Doctor.Fix(dir, baseDir, tmp["fixed"]), "the fix returns the input's report");
                foreach (string f in new[] { "adapter_model.safetensors", "adapter_config.json" })
                    Assert.SequenceEqual(File.ReadAllBytes(Path.Combine(dir, f)), File.ReadAllBytes(Path.Combine(tmp["fixed"], f)), f);
            }
        }

        // A config whose r does not fit the tensors: 14 problems of kind rank_mismatch, not an exception.
        [Test]
        public void RankMismatchIsAProblem()
        {
            string src = Fixtures.AdapterDir("llama_lora");
            using (var tmp = new TempDir())
            {
                Directory.CreateDirectory(tmp["a"]);
                File.Copy(Path.Combine(src, "adapter_model.safetensors"), Path.Combine(tmp["a"], "adapter_model.safetensors"));
                File.WriteAllText(Path.Combine(tmp["a"], "adapter_config.json"),
                                  File.ReadAllText(Path.Combine(src, "adapter_config.json")).Replace("\"r\": 4,", "\"r\": 2,"));
                var report = (JsonObject)JsonValue.Parse(Doctor.Check(tmp["a"]));
                Assert.False((bool)report["summary"]["ok"], "not ok");
                var problems = (JsonArray)report["problems"];
                Assert.Equal(14, problems.Count, "problems");
                Assert.True(problems.All(p => (string)p["kind"] == "rank_mismatch"), "kinds");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => Doctor.Check(tmp["absent"]), "missing folder");
                Assert.ThrowsPeft(ErrorCode.NotFound, () => Doctor.Fix(tmp["absent"], null, tmp["out"]), "missing folder");
                Assert.False(Directory.Exists(tmp["out"]), "a failed fix writes nothing");
            }
        }
    }
}
