// Model ids resolved in a hub cache laid out as huggingface_hub lays it out (blobs named by sha256,
// snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main).
using System;
using System.IO;
using System.Runtime.InteropServices;
using System.Security.Cryptography;

namespace PeftC.Tests
{
    public static class HubTests
    {
        [DllImport("libc", EntryPoint = "symlink", SetLastError = true)]
        private static extern int Symlink(string target, string linkPath);

        private static string LaySnapshot(string cache, string repo, string commit, string source)
        {
            string root = Path.Combine(cache, "models--" + repo.Replace("/", "--"));
            string snapshot = Path.Combine(root, "snapshots", commit);
            Directory.CreateDirectory(Path.Combine(root, "blobs"));
            Directory.CreateDirectory(Path.Combine(root, "refs"));
            Directory.CreateDirectory(snapshot);
            foreach (string file in Directory.GetFiles(source))
            {
                byte[] data = File.ReadAllBytes(file);
                string blob;
                using (var sha = SHA256.Create()) blob = BitConverter.ToString(sha.ComputeHash(data)).Replace("-", "").ToLowerInvariant();
                File.WriteAllBytes(Path.Combine(root, "blobs", blob), data);
                if (Symlink("../../blobs/" + blob, Path.Combine(snapshot, Path.GetFileName(file))) != 0)
                    throw new Exception("symlink failed: errno " + Marshal.GetLastWin32Error());
            }
            File.WriteAllText(Path.Combine(root, "refs", "main"), commit);
            return snapshot;
        }

        [Test]
        public static void IdsResolveInTheHubCache()
        {
            string model = Fixtures.Model("llama");
            if (!File.Exists(Path.Combine(model, "model.safetensors"))) throw new SkipException("fixture absent");
            string saved = Environment.GetEnvironmentVariable("HF_HUB_CACHE");
            using (var tmp = new TempDir())
            {
                try
                {
                    Environment.SetEnvironmentVariable("HF_HUB_CACHE", tmp.Path);
                    string commit = string.Concat(System.Linq.Enumerable.Repeat("ef56", 10));
                    string snapshot = LaySnapshot(tmp.Path, "org/tiny", commit, model);
                    Assert.Equal(tmp.Path, Hub.CacheDir, "CacheDir");
                    foreach (string id in new[] { "org/tiny", "org/tiny@main", "org/tiny@" + commit, "org/tiny@ef56e" })
                        Assert.Equal(snapshot, Hub.Resolve(id), id);
                    Assert.Equal(model, Hub.Resolve(model), "an existing path");
                    using (var byId = Checkpoint.Open("org/tiny"))
                    using (var byPath = Checkpoint.Open(model))
                    {
                        Assert.True(byId.TensorCount > 0, "tensors");
                        Assert.Equal(byPath.TensorCount, byId.TensorCount, "tensor count");
                    }
                    PeftException e = Assert.ThrowsPeft(ErrorCode.NotFound, () => Hub.Resolve("org/absent"));
                    Assert.True(e.Message.Contains(tmp.Path), "the message names the cache: " + e.Message);
                    e = Assert.ThrowsPeft(ErrorCode.NotFound, () => Hub.Resolve("org/tiny@v9"));
                    Assert.True(e.Message.Contains("\"main\""), "the message lists the refs: " + e.Message);
                    foreach (string text in new[] { "../up", "a/b/c", "/no/such/folder", "org/name@" })
                        Assert.ThrowsPeft(ErrorCode.InvalidArgument, () => Hub.Resolve(text), text);
                }
                finally
                {
                    Environment.SetEnvironmentVariable("HF_HUB_CACHE", saved);
                }
            }
        }
    }
}
