// Writing: a streaming, atomic writer of one safetensors file or of a sharded checkpoint folder, whose
// output is byte-identical to the reference's save_file / save_pretrained.
using System;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>Fills <paramref name="destination"/> with the tensor's bytes starting at <paramref name="offset"/>
    /// (in the source dtype). Return false to cancel the write.</summary>
    public delegate bool TensorSource(long offset, Span<byte> destination);

    /// <summary>
    /// Writes one <c>.safetensors</c> file (<see cref="Create"/>) or a checkpoint folder
    /// (<see cref="CreateCheckpoint"/>) in three phases: declare every tensor (and metadata), write each
    /// tensor in the order <see cref="TensorName"/> gives after <see cref="Start"/>, then <see cref="Finish"/>.
    /// Nothing appears at the target before Finish succeeds; disposing an unfinished writer discards its
    /// output. A writer belongs to one thread at a time.
    /// </summary>
    public sealed class Writer : NativeObject
    {
        private Writer(WriterHandle h) : base(h) { }

        private WriterHandle Handle { get { return Live<WriterHandle>(); } }

        /// <summary>A writer of one file (its folder must exist when writing starts). No metadata entry at first.</summary>
        public static Writer Create(string path)
        {
            WriterHandle h;
            PeftException.Check(Native.peft_writer_new(Utf8.Required(path, "path"), out h));
            return new Writer(h);
        }

        /// <summary>A writer of a checkpoint folder as transformers' save_pretrained lays it out (shards of at most
        /// <paramref name="maxShardSize"/> bytes of tensor data, 0 for one file; metadata {"format":"pt"}).</summary>
        public static Writer CreateCheckpoint(string folder, long maxShardSize = 0)
        {
            if (maxShardSize < 0) throw new ArgumentOutOfRangeException("maxShardSize");
            WriterHandle h;
            PeftException.Check(Native.peft_writer_new_checkpoint(Utf8.Required(folder, "folder"), (ulong)maxShardSize, out h));
            return new Writer(h);
        }

        /// <summary>Declares a tensor. Its name may hold any character, NUL included.</summary>
        public void AddTensor(string name, DType dtype, params long[] shape)
        {
            if (name == null) throw new ArgumentNullException("name");
            if (shape == null) throw new ArgumentNullException("shape");
            var dims = new ulong[shape.Length];
            for (int i = 0; i < shape.Length; i++)
            {
                if (shape[i] < 0) throw new ArgumentOutOfRangeException("shape", "dimension " + i + " is negative");
                dims[i] = (ulong)shape[i];
            }
            byte[] bytes = Utf8.Bytes(name, "name");
            PeftException.Check(Native.peft_writer_add_tensor_n(Handle, Utf8.Terminated(bytes), (UIntPtr)bytes.Length, (int)dtype,
                                                                dims, (UIntPtr)dims.Length));
        }

        /// <summary>Whether the file has a <c>__metadata__</c> entry (false also removes the keys set so far).</summary>
        public void SetMetadataPresent(bool present)
        {
            PeftException.Check(Native.peft_writer_set_metadata_present(Handle, present ? 1 : 0));
        }

        /// <summary>Sets a metadata entry (makes the metadata present).</summary>
        public void SetMetadata(string key, string value)
        {
            PeftException.Check(Native.peft_writer_set_metadata(Handle, Utf8.Required(key, "key"), Utf8.Required(value, "value")));
        }

        /// <summary>Checkpoint writers: the next declared tensor starts a new shard.</summary>
        public void BreakShard()
        {
            PeftException.Check(Native.peft_writer_break_shard(Handle));
        }

        /// <summary>Checkpoint writers: extra entries of the index's "metadata" object (a JSON object).</summary>
        public void SetIndexMetadataJson(string jsonObject)
        {
            PeftException.Check(Native.peft_writer_set_index_metadata_json(Handle, Utf8.Required(jsonObject, "jsonObject")));
        }

        /// <summary>Ends the declarations and computes every header (the first write does it otherwise).</summary>
        public void Start()
        {
            PeftException.Check(Native.peft_writer_start(Handle));
        }

        /// <summary>Number of declared tensors.</summary>
        public int TensorCount { get { return Checkpoint.ToInt(Native.peft_writer_tensor_count(Handle)); } }

        /// <summary>Name of the tensor to write at <paramref name="position"/> (after Start).</summary>
        public string TensorName(int position)
        {
            WriterHandle h = Handle;
            CheckPosition(position);
            IntPtr p = Native.peft_writer_tensor_name(h, (UIntPtr)position);
            if (p == IntPtr.Zero) throw new InvalidOperationException("the writer has not started");
            return Utf8.Decode(p, Native.peft_writer_tensor_name_length(h, (UIntPtr)position));
        }

        /// <summary>The names in the order they must be written (starts the writer if needed).</summary>
        public string[] WriteOrder()
        {
            Start();
            var names = new string[TensorCount];
            for (int i = 0; i < names.Length; i++) names[i] = TensorName(i);
            return names;
        }

        /// <summary>Declaration index (AddTensor order) of the tensor at <paramref name="position"/> (after Start).</summary>
        public int TensorDeclaration(int position)
        {
            CheckPosition(position);
            ulong d = Native.peft_writer_tensor_declaration(Handle, (UIntPtr)position).ToUInt64();
            if (d == (UIntPtr.Size == 8 ? ulong.MaxValue : uint.MaxValue)) throw new InvalidOperationException("the writer has not started");
            return checked((int)d);
        }

        /// <summary>Number of files written (after Start; the index file is not counted).</summary>
        public int FileCount { get { return Checkpoint.ToInt(Native.peft_writer_file_count(Handle)); } }

        /// <summary>Path of output file <paramref name="file"/> (after Start).</summary>
        public string FilePath(int file)
        {
            if (file < 0 || file >= FileCount) throw new ArgumentOutOfRangeException("file", file, "no such file (or not started)");
            return Utf8.Decode(Native.peft_writer_file_path(Handle, (UIntPtr)file));
        }

        /// <summary>Begins the next tensor (<paramref name="name"/> must be it; null means whichever it is);
        /// its bytes in <paramref name="srcDtype"/> then come through <see cref="Write"/>.</summary>
        public void BeginTensor(string name, DType srcDtype)
        {
            PeftException.Check(Native.peft_writer_begin_tensor(Handle, Utf8.Encode(name, "name"), (int)srcDtype));
        }

        /// <summary>Appends bytes of the tensor begun with BeginTensor.</summary>
        public unsafe void Write(ReadOnlySpan<byte> data)
        {
            fixed (byte* p = &MemoryMarshal.GetReference(data))
            {
                PeftException.Check(Native.peft_writer_write(Handle, p, (ulong)data.Length));
            }
        }

        /// <summary>Writes the next tensor whole (<paramref name="name"/> must be it; null means whichever it is)
        /// from bytes of <paramref name="srcDtype"/>, converting to the declared dtype if they differ.</summary>
        public unsafe void WriteTensor(string name, DType srcDtype, ReadOnlySpan<byte> data)
        {
            byte[] n = Utf8.Encode(name, "name");
            fixed (byte* p = &MemoryMarshal.GetReference(data))
            {
                PeftException.Check(Native.peft_writer_write_tensor(Handle, n, (int)srcDtype, p, (ulong)data.Length));
            }
        }

        /// <summary>Writes the next tensor whole from floats (converted to the declared dtype).</summary>
        public void WriteTensor(string name, ReadOnlySpan<float> data)
        {
            WriteTensor(name, DType.F32, MemoryMarshal.AsBytes(data));
        }

        /// <summary>Writes the next tensor whole from a callback that fills chunks of at most 4 MiB. A callback
        /// returning false cancels (PeftException Cancelled); one that throws cancels too, and its exception
        /// becomes the PeftException's InnerException. Either way the output is discarded.</summary>
        public void WriteFromCallback(string name, DType srcDtype, TensorSource source)
        {
            if (source == null) throw new ArgumentNullException("source");
            byte[] n = Utf8.Encode(name, "name");
            Exception thrown = null;
            NativeTensorSource trampoline = (user, offset, dst, nbytes) =>
            {
                try
                {
                    Span<byte> chunk;
                    unsafe { chunk = new Span<byte>((void*)dst, checked((int)nbytes)); }
                    return source(checked((long)offset), chunk) ? 0 : 1;
                }
                catch (Exception e)
                {
                    thrown = e;
                    return 1;
                }
            };
            ErrorHandle err = Native.peft_writer_write_from_callback(Handle, n, (int)srcDtype, trampoline, IntPtr.Zero);
            GC.KeepAlive(trampoline);  // C held a pointer to it until the call returned
            PeftException.Check(err, thrown);
        }

        /// <summary>Writes the next tensor from tensor <paramref name="index"/> of an opened checkpoint
        /// (streamed, converted if the declared dtype differs).</summary>
        public void WriteFromCheckpoint(string name, Checkpoint source, int index)
        {
            if (source == null) throw new ArgumentNullException("source");
            if (index < 0) throw new ArgumentOutOfRangeException("index");
            PeftException.Check(Native.peft_writer_write_from_checkpoint(Handle, Utf8.Encode(name, "name"), source.Handle, (UIntPtr)index));
        }

        /// <summary>Completes the output: flushes and renames every file into place.</summary>
        public void Finish()
        {
            PeftException.Check(Native.peft_writer_finish(Handle));
        }

        private void CheckPosition(int position)
        {
            if (position < 0 || position >= TensorCount) throw new ArgumentOutOfRangeException("position", position, "no such tensor");
        }
    }
}
