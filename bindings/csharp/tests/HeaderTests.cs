// The drift check of the C# binding: the P/Invoke declarations of src/Native.cs against the prototypes of
// include/peft_c.h. Every declared function must be in the header with as many parameters and compatible
// types; every header function must be declared or listed in NotWrapped with the reason.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Runtime.InteropServices;
using System.Text.RegularExpressions;

namespace PeftC.Tests
{
    /// <summary>One PEFT_API prototype: C types with <c>const</c> and spaces removed, e.g. "peft_lease**".</summary>
    internal sealed class CPrototype
    {
        internal string Return;
        internal List<string> Params;
    }

    public class HeaderTests
    {
        // Header functions the binding does not declare, and why.
        internal static readonly Dictionary<string, string> NotWrapped = new Dictionary<string, string>
        {
            { "peft_checkpoint_find", "the _n variant is used: names are passed with their length (they may hold NUL)" },
            { "peft_writer_add_tensor", "the _n variant is used: names are passed with their length (they may hold NUL)" },
            { "peft_get_api", "the function table is for C callers that load the library by hand; P/Invoke binds by name" },
            // Older aliases the header keeps beside the regular names (see its Conventions).
            { "peft_lease_release", "older alias of peft_lease_free; the binding calls the regular one" },
            { "peft_merge_buffer_remove", "older alias of peft_merge_record_unmerge; the binding calls the regular one" },
            { "peft_registry_names", "older alias of peft_registry_name_list; the binding calls the regular one" },
            { "peft_translator_builtin_families", "older alias of peft_translator_builtin_family_list; the binding calls the regular one" },
        };

        private static readonly Dictionary<string, Type> Scalars = new Dictionary<string, Type>
        {
            { "int32_t", typeof(int) }, { "uint32_t", typeof(uint) }, { "int64_t", typeof(long) },
            { "uint64_t", typeof(ulong) }, { "double", typeof(double) }, { "size_t", typeof(UIntPtr) },
            { "void", typeof(void) }, { "char", typeof(byte) },
        };

        internal static string HeaderPath()
        {
            return Path.GetFullPath(Path.Combine(Fixtures.Root, "..", "..", "include", "peft_c.h"));
        }

        /// <summary>The PEFT_API prototypes of a header's text, by function name.</summary>
        internal static Dictionary<string, CPrototype> ParseHeader(string text)
        {
            text = Regex.Replace(text, @"/\*.*?\*/", " ", RegexOptions.Singleline);
            text = Regex.Replace(text, @"//[^\n]*", " ");
            string code = string.Join("\n", text.Split('\n').Where(line => !line.TrimStart().StartsWith("#")));
            var prototypes = new Dictionary<string, CPrototype>();
            var prototype = new Regex(@"PEFT_API\s+(.+?)\b(peft_\w+)\s*\((.*)\)\s*$", RegexOptions.Singleline);
            foreach (string statement in code.Split(';'))
            {
                Match m = prototype.Match(statement);
                if (!m.Success) continue;
                var parameters = m.Groups[3].Value.Split(',').Select(p => p.Trim()).ToList();
                if (parameters.Count == 1 && (parameters[0] == "void" || parameters[0] == "")) parameters.Clear();
                prototypes[m.Groups[2].Value] = new CPrototype
                {
                    Return = Normalize(m.Groups[1].Value),
                    Params = parameters.Select(p => Normalize(Regex.Replace(p, @"\b\w+$", ""))).ToList(),
                };
            }
            return prototypes;
        }

        private static string Normalize(string type)
        {
            return Regex.Replace(Regex.Replace(type, @"\bconst\b", ""), @"\s+", "");
        }

        /// <summary>"checkpoint" for CheckpointHandle, "host_model" for HostModelHandle.</summary>
        private static string SnakeCase(string pascal)
        {
            return Regex.Replace(pascal, @"(?<=[a-z0-9])([A-Z])", "_$1").ToLowerInvariant();
        }

        /// <summary>Whether a C type (normalized) and the CLR type P/Invoke passes for it agree.</summary>
        internal static bool Matches(string c, Type t)
        {
            if (t.IsByRef || t.IsPointer || t.IsArray)
                return c.EndsWith("*") && Matches(c.Substring(0, c.Length - 1), t.GetElementType());
            Type scalar;
            if (Scalars.TryGetValue(c, out scalar)) return t == scalar || (c == "void" && t == typeof(byte));
            if (c.EndsWith("_fn")) return t.IsSubclassOf(typeof(Delegate));  // callback typedefs
            if (c.EndsWith("*"))
            {
                if (t == typeof(IntPtr)) return true;
                if (!typeof(PeftHandle).IsAssignableFrom(t) || !t.Name.EndsWith("Handle")) return false;
                return c == "peft_" + SnakeCase(t.Name.Substring(0, t.Name.Length - "Handle".Length)) + "*";
            }
            // a struct passed by pointer: peft_registry_stats is NativeRegistryStats
            return c.StartsWith("peft_") && t.IsValueType && t.Name == "Native" + Regex.Replace(
                c.Substring("peft_".Length), @"(?:^|_)([a-z])", m => m.Groups[1].Value.ToUpperInvariant());
        }

