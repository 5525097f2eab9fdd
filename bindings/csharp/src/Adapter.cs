// PEFT LoRA adapters: opening, the config, modules and tensors, validation against a base model.
using System;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>Kinds of adapter modules (the PEFT_LAYER_* values).</summary>
    public enum LayerKind
    {
        /// <summary>nn.Linear: base weight [out, in].</summary>
        Linear = 0,
        /// <summary>transformers Conv1D (GPT-2): base weight [in, out].</summary>
        Conv1D = 1,
        /// <summary>nn.Embedding: base [num, dim].</summary>
        Embedding = 2,
        /// <summary>nn.Conv2d: base [out, in, kh, kw].</summary>
        Conv2D = 3,
        /// <summary>Whole tensors that replace the base's (modules_to_save, biases).</summary>
        Full = 4,
        /// <summary>Rows that replace base embedding rows (trainable_token_indices).</summary>
        TrainableTokens = 5,
    }

    /// <summary>
    /// A loaded PEFT LoRA adapter (a folder with adapter_config.json and adapter_model.safetensors).
    /// Read-only after opening: every member may be used from many threads at once.
    /// </summary>
    public sealed class Adapter : NativeObject
    {
        private Adapter(AdapterHandle h) : base(h) { }

        internal AdapterHandle Handle { get { return Live<AdapterHandle>(); } }

        /// <summary>Opens an adapter folder. With <paramref name="baseDir"/>, it is also resolved and validated against
        /// that base model (all-linear expanded, Conv1D told from Linear by the base's shapes). With
        /// <paramref name="translator"/>, its table is used instead of the one detected. With <paramref name="lenient"/>,
        /// it is loaded as PEFT's PeftModel.from_pretrained loads it: what PEFT ignores (unexpected keys, missing keys
        /// that leave a layer without effect) is dropped and listed in <see cref="Warnings"/>; what PEFT refuses stays
        /// an error. Strict is the default.</summary>
        /// <exception cref="PeftException">NotFound, Unsupported, InvalidConfig, UnresolvedKey, ShapeMismatch, ...</exception>
        public static Adapter Open(string dir, string baseDir = null, Translator translator = null, bool lenient = false)
        {
            byte[] d = Utf8.Required(dir, "dir");
            AdapterOptionsHandle o;
            PeftException.Check(Native.peft_adapter_options_new(out o));
            using (o)
            {
                if (baseDir != null) PeftException.Check(Native.peft_adapter_options_set_base_dir(o, Utf8.Encode(baseDir, "baseDir")));
                if (translator != null) PeftException.Check(Native.peft_adapter_options_set_translator(o, translator.Handle));
                if (lenient) PeftException.Check(Native.peft_adapter_options_set_lenient(o, 1));
                AdapterHandle h;
                PeftException.Check(Native.peft_adapter_open(d, o, out h));
                return new Adapter(h);
            }
        }

        /// <summary>Checks every module against a base model folder, without changing the adapter.</summary>
        /// <exception cref="PeftException">UnresolvedKey or ShapeMismatch listing every problem.</exception>
        public void Validate(string baseDir)
        {
            PeftException.Check(Native.peft_adapter_validate(Handle, Utf8.Required(baseDir, "baseDir")));
        }

        /// <summary>The config as PEFT writes it (json.dumps(config, indent=2, sort_keys=True)).</summary>
        public string ConfigJson { get { return Utf8.Decode(Native.peft_adapter_config_json(Handle)); } }

        /// <summary>One config field as compact JSON; null when the file has no such field.</summary>
        public string ConfigField(string field)
        {
            return Utf8.Decode(Native.peft_adapter_config_field(Handle, Utf8.Required(field, "field")));
        }

        public long R { get { return Native.peft_adapter_r(Handle); } }
        public double LoraAlpha { get { return Native.peft_adapter_lora_alpha(Handle); } }
        public bool UseRslora { get { return Native.peft_adapter_use_rslora(Handle) != 0; } }
        public bool UseDora { get { return Native.peft_adapter_use_dora(Handle) != 0; } }
        public bool LoraBias { get { return Native.peft_adapter_lora_bias(Handle) != 0; } }
        public bool FanInFanOut { get { return Native.peft_adapter_fan_in_fan_out(Handle) != 0; } }
        public string PeftType { get { return Utf8.Decode(Native.peft_adapter_peft_type(Handle)); } }
        /// <summary>"none", "all" or "lora_only".</summary>
        public string Bias { get { return Utf8.Decode(Native.peft_adapter_bias(Handle)); } }
        /// <summary>The task type, e.g. "CAUSAL_LM"; null when absent.</summary>
        public string TaskType { get { return Utf8.Decode(Native.peft_adapter_task_type(Handle)); } }
        /// <summary>base_model_name_or_path; null when absent.</summary>
        public string BaseModelNameOrPath { get { return Utf8.Decode(Native.peft_adapter_base_model_name_or_path(Handle)); } }
        /// <summary>The architecture family whose table applies ("llama", ...); null when none does.</summary>
        public string Family { get { return Utf8.Decode(Native.peft_adapter_family(Handle)); } }

        /// <summary>Things worth knowing that are not errors.</summary>
        public string[] Notes
        {
            get
            {
                AdapterHandle h = Handle;
                var notes = new string[Checkpoint.ToInt(Native.peft_adapter_note_count(h))];
                for (int i = 0; i < notes.Length; i++) notes[i] = Utf8.Decode(Native.peft_adapter_note(h, (UIntPtr)i));
                return notes;
            }
        }

        /// <summary>What lenient loading ignored, one sentence each, starting with <c>unexpected key "&lt;key&gt;": </c>
        /// or <c>missing key "&lt;key&gt;": </c>; empty for an adapter opened strictly.</summary>
        public string[] Warnings
        {
            get
            {
                AdapterHandle h = Handle;
                var warnings = new string[Checkpoint.ToInt(Native.peft_adapter_warning_count(h))];
                for (int i = 0; i < warnings.Length; i++) warnings[i] = Utf8.Decode(Native.peft_adapter_warning(h, (UIntPtr)i));
                return warnings;
            }
        }

        /// <summary>A translator over the adapter's architecture table.</summary>
        /// <exception cref="PeftException">NotFound when the adapter has no table.</exception>
        public Translator Translator()
        {
            TranslatorHandle t;
            PeftException.Check(Native.peft_adapter_translator(Handle, out t));
            return new Translator(t);
        }

        /// <summary>Number of modules (LoRA layers and modules with full tensors), in file order.</summary>
        public int ModuleCount { get { return Checkpoint.ToInt(Native.peft_adapter_module_count(Handle)); } }

        /// <summary>Module <paramref name="index"/>.</summary>
        public AdapterModule Module(int index)
        {
            if (index < 0 || index >= ModuleCount) throw new ArgumentOutOfRangeException("index", index, "no such module");
            return new AdapterModule(this, index);
        }

        /// <summary>The module with this path (without "base_model.model.").</summary>
        /// <exception cref="PeftException">NotFound.</exception>
        public AdapterModule Module(string name)
        {
            UIntPtr index;
            PeftException.Check(Native.peft_adapter_find_module(Handle, Utf8.Required(name, "name"), out index));
            return new AdapterModule(this, Checkpoint.ToInt(index));
        }

        /// <summary>Every module, in file order.</summary>
        public AdapterModule[] Modules()
        {
            var modules = new AdapterModule[ModuleCount];
            for (int i = 0; i < modules.Length; i++) modules[i] = new AdapterModule(this, i);
            return modules;
        }

        /// <summary>Writes the adapter as a PEFT adapter folder (see <see cref="PeftC.Export.Save"/>).</summary>
        public void Export(string outDir, ExportOptions options = null)
        {
            PeftC.Export.Save(this, outDir, options);
        }

        /// <summary>Writes the adapter as a GGUF LoRA adapter for llama.cpp (see <see cref="PeftC.Export.SaveGguf"/>).</summary>
        public void ExportGguf(string outPath, string baseModel = null, int ggmlType = Ggml.F32)
        {
            PeftC.Export.SaveGguf(this, outPath, baseModel, ggmlType);
        }

        /// <summary>Writes the adapter as a GGUF LoRA adapter for llama.cpp and what GGUF LoRA cannot hold merged into a
        /// copy of the base at <paramref name="baseOut"/> (see <see cref="PeftC.Export.SaveGgufSplit"/>).</summary>
        public void ExportGgufSplit(string outPath, string baseOut, string baseModel = null, int ggmlType = Ggml.F32)
        {
            PeftC.Export.SaveGgufSplit(this, outPath, baseOut, baseModel, ggmlType);
        }
    }

    /// <summary>One module of an adapter (a LoRA layer or a module with full replacement tensors).</summary>
    public sealed class AdapterModule
    {
        private readonly Adapter adapter_;
        private readonly UIntPtr index_;

        internal AdapterModule(Adapter adapter, int index)
        {
            adapter_ = adapter;
            index_ = (UIntPtr)index;
        }

        internal Adapter Adapter { get { return adapter_; } }
        internal UIntPtr RawIndex { get { return index_; } }
        private AdapterHandle H { get { return adapter_.Handle; } }

        public int Index { get { return (int)index_.ToUInt64(); } }
        /// <summary>The transformers module path, e.g. "model.layers.0.self_attn.q_proj".</summary>
        public string Name { get { return Utf8.Decode(Native.peft_adapter_module_name(H, index_)); } }
        public LayerKind Kind { get { return (LayerKind)Native.peft_adapter_module_kind(H, index_); } }
        /// <summary>The LoRA rank (0 for full and trainable-token modules).</summary>
        public long Rank { get { return Native.peft_adapter_module_rank(H, index_); } }
        public double Alpha { get { return Native.peft_adapter_module_alpha(H, index_); } }
        /// <summary>alpha / rank, or alpha / sqrt(rank) with use_rslora.</summary>
        public double Scaling { get { return Native.peft_adapter_module_scaling(H, index_); } }
        public int TensorCount { get { return Checkpoint.ToInt(Native.peft_adapter_module_tensor_count(H, index_)); } }

        /// <summary>Token indices of a trainable-tokens module (empty for other modules).</summary>
        public unsafe long[] TokenIndices
        {
            get
            {
                UIntPtr count;
                long* p = Native.peft_adapter_module_token_indices(H, index_, out count);
                var result = new long[p == null ? 0 : Checkpoint.ToInt(count)];
                for (int i = 0; i < result.Length; i++) result[i] = p[i];
                return result;
            }
        }

        public AdapterTensor Tensor(int index)
        {
            if (index < 0 || index >= TensorCount) throw new ArgumentOutOfRangeException("index", index, "no such tensor");
            return new AdapterTensor(this, index);
        }

        /// <summary>The tensor of a role such as "lora_A.weight"; null when the module has none.</summary>
        public AdapterTensor Tensor(string role)
        {
            foreach (AdapterTensor t in Tensors())
                if (t.Role == role) return t;
            return null;
        }

        public AdapterTensor[] Tensors()
        {
            var tensors = new AdapterTensor[TensorCount];
            for (int i = 0; i < tensors.Length; i++) tensors[i] = new AdapterTensor(this, i);
            return tensors;
        }

        public override string ToString() { return Name + " (" + Kind + ")"; }
    }

    /// <summary>One tensor of an adapter module.</summary>
    public sealed class AdapterTensor
    {
        private readonly AdapterModule module_;
        private readonly UIntPtr index_;

        internal AdapterTensor(AdapterModule module, int index)
        {
            module_ = module;
            index_ = (UIntPtr)index;
        }

        private AdapterHandle H { get { return module_.Adapter.Handle; } }

        public AdapterModule Module { get { return module_; } }
        /// <summary>The key's tail after the module path: "lora_A.weight", "lora_B.bias", "weight", ...</summary>
        public string Role { get { return Utf8.Decode(Native.peft_adapter_module_tensor_role(H, module_.RawIndex, index_)); } }
        /// <summary>The key as stored in adapter_model.safetensors.</summary>
        public string Key { get { return Utf8.Decode(Native.peft_adapter_module_tensor_key(H, module_.RawIndex, index_)); } }
        /// <summary>The base model tensor it applies to or replaces.</summary>
        public string BaseName { get { return Utf8.Decode(Native.peft_adapter_module_tensor_base_name(H, module_.RawIndex, index_)); } }
        public DType DType { get { return (DType)Native.peft_adapter_module_tensor_dtype(H, module_.RawIndex, index_); } }

        public unsafe long[] Shape
        {
            get
            {
                AdapterHandle h = H;
                return Checkpoint.Shape(Native.peft_adapter_module_tensor_shape(h, module_.RawIndex, index_),
                                        Native.peft_adapter_module_tensor_ndim(h, module_.RawIndex, index_));
            }
        }

        public long ElementCount
        {
            get
            {
                long n = 1;
                foreach (long d in Shape) n = checked(n * d);
                return n;
            }
        }

        /// <summary>Reads the tensor converted to <paramref name="dtype"/> into <paramref name="destination"/>
        /// (exactly elements x size of the dtype).</summary>
        public unsafe void Read(DType dtype, Span<byte> destination)
        {
            fixed (byte* d = &MemoryMarshal.GetReference(destination))
            {
                PeftException.Check(Native.peft_adapter_module_tensor_read(H, module_.RawIndex, index_, (int)dtype, d,
                                                                           (ulong)destination.Length));
            }
        }

        /// <summary>Reads the tensor as float.</summary>
        public float[] ReadSingle()
        {
            var result = new float[checked((int)ElementCount)];
            Read(DType.F32, MemoryMarshal.AsBytes(result.AsSpan()));
            return result;
        }

        public override string ToString() { return Key; }
    }
}
