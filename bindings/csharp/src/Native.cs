// P/Invoke declarations of include/peft_c.h, one to one. Nothing here is public: the wrappers in this
// folder turn errors into exceptions and handles into IDisposable objects.
//
// Marshalling rules kept throughout (see bindings/csharp/README.md):
// - strings go in as NUL-terminated UTF-8 byte[] built by Utf8.Encode (never the marshaller's string
//   conversion) and come out as IntPtr decoded by Utf8.Decode, so the encoding is UTF-8 on every platform;
// - size_t is UIntPtr, uint64_t ulong, int32_t int (booleans included: no bool in any signature);
// - a fallible call returns ErrorHandle, a SafeHandle that owns the peft_error (invalid when NULL);
// - handles go in as their SafeHandle type, so the marshaller holds a reference during the call and a
//   disposed handle fails with ObjectDisposedException instead of reaching C.
using System;
using System.Runtime.InteropServices;

namespace PeftC
{
    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate int NativeTensorSource(IntPtr userData, ulong offset, IntPtr dst, ulong nbytes);

    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate int NativeProgress(IntPtr userData, ulong done, ulong total);

    /// <summary>peft_registry_stats (peft_registry_get_stats): <c>Size</c> is set to the struct's size before the call.</summary>
    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeRegistryStats
    {
        internal ulong Size;
        internal ulong BudgetBytes;
        internal ulong LoadedBytes;
        internal ulong PeakLoadedBytes;
        internal ulong Registered;
        internal ulong Loaded;
        internal ulong Pinned;
        internal ulong Loads;
        internal ulong Hits;
        internal ulong Evictions;
    }

    /// <summary>peft_swap_stats: <c>Size</c> is set to the struct's size before the call.</summary>
    [StructLayout(LayoutKind.Sequential)]
    internal struct NativeSwapStats
    {
        internal ulong Size;
        internal double RemoveSeconds;
        internal double MergeSeconds;
        internal ulong LayersRemoved;
        internal ulong LayersMerged;
        internal ulong SavedBytes;
    }

    internal static unsafe class Native
    {
        // Mono maps "peft_c" to libpeft_c.so; PeftC.dll.config maps it to the ABI-versioned SONAME.
        internal const string Lib = "peft_c";
        private const CallingConvention Cdecl = CallingConvention.Cdecl;

        // Runs before the first call into the library (an explicit static constructor is precise).
        static Native() { DataDir.Init(); }

        /// <summary>For options that choose an output dtype: keep each tensor's own.</summary>
        internal const int PEFT_DTYPE_KEEP = -1;

        // ---- versions ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_version();
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern uint peft_version_number();
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern uint peft_abi_version();
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_kernels();

        // ---- errors ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_error_code(ErrorHandle err);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_error_message(ErrorHandle err);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_error_free(IntPtr err);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_error_code_name(int code);

        // ---- dtypes ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_dtype_name(int dtype);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_dtype_from_name(byte[] name);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern uint peft_dtype_bits(int dtype);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_convert(int srcDtype, void* src, int dstDtype, void* dst, ulong count);

