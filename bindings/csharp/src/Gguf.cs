// GGUF files: the formats of a checkpoint's files, GGUF metadata as typed values, and ggml tensor types.
using System;
using System.Collections.Generic;
using System.Collections.ObjectModel;
using System.Globalization;

namespace PeftC
{
    /// <summary>The format of one file of a checkpoint (the PEFT_FORMAT_* values).</summary>
    public enum FileFormat
    {
        Safetensors = 0,
        Gguf = 1,
    }

    /// <summary>The type of a GGUF metadata value (the PEFT_GGUF_* values, gguf.h's numbering).</summary>
    public enum GgufType
    {
        U8 = 0,
        I8 = 1,
        U16 = 2,
        I16 = 3,
        U32 = 4,
        I32 = 5,
        F32 = 6,
        Bool = 7,
        String = 8,
        Array = 9,
        U64 = 10,
        I64 = 11,
        F64 = 12,
    }

    /// <summary>
    /// One GGUF metadata value, copied out of the checkpoint. <see cref="Value"/> holds it in the CLR type of its
    /// GGUF type (byte, sbyte, ushort, short, uint, int, ulong, long, float, double, bool, string); an array has
    /// <see cref="Items"/> of <see cref="ElementType"/> instead. The As* accessors convert between integer widths
    /// and throw InvalidCastException for a value of another kind or out of range.
    /// </summary>
    public sealed class GgufValue
    {
        internal GgufValue(GgufType type, object value)
        {
            Type = type;
            Value = value;
        }

        internal GgufValue(GgufType elementType, IList<GgufValue> items)
        {
            Type = GgufType.Array;
            ElementType = elementType;
            Items = new ReadOnlyCollection<GgufValue>(items);
        }

        /// <summary>The type the file stores the value in.</summary>
        public GgufType Type { get; private set; }

        /// <summary>The elements' type of an array; null for a scalar.</summary>
        public GgufType? ElementType { get; private set; }

        /// <summary>A scalar's value in its CLR type; null for an array.</summary>
        public object Value { get; private set; }

        /// <summary>An array's elements; null for a scalar.</summary>
        public IReadOnlyList<GgufValue> Items { get; private set; }

        private bool IsInteger
        {
            get { return Type <= GgufType.I32 || Type == GgufType.U64 || Type == GgufType.I64; }
        }

        /// <summary>An integer value of any width that fits long.</summary>
        public long AsInt64()
        {
            if (!IsInteger) throw WrongKind("an integer");
            if (Value is ulong && (ulong)Value > long.MaxValue) throw new InvalidCastException("the U64 value " + Value + " does not fit long");
            return Convert.ToInt64(Value, CultureInfo.InvariantCulture);
        }

        /// <summary>An integer value of any width that is not negative.</summary>
        public ulong AsUInt64()
        {
            if (!IsInteger) throw WrongKind("an integer");
            if (!(Value is ulong) && Convert.ToInt64(Value, CultureInfo.InvariantCulture) < 0)
                throw new InvalidCastException("the " + Type + " value " + Value + " is negative");
            return Convert.ToUInt64(Value, CultureInfo.InvariantCulture);
        }

        /// <summary>An F32 (widened exactly) or F64 value.</summary>
        public double AsDouble()
        {
            if (Type == GgufType.F32) return (float)Value;
            if (Type == GgufType.F64) return (double)Value;
            throw WrongKind("a floating-point value");
        }

        /// <summary>A BOOL value.</summary>
        public bool AsBoolean()
        {
            if (Type != GgufType.Bool) throw WrongKind("a boolean");
            return (bool)Value;
        }

        /// <summary>A STRING value.</summary>
        public string AsString()
        {
            if (Type != GgufType.String) throw WrongKind("a string");
            return (string)Value;
        }

        private InvalidCastException WrongKind(string wanted)
        {
            return new InvalidCastException("a GGUF " + Type + " value is not " + wanted);
        }

        public override string ToString()
        {
            if (Items != null) return "[" + string.Join(", ", Items) + "]";
            return Convert.ToString(Value, CultureInfo.InvariantCulture);
        }
    }

    /// <summary>ggml tensor types (ggml's numbering: 0 F32, 1 F16, 8 Q8_0, 12 Q4_K, 30 BF16, ...), as GGUF files store tensors.</summary>
    public static class Ggml
    {
        /// <summary>F32, one of the types <see cref="Export.SaveGguf"/> writes factors in.</summary>
        public const int F32 = 0;
        /// <summary>F16.</summary>
        public const int F16 = 1;
        /// <summary>Q8_0 (blocks of 32 values).</summary>
        public const int Q8_0 = 8;
        /// <summary>BF16.</summary>
        public const int BF16 = 30;

        /// <summary>The name of a ggml type as gguf-py spells it ("Q4_K"); null for a number ggml does not define.</summary>
        public static string TypeName(int ggmlType)
        {
            return Utf8.Decode(Native.peft_ggml_type_name(ggmlType));
        }

        /// <summary>The ggml type of an exact name ("BF16", "Q8_0").</summary>
        /// <returns>False when ggml defines no type of that name.</returns>
        public static bool TryParseType(string name, out int ggmlType)
        {
            ggmlType = -1;
            if (name == null || name.IndexOf('\0') >= 0) return false;
            ggmlType = Native.peft_ggml_type_from_name(Utf8.Encode(name, "name"));
            return ggmlType >= 0;
        }

