using System;
using System.IO;
using System.Json;
using System.Linq;

namespace PeftC.Tests
{
    public class MalformedTests
    {
        // tests/fixtures/malformed/expected.json gives, for each broken file, the failure kind of the reference
        // reader; the binding must raise exactly that code, however the file is opened.
        [Test]
        public void EveryMalformedFixtureFailsWithTheReferenceKind()
        {
            string dir = Fixtures.Path_("malformed");
            string expectedPath = Path.Combine(dir, "expected.json");
            if (!File.Exists(expectedPath)) throw new SkipException("no " + expectedPath);
            var expected = (JsonObject)JsonValue.Parse(File.ReadAllText(expectedPath));
            int count = 0;
            foreach (var entry in expected)
            {
                string file = Path.Combine(dir, entry.Key);
                string code = (string)entry.Value["code"];
                foreach (var open in new Func<Checkpoint>[]
                         {
                             () => Checkpoint.Open(file), () => Checkpoint.Open(file, new OpenOptions { UsePread = true }),
                             () => Checkpoint.FromBytes(File.ReadAllBytes(file)),
                         })
                {
                    PeftException e = Assert.Throws<PeftException>(() => open().Dispose(), entry.Key);
                    Assert.Equal(code, e.CodeName, entry.Key + " (" + e.Message + ")");
                }
                count++;
            }
            Assert.Equal(expected.Count, count);
            Assert.True(count > 50, "malformed fixtures: " + count);
            Assert.Equal(expected.Count + 1, Directory.GetFiles(dir).Length, "every file in malformed/ is listed");
        }
    }
}
