// A small test runner (no NuGet): every method marked [Test] in this assembly runs once; each failure prints
// one line; the last line is exactly "N passed, N failed"; the exit status is nonzero on any failure.
// Usage: mono PeftC.Tests.exe [substring-of-test-name ...]
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Reflection;

namespace PeftC.Tests
{
    [AttributeUsage(AttributeTargets.Method)]
    public sealed class TestAttribute : Attribute { }

    /// <summary>Thrown by a test that cannot run here (counted as skipped, with the reason printed).</summary>
    public sealed class SkipException : Exception
    {
        public SkipException(string reason) : base(reason) { }
    }

    public static class TestRunner
    {
        public static int Main(string[] args)
        {
            var tests = typeof(TestRunner).Assembly.GetTypes()
                .SelectMany(t => t.GetMethods(BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Static | BindingFlags.Instance))
                .Where(m => m.GetCustomAttributes(typeof(TestAttribute), false).Length > 0)
                .OrderBy(m => m.DeclaringType.Name + "." + m.Name, StringComparer.Ordinal)
                .ToList();
            int passed = 0, failed = 0, skipped = 0;
            foreach (MethodInfo test in tests)
            {
                string name = test.DeclaringType.Name + "." + test.Name;
                if (args.Length > 0 && !args.Any(a => name.Contains(a))) continue;
                try
                {
                    object target = test.IsStatic ? null : Activator.CreateInstance(test.DeclaringType);
                    try
                    {
                        test.Invoke(target, null);
                    }
                    finally
                    {
                        var disposable = target as IDisposable;
                        if (disposable != null) disposable.Dispose();
                    }
                    passed++;
                }
                catch (Exception e)
                {
                    Exception cause = e is TargetInvocationException && e.InnerException != null ? e.InnerException : e;
                    if (cause is SkipException)
                    {
                        skipped++;
                        Console.WriteLine("SKIP " + name + ": " + cause.Message);
                        continue;
                    }
                    failed++;
                    Console.WriteLine("FAIL " + name + ": " + cause.GetType().Name + ": " +
                                      cause.Message.Replace("\n", "\\n") + " at " + FirstFrame(cause));
                }
            }
            // Finalizers of handles the tests left undisposed run here, while the library is still loaded.
            GC.Collect();
            GC.WaitForPendingFinalizers();
            if (skipped > 0) Console.WriteLine(skipped + " skipped");
            Console.WriteLine(passed + " passed, " + failed + " failed");
            return failed == 0 ? 0 : 1;
        }

        private static string FirstFrame(Exception e)
        {
            string trace = e.StackTrace ?? "";
            foreach (string line in trace.Split('\n'))
                if (line.Contains("PeftC.Tests.") && !line.Contains("PeftC.Tests.Assert.")) return line.Trim();
            return trace.Split('\n').FirstOrDefault() ?? "";
        }
    }

    public static class Assert
    {
        public static void True(bool condition, string what = "condition")
        {
            if (!condition) throw new Exception("expected true: " + what);
        }

        public static void False(bool condition, string what = "condition")
        {
            if (condition) throw new Exception("expected false: " + what);
        }

        public static void Equal<T>(T expected, T actual, string what = "value")
        {
            if (!EqualityComparer<T>.Default.Equals(expected, actual))
                throw new Exception(what + ": expected <" + expected + "> but got <" + actual + ">");
        }

        public static void SequenceEqual<T>(IEnumerable<T> expected, IEnumerable<T> actual, string what = "sequence")
        {
            var e = expected.ToList();
            var a = actual.ToList();
            if (e.Count != a.Count) throw new Exception(what + ": expected " + e.Count + " items but got " + a.Count);
            for (int i = 0; i < e.Count; i++)
                if (!EqualityComparer<T>.Default.Equals(e[i], a[i]))
                    throw new Exception(what + "[" + i + "]: expected <" + e[i] + "> but got <" + a[i] + ">");
        }

        public static T Throws<T>(Action action, string what = "call") where T : Exception
        {
            try
            {
                action();
            }
            catch (T e)
            {
                return e;
            }
            catch (Exception e)
            {
                throw new Exception(what + ": expected " + typeof(T).Name + " but got " + e.GetType().Name + ": " + e.Message);
            }
            throw new Exception(what + ": expected " + typeof(T).Name + " but nothing was thrown");
        }

        public static PeftException ThrowsPeft(ErrorCode code, Action action, string what = "call")
        {
            PeftException e = Throws<PeftException>(action, what);
            if (e.Code != code) throw new Exception(what + ": expected " + code + " but got " + e.Code + ": " + e.Message);
            if (string.IsNullOrEmpty(e.Message)) throw new Exception(what + ": the error has no message");
            return e;
        }
    }

    /// <summary>Fixture paths and temporary folders.</summary>
    public static class Fixtures
    {
        public static string Root
        {
            get
            {
                string dir = Environment.GetEnvironmentVariable("PEFT_TEST_DATA");
                if (string.IsNullOrEmpty(dir)) dir = Path.Combine(Directory.GetCurrentDirectory(), "tests", "fixtures");
                if (!Directory.Exists(dir)) throw new Exception("no fixtures at " + dir + " (set PEFT_TEST_DATA)");
                return dir;
            }
        }

        public static string Path_(params string[] parts)
        {
            return Path.Combine(new[] { Root }.Concat(parts).ToArray());
        }

        public static string Model(string name) { return Path_("models", name); }
        public static string AdapterDir(string name) { return Path_("adapters", name); }
        public static string Safetensors(string name) { return Path_("safetensors", name); }
    }

    /// <summary>A temporary folder removed when disposed.</summary>
    public sealed class TempDir : IDisposable
    {
        public readonly string Path;

        public TempDir()
        {
            Path = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "peftc-cs-" + Guid.NewGuid().ToString("N"));
            Directory.CreateDirectory(Path);
        }

        public string this[string name] { get { return System.IO.Path.Combine(Path, name); } }

        public void Dispose()
        {
            try { Directory.Delete(Path, true); } catch (IOException) { }
        }
    }
}