        /// <summary>The ggml type of an exact name.</summary>
        /// <exception cref="ArgumentException">When ggml defines no type of that name.</exception>
        public static int ParseType(string name)
        {
            int ggmlType;
            if (!TryParseType(name, out ggmlType)) throw new ArgumentException("not a ggml type name: " + name, "name");
            return ggmlType;
        }

        /// <summary>How a ggml type stores a row: n elements (a multiple of the block size) take n / blockSize blocks
        /// of typeSize bytes (1 and 4 for F32, 32 and 34 for Q8_0).</summary>
        /// <exception cref="PeftException">InvalidArgument for a type ggml does not define.</exception>
        public static void Geometry(int ggmlType, out int blockSize, out int typeSize)
        {
            uint block, size;
            PeftException.Check(Native.peft_ggml_type_geometry(ggmlType, out block, out size));
            blockSize = checked((int)block);
            typeSize = checked((int)size);
        }
    }

    public sealed partial class Checkpoint
    {
        /// <summary>The format of a file of the checkpoint.</summary>
        public FileFormat FileFormat(int file = 0)
        {
            CheckFile(file);
            return (FileFormat)Native.peft_checkpoint_file_format(Handle, (UIntPtr)file);
        }

        /// <summary>The GGUF version (2 or 3) of a file; null for a safetensors file.</summary>
        public int? GgufVersion(int file = 0)
        {
            CheckFile(file);
            uint version = Native.peft_checkpoint_gguf_version(Handle, (UIntPtr)file);
            return version == 0 ? (int?)null : checked((int)version);
        }

        /// <summary>The metadata key/values of a GGUF file in file order; null for a safetensors file (whose metadata
        /// <see cref="Metadata"/> gives).</summary>
        public KeyValuePair<string, GgufValue>[] GgufMetadata(int file = 0)
        {
            if (FileFormat(file) != PeftC.FileFormat.Gguf) return null;
            CheckpointHandle h = Handle;
            var f = (UIntPtr)file;
            var result = new KeyValuePair<string, GgufValue>[ToInt(Native.peft_checkpoint_gguf_kv_count(h, f))];
            for (int i = 0; i < result.Length; i++)
                result[i] = new KeyValuePair<string, GgufValue>(Utf8.Decode(Native.peft_checkpoint_gguf_kv_key(h, f, (UIntPtr)i)),
                                                                ReadGgufValue(h, f, (UIntPtr)i));
            return result;
        }

        /// <summary>The GGUF metadata value of <paramref name="key"/>.</summary>
        /// <exception cref="PeftException">NotFound naming the key when the file has no such entry (also for a
        /// safetensors file).</exception>
        public GgufValue GetGgufValue(string key, int file = 0)
        {
            byte[] k = Utf8.Required(key, "key");
            CheckFile(file);
            CheckpointHandle h = Handle;
            UIntPtr kv;
            PeftException.Check(Native.peft_checkpoint_gguf_kv_find(h, (UIntPtr)file, k, out kv));
            return ReadGgufValue(h, (UIntPtr)file, kv);
        }

        private static GgufValue ReadGgufValue(CheckpointHandle h, UIntPtr file, UIntPtr kv)
        {
            var type = (GgufType)Native.peft_checkpoint_gguf_kv_type(h, file, kv);
            if (type != GgufType.Array) return new GgufValue(type, ReadGgufScalar(h, file, kv, 0, type));
            var elementType = (GgufType)Native.peft_checkpoint_gguf_kv_array_type(h, file, kv);
            var items = new GgufValue[checked((int)Native.peft_checkpoint_gguf_kv_array_length(h, file, kv))];
            for (int i = 0; i < items.Length; i++)
                items[i] = new GgufValue(elementType, ReadGgufScalar(h, file, kv, (ulong)i, elementType));
            return new GgufValue(elementType, items);
        }

        private static object ReadGgufScalar(CheckpointHandle h, UIntPtr file, UIntPtr kv, ulong element, GgufType type)
        {
            long i;
            ulong u;
            double d;
            // The library holds each value in its own type, so the narrowing casts are exact.
            switch (type)
            {
                case GgufType.U8:
                case GgufType.U16:
                case GgufType.U32:
                case GgufType.U64:
                    PeftException.Check(Native.peft_checkpoint_gguf_kv_uint(h, file, kv, element, out u));
                    if (type == GgufType.U8) return (byte)u;
                    if (type == GgufType.U16) return (ushort)u;
                    if (type == GgufType.U32) return (uint)u;
                    return u;
                case GgufType.I8:
                case GgufType.I16:
                case GgufType.I32:
                case GgufType.I64:
                case GgufType.Bool:
                    PeftException.Check(Native.peft_checkpoint_gguf_kv_int(h, file, kv, element, out i));
                    if (type == GgufType.I8) return (sbyte)i;
                    if (type == GgufType.I16) return (short)i;
                    if (type == GgufType.I32) return (int)i;
                    if (type == GgufType.Bool) return i != 0;
                    return i;
                case GgufType.F32:
                case GgufType.F64:
                    PeftException.Check(Native.peft_checkpoint_gguf_kv_float(h, file, kv, element, out d));
                    return type == GgufType.F32 ? (object)(float)d : d;
                case GgufType.String:
                    IntPtr data;
                    UIntPtr length;
                    PeftException.Check(Native.peft_checkpoint_gguf_kv_string(h, file, kv, element, out data, out length));
                    return length == UIntPtr.Zero ? "" : Utf8.Decode(data, length);
            }
            throw new PeftException(ErrorCode.Unsupported, "GGUF metadata " + Utf8.Decode(Native.peft_checkpoint_gguf_kv_key(h, file, kv)) +
                                                           ": values of type " + type + " cannot be read");
        }
    }
}
