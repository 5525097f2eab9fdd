// Translators: tensor keys between HuggingFace names and a host's slash-separated native names.
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>
    /// Maps keys between HuggingFace names (<c>base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight</c>)
    /// and native names (<c>transformer/layer_4/attention/query/lora_a</c>) with an architecture table.
    /// Read-only: every member may be used from many threads at once.
    /// </summary>
    public sealed class Translator : NativeObject
    {
        internal Translator(TranslatorHandle h) : base(h) { }

        internal TranslatorHandle Handle { get { return Live<TranslatorHandle>(); } }

        /// <summary>The built-in table of a family such as "llama" (see <see cref="BuiltinFamilies"/>).</summary>
        public static Translator Builtin(string family)
        {
            TranslatorHandle h;
            PeftException.Check(Native.peft_translator_new_builtin(Utf8.Required(family, "family"), out h));
            return new Translator(h);
        }

        /// <summary>The caller's table in a JSON file (docs/translation-tables.md).</summary>
        public static Translator FromFile(string path)
        {
            TranslatorHandle h;
            PeftException.Check(Native.peft_translator_from_file(Utf8.Required(path, "path"), out h));
            return new Translator(h);
        }

        /// <summary>The caller's table given as JSON text.</summary>
        public static Translator FromJson(string json)
        {
            TranslatorHandle h;
            PeftException.Check(Native.peft_translator_from_json(Utf8.Required(json, "json"), out h));
            return new Translator(h);
        }

        /// <summary>A translator for GGUF names from a checkpoint opened on one GGUF model file: its general.architecture
        /// chooses the table, its attention head counts the RoPE row order. <c>ToNative</c> turns
        /// "model.layers.0.self_attn.q_proj.weight" into "blk.0.attn_q.weight" (the roles weight and bias only) and
        /// ToHf back; given to a buffer merge or <c>HostModel.SetTranslator</c>, layer names are GGUF tensor names
        /// of buffers laid out as a llama.cpp-family engine loads them (include/peft_c.h, peft_translator_from_gguf).
        /// The translator copies what it needs; the checkpoint may be disposed afterwards. A file without head counts
        /// gives a translator whose reordered weights fail (ShapeMismatch) when merged or added to a host
        /// model.</summary>
        /// <exception cref="PeftException">InvalidArgument for a checkpoint that is not one GGUF file;
        /// InvalidCheckpoint without a string general.architecture; Unsupported when no built-in table reads the
        /// architecture; NotFound or InvalidConfig when the tables cannot be read.</exception>
        public static Translator FromGguf(Checkpoint checkpoint)
        {
            if (checkpoint == null) throw new ArgumentNullException("checkpoint");
            TranslatorHandle h;
            PeftException.Check(Native.peft_translator_from_gguf(checkpoint.Handle, out h));
            return new Translator(h);
        }

        /// <summary>A translator for GGUF names from a GGUF architecture ("llama", "qwen2", "gemma2", ...) and its
        /// attention head counts, for hosts that hold the weights without the file (see <see cref="FromGguf"/>).</summary>
        /// <param name="architecture">A GGUF general.architecture.</param>
        /// <param name="headCount">The attention heads, at least 1.</param>
        /// <param name="headCountKv">The key/value heads, or 0 for <paramref name="headCount"/>.</param>
        /// <exception cref="PeftException">InvalidArgument for a headCount of 0; Unsupported when no built-in table
        /// reads the architecture; NotFound or InvalidConfig when the tables cannot be read.</exception>
        public static Translator NewGguf(string architecture, ulong headCount, ulong headCountKv = 0)
        {
            TranslatorHandle h;
            PeftException.Check(Native.peft_translator_new_gguf(Utf8.Required(architecture, "architecture"), headCount, headCountKv, out h));
            return new Translator(h);
        }

        /// <summary>The built-in table of a base model (its config.json) or, failing that, of a model name.</summary>
        public static Translator Detect(string baseDir, string modelName = null)
        {
            TranslatorHandle h;
            PeftException.Check(Native.peft_translator_detect(Utf8.Encode(baseDir, "baseDir"), Utf8.Encode(modelName, "modelName"), out h));
            return new Translator(h);
        }

        /// <summary>The families with an installed built-in table, sorted.</summary>
        public static string[] BuiltinFamilies()
        {
            IntPtr list;
            PeftException.Check(Native.peft_translator_builtin_family_list(out list));
            return Utf8.TakeList(list);
        }

        /// <summary>The table's family name.</summary>
        public string Family { get { return Utf8.Decode(Native.peft_translator_family(Handle)); } }

        /// <summary>The native name of a HuggingFace key (with or without "base_model.model.").</summary>
        /// <exception cref="PeftException">UnresolvedKey when the table does not resolve it.</exception>
        public string ToNative(string hfKey)
        {
            IntPtr text;
            PeftException.Check(Native.peft_translator_to_native(Handle, Utf8.Required(hfKey, "hfKey"), out text));
            return Utf8.TakeOwned(text);
        }

        /// <summary>The HuggingFace key of a native name, with "base_model.model." if asked.</summary>
        public string ToHf(string nativeKey, bool withPeftPrefix = false)
        {
            IntPtr text;
            PeftException.Check(Native.peft_translator_to_hf(Handle, Utf8.Required(nativeKey, "nativeKey"), withPeftPrefix ? 1 : 0, out text));
            return Utf8.TakeOwned(text);
        }

        /// <summary>Translates many keys at once; fails listing every key that does not resolve.</summary>
        public string[] ToNative(IList<string> hfKeys)
        {
            return Batch(hfKeys, false, false);
        }

        /// <summary>Translates many native names at once; fails listing every name that does not resolve.</summary>
        public string[] ToHf(IList<string> nativeKeys, bool withPeftPrefix = false)
        {
            return Batch(nativeKeys, true, withPeftPrefix);
        }

        private unsafe string[] Batch(IList<string> keys, bool toHf, bool withPeftPrefix)
        {
            if (keys == null) throw new ArgumentNullException("keys");
            int count = keys.Count;
            var handles = new GCHandle[count];
            var pointers = new IntPtr[Math.Max(count, 1)];
            var results = new IntPtr[Math.Max(count, 1)];
            try
            {
                for (int i = 0; i < count; i++)
                {
                    handles[i] = GCHandle.Alloc(Utf8.Required(keys[i], "keys[" + i + "]"), GCHandleType.Pinned);
                    pointers[i] = handles[i].AddrOfPinnedObject();
                }
                fixed (IntPtr* k = pointers)
                fixed (IntPtr* r = results)
                {
                    PeftException.Check(toHf
                        ? Native.peft_translator_to_hf_batch(Handle, k, (UIntPtr)count, withPeftPrefix ? 1 : 0, r)
                        : Native.peft_translator_to_native_batch(Handle, k, (UIntPtr)count, r));
                }
                var strings = new string[count];
                for (int i = 0; i < count; i++)
                {
                    strings[i] = Utf8.TakeOwned(results[i]);
                    results[i] = IntPtr.Zero;
                }
                return strings;
            }
            finally
            {
                for (int i = 0; i < count; i++)
                {
                    if (handles[i].IsAllocated) handles[i].Free();
                    if (results[i] != IntPtr.Zero) Native.peft_string_free(results[i]);
                }
            }
        }
    }
}
