// The adapter doctor: an adapter checked against a base model without merging, and a repaired copy.
using System;

namespace PeftC
{
    /// <summary>
    /// The adapter doctor: checks an adapter folder against a base model folder without merging (and without
    /// the strict loader, so it also reads adapters <see cref="Adapter.Open(string, string, Translator, bool)"/> refuses), and writes a copy with
    /// every known rename applied. The report is JSON (schema 1, docs/doctor.md): summary.ok, problems (each
    /// with a stable kind), modules, renames, config_changes. Thread-safe.
    /// </summary>
    public static class Doctor
    {
        /// <summary>The report on <paramref name="adapterDir"/>, against <paramref name="baseDir"/> when not null.</summary>
        /// <exception cref="PeftException">NotFound for a missing folder or file, InvalidConfig for an unreadable config
        /// (problems are in the report, not exceptions).</exception>
        public static string Check(string adapterDir, string baseDir = null)
        {
            IntPtr json;
            PeftException.Check(Native.peft_adapter_doctor(Utf8.Required(adapterDir, "adapterDir"), Utf8.Encode(baseDir, "baseDir"), out json));
            return Utf8.TakeOwned(json);
        }

        /// <summary>Writes <paramref name="outDir"/>: the adapter with every rename the doctor knows applied
        /// (atomically, as an export). Returns the report on <paramref name="adapterDir"/>; call
        /// <see cref="Check"/> on <paramref name="outDir"/> to see what remains.</summary>
        public static string Fix(string adapterDir, string baseDir, string outDir)
        {
            IntPtr json;
            PeftException.Check(Native.peft_adapter_doctor_fix(Utf8.Required(adapterDir, "adapterDir"), Utf8.Encode(baseDir, "baseDir"),
                                                               Utf8.Required(outDir, "outDir"), out json));
            return Utf8.TakeOwned(json);
        }
    }
}
