//! Raw declarations of the peft_c C API, written by hand from `include/peft_c.h`.
//!
//! Everything here is `unsafe` and mirrors the header one to one: the same names, the same
//! parameters, C types mapped to their Rust equivalents (`int32_t` → `i32`, `size_t` → `usize`,
//! `const char*` → `*const c_char`, `T**` → `*mut *mut T`, ...). The header's documentation
//! (ownership, errors, thread safety) applies unchanged; read it there. Use the `peft-c` crate for
//! a safe interface.
//!
//! The test `tests/header.rs` parses the header and fails when a function, callback type, opaque
//! type, struct field or constant is missing here or declared differently. For that, the
//! declarations go through small macros that also record each declaration's name and types (the
//! hidden `FUNCTIONS`, `CALLBACKS`, `OPAQUE_TYPES`, `STRUCTS` and `CONSTANTS` tables).
#![no_std]
#![allow(non_camel_case_types)]

pub use core::ffi::{c_char, c_void};

/// A declaration as the macros below recorded it: the name and the Rust types as written.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Declaration {
    pub name: &'static str,
    pub params: &'static [&'static str],
    /// The return type, or "" for none.
    pub ret: &'static str,
}

macro_rules! opaque_types {
    ($($(#[$attr:meta])* $name:ident;)*) => {
        $(
            $(#[$attr])*
            #[repr(C)]
            pub struct $name {
                _private: [u8; 0],
                // Neither Send, Sync nor Unpin: only the safe crate decides what may cross threads.
                _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
            }
        )*
        /// The opaque handle types declared in this crate.
        #[doc(hidden)]
        pub const OPAQUE_TYPES: &[&str] = &[$(stringify!($name)),*];
    };
}

macro_rules! callback_types {
    ($($(#[$attr:meta])* pub type $name:ident = fn($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*) => {
        $(
            $(#[$attr])*
            pub type $name = Option<unsafe extern "C" fn($($arg: $ty),*) -> $ret>;
        )*
        /// The callback types declared in this crate (parameter and return types of the function).
        #[doc(hidden)]
        pub const CALLBACKS: &[Declaration] = &[$(
            Declaration { name: stringify!($name), params: &[$(stringify!($ty)),*], ret: stringify!($ret) }
        ),*];
    };
}

macro_rules! constants {
    ($($(#[$attr:meta])* pub const $name:ident: $ty:ty = $value:expr;)*) => {
        $(
            $(#[$attr])*
            pub const $name: $ty = $value;
        )*
        /// The constants declared in this crate with their values.
        #[doc(hidden)]
        pub const CONSTANTS: &[(&str, i64)] = &[$((stringify!($name), $name as i64)),*];
    };
}

macro_rules! functions {
    ($($(#[$attr:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        extern "C" {
            $(
                $(#[$attr])*
                pub fn $name($($arg: $ty),*) $(-> $ret)?;
            )*
        }
        /// The functions declared in this crate.
        #[doc(hidden)]
        pub const FUNCTIONS: &[Declaration] = &[$(
            Declaration {
                name: stringify!($name),
                params: &[$(stringify!($ty)),*],
                ret: concat!("" $(, stringify!($ret))?),
            }
        ),*];
        /// The address of every declared function, which makes the linker resolve each symbol.
        #[doc(hidden)]
        pub fn function_addresses() -> [(&'static str, usize); FUNCTIONS.len()] {
            [$((stringify!($name), $name as *const () as usize)),*]
        }
    };
}

/// A field of a struct of the header, as the `value_structs!` and `api_table!` macros recorded it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Field {
    /// A plain value of this Rust type.
    Value { name: &'static str, ty: &'static str },
    /// A function pointer.
    Function(Declaration),
}

/// Structs of plain values that the caller and the library fill in (counters and the like).
macro_rules! value_structs {
    ($(
        $(#[$attr:meta])*
        pub struct $name:ident { $($(#[$fattr:meta])* pub $field:ident: $ty:ty,)* }
    )*) => {
        $(
            $(#[$attr])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, Default, PartialEq)]
            pub struct $name {
                $($(#[$fattr])* pub $field: $ty,)*
            }
            impl $name {
                /// The struct's name and fields in order, for the header check.
                #[doc(hidden)]
                pub const DECLARATION: (&'static str, &'static [Field]) =
                    (stringify!($name), &[$(Field::Value { name: stringify!($field), ty: stringify!($ty) }),*]);
            }
        )*
    };
}

macro_rules! api_table {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            values { $($(#[$vattr:meta])* pub $vfield:ident: $vty:ty,)* }
            $(pub fn $ffield:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $target:ident;)*
        }
    ) => {
        $(#[$attr])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct $name {
            $($(#[$vattr])* pub $vfield: $vty,)*
            $(#[doc = concat!("`", stringify!($target), "`")] pub $ffield: Option<unsafe extern "C" fn($($arg: $ty),*) $(-> $ret)?>,)*
        }
        impl $name {
            /// The struct's name and fields in order, for the header check.
            #[doc(hidden)]
            pub const DECLARATION: (&'static str, &'static [Field]) = (stringify!($name), &[
                $(Field::Value { name: stringify!($vfield), ty: stringify!($vty) },)*
                $(Field::Function(Declaration {
                    name: stringify!($ffield),
                    params: &[$(stringify!($ty)),*],
                    ret: concat!("" $(, stringify!($ret))?),
                }),)*
            ]);
        }
        /// Calls `visit(field, address in the table, address of the exported function)` for every
        /// function entry of a table.
        #[doc(hidden)]
        pub fn visit_api_entries(table: &$name, mut visit: impl FnMut(&'static str, usize, usize)) {
            $(visit(stringify!($ffield), table.$ffield.map_or(0, |f| f as *const () as usize), $target as *const () as usize);)*
        }
    };
}

opaque_types! {
    /// An error: a stable code and a message.
    peft_error;
    /// Options for opening files.
    peft_open_options;
    /// A validated, opened checkpoint: one file or a folder of shards.
    peft_checkpoint;
    /// A streaming writer of one safetensors file or of a checkpoint folder.
    peft_writer;
    /// A loaded LoRA adapter.
    peft_adapter;
    /// Options for `peft_adapter_open`.
    peft_adapter_options;
    /// A key translator backed by an architecture table.
    peft_translator;
    /// Options of a checkpoint merge.
    peft_merge_options;
    /// What a checkpoint merge did.
    peft_merge_result;
    /// Options of a buffer merge.
    peft_merge_buffer_options;
    /// One adapter layer merged into a host buffer, and what removing it needs.
    peft_merge_record;
    /// Options for `peft_adapter_export` and `peft_adapter_combine`.
    peft_export_options;
    /// A registry of adapters under a memory budget.
    peft_registry;
    /// An acquired adapter of a registry, loaded and pinned until released.
    peft_lease;
    /// The weight buffers of a host's model, into which adapters are swapped.
    peft_host_model;
    /// An immutable list of strings, read by index.
    peft_string_list;
    /// Options for `peft_adapter_extract` and `peft_adapter_convert_to_lora`.
    peft_lowrank_options;
    /// The per-module ranks and errors of an extraction or conversion.
    peft_lowrank_report;
    /// A control vector: directions by layer.
    peft_control_vector;
    /// What an exact removal of `peft_control_vector_apply` needs.
    peft_control_record;
}

callback_types! {
    /// A source of tensor bytes for `peft_writer_write_from_callback`: returns 0 to continue.
    pub type peft_tensor_source_fn = fn(user_data: *mut c_void, offset: u64, dst: *mut c_void, nbytes: u64) -> i32;
    /// Progress of a long operation: returns 0 to continue, nonzero to cancel.
    pub type peft_progress_fn = fn(user_data: *mut c_void, done: u64, total: u64) -> i32;
    /// The type of `peft_get_api`, for `dlsym`.
    pub type peft_get_api_fn = fn(abi_version: u32) -> *const peft_api;
}

constants! {
    pub const PEFT_VERSION_MAJOR: u32 = 0;
    pub const PEFT_VERSION_MINOR: u32 = 1;
    pub const PEFT_VERSION_PATCH: u32 = 0;
    /// major * 10000 + minor * 100 + patch.
    pub const PEFT_VERSION_NUMBER: u32 = PEFT_VERSION_MAJOR * 10000 + PEFT_VERSION_MINOR * 100 + PEFT_VERSION_PATCH;
    /// ABI version of the header; equals the shared library's SONAME number.
    pub const PEFT_ABI_VERSION: u32 = 1;

    pub const PEFT_OK: i32 = 0;
    pub const PEFT_ERR_HEADER_TOO_SMALL: i32 = 1;
    pub const PEFT_ERR_HEADER_TOO_LARGE: i32 = 2;
    pub const PEFT_ERR_INVALID_HEADER_LENGTH: i32 = 3;
    pub const PEFT_ERR_INVALID_HEADER_UTF8: i32 = 4;
    pub const PEFT_ERR_INVALID_HEADER: i32 = 5;
    pub const PEFT_ERR_INVALID_OFFSET: i32 = 6;
    pub const PEFT_ERR_VALIDATION_OVERFLOW: i32 = 7;
    pub const PEFT_ERR_MISALIGNED_SLICE: i32 = 8;
    pub const PEFT_ERR_TENSOR_INVALID_INFO: i32 = 9;
    pub const PEFT_ERR_METADATA_INCOMPLETE_BUFFER: i32 = 10;
    pub const PEFT_ERR_IO: i32 = 20;
    pub const PEFT_ERR_NOT_FOUND: i32 = 21;
    pub const PEFT_ERR_UNSUPPORTED: i32 = 22;
    pub const PEFT_ERR_UNRESOLVED_KEY: i32 = 23;
    pub const PEFT_ERR_SHAPE_MISMATCH: i32 = 24;
    pub const PEFT_ERR_INVALID_ARGUMENT: i32 = 25;
    pub const PEFT_ERR_OUT_OF_MEMORY: i32 = 26;
    pub const PEFT_ERR_CANCELLED: i32 = 27;
    pub const PEFT_ERR_INVALID_CONFIG: i32 = 28;
    pub const PEFT_ERR_INVALID_CHECKPOINT: i32 = 29;
    pub const PEFT_ERR_OVER_BUDGET: i32 = 30;
    pub const PEFT_ERR_NON_FINITE: i32 = 31;
    pub const PEFT_ERR_INTERNAL: i32 = 99;

    pub const PEFT_DTYPE_BOOL: i32 = 0;
    pub const PEFT_DTYPE_F4: i32 = 1;
    pub const PEFT_DTYPE_F6_E2M3: i32 = 2;
    pub const PEFT_DTYPE_F6_E3M2: i32 = 3;
    pub const PEFT_DTYPE_U8: i32 = 4;
    pub const PEFT_DTYPE_I8: i32 = 5;
    pub const PEFT_DTYPE_F8_E5M2: i32 = 6;
    pub const PEFT_DTYPE_F8_E4M3: i32 = 7;
    pub const PEFT_DTYPE_F8_E8M0: i32 = 8;
    pub const PEFT_DTYPE_F8_E4M3FNUZ: i32 = 9;
    pub const PEFT_DTYPE_F8_E5M2FNUZ: i32 = 10;
    pub const PEFT_DTYPE_I16: i32 = 11;
    pub const PEFT_DTYPE_U16: i32 = 12;
    pub const PEFT_DTYPE_F16: i32 = 13;
    pub const PEFT_DTYPE_BF16: i32 = 14;
    pub const PEFT_DTYPE_I32: i32 = 15;
    pub const PEFT_DTYPE_U32: i32 = 16;
    pub const PEFT_DTYPE_F32: i32 = 17;
    pub const PEFT_DTYPE_C64: i32 = 18;
    pub const PEFT_DTYPE_F64: i32 = 19;
    pub const PEFT_DTYPE_I64: i32 = 20;
    pub const PEFT_DTYPE_U64: i32 = 21;
    pub const PEFT_DTYPE_COUNT: i32 = 22;
    pub const PEFT_DTYPE_KEEP: i32 = -1;

    pub const PEFT_LAYER_LINEAR: i32 = 0;
    pub const PEFT_LAYER_CONV1D: i32 = 1;
    pub const PEFT_LAYER_EMBEDDING: i32 = 2;
    pub const PEFT_LAYER_CONV2D: i32 = 3;
    pub const PEFT_LAYER_FULL: i32 = 4;
    pub const PEFT_LAYER_TRAINABLE_TOKENS: i32 = 5;

    pub const PEFT_MERGE_DTYPE_KEEP: i32 = -1;
    pub const PEFT_MERGE_TENSORS_MERGED: i32 = 0;
    pub const PEFT_MERGE_TENSORS_REPLACED: i32 = 1;
    pub const PEFT_MERGE_TENSORS_COPIED: i32 = 2;
    pub const PEFT_MERGE_TENSORS_ADDED: i32 = 3;
    pub const PEFT_MERGE_ARITHMETIC_PEFT: i32 = 0;
    pub const PEFT_MERGE_ARITHMETIC_GGML: i32 = 1;
    pub const PEFT_MERGE_TIED_UNTIE: i32 = 0;
    pub const PEFT_MERGE_TIED_SHARED: i32 = 1;

    pub const PEFT_COMBINE_CAT: i32 = 0;
    pub const PEFT_COMBINE_LINEAR: i32 = 1;
    pub const PEFT_COMBINE_TIES: i32 = 2;
    pub const PEFT_COMBINE_DARE_LINEAR: i32 = 3;
    pub const PEFT_COMBINE_DARE_TIES: i32 = 4;
    pub const PEFT_COMBINE_MAGNITUDE_PRUNE: i32 = 5;
    pub const PEFT_COMBINE_SVD: i32 = 6;
    pub const PEFT_COMBINE_TIES_SVD: i32 = 7;
    pub const PEFT_COMBINE_DARE_LINEAR_SVD: i32 = 8;
    pub const PEFT_COMBINE_DARE_TIES_SVD: i32 = 9;
    pub const PEFT_COMBINE_MAGNITUDE_PRUNE_SVD: i32 = 10;
    pub const PEFT_MAJORITY_SIGN_TOTAL: i32 = 0;
    pub const PEFT_MAJORITY_SIGN_FREQUENCY: i32 = 1;

    pub const PEFT_FORMAT_SAFETENSORS: i32 = 0;
    pub const PEFT_FORMAT_GGUF: i32 = 1;
    pub const PEFT_GGUF_U8: i32 = 0;
    pub const PEFT_GGUF_I8: i32 = 1;
    pub const PEFT_GGUF_U16: i32 = 2;
    pub const PEFT_GGUF_I16: i32 = 3;
    pub const PEFT_GGUF_U32: i32 = 4;
    pub const PEFT_GGUF_I32: i32 = 5;
    pub const PEFT_GGUF_F32: i32 = 6;
    pub const PEFT_GGUF_BOOL: i32 = 7;
    pub const PEFT_GGUF_STRING: i32 = 8;
    pub const PEFT_GGUF_ARRAY: i32 = 9;
    pub const PEFT_GGUF_U64: i32 = 10;
    pub const PEFT_GGUF_I64: i32 = 11;
    pub const PEFT_GGUF_F64: i32 = 12;

    pub const PEFT_SVD_EXACT: i32 = 0;
    pub const PEFT_SVD_RANDOMIZED: i32 = 1;
}

functions! {
    // ---- versions
    pub fn peft_version() -> *const c_char;
    pub fn peft_version_number() -> u32;
    pub fn peft_abi_version() -> u32;
    pub fn peft_kernels() -> *const c_char;

    // ---- errors
    pub fn peft_error_code(err: *const peft_error) -> i32;
    pub fn peft_error_message(err: *const peft_error) -> *const c_char;
    pub fn peft_error_free(err: *mut peft_error);
    pub fn peft_error_code_name(code: i32) -> *const c_char;

    // ---- dtypes
    pub fn peft_dtype_name(dtype: i32) -> *const c_char;
    pub fn peft_dtype_from_name(name: *const c_char) -> i32;
    pub fn peft_dtype_bits(dtype: i32) -> u32;
    pub fn peft_convert(src_dtype: i32, src: *const c_void, dst_dtype: i32, dst: *mut c_void, count: u64)
        -> *mut peft_error;

    // ---- reading
    pub fn peft_open_options_new(out: *mut *mut peft_open_options) -> *mut peft_error;
    pub fn peft_open_options_free(opts: *mut peft_open_options);
    pub fn peft_open_options_set_max_header_size(opts: *mut peft_open_options, max_bytes: u64) -> *mut peft_error;
    pub fn peft_open_options_set_use_pread(opts: *mut peft_open_options, use_pread: i32) -> *mut peft_error;
    pub fn peft_checkpoint_open(path: *const c_char, opts: *const peft_open_options, out: *mut *mut peft_checkpoint)
        -> *mut peft_error;
    pub fn peft_checkpoint_open_memory(
        data: *const c_void,
        size: usize,
        opts: *const peft_open_options,
        out: *mut *mut peft_checkpoint,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_free(ckpt: *mut peft_checkpoint);
    pub fn peft_checkpoint_file_count(ckpt: *const peft_checkpoint) -> usize;
    pub fn peft_checkpoint_file_path(ckpt: *const peft_checkpoint, file_index: usize) -> *const c_char;
    pub fn peft_checkpoint_has_metadata(ckpt: *const peft_checkpoint, file_index: usize) -> i32;
    pub fn peft_checkpoint_metadata_count(ckpt: *const peft_checkpoint, file_index: usize) -> usize;
    pub fn peft_checkpoint_metadata_key(ckpt: *const peft_checkpoint, file_index: usize, entry: usize)
        -> *const c_char;
    pub fn peft_checkpoint_metadata_value(ckpt: *const peft_checkpoint, file_index: usize, entry: usize)
        -> *const c_char;
    pub fn peft_checkpoint_index_metadata_json(ckpt: *const peft_checkpoint) -> *const c_char;
    pub fn peft_checkpoint_tensor_count(ckpt: *const peft_checkpoint) -> usize;
    pub fn peft_checkpoint_find(ckpt: *const peft_checkpoint, name: *const c_char, out_index: *mut usize)
        -> *mut peft_error;
    pub fn peft_checkpoint_find_n(
        ckpt: *const peft_checkpoint,
        name: *const c_char,
        name_length: usize,
        out_index: *mut usize,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_tensor_name_length(ckpt: *const peft_checkpoint, index: usize) -> usize;
    pub fn peft_checkpoint_tensor_name(ckpt: *const peft_checkpoint, index: usize) -> *const c_char;
    pub fn peft_checkpoint_tensor_dtype(ckpt: *const peft_checkpoint, index: usize) -> i32;
    pub fn peft_checkpoint_tensor_ndim(ckpt: *const peft_checkpoint, index: usize) -> usize;
    pub fn peft_checkpoint_tensor_shape(ckpt: *const peft_checkpoint, index: usize) -> *const u64;
    pub fn peft_checkpoint_tensor_offsets(
        ckpt: *const peft_checkpoint,
        index: usize,
        out_begin: *mut u64,
        out_end: *mut u64,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_tensor_file(ckpt: *const peft_checkpoint, index: usize) -> usize;
    pub fn peft_checkpoint_tensor_view(
        ckpt: *const peft_checkpoint,
        index: usize,
        out_data: *mut *const c_void,
        out_nbytes: *mut u64,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_tensor_read(
        ckpt: *const peft_checkpoint,
        index: usize,
        dtype: i32,
        dst: *mut c_void,
        dst_nbytes: u64,
    ) -> *mut peft_error;

    // ---- writer
    pub fn peft_writer_new(path: *const c_char, out: *mut *mut peft_writer) -> *mut peft_error;
    pub fn peft_writer_new_checkpoint(folder: *const c_char, max_shard_size: u64, out: *mut *mut peft_writer)
        -> *mut peft_error;
    pub fn peft_writer_free(writer: *mut peft_writer);
    pub fn peft_writer_add_tensor(
        writer: *mut peft_writer,
        name: *const c_char,
        dtype: i32,
        shape: *const u64,
        ndim: usize,
    ) -> *mut peft_error;
    pub fn peft_writer_add_tensor_n(
        writer: *mut peft_writer,
        name: *const c_char,
        name_length: usize,
        dtype: i32,
        shape: *const u64,
        ndim: usize,
    ) -> *mut peft_error;
    pub fn peft_writer_set_metadata_present(writer: *mut peft_writer, present: i32) -> *mut peft_error;
    pub fn peft_writer_set_metadata(writer: *mut peft_writer, key: *const c_char, value: *const c_char)
        -> *mut peft_error;
    pub fn peft_writer_break_shard(writer: *mut peft_writer) -> *mut peft_error;
    pub fn peft_writer_set_index_metadata_json(writer: *mut peft_writer, json_object: *const c_char)
        -> *mut peft_error;
    pub fn peft_writer_start(writer: *mut peft_writer) -> *mut peft_error;
    pub fn peft_writer_tensor_count(writer: *const peft_writer) -> usize;
    pub fn peft_writer_tensor_name(writer: *const peft_writer, position: usize) -> *const c_char;
    pub fn peft_writer_tensor_name_length(writer: *const peft_writer, position: usize) -> usize;
    pub fn peft_writer_tensor_declaration(writer: *const peft_writer, position: usize) -> usize;
    pub fn peft_writer_file_count(writer: *const peft_writer) -> usize;
    pub fn peft_writer_file_path(writer: *const peft_writer, file_index: usize) -> *const c_char;
    pub fn peft_writer_begin_tensor(writer: *mut peft_writer, name: *const c_char, src_dtype: i32) -> *mut peft_error;
    pub fn peft_writer_write(writer: *mut peft_writer, data: *const c_void, nbytes: u64) -> *mut peft_error;
    pub fn peft_writer_write_tensor(
        writer: *mut peft_writer,
        name: *const c_char,
        src_dtype: i32,
        data: *const c_void,
        nbytes: u64,
    ) -> *mut peft_error;
    pub fn peft_writer_write_from_callback(
        writer: *mut peft_writer,
        name: *const c_char,
        src_dtype: i32,
        source: peft_tensor_source_fn,
        user_data: *mut c_void,
    ) -> *mut peft_error;
    pub fn peft_writer_write_from_checkpoint(
        writer: *mut peft_writer,
        name: *const c_char,
        ckpt: *const peft_checkpoint,
        index: usize,
    ) -> *mut peft_error;
    pub fn peft_writer_finish(writer: *mut peft_writer) -> *mut peft_error;

    // ---- strings and lists
    pub fn peft_string_free(text: *mut c_char);
    pub fn peft_string_list_count(list: *const peft_string_list) -> usize;
    pub fn peft_string_list_get(list: *const peft_string_list, index: usize) -> *const c_char;
    pub fn peft_string_list_free(list: *mut peft_string_list);

    // ---- adapter
    pub fn peft_adapter_options_new(out: *mut *mut peft_adapter_options) -> *mut peft_error;
    pub fn peft_adapter_options_free(opts: *mut peft_adapter_options);
    pub fn peft_adapter_options_set_base_dir(opts: *mut peft_adapter_options, base_dir: *const c_char)
        -> *mut peft_error;
    pub fn peft_adapter_options_set_translator(opts: *mut peft_adapter_options, translator: *const peft_translator)
        -> *mut peft_error;
    pub fn peft_adapter_open(dir: *const c_char, opts: *const peft_adapter_options, out: *mut *mut peft_adapter)
        -> *mut peft_error;
    pub fn peft_adapter_free(adapter: *mut peft_adapter);
    pub fn peft_adapter_validate(adapter: *const peft_adapter, base_dir: *const c_char) -> *mut peft_error;
    pub fn peft_adapter_config_json(adapter: *const peft_adapter) -> *const c_char;
    pub fn peft_adapter_config_field(adapter: *const peft_adapter, field: *const c_char) -> *const c_char;
    pub fn peft_adapter_r(adapter: *const peft_adapter) -> i64;
    pub fn peft_adapter_lora_alpha(adapter: *const peft_adapter) -> f64;
    pub fn peft_adapter_use_rslora(adapter: *const peft_adapter) -> i32;
    pub fn peft_adapter_use_dora(adapter: *const peft_adapter) -> i32;
    pub fn peft_adapter_lora_bias(adapter: *const peft_adapter) -> i32;
    pub fn peft_adapter_fan_in_fan_out(adapter: *const peft_adapter) -> i32;
    pub fn peft_adapter_peft_type(adapter: *const peft_adapter) -> *const c_char;
    pub fn peft_adapter_bias(adapter: *const peft_adapter) -> *const c_char;
    pub fn peft_adapter_task_type(adapter: *const peft_adapter) -> *const c_char;
    pub fn peft_adapter_base_model_name_or_path(adapter: *const peft_adapter) -> *const c_char;
    pub fn peft_adapter_family(adapter: *const peft_adapter) -> *const c_char;
    pub fn peft_adapter_translator(adapter: *const peft_adapter, out: *mut *mut peft_translator) -> *mut peft_error;
    pub fn peft_adapter_note_count(adapter: *const peft_adapter) -> usize;
    pub fn peft_adapter_note(adapter: *const peft_adapter, index: usize) -> *const c_char;
    pub fn peft_adapter_module_count(adapter: *const peft_adapter) -> usize;
    pub fn peft_adapter_find_module(adapter: *const peft_adapter, name: *const c_char, out_index: *mut usize)
        -> *mut peft_error;
    pub fn peft_adapter_module_name(adapter: *const peft_adapter, module: usize) -> *const c_char;
    pub fn peft_adapter_module_kind(adapter: *const peft_adapter, module: usize) -> i32;
    pub fn peft_adapter_module_rank(adapter: *const peft_adapter, module: usize) -> i64;
    pub fn peft_adapter_module_alpha(adapter: *const peft_adapter, module: usize) -> f64;
    pub fn peft_adapter_module_scaling(adapter: *const peft_adapter, module: usize) -> f64;
    pub fn peft_adapter_module_tensor_count(adapter: *const peft_adapter, module: usize) -> usize;
    pub fn peft_adapter_module_tensor_role(adapter: *const peft_adapter, module: usize, tensor: usize)
        -> *const c_char;
    pub fn peft_adapter_module_tensor_key(adapter: *const peft_adapter, module: usize, tensor: usize)
        -> *const c_char;
    pub fn peft_adapter_module_tensor_base_name(adapter: *const peft_adapter, module: usize, tensor: usize)
        -> *const c_char;
    pub fn peft_adapter_module_tensor_dtype(adapter: *const peft_adapter, module: usize, tensor: usize) -> i32;
    pub fn peft_adapter_module_tensor_ndim(adapter: *const peft_adapter, module: usize, tensor: usize) -> usize;
    pub fn peft_adapter_module_tensor_shape(adapter: *const peft_adapter, module: usize, tensor: usize)
        -> *const u64;
    pub fn peft_adapter_module_tensor_read(
        adapter: *const peft_adapter,
        module: usize,
        tensor: usize,
        dtype: i32,
        dst: *mut c_void,
        dst_nbytes: u64,
    ) -> *mut peft_error;
    pub fn peft_adapter_module_token_indices(adapter: *const peft_adapter, module: usize, out_count: *mut usize)
        -> *const i64;
    pub fn peft_translator_new_builtin(family: *const c_char, out: *mut *mut peft_translator) -> *mut peft_error;
    pub fn peft_translator_from_file(path: *const c_char, out: *mut *mut peft_translator) -> *mut peft_error;
    pub fn peft_translator_from_json(json: *const c_char, out: *mut *mut peft_translator) -> *mut peft_error;
    pub fn peft_translator_detect(
        base_dir: *const c_char,
        model_name: *const c_char,
        out: *mut *mut peft_translator,
    ) -> *mut peft_error;
    pub fn peft_translator_builtin_families(out: *mut *mut c_char) -> *mut peft_error;
    pub fn peft_translator_builtin_family_list(out: *mut *mut peft_string_list) -> *mut peft_error;
    pub fn peft_translator_free(translator: *mut peft_translator);
    pub fn peft_translator_family(translator: *const peft_translator) -> *const c_char;
    pub fn peft_translator_to_native(translator: *const peft_translator, hf_key: *const c_char, out: *mut *mut c_char)
        -> *mut peft_error;
    pub fn peft_translator_to_hf(
        translator: *const peft_translator,
        native_key: *const c_char,
        with_peft_prefix: i32,
        out: *mut *mut c_char,
    ) -> *mut peft_error;
    pub fn peft_translator_to_native_batch(
        translator: *const peft_translator,
        hf_keys: *const *const c_char,
        count: usize,
        out: *mut *mut c_char,
    ) -> *mut peft_error;
    pub fn peft_translator_to_hf_batch(
        translator: *const peft_translator,
        native_keys: *const *const c_char,
        count: usize,
        with_peft_prefix: i32,
        out: *mut *mut c_char,
    ) -> *mut peft_error;

    // ---- merge
    pub fn peft_merge_options_new(out: *mut *mut peft_merge_options) -> *mut peft_error;
    pub fn peft_merge_options_free(opts: *mut peft_merge_options);
    pub fn peft_merge_options_add_adapter(opts: *mut peft_merge_options, adapter: *const peft_adapter, weight: f64)
        -> *mut peft_error;
    pub fn peft_merge_options_add_adapter_dir(opts: *mut peft_merge_options, dir: *const c_char, weight: f64)
        -> *mut peft_error;
    pub fn peft_merge_options_set_dtype(opts: *mut peft_merge_options, dtype: i32) -> *mut peft_error;
    pub fn peft_merge_options_set_max_shard_size(opts: *mut peft_merge_options, max_shard_size: u64)
        -> *mut peft_error;
    pub fn peft_merge_options_set_threads(opts: *mut peft_merge_options, threads: u32) -> *mut peft_error;
    pub fn peft_merge_options_set_progress(opts: *mut peft_merge_options, fn_: peft_progress_fn, user_data: *mut c_void)
        -> *mut peft_error;
    pub fn peft_merge_checkpoint(
        base_dir: *const c_char,
        out_dir: *const c_char,
        opts: *const peft_merge_options,
        out_result: *mut *mut peft_merge_result,
    ) -> *mut peft_error;
    pub fn peft_merge_result_free(result: *mut peft_merge_result);
    pub fn peft_merge_result_tensor_count(result: *const peft_merge_result, which: i32) -> u64;
    pub fn peft_merge_result_bytes(result: *const peft_merge_result) -> u64;
    pub fn peft_merge_result_file_count(result: *const peft_merge_result) -> usize;
    pub fn peft_merge_result_file_name(result: *const peft_merge_result, index: usize) -> *const c_char;
    pub fn peft_merge_result_untied_embeddings(result: *const peft_merge_result) -> i32;
    pub fn peft_merge_result_note_count(result: *const peft_merge_result) -> usize;
    pub fn peft_merge_result_note(result: *const peft_merge_result, index: usize) -> *const c_char;
    pub fn peft_merge_buffer_options_new(out: *mut *mut peft_merge_buffer_options) -> *mut peft_error;
    pub fn peft_merge_buffer_options_free(opts: *mut peft_merge_buffer_options);
    pub fn peft_merge_buffer_options_set_weight(opts: *mut peft_merge_buffer_options, weight: f64) -> *mut peft_error;
    pub fn peft_merge_buffer_options_set_keep_original_rows(opts: *mut peft_merge_buffer_options, keep: i32)
        -> *mut peft_error;
    pub fn peft_merge_buffer_options_set_threads(opts: *mut peft_merge_buffer_options, threads: u32)
        -> *mut peft_error;
    pub fn peft_merge_buffer_options_set_translator(
        opts: *mut peft_merge_buffer_options,
        translator: *const peft_translator,
    ) -> *mut peft_error;
    pub fn peft_merge_buffer_apply(
        adapter: *const peft_adapter,
        name: *const c_char,
        data: *mut c_void,
        dtype: i32,
        shape: *const u64,
        ndim: usize,
        bias: *mut c_void,
        bias_dtype: i32,
        opts: *const peft_merge_buffer_options,
        out: *mut *mut peft_merge_record,
    ) -> *mut peft_error;
    pub fn peft_merge_record_unmerge(record: *mut peft_merge_record, data: *mut c_void, bias: *mut c_void)
        -> *mut peft_error;
    pub fn peft_merge_buffer_remove(record: *mut peft_merge_record, data: *mut c_void, bias: *mut c_void)
        -> *mut peft_error;
    pub fn peft_merge_record_free(record: *mut peft_merge_record);
    pub fn peft_merge_record_module(record: *const peft_merge_record) -> *const c_char;
    pub fn peft_merge_record_active(record: *const peft_merge_record) -> i32;
    pub fn peft_merge_record_saved_bytes(record: *const peft_merge_record) -> u64;

    // ---- lenient adapter loading
    pub fn peft_adapter_options_set_lenient(opts: *mut peft_adapter_options, lenient: i32) -> *mut peft_error;
    pub fn peft_adapter_warning_count(adapter: *const peft_adapter) -> usize;
    pub fn peft_adapter_warning(adapter: *const peft_adapter, index: usize) -> *const c_char;

    // ---- export
    pub fn peft_export_options_new(out: *mut *mut peft_export_options) -> *mut peft_error;
    pub fn peft_export_options_free(opts: *mut peft_export_options);
    pub fn peft_export_options_set_dtype(opts: *mut peft_export_options, dtype: i32) -> *mut peft_error;
    pub fn peft_export_options_set_peft_version(opts: *mut peft_export_options, version: *const c_char)
        -> *mut peft_error;
    pub fn peft_adapter_export(adapter: *const peft_adapter, out_dir: *const c_char, opts: *const peft_export_options)
        -> *mut peft_error;
    pub fn peft_adapter_combine(
        adapters: *const *const peft_adapter,
        weights: *const f64,
        count: usize,
        method: i32,
        out_dir: *const c_char,
        opts: *const peft_export_options,
    ) -> *mut peft_error;

    // ---- serving
    pub fn peft_registry_new(
        storage_dtype: i32,
        budget_bytes: u64,
        translator: *const peft_translator,
        out: *mut *mut peft_registry,
    ) -> *mut peft_error;
    pub fn peft_registry_free(registry: *mut peft_registry);
    pub fn peft_registry_register(
        registry: *mut peft_registry,
        name: *const c_char,
        dir: *const c_char,
        opts: *const peft_adapter_options,
    ) -> *mut peft_error;
    pub fn peft_registry_register_memory(
        registry: *mut peft_registry,
        name: *const c_char,
        config_json: *const c_char,
        weights: *const c_void,
        weights_size: usize,
        opts: *const peft_adapter_options,
    ) -> *mut peft_error;
    pub fn peft_registry_unregister(registry: *mut peft_registry, name: *const c_char) -> *mut peft_error;
    pub fn peft_registry_names(registry: *const peft_registry, out: *mut *mut c_char) -> *mut peft_error;
    pub fn peft_registry_name_list(registry: *const peft_registry, out: *mut *mut peft_string_list) -> *mut peft_error;
    pub fn peft_registry_warning_list(
        registry: *const peft_registry,
        name: *const c_char,
        out: *mut *mut peft_string_list,
    ) -> *mut peft_error;
    pub fn peft_registry_acquire(registry: *mut peft_registry, name: *const c_char, out: *mut *mut peft_lease)
        -> *mut peft_error;
    pub fn peft_registry_trim(registry: *mut peft_registry) -> *mut peft_error;
    pub fn peft_registry_set_budget(registry: *mut peft_registry, budget_bytes: u64) -> *mut peft_error;
    pub fn peft_registry_get_stats(registry: *const peft_registry, stats: *mut peft_registry_stats) -> *mut peft_error;
    pub fn peft_lease_free(lease: *mut peft_lease);
    pub fn peft_lease_release(lease: *mut peft_lease);
    pub fn peft_lease_name(lease: *const peft_lease) -> *const c_char;
    pub fn peft_lease_version(lease: *const peft_lease) -> u64;
    pub fn peft_lease_bytes(lease: *const peft_lease) -> u64;
    pub fn peft_lease_has_module(lease: *const peft_lease, module: *const c_char) -> i32;
    pub fn peft_lora_apply(
        module: *const c_char,
        leases: *const *const peft_lease,
        lease_count: usize,
        row_lease: *const i32,
        x: *const c_void,
        x_dtype: i32,
        rows: u64,
        in_features: u64,
        y: *mut c_void,
        y_dtype: i32,
        out_features: u64,
    ) -> *mut peft_error;
    pub fn peft_host_model_new(out: *mut *mut peft_host_model) -> *mut peft_error;
    pub fn peft_host_model_free(host: *mut peft_host_model);
    pub fn peft_host_model_set_translator(host: *mut peft_host_model, translator: *const peft_translator)
        -> *mut peft_error;
    pub fn peft_host_model_set_exact(host: *mut peft_host_model, exact: i32) -> *mut peft_error;
    pub fn peft_host_model_add_weight(
        host: *mut peft_host_model,
        name: *const c_char,
        data: *mut c_void,
        dtype: i32,
        shape: *const u64,
        ndim: usize,
        bias: *mut c_void,
        bias_dtype: i32,
        bias_elements: u64,
    ) -> *mut peft_error;
    pub fn peft_host_model_swap(
        host: *mut peft_host_model,
        lease: *const peft_lease,
        weight: f64,
        stats: *mut peft_swap_stats,
    ) -> *mut peft_error;
    pub fn peft_host_model_current(host: *const peft_host_model) -> *const c_char;
    pub fn peft_merge_options_set_require_config(opts: *mut peft_merge_options, require: i32) -> *mut peft_error;
    pub fn peft_merge_options_set_allow_nonfinite(opts: *mut peft_merge_options, allow: i32) -> *mut peft_error;

    // ---- hub cache
    pub fn peft_hub_resolve(id_or_path: *const c_char, out_dir: *mut *mut c_char) -> *mut peft_error;
    pub fn peft_hub_cache_dir(out_dir: *mut *mut c_char) -> *mut peft_error;
    // ---- the adapter doctor
    pub fn peft_adapter_doctor(adapter_dir: *const c_char, base_dir: *const c_char, out_json: *mut *mut c_char)
        -> *mut peft_error;
    pub fn peft_adapter_doctor_fix(
        adapter_dir: *const c_char,
        base_dir: *const c_char,
        out_dir: *const c_char,
        out_json: *mut *mut c_char,
    ) -> *mut peft_error;

    // ---- GGUF files
    pub fn peft_checkpoint_file_format(ckpt: *const peft_checkpoint, file_index: usize) -> i32;
    pub fn peft_checkpoint_gguf_version(ckpt: *const peft_checkpoint, file_index: usize) -> u32;
    pub fn peft_checkpoint_tensor_ggml_type(ckpt: *const peft_checkpoint, index: usize) -> i32;
    pub fn peft_ggml_type_name(ggml_type: i32) -> *const c_char;
    pub fn peft_ggml_type_from_name(name: *const c_char) -> i32;
    pub fn peft_ggml_type_geometry(ggml_type: i32, out_block_size: *mut u32, out_type_size: *mut u32)
        -> *mut peft_error;
    pub fn peft_checkpoint_gguf_kv_count(ckpt: *const peft_checkpoint, file_index: usize) -> usize;
    pub fn peft_checkpoint_gguf_kv_key(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> *const c_char;
    pub fn peft_checkpoint_gguf_kv_find(
        ckpt: *const peft_checkpoint,
        file_index: usize,
        key: *const c_char,
        out_kv: *mut usize,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_gguf_kv_type(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> i32;
    pub fn peft_checkpoint_gguf_kv_array_type(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> i32;
    pub fn peft_checkpoint_gguf_kv_array_length(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> u64;
    pub fn peft_checkpoint_gguf_kv_int(
        ckpt: *const peft_checkpoint,
        file_index: usize,
        kv: usize,
        element: u64,
        out: *mut i64,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_gguf_kv_uint(
        ckpt: *const peft_checkpoint,
        file_index: usize,
        kv: usize,
        element: u64,
        out: *mut u64,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_gguf_kv_float(
        ckpt: *const peft_checkpoint,
        file_index: usize,
        kv: usize,
        element: u64,
        out: *mut f64,
    ) -> *mut peft_error;
    pub fn peft_checkpoint_gguf_kv_string(
        ckpt: *const peft_checkpoint,
        file_index: usize,
        kv: usize,
        element: u64,
        out_data: *mut *const c_char,
        out_length: *mut usize,
    ) -> *mut peft_error;
    pub fn peft_adapter_export_gguf(
        adapter: *const peft_adapter,
        out_path: *const c_char,
        base: *const c_char,
        ggml_type: i32,
    ) -> *mut peft_error;
    pub fn peft_adapter_import_gguf(
        gguf_path: *const c_char,
        out_dir: *const c_char,
        base: *const c_char,
    ) -> *mut peft_error;
    pub fn peft_translator_from_gguf(
        checkpoint: *const peft_checkpoint,
        out: *mut *mut peft_translator,
    ) -> *mut peft_error;
    pub fn peft_translator_new_gguf(
        architecture: *const c_char,
        head_count: u64,
        head_count_kv: u64,
        out: *mut *mut peft_translator,
    ) -> *mut peft_error;
    pub fn peft_adapter_export_gguf_split(
        adapter: *const peft_adapter,
        out_path: *const c_char,
        base: *const c_char,
        ggml_type: i32,
        base_out: *const c_char,
    ) -> *mut peft_error;
    pub fn peft_registry_set_base_weight(
        registry: *mut peft_registry,
        name: *const c_char,
        data: *const c_void,
        dtype: i32,
        shape: *const u64,
        ndim: usize,
        bias: *const c_void,
        bias_dtype: i32,
        bias_elements: u64,
    ) -> *mut peft_error;
    pub fn peft_registry_base_weights_changed(registry: *mut peft_registry) -> *mut peft_error;
    pub fn peft_lowrank_options_new(out: *mut *mut peft_lowrank_options) -> *mut peft_error;
    pub fn peft_lowrank_options_free(opts: *mut peft_lowrank_options);
    pub fn peft_lowrank_options_set_rank(opts: *mut peft_lowrank_options, rank: i64) -> *mut peft_error;
    pub fn peft_lowrank_options_set_energy(opts: *mut peft_lowrank_options, fraction: f64) -> *mut peft_error;
    pub fn peft_lowrank_options_set_svd(opts: *mut peft_lowrank_options, method: i32) -> *mut peft_error;
    pub fn peft_lowrank_options_set_threads(opts: *mut peft_lowrank_options, threads: u32) -> *mut peft_error;
    pub fn peft_lowrank_options_set_dtype(opts: *mut peft_lowrank_options, dtype: i32) -> *mut peft_error;
    pub fn peft_lowrank_options_set_modules(
        opts: *mut peft_lowrank_options,
        names: *const *const c_char,
        count: usize,
    ) -> *mut peft_error;
    pub fn peft_lowrank_report_module_count(report: *const peft_lowrank_report) -> usize;
    pub fn peft_lowrank_report_module_name(report: *const peft_lowrank_report, index: usize) -> *const c_char;
    pub fn peft_lowrank_report_module_rank(report: *const peft_lowrank_report, index: usize) -> i64;
    pub fn peft_lowrank_report_module_error(report: *const peft_lowrank_report, index: usize) -> f64;
    pub fn peft_lowrank_report_free(report: *mut peft_lowrank_report);
    pub fn peft_adapter_extract(
        base: *const c_char,
        tuned: *const c_char,
        out_dir: *const c_char,
        opts: *const peft_lowrank_options,
        out_report: *mut *mut peft_lowrank_report,
    ) -> *mut peft_error;
    pub fn peft_adapter_convert_to_lora(
        adapter: *const peft_adapter,
        out_dir: *const c_char,
        opts: *const peft_lowrank_options,
        out_report: *mut *mut peft_lowrank_report,
    ) -> *mut peft_error;
    pub fn peft_adapter_convert_initial(
        tuned_dir: *const c_char,
        initial_dir: *const c_char,
        out_dir: *const c_char,
        opts: *const peft_export_options,
    ) -> *mut peft_error;
    pub fn peft_merge_options_set_quant(opts: *mut peft_merge_options, ggml_type: i32) -> *mut peft_error;
    pub fn peft_merge_options_set_report(opts: *mut peft_merge_options, report: i32) -> *mut peft_error;
    pub fn peft_merge_result_report_json(result: *const peft_merge_result) -> *const c_char;
    pub fn peft_lowrank_options_set_base(opts: *mut peft_lowrank_options, base_dir: *const c_char) -> *mut peft_error;
    pub fn peft_merge_options_set_arithmetic(opts: *mut peft_merge_options, arithmetic: i32) -> *mut peft_error;
    pub fn peft_merge_options_set_tied_embeddings(opts: *mut peft_merge_options, policy: i32) -> *mut peft_error;
    pub fn peft_export_options_set_combine_density(opts: *mut peft_export_options, density: f64) -> *mut peft_error;
    pub fn peft_export_options_set_combine_majority_sign(opts: *mut peft_export_options, method: i32) -> *mut peft_error;
    pub fn peft_export_options_set_combine_seed(opts: *mut peft_export_options, seed: u64) -> *mut peft_error;
    pub fn peft_merge_options_set_join_split(opts: *mut peft_merge_options, join: i32) -> *mut peft_error;
    pub fn peft_export_options_set_combine_svd_rank(opts: *mut peft_export_options, rank: i64) -> *mut peft_error;
    pub fn peft_export_options_set_combine_svd_clamp(opts: *mut peft_export_options, quantile: f64) -> *mut peft_error;
    pub fn peft_adapter_combine_deltas(
        adapters: *const *const peft_adapter,
        weights: *const f64,
        count: usize,
        method: i32,
        out_dir: *const c_char,
        combine_opts: *const peft_export_options,
        opts: *const peft_lowrank_options,
        out_report: *mut *mut peft_lowrank_report,
    ) -> *mut peft_error;
    pub fn peft_model_combine(
        base_dir: *const c_char,
        models: *const *const c_char,
        weights: *const f64,
        count: usize,
        method: i32,
        out_dir: *const c_char,
        combine_opts: *const peft_export_options,
        opts: *const peft_merge_options,
        out_result: *mut *mut peft_merge_result,
    ) -> *mut peft_error;

    // ---- control vectors
    pub fn peft_control_vector_open(path: *const c_char, out: *mut *mut peft_control_vector) -> *mut peft_error;
    pub fn peft_control_vector_new(
        n_embd: u64,
        model_hint: *const c_char,
        out: *mut *mut peft_control_vector,
    ) -> *mut peft_error;
    pub fn peft_control_vector_free(vector: *mut peft_control_vector);
    pub fn peft_control_vector_n_embd(vector: *const peft_control_vector) -> u64;
    pub fn peft_control_vector_model_hint(vector: *const peft_control_vector) -> *const c_char;
    pub fn peft_control_vector_layer_count(vector: *const peft_control_vector) -> usize;
    pub fn peft_control_vector_layer(vector: *const peft_control_vector, index: usize) -> i64;
    pub fn peft_control_vector_direction(vector: *const peft_control_vector, layer: i64) -> *const f32;
    pub fn peft_control_vector_set_direction(
        vector: *mut peft_control_vector,
        layer: i64,
        dtype: i32,
        data: *const c_void,
    ) -> *mut peft_error;
    pub fn peft_control_vector_add(
        dst: *mut peft_control_vector,
        src: *const peft_control_vector,
        strength: f64,
    ) -> *mut peft_error;
    pub fn peft_control_vector_save(vector: *const peft_control_vector, path: *const c_char, format: i32) -> *mut peft_error;
    pub fn peft_control_vector_apply(
        vector: *const peft_control_vector,
        layer: i64,
        strength: f64,
        data: *mut c_void,
        dtype: i32,
        rows: u64,
        out: *mut *mut peft_control_record,
    ) -> *mut peft_error;
    pub fn peft_control_record_remove(record: *mut peft_control_record, data: *mut c_void) -> *mut peft_error;
    pub fn peft_control_record_free(record: *mut peft_control_record);

    // ---- merge: adapters combined on their deltas
    pub fn peft_merge_options_set_combine(
        opts: *mut peft_merge_options,
        method: i32,
        combine_opts: *const peft_export_options,
    ) -> *mut peft_error;

    // ---- api table
    pub fn peft_get_api(abi_version: u32) -> *const peft_api;
}

value_structs! {
    /// Counters of a registry (`peft_registry_get_stats`).
    pub struct peft_registry_stats {
        /// Set by the caller to `size_of::<peft_registry_stats>()`; fields past it are not written.
        pub size: u64,
        /// The byte budget.
        pub budget_bytes: u64,
        /// Bytes of adapter tensors in memory now (never above the budget).
        pub loaded_bytes: u64,
        /// The highest `loaded_bytes` seen.
        pub peak_loaded_bytes: u64,
        /// Names registered now.
        pub registered: u64,
        /// Adapter versions in memory now (replaced versions still leased included).
        pub loaded: u64,
        /// Of those, versions held by at least one lease or host model.
        pub pinned: u64,
        /// Loads of tensors since the registry was made.
        pub loads: u64,
        /// Acquisitions that found the tensors in memory.
        pub hits: u64,
        /// Loaded versions evicted to make room or by `peft_registry_trim`.
        pub evictions: u64,
    }

    /// What a swap did (`peft_host_model_swap`).
    pub struct peft_swap_stats {
        /// Set by the caller to `size_of::<peft_swap_stats>()`; fields past it are not written.
        pub size: u64,
        /// Wall time taking the previous adapter out.
        pub remove_seconds: f64,
        /// Wall time merging the new adapter in.
        pub merge_seconds: f64,
        /// Layers of the previous adapter taken out.
        pub layers_removed: u64,
        /// Layers of the new adapter merged in.
        pub layers_merged: u64,
        /// Bytes of original rows kept for the next exact removal.
        pub saved_bytes: u64,
    }
}

/// The structs declared in this crate with their fields in order.
#[doc(hidden)]
pub const STRUCTS: &[(&str, &[Field])] =
    &[peft_registry_stats::DECLARATION, peft_swap_stats::DECLARATION, peft_api::DECLARATION];

api_table! {
    /// Every function of the header in a stable, append-only order (see `peft_get_api`): what a
    /// host that loads the library with `dlopen` needs. Read only the entries within `size` bytes.
    pub struct peft_api {
        values {
            /// The ABI version this table implements (`PEFT_ABI_VERSION`).
            pub abi: u32,
            /// `sizeof(peft_api)` in the library that filled the table.
            pub size: u32,
        }
        pub fn version() -> *const c_char = peft_version;
        pub fn version_number() -> u32 = peft_version_number;
        pub fn abi_version() -> u32 = peft_abi_version;
        pub fn error_code(err: *const peft_error) -> i32 = peft_error_code;
        pub fn error_message(err: *const peft_error) -> *const c_char = peft_error_message;
        pub fn error_free(err: *mut peft_error) = peft_error_free;
        pub fn error_code_name(code: i32) -> *const c_char = peft_error_code_name;
        pub fn dtype_name(dtype: i32) -> *const c_char = peft_dtype_name;
        pub fn dtype_from_name(name: *const c_char) -> i32 = peft_dtype_from_name;
        pub fn dtype_bits(dtype: i32) -> u32 = peft_dtype_bits;
        pub fn convert(src_dtype: i32, src: *const c_void, dst_dtype: i32, dst: *mut c_void, count: u64) -> *mut peft_error = peft_convert;
        pub fn open_options_new(out: *mut *mut peft_open_options) -> *mut peft_error = peft_open_options_new;
        pub fn open_options_free(opts: *mut peft_open_options) = peft_open_options_free;
        pub fn open_options_set_max_header_size(opts: *mut peft_open_options, max_bytes: u64) -> *mut peft_error = peft_open_options_set_max_header_size;
        pub fn open_options_set_use_pread(opts: *mut peft_open_options, use_pread: i32) -> *mut peft_error = peft_open_options_set_use_pread;
        pub fn checkpoint_open(path: *const c_char, opts: *const peft_open_options, out: *mut *mut peft_checkpoint) -> *mut peft_error = peft_checkpoint_open;
        pub fn checkpoint_open_memory(data: *const c_void, size: usize, opts: *const peft_open_options, out: *mut *mut peft_checkpoint) -> *mut peft_error = peft_checkpoint_open_memory;
        pub fn checkpoint_free(ckpt: *mut peft_checkpoint) = peft_checkpoint_free;
        pub fn checkpoint_file_count(ckpt: *const peft_checkpoint) -> usize = peft_checkpoint_file_count;
        pub fn checkpoint_file_path(ckpt: *const peft_checkpoint, file_index: usize) -> *const c_char = peft_checkpoint_file_path;
        pub fn checkpoint_has_metadata(ckpt: *const peft_checkpoint, file_index: usize) -> i32 = peft_checkpoint_has_metadata;
        pub fn checkpoint_metadata_count(ckpt: *const peft_checkpoint, file_index: usize) -> usize = peft_checkpoint_metadata_count;
        pub fn checkpoint_metadata_key(ckpt: *const peft_checkpoint, file_index: usize, entry: usize) -> *const c_char = peft_checkpoint_metadata_key;
        pub fn checkpoint_metadata_value(ckpt: *const peft_checkpoint, file_index: usize, entry: usize) -> *const c_char = peft_checkpoint_metadata_value;
        pub fn checkpoint_index_metadata_json(ckpt: *const peft_checkpoint) -> *const c_char = peft_checkpoint_index_metadata_json;
        pub fn checkpoint_tensor_count(ckpt: *const peft_checkpoint) -> usize = peft_checkpoint_tensor_count;
        pub fn checkpoint_find(ckpt: *const peft_checkpoint, name: *const c_char, out_index: *mut usize) -> *mut peft_error = peft_checkpoint_find;
        pub fn checkpoint_find_n(ckpt: *const peft_checkpoint, name: *const c_char, name_length: usize, out_index: *mut usize) -> *mut peft_error = peft_checkpoint_find_n;
        pub fn checkpoint_tensor_name_length(ckpt: *const peft_checkpoint, index: usize) -> usize = peft_checkpoint_tensor_name_length;
        pub fn checkpoint_tensor_name(ckpt: *const peft_checkpoint, index: usize) -> *const c_char = peft_checkpoint_tensor_name;
        pub fn checkpoint_tensor_dtype(ckpt: *const peft_checkpoint, index: usize) -> i32 = peft_checkpoint_tensor_dtype;
        pub fn checkpoint_tensor_ndim(ckpt: *const peft_checkpoint, index: usize) -> usize = peft_checkpoint_tensor_ndim;
        pub fn checkpoint_tensor_shape(ckpt: *const peft_checkpoint, index: usize) -> *const u64 = peft_checkpoint_tensor_shape;
        pub fn checkpoint_tensor_offsets(ckpt: *const peft_checkpoint, index: usize, out_begin: *mut u64, out_end: *mut u64) -> *mut peft_error = peft_checkpoint_tensor_offsets;
        pub fn checkpoint_tensor_file(ckpt: *const peft_checkpoint, index: usize) -> usize = peft_checkpoint_tensor_file;
        pub fn checkpoint_tensor_view(ckpt: *const peft_checkpoint, index: usize, out_data: *mut *const c_void, out_nbytes: *mut u64) -> *mut peft_error = peft_checkpoint_tensor_view;
        pub fn checkpoint_tensor_read(ckpt: *const peft_checkpoint, index: usize, dtype: i32, dst: *mut c_void, dst_nbytes: u64) -> *mut peft_error = peft_checkpoint_tensor_read;
        pub fn writer_new(path: *const c_char, out: *mut *mut peft_writer) -> *mut peft_error = peft_writer_new;
        pub fn writer_new_checkpoint(folder: *const c_char, max_shard_size: u64, out: *mut *mut peft_writer) -> *mut peft_error = peft_writer_new_checkpoint;
        pub fn writer_free(writer: *mut peft_writer) = peft_writer_free;
        pub fn writer_add_tensor(writer: *mut peft_writer, name: *const c_char, dtype: i32, shape: *const u64, ndim: usize) -> *mut peft_error = peft_writer_add_tensor;
        pub fn writer_add_tensor_n(writer: *mut peft_writer, name: *const c_char, name_length: usize, dtype: i32, shape: *const u64, ndim: usize) -> *mut peft_error = peft_writer_add_tensor_n;
        pub fn writer_set_metadata_present(writer: *mut peft_writer, present: i32) -> *mut peft_error = peft_writer_set_metadata_present;
        pub fn writer_set_metadata(writer: *mut peft_writer, key: *const c_char, value: *const c_char) -> *mut peft_error = peft_writer_set_metadata;
        pub fn writer_break_shard(writer: *mut peft_writer) -> *mut peft_error = peft_writer_break_shard;
        pub fn writer_set_index_metadata_json(writer: *mut peft_writer, json_object: *const c_char) -> *mut peft_error = peft_writer_set_index_metadata_json;
        pub fn writer_start(writer: *mut peft_writer) -> *mut peft_error = peft_writer_start;
        pub fn writer_tensor_count(writer: *const peft_writer) -> usize = peft_writer_tensor_count;
        pub fn writer_tensor_name(writer: *const peft_writer, position: usize) -> *const c_char = peft_writer_tensor_name;
        pub fn writer_tensor_name_length(writer: *const peft_writer, position: usize) -> usize = peft_writer_tensor_name_length;
        pub fn writer_tensor_declaration(writer: *const peft_writer, position: usize) -> usize = peft_writer_tensor_declaration;
        pub fn writer_file_count(writer: *const peft_writer) -> usize = peft_writer_file_count;
        pub fn writer_file_path(writer: *const peft_writer, file_index: usize) -> *const c_char = peft_writer_file_path;
        pub fn writer_begin_tensor(writer: *mut peft_writer, name: *const c_char, src_dtype: i32) -> *mut peft_error = peft_writer_begin_tensor;
        pub fn writer_write(writer: *mut peft_writer, data: *const c_void, nbytes: u64) -> *mut peft_error = peft_writer_write;
        pub fn writer_write_tensor(writer: *mut peft_writer, name: *const c_char, src_dtype: i32, data: *const c_void, nbytes: u64) -> *mut peft_error = peft_writer_write_tensor;
        pub fn writer_write_from_callback(writer: *mut peft_writer, name: *const c_char, src_dtype: i32, source: peft_tensor_source_fn, user_data: *mut c_void) -> *mut peft_error = peft_writer_write_from_callback;
        pub fn writer_write_from_checkpoint(writer: *mut peft_writer, name: *const c_char, ckpt: *const peft_checkpoint, index: usize) -> *mut peft_error = peft_writer_write_from_checkpoint;
        pub fn writer_finish(writer: *mut peft_writer) -> *mut peft_error = peft_writer_finish;
        pub fn string_free(text: *mut c_char) = peft_string_free;
        pub fn adapter_options_new(out: *mut *mut peft_adapter_options) -> *mut peft_error = peft_adapter_options_new;
        pub fn adapter_options_free(opts: *mut peft_adapter_options) = peft_adapter_options_free;
        pub fn adapter_options_set_base_dir(opts: *mut peft_adapter_options, base_dir: *const c_char) -> *mut peft_error = peft_adapter_options_set_base_dir;
        pub fn adapter_options_set_translator(opts: *mut peft_adapter_options, translator: *const peft_translator) -> *mut peft_error = peft_adapter_options_set_translator;
        pub fn adapter_open(dir: *const c_char, opts: *const peft_adapter_options, out: *mut *mut peft_adapter) -> *mut peft_error = peft_adapter_open;
        pub fn adapter_free(adapter: *mut peft_adapter) = peft_adapter_free;
        pub fn adapter_validate(adapter: *const peft_adapter, base_dir: *const c_char) -> *mut peft_error = peft_adapter_validate;
        pub fn adapter_config_json(adapter: *const peft_adapter) -> *const c_char = peft_adapter_config_json;
        pub fn adapter_config_field(adapter: *const peft_adapter, field: *const c_char) -> *const c_char = peft_adapter_config_field;
        pub fn adapter_r(adapter: *const peft_adapter) -> i64 = peft_adapter_r;
        pub fn adapter_lora_alpha(adapter: *const peft_adapter) -> f64 = peft_adapter_lora_alpha;
        pub fn adapter_use_rslora(adapter: *const peft_adapter) -> i32 = peft_adapter_use_rslora;
        pub fn adapter_use_dora(adapter: *const peft_adapter) -> i32 = peft_adapter_use_dora;
        pub fn adapter_lora_bias(adapter: *const peft_adapter) -> i32 = peft_adapter_lora_bias;
        pub fn adapter_fan_in_fan_out(adapter: *const peft_adapter) -> i32 = peft_adapter_fan_in_fan_out;
        pub fn adapter_peft_type(adapter: *const peft_adapter) -> *const c_char = peft_adapter_peft_type;
        pub fn adapter_bias(adapter: *const peft_adapter) -> *const c_char = peft_adapter_bias;
        pub fn adapter_task_type(adapter: *const peft_adapter) -> *const c_char = peft_adapter_task_type;
        pub fn adapter_base_model_name_or_path(adapter: *const peft_adapter) -> *const c_char = peft_adapter_base_model_name_or_path;
        pub fn adapter_family(adapter: *const peft_adapter) -> *const c_char = peft_adapter_family;
        pub fn adapter_translator(adapter: *const peft_adapter, out: *mut *mut peft_translator) -> *mut peft_error = peft_adapter_translator;
        pub fn adapter_note_count(adapter: *const peft_adapter) -> usize = peft_adapter_note_count;
        pub fn adapter_note(adapter: *const peft_adapter, index: usize) -> *const c_char = peft_adapter_note;
        pub fn adapter_module_count(adapter: *const peft_adapter) -> usize = peft_adapter_module_count;
        pub fn adapter_find_module(adapter: *const peft_adapter, name: *const c_char, out_index: *mut usize) -> *mut peft_error = peft_adapter_find_module;
        pub fn adapter_module_name(adapter: *const peft_adapter, module: usize) -> *const c_char = peft_adapter_module_name;
        pub fn adapter_module_kind(adapter: *const peft_adapter, module: usize) -> i32 = peft_adapter_module_kind;
        pub fn adapter_module_rank(adapter: *const peft_adapter, module: usize) -> i64 = peft_adapter_module_rank;
        pub fn adapter_module_alpha(adapter: *const peft_adapter, module: usize) -> f64 = peft_adapter_module_alpha;
        pub fn adapter_module_scaling(adapter: *const peft_adapter, module: usize) -> f64 = peft_adapter_module_scaling;
        pub fn adapter_module_tensor_count(adapter: *const peft_adapter, module: usize) -> usize = peft_adapter_module_tensor_count;
        pub fn adapter_module_tensor_role(adapter: *const peft_adapter, module: usize, tensor: usize) -> *const c_char = peft_adapter_module_tensor_role;
        pub fn adapter_module_tensor_key(adapter: *const peft_adapter, module: usize, tensor: usize) -> *const c_char = peft_adapter_module_tensor_key;
        pub fn adapter_module_tensor_base_name(adapter: *const peft_adapter, module: usize, tensor: usize) -> *const c_char = peft_adapter_module_tensor_base_name;
        pub fn adapter_module_tensor_dtype(adapter: *const peft_adapter, module: usize, tensor: usize) -> i32 = peft_adapter_module_tensor_dtype;
        pub fn adapter_module_tensor_ndim(adapter: *const peft_adapter, module: usize, tensor: usize) -> usize = peft_adapter_module_tensor_ndim;
        pub fn adapter_module_tensor_shape(adapter: *const peft_adapter, module: usize, tensor: usize) -> *const u64 = peft_adapter_module_tensor_shape;
        pub fn adapter_module_tensor_read(adapter: *const peft_adapter, module: usize, tensor: usize, dtype: i32, dst: *mut c_void, dst_nbytes: u64) -> *mut peft_error = peft_adapter_module_tensor_read;
        pub fn adapter_module_token_indices(adapter: *const peft_adapter, module: usize, out_count: *mut usize) -> *const i64 = peft_adapter_module_token_indices;
        pub fn translator_new_builtin(family: *const c_char, out: *mut *mut peft_translator) -> *mut peft_error = peft_translator_new_builtin;
        pub fn translator_from_file(path: *const c_char, out: *mut *mut peft_translator) -> *mut peft_error = peft_translator_from_file;
        pub fn translator_from_json(json: *const c_char, out: *mut *mut peft_translator) -> *mut peft_error = peft_translator_from_json;
        pub fn translator_detect(base_dir: *const c_char, model_name: *const c_char, out: *mut *mut peft_translator) -> *mut peft_error = peft_translator_detect;
        pub fn translator_builtin_families(out: *mut *mut c_char) -> *mut peft_error = peft_translator_builtin_families;
        pub fn translator_free(translator: *mut peft_translator) = peft_translator_free;
        pub fn translator_family(translator: *const peft_translator) -> *const c_char = peft_translator_family;
        pub fn translator_to_native(translator: *const peft_translator, hf_key: *const c_char, out: *mut *mut c_char) -> *mut peft_error = peft_translator_to_native;
        pub fn translator_to_hf(translator: *const peft_translator, native_key: *const c_char, with_peft_prefix: i32, out: *mut *mut c_char) -> *mut peft_error = peft_translator_to_hf;
        pub fn translator_to_native_batch(translator: *const peft_translator, hf_keys: *const *const c_char, count: usize, out: *mut *mut c_char) -> *mut peft_error = peft_translator_to_native_batch;
        pub fn translator_to_hf_batch(translator: *const peft_translator, native_keys: *const *const c_char, count: usize, with_peft_prefix: i32, out: *mut *mut c_char) -> *mut peft_error = peft_translator_to_hf_batch;
        pub fn merge_options_new(out: *mut *mut peft_merge_options) -> *mut peft_error = peft_merge_options_new;
        pub fn merge_options_free(opts: *mut peft_merge_options) = peft_merge_options_free;
        pub fn merge_options_add_adapter(opts: *mut peft_merge_options, adapter: *const peft_adapter, weight: f64) -> *mut peft_error = peft_merge_options_add_adapter;
        pub fn merge_options_add_adapter_dir(opts: *mut peft_merge_options, dir: *const c_char, weight: f64) -> *mut peft_error = peft_merge_options_add_adapter_dir;
        pub fn merge_options_set_dtype(opts: *mut peft_merge_options, dtype: i32) -> *mut peft_error = peft_merge_options_set_dtype;
        pub fn merge_options_set_max_shard_size(opts: *mut peft_merge_options, max_shard_size: u64) -> *mut peft_error = peft_merge_options_set_max_shard_size;
        pub fn merge_options_set_threads(opts: *mut peft_merge_options, threads: u32) -> *mut peft_error = peft_merge_options_set_threads;
        pub fn merge_options_set_progress(opts: *mut peft_merge_options, fn_: peft_progress_fn, user_data: *mut c_void) -> *mut peft_error = peft_merge_options_set_progress;
        pub fn merge_checkpoint(base_dir: *const c_char, out_dir: *const c_char, opts: *const peft_merge_options, out_result: *mut *mut peft_merge_result) -> *mut peft_error = peft_merge_checkpoint;
        pub fn merge_result_free(result: *mut peft_merge_result) = peft_merge_result_free;
        pub fn merge_result_tensor_count(result: *const peft_merge_result, which: i32) -> u64 = peft_merge_result_tensor_count;
        pub fn merge_result_bytes(result: *const peft_merge_result) -> u64 = peft_merge_result_bytes;
        pub fn merge_result_file_count(result: *const peft_merge_result) -> usize = peft_merge_result_file_count;
        pub fn merge_result_file_name(result: *const peft_merge_result, index: usize) -> *const c_char = peft_merge_result_file_name;
        pub fn merge_result_untied_embeddings(result: *const peft_merge_result) -> i32 = peft_merge_result_untied_embeddings;
        pub fn merge_result_note_count(result: *const peft_merge_result) -> usize = peft_merge_result_note_count;
        pub fn merge_result_note(result: *const peft_merge_result, index: usize) -> *const c_char = peft_merge_result_note;
        pub fn merge_buffer_options_new(out: *mut *mut peft_merge_buffer_options) -> *mut peft_error = peft_merge_buffer_options_new;
        pub fn merge_buffer_options_free(opts: *mut peft_merge_buffer_options) = peft_merge_buffer_options_free;
        pub fn merge_buffer_options_set_weight(opts: *mut peft_merge_buffer_options, weight: f64) -> *mut peft_error = peft_merge_buffer_options_set_weight;
        pub fn merge_buffer_options_set_keep_original_rows(opts: *mut peft_merge_buffer_options, keep: i32) -> *mut peft_error = peft_merge_buffer_options_set_keep_original_rows;
        pub fn merge_buffer_options_set_threads(opts: *mut peft_merge_buffer_options, threads: u32) -> *mut peft_error = peft_merge_buffer_options_set_threads;
        pub fn merge_buffer_options_set_translator(opts: *mut peft_merge_buffer_options, translator: *const peft_translator) -> *mut peft_error = peft_merge_buffer_options_set_translator;
        pub fn merge_buffer_apply(adapter: *const peft_adapter, name: *const c_char, data: *mut c_void, dtype: i32, shape: *const u64, ndim: usize, bias: *mut c_void, bias_dtype: i32, opts: *const peft_merge_buffer_options, out: *mut *mut peft_merge_record) -> *mut peft_error = peft_merge_buffer_apply;
        pub fn merge_buffer_remove(record: *mut peft_merge_record, data: *mut c_void, bias: *mut c_void) -> *mut peft_error = peft_merge_buffer_remove;
        pub fn merge_record_free(record: *mut peft_merge_record) = peft_merge_record_free;
        pub fn merge_record_module(record: *const peft_merge_record) -> *const c_char = peft_merge_record_module;
        pub fn merge_record_active(record: *const peft_merge_record) -> i32 = peft_merge_record_active;
        pub fn merge_record_saved_bytes(record: *const peft_merge_record) -> u64 = peft_merge_record_saved_bytes;
        pub fn export_options_new(out: *mut *mut peft_export_options) -> *mut peft_error = peft_export_options_new;
        pub fn export_options_free(opts: *mut peft_export_options) = peft_export_options_free;
        pub fn export_options_set_dtype(opts: *mut peft_export_options, dtype: i32) -> *mut peft_error = peft_export_options_set_dtype;
        pub fn export_options_set_peft_version(opts: *mut peft_export_options, version: *const c_char) -> *mut peft_error = peft_export_options_set_peft_version;
        pub fn adapter_export(adapter: *const peft_adapter, out_dir: *const c_char, opts: *const peft_export_options) -> *mut peft_error = peft_adapter_export;
        pub fn adapter_combine(adapters: *const *const peft_adapter, weights: *const f64, count: usize, method: i32, out_dir: *const c_char, opts: *const peft_export_options) -> *mut peft_error = peft_adapter_combine;
        pub fn registry_new(storage_dtype: i32, budget_bytes: u64, translator: *const peft_translator, out: *mut *mut peft_registry) -> *mut peft_error = peft_registry_new;
        pub fn registry_free(registry: *mut peft_registry) = peft_registry_free;
        pub fn registry_register(registry: *mut peft_registry, name: *const c_char, dir: *const c_char, opts: *const peft_adapter_options) -> *mut peft_error = peft_registry_register;
        pub fn registry_register_memory(registry: *mut peft_registry, name: *const c_char, config_json: *const c_char, weights: *const c_void, weights_size: usize, opts: *const peft_adapter_options) -> *mut peft_error = peft_registry_register_memory;
        pub fn registry_unregister(registry: *mut peft_registry, name: *const c_char) -> *mut peft_error = peft_registry_unregister;
        pub fn registry_names(registry: *const peft_registry, out: *mut *mut c_char) -> *mut peft_error = peft_registry_names;
        pub fn registry_acquire(registry: *mut peft_registry, name: *const c_char, out: *mut *mut peft_lease) -> *mut peft_error = peft_registry_acquire;
        pub fn registry_trim(registry: *mut peft_registry) -> *mut peft_error = peft_registry_trim;
        pub fn registry_set_budget(registry: *mut peft_registry, budget_bytes: u64) -> *mut peft_error = peft_registry_set_budget;
        pub fn registry_get_stats(registry: *const peft_registry, stats: *mut peft_registry_stats) -> *mut peft_error = peft_registry_get_stats;
        pub fn lease_release(lease: *mut peft_lease) = peft_lease_release;
        pub fn lease_name(lease: *const peft_lease) -> *const c_char = peft_lease_name;
        pub fn lease_version(lease: *const peft_lease) -> u64 = peft_lease_version;
        pub fn lease_bytes(lease: *const peft_lease) -> u64 = peft_lease_bytes;
        pub fn lease_has_module(lease: *const peft_lease, module: *const c_char) -> i32 = peft_lease_has_module;
        pub fn lora_apply(module: *const c_char, leases: *const *const peft_lease, lease_count: usize, row_lease: *const i32, x: *const c_void, x_dtype: i32, rows: u64, in_features: u64, y: *mut c_void, y_dtype: i32, out_features: u64) -> *mut peft_error = peft_lora_apply;
        pub fn host_model_new(out: *mut *mut peft_host_model) -> *mut peft_error = peft_host_model_new;
        pub fn host_model_free(host: *mut peft_host_model) = peft_host_model_free;
        pub fn host_model_set_translator(host: *mut peft_host_model, translator: *const peft_translator) -> *mut peft_error = peft_host_model_set_translator;
        pub fn host_model_set_exact(host: *mut peft_host_model, exact: i32) -> *mut peft_error = peft_host_model_set_exact;
        pub fn host_model_add_weight(host: *mut peft_host_model, name: *const c_char, data: *mut c_void, dtype: i32, shape: *const u64, ndim: usize, bias: *mut c_void, bias_dtype: i32, bias_elements: u64) -> *mut peft_error = peft_host_model_add_weight;
        pub fn host_model_swap(host: *mut peft_host_model, lease: *const peft_lease, weight: f64, stats: *mut peft_swap_stats) -> *mut peft_error = peft_host_model_swap;
        pub fn host_model_current(host: *const peft_host_model) -> *const c_char = peft_host_model_current;
        pub fn kernels() -> *const c_char = peft_kernels;
        pub fn merge_options_set_require_config(opts: *mut peft_merge_options, require: i32) -> *mut peft_error = peft_merge_options_set_require_config;
        pub fn merge_options_set_allow_nonfinite(opts: *mut peft_merge_options, allow: i32) -> *mut peft_error = peft_merge_options_set_allow_nonfinite;
        pub fn string_list_count(list: *const peft_string_list) -> usize = peft_string_list_count;
        pub fn string_list_get(list: *const peft_string_list, index: usize) -> *const c_char = peft_string_list_get;
        pub fn string_list_free(list: *mut peft_string_list) = peft_string_list_free;
        pub fn translator_builtin_family_list(out: *mut *mut peft_string_list) -> *mut peft_error = peft_translator_builtin_family_list;
        pub fn registry_name_list(registry: *const peft_registry, out: *mut *mut peft_string_list) -> *mut peft_error = peft_registry_name_list;
        pub fn lease_free(lease: *mut peft_lease) = peft_lease_free;
        pub fn merge_record_unmerge(record: *mut peft_merge_record, data: *mut c_void, bias: *mut c_void) -> *mut peft_error = peft_merge_record_unmerge;
        pub fn hub_resolve(id_or_path: *const c_char, out_dir: *mut *mut c_char) -> *mut peft_error = peft_hub_resolve;
        pub fn hub_cache_dir(out_dir: *mut *mut c_char) -> *mut peft_error = peft_hub_cache_dir;
        pub fn adapter_options_set_lenient(opts: *mut peft_adapter_options, lenient: i32) -> *mut peft_error = peft_adapter_options_set_lenient;
        pub fn adapter_warning_count(adapter: *const peft_adapter) -> usize = peft_adapter_warning_count;
        pub fn adapter_warning(adapter: *const peft_adapter, index: usize) -> *const c_char = peft_adapter_warning;
        pub fn adapter_doctor(adapter_dir: *const c_char, base_dir: *const c_char, out_json: *mut *mut c_char) -> *mut peft_error = peft_adapter_doctor;
        pub fn adapter_doctor_fix(adapter_dir: *const c_char, base_dir: *const c_char, out_dir: *const c_char, out_json: *mut *mut c_char) -> *mut peft_error = peft_adapter_doctor_fix;
        pub fn registry_warning_list(registry: *const peft_registry, name: *const c_char, out: *mut *mut peft_string_list) -> *mut peft_error = peft_registry_warning_list;
        pub fn checkpoint_file_format(ckpt: *const peft_checkpoint, file_index: usize) -> i32 = peft_checkpoint_file_format;
        pub fn checkpoint_gguf_version(ckpt: *const peft_checkpoint, file_index: usize) -> u32 = peft_checkpoint_gguf_version;
        pub fn checkpoint_tensor_ggml_type(ckpt: *const peft_checkpoint, index: usize) -> i32 = peft_checkpoint_tensor_ggml_type;
        pub fn ggml_type_name(ggml_type: i32) -> *const c_char = peft_ggml_type_name;
        pub fn ggml_type_from_name(name: *const c_char) -> i32 = peft_ggml_type_from_name;
        pub fn ggml_type_geometry(ggml_type: i32, out_block_size: *mut u32, out_type_size: *mut u32) -> *mut peft_error = peft_ggml_type_geometry;
        pub fn checkpoint_gguf_kv_count(ckpt: *const peft_checkpoint, file_index: usize) -> usize = peft_checkpoint_gguf_kv_count;
        pub fn checkpoint_gguf_kv_key(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> *const c_char = peft_checkpoint_gguf_kv_key;
        pub fn checkpoint_gguf_kv_find(ckpt: *const peft_checkpoint, file_index: usize, key: *const c_char, out_kv: *mut usize) -> *mut peft_error = peft_checkpoint_gguf_kv_find;
        pub fn checkpoint_gguf_kv_type(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> i32 = peft_checkpoint_gguf_kv_type;
        pub fn checkpoint_gguf_kv_array_type(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> i32 = peft_checkpoint_gguf_kv_array_type;
        pub fn checkpoint_gguf_kv_array_length(ckpt: *const peft_checkpoint, file_index: usize, kv: usize) -> u64 = peft_checkpoint_gguf_kv_array_length;
        pub fn checkpoint_gguf_kv_int(ckpt: *const peft_checkpoint, file_index: usize, kv: usize, element: u64, out: *mut i64) -> *mut peft_error = peft_checkpoint_gguf_kv_int;
        pub fn checkpoint_gguf_kv_uint(ckpt: *const peft_checkpoint, file_index: usize, kv: usize, element: u64, out: *mut u64) -> *mut peft_error = peft_checkpoint_gguf_kv_uint;
        pub fn checkpoint_gguf_kv_float(ckpt: *const peft_checkpoint, file_index: usize, kv: usize, element: u64, out: *mut f64) -> *mut peft_error = peft_checkpoint_gguf_kv_float;
        pub fn checkpoint_gguf_kv_string(ckpt: *const peft_checkpoint, file_index: usize, kv: usize, element: u64, out_data: *mut *const c_char, out_length: *mut usize) -> *mut peft_error = peft_checkpoint_gguf_kv_string;
        pub fn adapter_export_gguf(adapter: *const peft_adapter, out_path: *const c_char, base: *const c_char, ggml_type: i32) -> *mut peft_error = peft_adapter_export_gguf;
        pub fn adapter_import_gguf(gguf_path: *const c_char, out_dir: *const c_char, base: *const c_char) -> *mut peft_error = peft_adapter_import_gguf;
        pub fn translator_from_gguf(checkpoint: *const peft_checkpoint, out: *mut *mut peft_translator) -> *mut peft_error = peft_translator_from_gguf;
        pub fn translator_new_gguf(architecture: *const c_char, head_count: u64, head_count_kv: u64, out: *mut *mut peft_translator) -> *mut peft_error = peft_translator_new_gguf;
        pub fn adapter_export_gguf_split(adapter: *const peft_adapter, out_path: *const c_char, base: *const c_char, ggml_type: i32, base_out: *const c_char) -> *mut peft_error = peft_adapter_export_gguf_split;
        pub fn registry_set_base_weight(registry: *mut peft_registry, name: *const c_char, data: *const c_void, dtype: i32, shape: *const u64, ndim: usize, bias: *const c_void, bias_dtype: i32, bias_elements: u64) -> *mut peft_error = peft_registry_set_base_weight;
        pub fn registry_base_weights_changed(registry: *mut peft_registry) -> *mut peft_error = peft_registry_base_weights_changed;
        pub fn lowrank_options_new(out: *mut *mut peft_lowrank_options) -> *mut peft_error = peft_lowrank_options_new;
        pub fn lowrank_options_free(opts: *mut peft_lowrank_options) = peft_lowrank_options_free;
        pub fn lowrank_options_set_rank(opts: *mut peft_lowrank_options, rank: i64) -> *mut peft_error = peft_lowrank_options_set_rank;
        pub fn lowrank_options_set_energy(opts: *mut peft_lowrank_options, fraction: f64) -> *mut peft_error = peft_lowrank_options_set_energy;
        pub fn lowrank_options_set_svd(opts: *mut peft_lowrank_options, method: i32) -> *mut peft_error = peft_lowrank_options_set_svd;
        pub fn lowrank_options_set_threads(opts: *mut peft_lowrank_options, threads: u32) -> *mut peft_error = peft_lowrank_options_set_threads;
        pub fn lowrank_options_set_dtype(opts: *mut peft_lowrank_options, dtype: i32) -> *mut peft_error = peft_lowrank_options_set_dtype;
        pub fn lowrank_options_set_modules(opts: *mut peft_lowrank_options, names: *const *const c_char, count: usize) -> *mut peft_error = peft_lowrank_options_set_modules;
        pub fn lowrank_report_module_count(report: *const peft_lowrank_report) -> usize = peft_lowrank_report_module_count;
        pub fn lowrank_report_module_name(report: *const peft_lowrank_report, index: usize) -> *const c_char = peft_lowrank_report_module_name;
        pub fn lowrank_report_module_rank(report: *const peft_lowrank_report, index: usize) -> i64 = peft_lowrank_report_module_rank;
        pub fn lowrank_report_module_error(report: *const peft_lowrank_report, index: usize) -> f64 = peft_lowrank_report_module_error;
        pub fn lowrank_report_free(report: *mut peft_lowrank_report) = peft_lowrank_report_free;
        pub fn adapter_extract(base: *const c_char, tuned: *const c_char, out_dir: *const c_char, opts: *const peft_lowrank_options, out_report: *mut *mut peft_lowrank_report) -> *mut peft_error = peft_adapter_extract;
        pub fn adapter_convert_to_lora(adapter: *const peft_adapter, out_dir: *const c_char, opts: *const peft_lowrank_options, out_report: *mut *mut peft_lowrank_report) -> *mut peft_error = peft_adapter_convert_to_lora;
        pub fn adapter_convert_initial(tuned_dir: *const c_char, initial_dir: *const c_char, out_dir: *const c_char, opts: *const peft_export_options) -> *mut peft_error = peft_adapter_convert_initial;
        pub fn merge_options_set_quant(opts: *mut peft_merge_options, ggml_type: i32) -> *mut peft_error = peft_merge_options_set_quant;
        pub fn merge_options_set_report(opts: *mut peft_merge_options, report: i32) -> *mut peft_error = peft_merge_options_set_report;
        pub fn merge_result_report_json(result: *const peft_merge_result) -> *const c_char = peft_merge_result_report_json;
        pub fn lowrank_options_set_base(opts: *mut peft_lowrank_options, base_dir: *const c_char) -> *mut peft_error = peft_lowrank_options_set_base;
        pub fn merge_options_set_arithmetic(opts: *mut peft_merge_options, arithmetic: i32) -> *mut peft_error = peft_merge_options_set_arithmetic;
        pub fn merge_options_set_tied_embeddings(opts: *mut peft_merge_options, policy: i32) -> *mut peft_error = peft_merge_options_set_tied_embeddings;
        pub fn export_options_set_combine_density(opts: *mut peft_export_options, density: f64) -> *mut peft_error = peft_export_options_set_combine_density;
        pub fn export_options_set_combine_majority_sign(opts: *mut peft_export_options, method: i32) -> *mut peft_error = peft_export_options_set_combine_majority_sign;
        pub fn export_options_set_combine_seed(opts: *mut peft_export_options, seed: u64) -> *mut peft_error = peft_export_options_set_combine_seed;
        pub fn merge_options_set_join_split(opts: *mut peft_merge_options, join: i32) -> *mut peft_error = peft_merge_options_set_join_split;
        pub fn export_options_set_combine_svd_rank(opts: *mut peft_export_options, rank: i64) -> *mut peft_error = peft_export_options_set_combine_svd_rank;
        pub fn export_options_set_combine_svd_clamp(opts: *mut peft_export_options, quantile: f64) -> *mut peft_error = peft_export_options_set_combine_svd_clamp;
        pub fn adapter_combine_deltas(adapters: *const *const peft_adapter, weights: *const f64, count: usize, method: i32, out_dir: *const c_char, combine_opts: *const peft_export_options, opts: *const peft_lowrank_options, out_report: *mut *mut peft_lowrank_report) -> *mut peft_error = peft_adapter_combine_deltas;
        pub fn model_combine(base_dir: *const c_char, models: *const *const c_char, weights: *const f64, count: usize, method: i32, out_dir: *const c_char, combine_opts: *const peft_export_options, opts: *const peft_merge_options, out_result: *mut *mut peft_merge_result) -> *mut peft_error = peft_model_combine;
        pub fn control_vector_open(path: *const c_char, out: *mut *mut peft_control_vector) -> *mut peft_error = peft_control_vector_open;
        pub fn control_vector_new(n_embd: u64, model_hint: *const c_char, out: *mut *mut peft_control_vector) -> *mut peft_error = peft_control_vector_new;
        pub fn control_vector_free(vector: *mut peft_control_vector) = peft_control_vector_free;
        pub fn control_vector_n_embd(vector: *const peft_control_vector) -> u64 = peft_control_vector_n_embd;
        pub fn control_vector_model_hint(vector: *const peft_control_vector) -> *const c_char = peft_control_vector_model_hint;
        pub fn control_vector_layer_count(vector: *const peft_control_vector) -> usize = peft_control_vector_layer_count;
        pub fn control_vector_layer(vector: *const peft_control_vector, index: usize) -> i64 = peft_control_vector_layer;
        pub fn control_vector_direction(vector: *const peft_control_vector, layer: i64) -> *const f32 = peft_control_vector_direction;
        pub fn control_vector_set_direction(vector: *mut peft_control_vector, layer: i64, dtype: i32, data: *const c_void) -> *mut peft_error = peft_control_vector_set_direction;
        pub fn control_vector_add(dst: *mut peft_control_vector, src: *const peft_control_vector, strength: f64) -> *mut peft_error = peft_control_vector_add;
        pub fn control_vector_save(vector: *const peft_control_vector, path: *const c_char, format: i32) -> *mut peft_error = peft_control_vector_save;
        pub fn control_vector_apply(vector: *const peft_control_vector, layer: i64, strength: f64, data: *mut c_void, dtype: i32, rows: u64, out: *mut *mut peft_control_record) -> *mut peft_error = peft_control_vector_apply;
        pub fn control_record_remove(record: *mut peft_control_record, data: *mut c_void) -> *mut peft_error = peft_control_record_remove;
        pub fn control_record_free(record: *mut peft_control_record) = peft_control_record_free;
        pub fn merge_options_set_combine(opts: *mut peft_merge_options, method: i32, combine_opts: *const peft_export_options) -> *mut peft_error = peft_merge_options_set_combine;
    }
}
