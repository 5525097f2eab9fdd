// The translation tables (data/arch/*.json) that the library reads at run time, for a program that got
// the library from the NuGet package: the package copies them into the program's folder as
// peft_c/arch/*.json (contentFiles for .NET, build/PeftC.targets for .NET Framework and Mono), where the
// library does not look (it looks in $PEFT_C_DATA_DIR, its install prefix and its source tree). Before
// the first call into the library, if PEFT_C_DATA_DIR is unset and such a folder exists next to the
// program or to PeftC.dll, it is set to that folder, in the process's C environment (libc setenv:
// Environment.SetEnvironmentVariable does not reach the C library's getenv on .NET).
using System;
using System.IO;
using System.Runtime.InteropServices;

namespace PeftC
{
    internal static class DataDir
    {
        [DllImport("libc.so.6", EntryPoint = "setenv")]
        private static extern int SetEnv(byte[] name, byte[] value, int overwrite);

        [DllImport("libc.so.6", EntryPoint = "getenv")]
        private static extern IntPtr GetEnv(byte[] name);

        internal static void Init()
        {
            try
            {
                byte[] name = Utf8.Encode("PEFT_C_DATA_DIR", "name");
                if (GetEnv(name) != IntPtr.Zero) return;
                foreach (string dir in new[] { AppDomain.CurrentDomain.BaseDirectory,
                                               Path.GetDirectoryName(typeof(DataDir).Assembly.Location) })
                {
                    if (string.IsNullOrEmpty(dir)) continue;
                    string data = Path.Combine(dir, "peft_c");
                    if (Directory.Exists(Path.Combine(data, "arch")))
                    {
                        SetEnv(name, Utf8.Encode(data, "path"), 0);
                        return;
                    }
                }
            }
            catch (DllNotFoundException) { }        // not glibc Linux: the tables come from elsewhere
            catch (EntryPointNotFoundException) { }
            catch (ArgumentException) { }           // a folder name the C environment cannot hold
        }
    }
}