        // ---- reading ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_open_options_new(out OpenOptionsHandle opts);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_open_options_free(IntPtr opts);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_open_options_set_max_header_size(OpenOptionsHandle opts, ulong maxBytes);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_open_options_set_use_pread(OpenOptionsHandle opts, int usePread);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_open(byte[] path, OpenOptionsHandle opts, out CheckpointHandle ckpt);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_open_memory(void* data, UIntPtr size, OpenOptionsHandle opts,
                                                                       out CheckpointHandle ckpt);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_checkpoint_free(IntPtr ckpt);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_checkpoint_file_count(CheckpointHandle c);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_checkpoint_file_path(CheckpointHandle c, UIntPtr file);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_checkpoint_has_metadata(CheckpointHandle c, UIntPtr file);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_checkpoint_metadata_count(CheckpointHandle c, UIntPtr file);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern IntPtr peft_checkpoint_metadata_key(CheckpointHandle c, UIntPtr file, UIntPtr entry);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern IntPtr peft_checkpoint_metadata_value(CheckpointHandle c, UIntPtr file, UIntPtr entry);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_checkpoint_index_metadata_json(CheckpointHandle c);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_checkpoint_tensor_count(CheckpointHandle c);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_find_n(CheckpointHandle c, byte[] name, UIntPtr nameLength, out UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_checkpoint_tensor_name_length(CheckpointHandle c, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_checkpoint_tensor_name(CheckpointHandle c, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_checkpoint_tensor_dtype(CheckpointHandle c, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_checkpoint_tensor_ndim(CheckpointHandle c, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ulong* peft_checkpoint_tensor_shape(CheckpointHandle c, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_tensor_offsets(CheckpointHandle c, UIntPtr i, out ulong begin, out ulong end);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_checkpoint_tensor_file(CheckpointHandle c, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_tensor_view(CheckpointHandle c, UIntPtr i, out IntPtr data, out ulong nbytes);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_tensor_read(CheckpointHandle c, UIntPtr i, int dtype, void* dst, ulong dstNbytes);

        // ---- writer ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_new(byte[] path, out WriterHandle w);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_writer_new_checkpoint(byte[] folder, ulong maxShardSize, out WriterHandle w);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_writer_free(IntPtr w);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_writer_add_tensor_n(WriterHandle w, byte[] name, UIntPtr nameLength, int dtype,
                                                                    ulong[] shape, UIntPtr ndim);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_set_metadata_present(WriterHandle w, int present);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_set_metadata(WriterHandle w, byte[] key, byte[] value);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_break_shard(WriterHandle w);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_set_index_metadata_json(WriterHandle w, byte[] json);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_start(WriterHandle w);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_writer_tensor_count(WriterHandle w);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_writer_tensor_name(WriterHandle w, UIntPtr position);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_writer_tensor_name_length(WriterHandle w, UIntPtr position);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_writer_tensor_declaration(WriterHandle w, UIntPtr position);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_writer_file_count(WriterHandle w);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_writer_file_path(WriterHandle w, UIntPtr file);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_begin_tensor(WriterHandle w, byte[] name, int srcDtype);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_write(WriterHandle w, void* data, ulong nbytes);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_writer_write_tensor(WriterHandle w, byte[] name, int srcDtype, void* data, ulong nbytes);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_writer_write_from_callback(WriterHandle w, byte[] name, int srcDtype,
                                                                           NativeTensorSource source, IntPtr userData);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_writer_write_from_checkpoint(WriterHandle w, byte[] name, CheckpointHandle c, UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_writer_finish(WriterHandle w);

        // ---- adapters and translators ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_string_free(IntPtr text);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_string_list_count(IntPtr list);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_string_list_get(IntPtr list, UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_string_list_free(IntPtr list);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_adapter_options_new(out AdapterOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_adapter_options_free(IntPtr o);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_options_set_base_dir(AdapterOptionsHandle o, byte[] baseDir);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_options_set_translator(AdapterOptionsHandle o, TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_open(byte[] dir, AdapterOptionsHandle o, out AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_adapter_free(IntPtr a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_adapter_validate(AdapterHandle a, byte[] baseDir);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_config_json(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_config_field(AdapterHandle a, byte[] field);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern long peft_adapter_r(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern double peft_adapter_lora_alpha(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_adapter_use_rslora(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_adapter_use_dora(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_adapter_lora_bias(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_adapter_fan_in_fan_out(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_peft_type(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_bias(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_task_type(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_base_model_name_or_path(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_family(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_adapter_translator(AdapterHandle a, out TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_adapter_note_count(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_note(AdapterHandle a, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_adapter_module_count(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_find_module(AdapterHandle a, byte[] name, out UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_module_name(AdapterHandle a, UIntPtr m);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_adapter_module_kind(AdapterHandle a, UIntPtr m);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern long peft_adapter_module_rank(AdapterHandle a, UIntPtr m);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern double peft_adapter_module_alpha(AdapterHandle a, UIntPtr m);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern double peft_adapter_module_scaling(AdapterHandle a, UIntPtr m);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_adapter_module_tensor_count(AdapterHandle a, UIntPtr m);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern IntPtr peft_adapter_module_tensor_role(AdapterHandle a, UIntPtr m, UIntPtr t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern IntPtr peft_adapter_module_tensor_key(AdapterHandle a, UIntPtr m, UIntPtr t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern IntPtr peft_adapter_module_tensor_base_name(AdapterHandle a, UIntPtr m, UIntPtr t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern int peft_adapter_module_tensor_dtype(AdapterHandle a, UIntPtr m, UIntPtr t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern UIntPtr peft_adapter_module_tensor_ndim(AdapterHandle a, UIntPtr m, UIntPtr t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ulong* peft_adapter_module_tensor_shape(AdapterHandle a, UIntPtr m, UIntPtr t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_module_tensor_read(AdapterHandle a, UIntPtr m, UIntPtr t, int dtype,
                                                                           void* dst, ulong dstNbytes);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern long* peft_adapter_module_token_indices(AdapterHandle a, UIntPtr m, out UIntPtr count);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_new_builtin(byte[] family, out TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_translator_from_file(byte[] path, out TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_translator_from_json(byte[] json, out TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_detect(byte[] baseDir, byte[] modelName, out TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_translator_builtin_family_list(out IntPtr list);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_from_gguf(CheckpointHandle c, out TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_new_gguf(byte[] architecture, ulong headCount, ulong headCountKv, out TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_translator_free(IntPtr t);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_translator_family(TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_to_native(TranslatorHandle t, byte[] hfKey, out IntPtr text);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_to_hf(TranslatorHandle t, byte[] nativeKey, int withPeftPrefix, out IntPtr text);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_to_native_batch(TranslatorHandle t, IntPtr* keys, UIntPtr count, IntPtr* result);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_translator_to_hf_batch(TranslatorHandle t, IntPtr* keys, UIntPtr count, int withPeftPrefix,
                                                                       IntPtr* result);

        // ---- merge ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_merge_options_new(out MergeOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_merge_options_free(IntPtr o);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_add_adapter(MergeOptionsHandle o, AdapterHandle a, double weight);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_add_adapter_dir(MergeOptionsHandle o, byte[] dir, double weight);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_merge_options_set_dtype(MergeOptionsHandle o, int dtype);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_max_shard_size(MergeOptionsHandle o, ulong maxShardSize);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_merge_options_set_threads(MergeOptionsHandle o, uint threads);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_progress(MergeOptionsHandle o, NativeProgress fn, IntPtr userData);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_require_config(MergeOptionsHandle o, int require);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_allow_nonfinite(MergeOptionsHandle o, int allow);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_quant(MergeOptionsHandle o, int ggmlType);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_report(MergeOptionsHandle o, int report);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_tied_embeddings(MergeOptionsHandle o, int policy);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_arithmetic(MergeOptionsHandle o, int arithmetic);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_join_split(MergeOptionsHandle o, int join);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_options_set_combine(MergeOptionsHandle o, int method, ExportOptionsHandle combineOptions);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_merge_result_report_json(MergeResultHandle r);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_checkpoint(byte[] baseDir, byte[] outDir, MergeOptionsHandle o, out MergeResultHandle r);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_merge_result_free(IntPtr r);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ulong peft_merge_result_tensor_count(MergeResultHandle r, int which);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ulong peft_merge_result_bytes(MergeResultHandle r);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_merge_result_file_count(MergeResultHandle r);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_merge_result_file_name(MergeResultHandle r, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_merge_result_untied_embeddings(MergeResultHandle r);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_merge_result_note_count(MergeResultHandle r);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_merge_result_note(MergeResultHandle r, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_merge_buffer_options_new(out MergeBufferOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_merge_buffer_options_free(IntPtr o);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_buffer_options_set_weight(MergeBufferOptionsHandle o, double weight);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_buffer_options_set_keep_original_rows(MergeBufferOptionsHandle o, int keep);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_buffer_options_set_threads(MergeBufferOptionsHandle o, uint threads);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_buffer_options_set_translator(MergeBufferOptionsHandle o, TranslatorHandle t);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_buffer_apply(AdapterHandle a, byte[] name, void* data, int dtype, ulong[] shape,
                                                                   UIntPtr ndim, void* bias, int biasDtype, MergeBufferOptionsHandle o,
                                                                   out MergeRecordHandle record);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_merge_record_unmerge(MergeRecordHandle record, void* data, void* bias);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_merge_record_free(IntPtr record);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_merge_record_module(MergeRecordHandle record);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_merge_record_active(MergeRecordHandle record);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ulong peft_merge_record_saved_bytes(MergeRecordHandle record);

        // ---- export ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_export_options_new(out ExportOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_export_options_free(IntPtr o);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_export_options_set_dtype(ExportOptionsHandle o, int dtype);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_export_options_set_peft_version(ExportOptionsHandle o, byte[] version);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_export_options_set_combine_density(ExportOptionsHandle o, double density);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_export_options_set_combine_majority_sign(ExportOptionsHandle o, int method);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_export_options_set_combine_seed(ExportOptionsHandle o, ulong seed);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_export_options_set_combine_svd_rank(ExportOptionsHandle o, long rank);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_export_options_set_combine_svd_clamp(ExportOptionsHandle o, double quantile);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_export(AdapterHandle a, byte[] outDir, ExportOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_combine(IntPtr* adapters, double[] weights, UIntPtr count, int method,
                                                                byte[] outDir, ExportOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_export_gguf(AdapterHandle a, byte[] outPath, byte[] baseModel, int ggmlType);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_export_gguf_split(AdapterHandle a, byte[] outPath, byte[] baseModel, int ggmlType,
                                                                          byte[] baseOut);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_import_gguf(byte[] ggufPath, byte[] outDir, byte[] baseModel);

        // ---- serving ----
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_new(int storageDtype, ulong budgetBytes, TranslatorHandle translator,
                                                             out RegistryHandle registry);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_registry_free(IntPtr registry);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_register(RegistryHandle registry, byte[] name, byte[] dir, AdapterOptionsHandle opts);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_register_memory(RegistryHandle registry, byte[] name, byte[] configJson,
                                                                         void* weights, UIntPtr weightsSize, AdapterOptionsHandle opts);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_registry_unregister(RegistryHandle registry, byte[] name);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_registry_name_list(RegistryHandle registry, out IntPtr list);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_registry_warning_list(RegistryHandle registry, byte[] name, out IntPtr list);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_acquire(RegistryHandle registry, byte[] name, out LeaseHandle lease);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_registry_trim(RegistryHandle registry);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_set_budget(RegistryHandle registry, ulong budgetBytes);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_get_stats(RegistryHandle registry, ref NativeRegistryStats stats);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_lease_free(IntPtr lease);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_lease_name(LeaseHandle lease);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ulong peft_lease_version(LeaseHandle lease);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ulong peft_lease_bytes(LeaseHandle lease);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_lease_has_module(LeaseHandle lease, byte[] module);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_lora_apply(byte[] module, IntPtr* leases, UIntPtr leaseCount, int* rowLease, void* x,
                                                           int xDtype, ulong rows, ulong inFeatures, void* y, int yDtype, ulong outFeatures);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_host_model_new(out HostModelHandle host);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_host_model_free(IntPtr host);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_host_model_set_translator(HostModelHandle host, TranslatorHandle translator);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_host_model_set_exact(HostModelHandle host, int exact);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_host_model_add_weight(HostModelHandle host, byte[] name, void* data, int dtype, ulong[] shape,
                                                                      UIntPtr ndim, void* bias, int biasDtype, ulong biasElements);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_set_base_weight(RegistryHandle registry, byte[] name, void* data, int dtype, ulong[] shape,
                                                                         UIntPtr ndim, void* bias, int biasDtype, ulong biasElements);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_registry_base_weights_changed(RegistryHandle registry);

        // LoRA extraction and conversion to LoRA (lowrank_api.cpp)
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_lowrank_options_new(out LowrankOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_lowrank_options_free(IntPtr o);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_lowrank_options_set_rank(LowrankOptionsHandle o, long rank);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_lowrank_options_set_energy(LowrankOptionsHandle o, double fraction);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_lowrank_options_set_svd(LowrankOptionsHandle o, int method);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_lowrank_options_set_threads(LowrankOptionsHandle o, uint threads);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_lowrank_options_set_dtype(LowrankOptionsHandle o, int dtype);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_lowrank_options_set_modules(LowrankOptionsHandle o, IntPtr* names, UIntPtr count);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_lowrank_options_set_base(LowrankOptionsHandle o, byte[] baseDir);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_lowrank_report_module_count(LowrankReportHandle r);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_lowrank_report_module_name(LowrankReportHandle r, UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern long peft_lowrank_report_module_rank(LowrankReportHandle r, UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern double peft_lowrank_report_module_error(LowrankReportHandle r, UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_lowrank_report_free(IntPtr r);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_extract(byte[] baseModel, byte[] tuned, byte[] outDir, LowrankOptionsHandle o,
                                                                out LowrankReportHandle report);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_convert_to_lora(AdapterHandle adapter, byte[] outDir, LowrankOptionsHandle o,
                                                                        out LowrankReportHandle report);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_convert_initial(byte[] tunedDir, byte[] initialDir, byte[] outDir, ExportOptionsHandle o);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_combine_deltas(IntPtr* adapters, double[] weights, UIntPtr count, int method,
                                                                       byte[] outDir, ExportOptionsHandle combineOptions,
                                                                       LowrankOptionsHandle o, out LowrankReportHandle report);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_model_combine(byte[] baseDir, IntPtr* models, double[] weights, UIntPtr count, int method,
                                                              byte[] outDir, ExportOptionsHandle combineOptions, MergeOptionsHandle o,
                                                              out MergeResultHandle result);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_host_model_swap(HostModelHandle host, LeaseHandle lease, double weight, ref NativeSwapStats stats);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_host_model_current(HostModelHandle host);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_hub_resolve(byte[] idOrPath, out IntPtr outDir);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ErrorHandle peft_hub_cache_dir(out IntPtr outDir);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_options_set_lenient(AdapterOptionsHandle o, int lenient);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_adapter_warning_count(AdapterHandle a);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_adapter_warning(AdapterHandle a, UIntPtr i);

        // ---- the adapter doctor ----
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_doctor(byte[] adapterDir, byte[] baseDir, out IntPtr json);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_adapter_doctor_fix(byte[] adapterDir, byte[] baseDir, byte[] outDir, out IntPtr json);

        // ---- GGUF files ----
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_checkpoint_file_format(CheckpointHandle c, UIntPtr file);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern uint peft_checkpoint_gguf_version(CheckpointHandle c, UIntPtr file);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_checkpoint_tensor_ggml_type(CheckpointHandle c, UIntPtr i);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_ggml_type_name(int ggmlType);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_ggml_type_from_name(byte[] name);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_ggml_type_geometry(int ggmlType, out uint blockSize, out uint typeSize);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_checkpoint_gguf_kv_count(CheckpointHandle c, UIntPtr file);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern IntPtr peft_checkpoint_gguf_kv_key(CheckpointHandle c, UIntPtr file, UIntPtr kv);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_gguf_kv_find(CheckpointHandle c, UIntPtr file, byte[] key, out UIntPtr kv);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern int peft_checkpoint_gguf_kv_type(CheckpointHandle c, UIntPtr file, UIntPtr kv);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern int peft_checkpoint_gguf_kv_array_type(CheckpointHandle c, UIntPtr file, UIntPtr kv);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ulong peft_checkpoint_gguf_kv_array_length(CheckpointHandle c, UIntPtr file, UIntPtr kv);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_gguf_kv_int(CheckpointHandle c, UIntPtr file, UIntPtr kv, ulong element, out long value);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_gguf_kv_uint(CheckpointHandle c, UIntPtr file, UIntPtr kv, ulong element, out ulong value);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_gguf_kv_float(CheckpointHandle c, UIntPtr file, UIntPtr kv, ulong element, out double value);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_checkpoint_gguf_kv_string(CheckpointHandle c, UIntPtr file, UIntPtr kv, ulong element,
                                                                          out IntPtr data, out UIntPtr length);

        // ---- control vectors ----
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_vector_open(byte[] path, out ControlVectorHandle vector);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_vector_new(ulong nEmbd, byte[] modelHint, out ControlVectorHandle vector);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_control_vector_free(IntPtr vector);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern ulong peft_control_vector_n_embd(ControlVectorHandle v);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_control_vector_model_hint(ControlVectorHandle v);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern UIntPtr peft_control_vector_layer_count(ControlVectorHandle v);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern long peft_control_vector_layer(ControlVectorHandle v, UIntPtr index);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern IntPtr peft_control_vector_direction(ControlVectorHandle v, long layer);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_vector_set_direction(ControlVectorHandle v, long layer, int dtype, void* data);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_vector_add(ControlVectorHandle dst, ControlVectorHandle src, double strength);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_vector_save(ControlVectorHandle v, byte[] path, int format);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_vector_apply(ControlVectorHandle v, long layer, double strength, void* data, int dtype,
                                                                     ulong rows, out ControlRecordHandle record);
        // The same function, asking for no record (NULL out).
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_vector_apply(ControlVectorHandle v, long layer, double strength, void* data, int dtype,
                                                                     ulong rows, IntPtr noRecord);
        [DllImport(Lib, CallingConvention = Cdecl)]
        internal static extern ErrorHandle peft_control_record_remove(ControlRecordHandle record, void* data);
        [DllImport(Lib, CallingConvention = Cdecl)] internal static extern void peft_control_record_free(IntPtr record);
    }
}
