// Control vectors (steering vectors): one direction per decoder layer, read from and written to llama.cpp's GGUF
// or safetensors files, combined, and added to a host's buffer; and the record that takes it out again exactly.
using System;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>
    /// A control vector: one direction of <see cref="NEmbd"/> float values per decoder layer. A host adds
    /// strength x the direction of layer N to the output of its 0-based decoder layer N (the residual stream after
    /// the layer), as llama.cpp applies --control-vector. The reading members may run on several threads at once;
    /// SetDirection and Add need the vector to themselves.
    /// </summary>
    public sealed class ControlVector : NativeObject
    {
        private ControlVector(ControlVectorHandle h) : base(h) { }

        internal ControlVectorHandle Handle { get { return Live<ControlVectorHandle>(); } }

        /// <summary>Reads a control vector from a GGUF or safetensors file (the format is told by its contents).</summary>
        /// <exception cref="PeftException">Io for a file that does not open, InvalidCheckpoint for a file that is no
        /// control vector, NonFinite for an infinite or NaN value.</exception>
        public static ControlVector Open(string path)
        {
            byte[] p = Utf8.Required(path, "path");
            ControlVectorHandle h;
            PeftException.Check(Native.peft_control_vector_open(p, out h));
            return new ControlVector(h);
        }

        /// <summary>An empty control vector of <paramref name="nEmbd"/> values per direction (in [1, 2^31]), made for
        /// the model <paramref name="modelHint"/> (null: none), to be filled with SetDirection or Add.</summary>
        public static ControlVector Create(long nEmbd, string modelHint = null)
        {
            if (nEmbd < 0) throw new ArgumentOutOfRangeException("nEmbd");
            byte[] hint = Utf8.Encode(modelHint, "modelHint");
            ControlVectorHandle h;
            PeftException.Check(Native.peft_control_vector_new((ulong)nEmbd, hint, out h));
            return new ControlVector(h);
        }

        /// <summary>Values per direction (the model's hidden size).</summary>
        public long NEmbd { get { return (long)Native.peft_control_vector_n_embd(Handle); } }

        /// <summary>The model the vector was made for, as its file names it ("" when none).</summary>
        public string ModelHint { get { return Utf8.Decode(Native.peft_control_vector_model_hint(Handle)) ?? ""; } }

        /// <summary>How many layers have a direction.</summary>
        public int LayerCount { get { return checked((int)(ulong)Native.peft_control_vector_layer_count(Handle)); } }

        /// <summary>The layer of the <paramref name="index"/>-th direction, layers in ascending order.</summary>
        public long Layer(int index)
        {
            if (index < 0) throw new ArgumentOutOfRangeException("index");
            long layer = Native.peft_control_vector_layer(Handle, (UIntPtr)index);
            if (layer < 0) throw new ArgumentOutOfRangeException("index", "the vector has " + LayerCount + " directions");
            return layer;
        }

        /// <summary>The layers that have a direction, ascending.</summary>
        public long[] Layers()
        {
            ControlVectorHandle h = Handle;
            var layers = new long[checked((int)(ulong)Native.peft_control_vector_layer_count(h))];
            for (int i = 0; i < layers.Length; i++) layers[i] = Native.peft_control_vector_layer(h, (UIntPtr)i);
            return layers;
        }

        /// <summary>A copy of one layer's direction, or null for a layer without one.</summary>
        public float[] Direction(long layer)
        {
            ControlVectorHandle h = Handle;
            IntPtr d = Native.peft_control_vector_direction(h, layer);
            if (d == IntPtr.Zero) return null;
            var values = new float[checked((int)Native.peft_control_vector_n_embd(h))];
            Marshal.Copy(d, values, 0, values.Length);
            GC.KeepAlive(h);
            return values;
        }

        /// <summary>Sets one layer's direction (layer &gt;= 0) from the raw little-endian bytes of NEmbd elements of
        /// <paramref name="dtype"/> (F32, BF16, F16 or F64), replacing what the layer had. On failure the vector is
        /// unchanged (NonFinite for an infinite or NaN value).</summary>
        public unsafe void SetDirection(long layer, ReadOnlySpan<byte> data, DType dtype)
        {
            if (dtype != DType.F32 && dtype != DType.BF16 && dtype != DType.F16 && dtype != DType.F64)
                throw new PeftException(ErrorCode.InvalidArgument, "a direction is F32, BF16, F16 or F64 values, not " + Peft.DTypeName(dtype));
            ControlVectorHandle h = Handle;
            long need = Peft.ByteSize(dtype, (long)Native.peft_control_vector_n_embd(h));
            if (data.Length != need)
                throw new ArgumentException("a direction is " + need + " bytes of " + Peft.DTypeName(dtype) + "; " + data.Length + " given", "data");
            fixed (byte* p = &MemoryMarshal.GetReference(data))
            {
                PeftException.Check(Native.peft_control_vector_set_direction(h, layer, (int)dtype, p));
            }
        }

        /// <summary>Sets one layer's direction from NEmbd float values.</summary>
        public void SetDirection(long layer, ReadOnlySpan<float> values)
        {
            SetDirection(layer, MemoryMarshal.AsBytes(values), DType.F32);
        }

        /// <summary>Sets one layer's direction from NEmbd float values.</summary>
        public void SetDirection(long layer, float[] values)
        {
            if (values == null) throw new ArgumentNullException("values");
            SetDirection(layer, new ReadOnlySpan<float>(values));
        }

        /// <summary>Adds <paramref name="strength"/> x <paramref name="src"/> to this vector, layer by layer (a layer
        /// it lacks starts at zero), with llama.cpp's arithmetic: src * (float)strength in float, then added in float.
        /// <paramref name="src"/> may be this vector. On failure this vector is unchanged (ShapeMismatch when the
        /// NEmbd differ, NonFinite when a sum overflows).</summary>
        public void Add(ControlVector src, double strength = 1.0)
        {
            if (src == null) throw new ArgumentNullException("src");
            PeftException.Check(Native.peft_control_vector_add(Handle, src.Handle, strength));
        }

        /// <summary>Writes the vector to <paramref name="path"/>, atomically: GGUF in llama.cpp's layout, or
        /// safetensors direction.N float tensors.</summary>
        /// <exception cref="PeftException">InvalidArgument for a vector without directions or (GGUF) a direction for
        /// layer 0, which llama.cpp refuses; Io when the file cannot be written.</exception>
        public void Save(string path, FileFormat format)
        {
            byte[] p = Utf8.Required(path, "path");
            PeftException.Check(Native.peft_control_vector_save(Handle, p, (int)format));
        }

        /// <summary>
        /// Adds layer <paramref name="layer"/>'s direction x <paramref name="strength"/> to every row of
        /// <paramref name="data"/> (a whole number of rows of NEmbd <paramref name="dtype"/> elements: F32, BF16 or
        /// F16), in place: y = round(x + d * (float)strength), the product and the sum in float as llama.cpp computes
        /// them. A layer without a direction leaves the buffer as it is. Returns the record that takes the direction
        /// out again exactly (it keeps twice the buffer's bytes), or null when <paramref name="record"/> is false.
        /// On failure the buffer is unchanged (NonFinite when a finite element would become infinite or NaN).
        /// </summary>
        public unsafe ControlRecord Apply(long layer, double strength, Span<byte> data, DType dtype, bool record = true)
        {
            if (dtype != DType.F32 && dtype != DType.BF16 && dtype != DType.F16)
                throw new PeftException(ErrorCode.Unsupported, "control vectors apply to F32, BF16 and F16, not " + Peft.DTypeName(dtype));
            ControlVectorHandle h = Handle;
            long rowBytes = Peft.ByteSize(dtype, (long)Native.peft_control_vector_n_embd(h));
            if (data.Length == 0 || rowBytes == 0 || data.Length % rowBytes != 0)
                throw new ArgumentException("data has " + data.Length + " bytes, not a whole nonzero number of rows of " +
                                            rowBytes, "data");
            ControlRecordHandle rec = null;
            fixed (byte* d = &MemoryMarshal.GetReference(data))
            {
                if (record)
                    PeftException.Check(Native.peft_control_vector_apply(h, layer, strength, d, (int)dtype,
                                                                         (ulong)(data.Length / rowBytes), out rec));
                else
                    PeftException.Check(Native.peft_control_vector_apply(h, layer, strength, d, (int)dtype,
                                                                         (ulong)(data.Length / rowBytes), IntPtr.Zero));
            }
            return record ? new ControlRecord(rec, dtype, data.Length) : null;
        }

        /// <summary>Apply to a float buffer.</summary>
        public ControlRecord Apply(long layer, double strength, Span<float> data, bool record = true)
        {
            return Apply(layer, strength, MemoryMarshal.AsBytes(data), DType.F32, record);
        }

        /// <summary>Apply to a float array.</summary>
        public ControlRecord Apply(long layer, double strength, float[] data, bool record = true)
        {
            if (data == null) throw new ArgumentNullException("data");
            return Apply(layer, strength, new Span<float>(data), record);
        }
    }

    /// <summary>A direction added to a buffer by ControlVector.Apply, and what taking it out exactly needs. Disposing
    /// it leaves the buffer as it is. One thread at a time.</summary>
    public sealed class ControlRecord : NativeObject
    {
        private readonly DType dtype_;
        private readonly int bytes_;

        internal ControlRecord(ControlRecordHandle h, DType dtype, int bytes) : base(h)
        {
            dtype_ = dtype;
            bytes_ = bytes;
        }

        private ControlRecordHandle Handle { get { return Live<ControlRecordHandle>(); } }

        /// <summary>Puts back the bytes the buffer held before the apply, after checking that it still holds what the
        /// apply wrote (it may have moved; with several applies, remove them in reverse order). On failure nothing is
        /// changed (InvalidArgument for a changed buffer or a spent record); on success the record is spent.</summary>
        public unsafe void Remove(Span<byte> data, DType dtype)
        {
            if (dtype != dtype_ || data.Length != bytes_)
                throw new ArgumentException("data is " + data.Length + " bytes of " + Peft.DTypeName(dtype) + "; the apply was to " +
                                            bytes_ + " bytes of " + Peft.DTypeName(dtype_), "data");
            fixed (byte* d = &MemoryMarshal.GetReference(data))
            {
                PeftException.Check(Native.peft_control_record_remove(Handle, d));
            }
        }

        /// <summary>Remove from a float buffer.</summary>
        public void Remove(Span<float> data) { Remove(MemoryMarshal.AsBytes(data), DType.F32); }

        /// <summary>Remove from a float array.</summary>
        public void Remove(float[] data)
        {
            if (data == null) throw new ArgumentNullException("data");
            Remove(new Span<float>(data));
        }
    }
}
