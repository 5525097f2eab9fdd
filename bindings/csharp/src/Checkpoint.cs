// Reading: an opened, validated checkpoint (one .safetensors or GGUF file or a folder of shards), tensors viewed
// without copying or read with conversion.
using System;
using System.Buffers;
using System.Collections.Generic;
using System.IO;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>How to open a checkpoint. Null means the defaults (mmap, header cap 100,000,000 bytes).</summary>
    public sealed class OpenOptions
    {
        /// <summary>Read with pread instead of mapping the files (tensors are read when first viewed).</summary>
        public bool UsePread { get; set; }

        /// <summary>The largest header accepted, in bytes; null for the default (100,000,000, as the reference).</summary>
        public long? MaxHeaderSize { get; set; }

        internal OpenOptionsHandle Create()
        {
            OpenOptionsHandle h;
            PeftException.Check(Native.peft_open_options_new(out h));
            try
            {
                if (MaxHeaderSize.HasValue)
                {
                    if (MaxHeaderSize.Value < 0) throw new ArgumentOutOfRangeException("MaxHeaderSize");
                    PeftException.Check(Native.peft_open_options_set_max_header_size(h, (ulong)MaxHeaderSize.Value));
                }
                PeftException.Check(Native.peft_open_options_set_use_pread(h, UsePread ? 1 : 0));
                return h;
            }
            catch
            {
                h.Dispose();
                throw;
            }
        }
    }

    /// <summary>What the header says about one tensor.</summary>
    public sealed class TensorInfo
    {
        public int Index { get; internal set; }
        public string Name { get; internal set; }
        /// <summary>The dtype; null for a block-quantized GGUF tensor (Q8_0, Q4_K, ...), which has none (see GgmlType).</summary>
        public DType? DType { get; internal set; }
        public long[] Shape { get; internal set; }
        /// <summary>Begin of the tensor's bytes in its file's data section (data_offsets[0]).</summary>
        public long DataBegin { get; internal set; }
        /// <summary>End (exclusive) of the tensor's bytes in its file's data section (data_offsets[1]).</summary>
        public long DataEnd { get; internal set; }
        /// <summary>Which file of the checkpoint holds the tensor.</summary>
        public int File { get; internal set; }
        /// <summary>The ggml type as its GGUF file stores the tensor (<see cref="Ggml.TypeName"/>); null in a safetensors file.</summary>
        public int? GgmlType { get; internal set; }
        public long ByteLength { get { return DataEnd - DataBegin; } }

        public long ElementCount
        {
            get
            {
                long n = 1;
                foreach (long d in Shape) n = checked(n * d);
                return n;
            }
        }

        public override string ToString()
        {
            string type = DType.HasValue ? Peft.DTypeName(DType.Value) : GgmlType.HasValue ? Ggml.TypeName(GgmlType.Value) : "?";
            return Name + " " + type + "[" + string.Join(", ", Shape) + "]";
        }
    }

    /// <summary>
    /// An opened checkpoint: one <c>.safetensors</c> or GGUF file, or a folder with <c>model.safetensors</c> or a
    /// sharded index. Every header is validated completely on opening. Read-only afterwards: every member may
    /// be used from many threads at once. Dispose it to unmap the files (the finalizer does it otherwise).
    /// </summary>
    public sealed partial class Checkpoint : NativeObject
    {
        private Checkpoint(CheckpointHandle h) : base(h) { }

        internal CheckpointHandle Handle { get { return Live<CheckpointHandle>(); } }

        /// <summary>Opens and validates a file or a checkpoint folder.</summary>
        /// <exception cref="PeftException">Format codes for a damaged file, Io, InvalidCheckpoint, ...</exception>
        public static Checkpoint Open(string path, OpenOptions options = null)
        {
            byte[] p = Utf8.Required(path, "path");
            using (OpenOptionsHandle o = options == null ? null : options.Create())
            {
                CheckpointHandle h;
                PeftException.Check(Native.peft_checkpoint_open(p, o ?? PeftHandle.Null<OpenOptionsHandle>(), out h));
                return new Checkpoint(h);
            }
        }

        /// <summary>Validates a safetensors or GGUF file held in memory (the bytes are copied) and opens it.</summary>
        public static unsafe Checkpoint FromBytes(ReadOnlySpan<byte> data, OpenOptions options = null)
        {
            using (OpenOptionsHandle o = options == null ? null : options.Create())
            fixed (byte* p = &MemoryMarshal.GetReference(data))
            {
                CheckpointHandle h;
                PeftException.Check(Native.peft_checkpoint_open_memory(p, (UIntPtr)(ulong)data.Length,
                                                                       o ?? PeftHandle.Null<OpenOptionsHandle>(), out h));
                return new Checkpoint(h);
            }
        }

        /// <summary>Number of files (1 for a single file, else the shards).</summary>
        public int FileCount { get { return ToInt(Native.peft_checkpoint_file_count(Handle)); } }

        /// <summary>Path of a file as opened.</summary>
        public string FilePath(int file)
        {
            CheckFile(file);
            return Utf8.Decode(Native.peft_checkpoint_file_path(Handle, (UIntPtr)file));
        }

        /// <summary>Whether the file has a <c>__metadata__</c> entry (which may be empty).</summary>
        public bool HasMetadata(int file = 0)
        {
            CheckFile(file);
            return Native.peft_checkpoint_has_metadata(Handle, (UIntPtr)file) != 0;
        }

        /// <summary>The file's <c>__metadata__</c> entries sorted by key bytes; null when it has none.</summary>
        public KeyValuePair<string, string>[] Metadata(int file = 0)
        {
            if (!HasMetadata(file)) return null;
            CheckpointHandle h = Handle;
            int count = ToInt(Native.peft_checkpoint_metadata_count(h, (UIntPtr)file));
            var result = new KeyValuePair<string, string>[count];
            for (int i = 0; i < count; i++)
                result[i] = new KeyValuePair<string, string>(Utf8.Decode(Native.peft_checkpoint_metadata_key(h, (UIntPtr)file, (UIntPtr)i)),
                                                             Utf8.Decode(Native.peft_checkpoint_metadata_value(h, (UIntPtr)file, (UIntPtr)i)));
            return result;
        }

        /// <summary>The <c>"metadata"</c> object of the folder's index as compact JSON; null without one.</summary>
        public string IndexMetadataJson { get { return Utf8.Decode(Native.peft_checkpoint_index_metadata_json(Handle)); } }

        /// <summary>Number of tensors.</summary>
        public int TensorCount { get { return ToInt(Native.peft_checkpoint_tensor_count(Handle)); } }

        /// <summary>Index of the tensor called <paramref name="name"/> (which may hold NUL characters).</summary>
        /// <exception cref="PeftException">NotFound when there is no such tensor.</exception>
        public int Find(string name)
        {
            if (name == null) throw new ArgumentNullException("name");
            byte[] bytes = Utf8.Bytes(name, "name");
            UIntPtr index;
            // A terminator keeps the pointer valid for an empty name.
            PeftException.Check(Native.peft_checkpoint_find_n(Handle, Utf8.Terminated(bytes), (UIntPtr)bytes.Length, out index));
            return ToInt(index);
        }

        /// <summary>As Find, but false when there is no such tensor.</summary>
        public bool TryFind(string name, out int index)
        {
            index = -1;
            if (name == null) return false;
            try
            {
                index = Find(name);
                return true;
            }
            catch (PeftException e)
            {
                if (e.Code == ErrorCode.NotFound) return false;
                throw;
            }
        }

        /// <summary>Whether there is a tensor of that name.</summary>
        public bool Contains(string name)
        {
            int index;
            return TryFind(name, out index);
        }

        /// <summary>Name of tensor <paramref name="index"/> (tensors are numbered file by file, in data order).</summary>
        public string TensorName(int index)
        {
            CheckTensor(index);
            CheckpointHandle h = Handle;
            return Utf8.Decode(Native.peft_checkpoint_tensor_name(h, (UIntPtr)index),
                               Native.peft_checkpoint_tensor_name_length(h, (UIntPtr)index));
        }

        /// <summary>Every tensor name, in index order.</summary>
        public string[] TensorNames()
        {
            var names = new string[TensorCount];
            for (int i = 0; i < names.Length; i++) names[i] = TensorName(i);
            return names;
        }

        /// <summary>Everything the header says about tensor <paramref name="index"/>.</summary>
        public unsafe TensorInfo Info(int index)
        {
            CheckTensor(index);
            CheckpointHandle h = Handle;
            var i = (UIntPtr)index;
            ulong begin, end;
            PeftException.Check(Native.peft_checkpoint_tensor_offsets(h, i, out begin, out end));
            int dtype = Native.peft_checkpoint_tensor_dtype(h, i), ggmlType = Native.peft_checkpoint_tensor_ggml_type(h, i);
            return new TensorInfo
            {
                Index = index,
                Name = TensorName(index),
                DType = dtype < 0 ? (DType?)null : (DType)dtype,
                GgmlType = ggmlType < 0 ? (int?)null : ggmlType,
                Shape = Shape(Native.peft_checkpoint_tensor_shape(h, i), Native.peft_checkpoint_tensor_ndim(h, i)),
                DataBegin = checked((long)begin),
                DataEnd = checked((long)end),
                File = ToInt(Native.peft_checkpoint_tensor_file(h, i)),
            };
        }

        /// <summary>Everything the header says about the tensor called <paramref name="name"/>.</summary>
        public TensorInfo Info(string name)
        {
            return Info(Find(name));
        }

        /// <summary>Every tensor's description, in index order.</summary>
        public TensorInfo[] Tensors()
        {
            var result = new TensorInfo[TensorCount];
            for (int i = 0; i < result.Length; i++) result[i] = Info(i);
            return result;
        }

        /// <summary>
        /// The tensor's bytes (little-endian, row-major) in the mapped file, without a copy. The span is valid
        /// until this checkpoint is disposed: do not keep it beyond that (use <see cref="ViewMemory"/> or
        /// <see cref="ViewStream"/> for a view that keeps the checkpoint's mapping alive by itself). Its
        /// alignment is the file's: check it before reinterpreting with MemoryMarshal.Cast.
        /// </summary>
        /// <exception cref="NotSupportedException">For a tensor of 2 GiB or more (a span's limit): use ViewStream.</exception>
        public unsafe ReadOnlySpan<byte> View(int index)
        {
            IntPtr data;
            long length = RawView(index, out data);
            if (length > int.MaxValue)
                throw new NotSupportedException("tensor " + index + " has " + length + " bytes, more than a span holds; use ViewStream");
            return new ReadOnlySpan<byte>((void*)data, (int)length);
        }

        /// <summary>The tensor's bytes as <see cref="ReadOnlyMemory{T}"/> without a copy. The returned owner
        /// holds a reference to the checkpoint's files, so the memory stays valid until the owner is disposed,
        /// even after this checkpoint is.</summary>
        public TensorMemory ViewMemory(int index)
        {
            IntPtr data;
            long length = RawView(index, out data);
            if (length > int.MaxValue)
                throw new NotSupportedException("tensor " + index + " has " + length + " bytes, more than Memory holds; use ViewStream");
            return new TensorMemory(Handle, data, (int)length);
        }

        /// <summary>The tensor's bytes as a read-only stream over the mapping, without a copy (any size). The
        /// stream keeps the checkpoint's files alive until it is disposed.</summary>
        public unsafe Stream ViewStream(int index)
        {
            IntPtr data;
            long length = RawView(index, out data);
            return new TensorStream(Handle, (byte*)data, length);
        }

        /// <summary>Reads tensor <paramref name="index"/> into <paramref name="destination"/>, converting to
        /// <paramref name="dtype"/>. The destination must hold exactly elements x size of the dtype.</summary>
        public unsafe void Read(int index, DType dtype, Span<byte> destination)
        {
            CheckTensor(index);
            fixed (byte* d = &MemoryMarshal.GetReference(destination))
            {
                PeftException.Check(Native.peft_checkpoint_tensor_read(Handle, (UIntPtr)index, (int)dtype, d, (ulong)destination.Length));
            }
        }

        /// <summary>Reads tensor <paramref name="index"/> converted to <paramref name="dtype"/> into a new array.</summary>
        public byte[] ReadBytes(int index, DType dtype)
        {
            var result = new byte[checked((int)Peft.ByteSize(dtype, Info(index).ElementCount))];
            Read(index, dtype, result);
            return result;
        }

        /// <summary>Reads tensor <paramref name="index"/> as float (any float, integer or bool source).</summary>
        public float[] ReadSingle(int index)
        {
            var result = new float[checked((int)Info(index).ElementCount)];
            Read(index, DType.F32, MemoryMarshal.AsBytes(result.AsSpan()));
            return result;
        }

        /// <summary>Reads the tensor called <paramref name="name"/> as float.</summary>
        public float[] ReadSingle(string name)
        {
            return ReadSingle(Find(name));
        }

        /// <summary>Reads tensor <paramref name="index"/> as double.</summary>
        public double[] ReadDouble(int index)
        {
            var result = new double[checked((int)Info(index).ElementCount)];
            Read(index, DType.F64, MemoryMarshal.AsBytes(result.AsSpan()));
            return result;
        }

        private long RawView(int index, out IntPtr data)
        {
            CheckTensor(index);
            ulong nbytes;
            PeftException.Check(Native.peft_checkpoint_tensor_view(Handle, (UIntPtr)index, out data, out nbytes));
            return checked((long)nbytes);
        }

        private void CheckTensor(int index)
        {
            if (index < 0 || index >= TensorCount) throw new ArgumentOutOfRangeException("index", index, "no such tensor");
        }

        private void CheckFile(int file)
        {
            if (file < 0 || file >= FileCount) throw new ArgumentOutOfRangeException("file", file, "no such file");
        }

        internal static int ToInt(UIntPtr value)
        {
            return checked((int)value.ToUInt64());
        }

        internal static unsafe long[] Shape(ulong* dims, UIntPtr ndim)
        {
            var shape = new long[ToInt(ndim)];
            for (int i = 0; i < shape.Length; i++) shape[i] = checked((long)dims[i]);
            return shape;
        }
    }

    /// <summary>A tensor's bytes in a checkpoint's mapping as <see cref="ReadOnlyMemory{T}"/>; holds the checkpoint's files
    /// open until disposed (or finalized).</summary>
    public sealed unsafe class TensorMemory : MemoryManager<byte>
    {
        private readonly CheckpointHandle owner_;
        private byte* data_;
        private readonly int length_;
        private bool released_;

        internal TensorMemory(CheckpointHandle owner, IntPtr data, int length)
        {
            bool added = false;
            owner.DangerousAddRef(ref added);
            owner_ = owner;
            data_ = (byte*)data;
            length_ = length;
        }

        /// <summary>The bytes, read-only (they are the file's; do not write through <see cref="MemoryManager{T}.Memory"/>).</summary>
        public ReadOnlyMemory<byte> ReadOnlyMemory { get { return Memory; } }

        /// <summary>The bytes as a span (valid until this object is disposed).</summary>
        public ReadOnlySpan<byte> Span { get { return GetSpan(); } }

        public override Span<byte> GetSpan()
        {
            if (released_) throw new ObjectDisposedException("TensorMemory");
            return new Span<byte>(data_, length_);
        }

        public override MemoryHandle Pin(int elementIndex = 0)
        {
            if (released_) throw new ObjectDisposedException("TensorMemory");
            if (elementIndex < 0 || elementIndex > length_) throw new ArgumentOutOfRangeException("elementIndex");
            return new MemoryHandle(data_ + elementIndex);
        }

        public override void Unpin() { }

        protected override void Dispose(bool disposing)
        {
            if (released_) return;
            released_ = true;
            data_ = null;
            owner_.DangerousRelease();
        }

        ~TensorMemory()
        {
            Dispose(false);
        }
    }

    /// <summary>A read-only stream over a tensor's bytes in a checkpoint's mapping; holds the files open.</summary>
    internal sealed unsafe class TensorStream : UnmanagedMemoryStream
    {
        private CheckpointHandle owner_;

        internal TensorStream(CheckpointHandle owner, byte* data, long length)
        {
            bool added = false;
            owner.DangerousAddRef(ref added);
            owner_ = owner;
            Initialize(data, length, length, FileAccess.Read);
        }

        protected override void Dispose(bool disposing)
        {
            try
            {
                base.Dispose(disposing);
            }
            finally
            {
                CheckpointHandle o = owner_;
                owner_ = null;
                if (o != null) o.DangerousRelease();
            }
        }

        ~TensorStream()
        {
            Dispose(false);
        }
    }
}
