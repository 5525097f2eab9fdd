// One SafeHandle subclass per C handle type. A SafeHandle releases its object exactly once (Dispose or
// the finalizer thread, which the C API allows: every free function may be called from any thread), and
// the marshaller keeps it alive and refuses it after disposal for the length of every call it is passed
// to. Children keep their parents alive in C (reference counting), so release order never matters.
using System;
using System.Buffers;
using System.Collections.Generic;
using System.Runtime.InteropServices;

namespace PeftC
{
    /// <summary>Base of the handle types: owns one C object; NULL is the invalid value.</summary>
    internal abstract class PeftHandle : SafeHandle
    {
        protected PeftHandle() : base(IntPtr.Zero, true) { }

        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        /// <summary>A handle holding NULL, for an optional argument left out (the marshaller passes NULL).</summary>
        internal static T Null<T>() where T : PeftHandle, new()
        {
            return NullCache<T>.Value;
        }

        private static class NullCache<T> where T : PeftHandle, new()
        {
            internal static readonly T Value = new T();
        }
    }

    internal sealed class ErrorHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_error_free(handle); return true; }
    }

    internal sealed class OpenOptionsHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_open_options_free(handle); return true; }
    }

    internal sealed class CheckpointHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_checkpoint_free(handle); return true; }
    }

    internal sealed class WriterHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_writer_free(handle); return true; }
    }

    internal sealed class AdapterOptionsHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_adapter_options_free(handle); return true; }
    }

    internal sealed class AdapterHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_adapter_free(handle); return true; }
    }

    internal sealed class TranslatorHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_translator_free(handle); return true; }
    }

    internal sealed class MergeOptionsHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_merge_options_free(handle); return true; }
    }

    internal sealed class MergeResultHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_merge_result_free(handle); return true; }
    }

    internal sealed class MergeBufferOptionsHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_merge_buffer_options_free(handle); return true; }
    }

    internal sealed class MergeRecordHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_merge_record_free(handle); return true; }
    }

    internal sealed class ControlVectorHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_control_vector_free(handle); return true; }
    }

    internal sealed class ControlRecordHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_control_record_free(handle); return true; }
    }

    internal sealed class ExportOptionsHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_export_options_free(handle); return true; }
    }

    internal sealed class RegistryHandle : PeftHandle
    {
        /// <summary>The pins of the base weights given to the registry (Registry.SetBaseWeight).</summary>
        internal readonly BaseWeightPins Pins = new BaseWeightPins();

        protected override bool ReleaseHandle()
        {
            Native.peft_registry_free(handle);
            Pins.ReleaseOwner();
            return true;
        }
    }

    internal sealed class LeaseHandle : PeftHandle
    {
        /// <summary>Its registry's base-weight pins (null until Registry.Acquire sets them).</summary>
        internal BaseWeightPins Pins;

        protected override bool ReleaseHandle()
        {
            Native.peft_lease_free(handle);
            if (Pins != null) Pins.ReleaseOwner();
            return true;
        }
    }

    /// <summary>The pins of the managed buffers given to Registry.SetBaseWeight: the library reads them at DoRA
    /// applies of the registry's leases, so they stay pinned until the registry and every lease of it are freed
    /// (owners counted: the registry, then one per lease).</summary>
    internal sealed class BaseWeightPins
    {
        private readonly List<MemoryHandle> pins_ = new List<MemoryHandle>();
        private int owners_ = 1;

        internal void Keep(MemoryHandle pin)
        {
            lock (pins_) pins_.Add(pin);
        }

        internal void AddOwner()
        {
            lock (pins_) owners_++;
        }

        internal void ReleaseOwner()
        {
            lock (pins_)
            {
                if (--owners_ > 0) return;
                foreach (MemoryHandle pin in pins_) pin.Dispose();
                pins_.Clear();
            }
        }
    }

    internal sealed class LowrankOptionsHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_lowrank_options_free(handle); return true; }
    }

    internal sealed class LowrankReportHandle : PeftHandle
    {
        protected override bool ReleaseHandle() { Native.peft_lowrank_report_free(handle); return true; }
    }

    /// <summary>A host model, and the pins of the managed buffers it was given: C keeps their addresses for its
    /// whole life, so they are unpinned only after the C object is freed (which never touches the buffers).</summary>
    internal sealed class HostModelHandle : PeftHandle
    {
        private readonly List<MemoryHandle> pins_ = new List<MemoryHandle>();

        /// <summary>Keeps <paramref name="pin"/> until the host model is released.</summary>
        internal void KeepPinned(MemoryHandle pin)
        {
            lock (pins_) pins_.Add(pin);
        }

        protected override bool ReleaseHandle()
        {
            Native.peft_host_model_free(handle);
            lock (pins_)
            {
                foreach (MemoryHandle pin in pins_) pin.Dispose();
                pins_.Clear();
            }
            return true;
        }
    }

    /// <summary>Shared disposal logic of the public wrappers: the handle, and the ObjectDisposedException.</summary>
    public abstract class NativeObject : IDisposable
    {
        private readonly PeftHandle handle_;

        internal NativeObject(PeftHandle handle)
        {
            handle_ = handle;
        }

        /// <summary>Whether Dispose has been called.</summary>
        public bool IsDisposed { get { return handle_.IsClosed; } }

        /// <summary>Releases the C object now. Calling it again does nothing.</summary>
        public void Dispose()
        {
            handle_.Dispose();
            GC.SuppressFinalize(this);
        }

        internal void ThrowIfDisposed()
        {
            if (handle_.IsClosed) throw new ObjectDisposedException(GetType().Name);
        }

        /// <summary>The live handle; ObjectDisposedException after Dispose.</summary>
        internal T Live<T>() where T : PeftHandle
        {
            ThrowIfDisposed();
            return (T)handle_;
        }
    }
}