        /// <summary>Every difference between the header and the DllImport methods of <paramref name="declarations"/>.</summary>
        internal static List<string> Compare(Dictionary<string, CPrototype> header, Type declarations,
                                             IDictionary<string, string> notWrapped)
        {
            var problems = new List<string>();
            var declared = new HashSet<string>();
            const BindingFlags all = BindingFlags.Static | BindingFlags.Public | BindingFlags.NonPublic;
            foreach (MethodInfo method in declarations.GetMethods(all))
            {
                if ((method.Attributes & MethodAttributes.PinvokeImpl) == 0) continue;
                string name = method.Name;
                declared.Add(name);
                CPrototype want;
                if (!header.TryGetValue(name, out want))
                {
                    problems.Add(name + " is declared but not in the header");
                    continue;
                }
                ParameterInfo[] got = method.GetParameters();
                if (got.Length != want.Params.Count)
                {
                    problems.Add(name + ": " + got.Length + " parameters declared, " + want.Params.Count + " in the header");
                    continue;
                }
                if (!Matches(want.Return, method.ReturnType))
                    problems.Add(name + ": returns " + method.ReturnType.Name + ", the header " + want.Return);
                for (int i = 0; i < got.Length; i++)
                    if (!Matches(want.Params[i], got[i].ParameterType))
                        problems.Add(name + " parameter " + i + " (" + got[i].Name + "): " + got[i].ParameterType.Name +
                                     ", the header " + want.Params[i]);
            }
            foreach (string name in header.Keys)
                if (!declared.Contains(name) && !notWrapped.ContainsKey(name))
                    problems.Add(name + " is in the header but neither declared nor listed as not wrapped");
            foreach (string name in notWrapped.Keys)
            {
                if (declared.Contains(name)) problems.Add(name + " is declared and also listed as not wrapped");
                if (!header.ContainsKey(name)) problems.Add(name + " is listed as not wrapped but not in the header");
            }
            return problems;
        }

        [Test]
        public void NativeDeclarationsMatchTheHeader()
        {
            Dictionary<string, CPrototype> header = ParseHeader(File.ReadAllText(HeaderPath()));
            // The parser must have found the API, or the comparison would prove nothing.
            Assert.True(header.Count >= 140, "only " + header.Count + " prototypes parsed from " + HeaderPath());
            List<string> problems = Compare(header, typeof(Native), NotWrapped);
            Assert.True(problems.Count == 0, problems.Count + " difference(s):\n  " + string.Join("\n  ", problems));
        }

        // Wrong on purpose, never called: what the checker has to notice.
        private static class WrongDeclarations
        {
            [DllImport("peft_c")] internal static extern int peft_version_number();                        // uint32_t
            [DllImport("peft_c")] internal static extern ErrorHandle peft_registry_trim(IntPtr r, int extra); // one parameter
            [DllImport("peft_c")] internal static extern void peft_lease_release(CheckpointHandle lease);    // peft_lease*
            [DllImport("peft_c")] internal static extern void peft_no_such_function();
            [DllImport("peft_c")] internal static extern ErrorHandle peft_registry_get_stats(RegistryHandle r, ref NativeRegistryStats s);
        }

        [Test]
        public void CheckerNoticesDifferences()
        {
            const string sample = @"
                #define PEFT_X 1
                typedef struct peft_registry peft_registry; /* a comment; with a semicolon */
                PEFT_API uint32_t peft_version_number(void);
                PEFT_API peft_error* peft_registry_trim(peft_registry* registry);
                PEFT_API void peft_lease_release(peft_lease* lease);
                PEFT_API peft_error* peft_registry_get_stats(const peft_registry* registry,
                                                             peft_registry_stats* stats);
                PEFT_API const char* peft_only_in_the_header(const char* const* keys, size_t n);";
            Dictionary<string, CPrototype> header = ParseHeader(sample);
            Assert.SequenceEqual(new[] { "peft_lease_release", "peft_only_in_the_header", "peft_registry_get_stats",
                                         "peft_registry_trim", "peft_version_number" },
                                 header.Keys.OrderBy(k => k, StringComparer.Ordinal), "parsed names");
            Assert.SequenceEqual(new[] { "char**", "size_t" }, header["peft_only_in_the_header"].Params, "parameters");
            Assert.Equal("char*", header["peft_only_in_the_header"].Return, "return");
            List<string> problems = Compare(header, typeof(WrongDeclarations), new Dictionary<string, string>());
            // peft_version_number's return, peft_registry_trim's count, peft_lease_release's handle,
            // peft_no_such_function extra, peft_only_in_the_header missing
            Assert.Equal(5, problems.Count, string.Join("\n", problems));
            Assert.Equal(0, Compare(header, typeof(WrongDeclarations),
                                    new Dictionary<string, string> { { "peft_only_in_the_header", "test" } })
                                .Count(p => p.Contains("peft_only_in_the_header")), "listed as not wrapped");
        }
    }
}
