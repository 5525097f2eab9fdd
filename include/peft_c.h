/**
 * @file peft_c.h
 * @brief peft_c: read, translate, merge and export HuggingFace PEFT adapters and safetensors checkpoints.
 *
 * This is the only public header of peft_c. It is plain C99 and compiles unchanged as C++.
 *
 * @section contents Contents
 *
 * | Section | What it holds |
 * |---|---|
 * | @ref version | Version macros and the version of the library you run against. |
 * | @ref errors | The error object and its stable codes (`PEFT_ERR_*`). |
 * | @ref strings | Strings and lists the library returns, and how they are released. |
 * | @ref dtypes | The safetensors dtypes and conversions between them. |
 * | @ref reading | Opening, indexing and reading safetensors and GGUF files and checkpoints. |
 * | @ref gguf | GGUF files: their typed metadata, ggml types and block-quantized tensors. |
 * | @ref hub | Model ids resolved offline in the Hugging Face hub cache; its snapshots and incomplete downloads. |
 * | @ref writing | Writing safetensors files and checkpoint folders, atomically. |
 * | @ref adapter | PEFT LoRA adapters, translation of module names, validation against a base, the adapter doctor. |
 * | @ref merge | Merging adapters into checkpoints (streaming) and into host buffers, and back out. |
 * | @ref export | Writing adapters as PEFT does, combining several into one, extracting LoRA from fine-tuned checkpoints, converting adapters to plain LoRA. |
 * | @ref serving | A registry with a memory budget, hot swap, unmerged multi-adapter apply. |
 * | @ref plugin | The function table, for hosts that load the library with `dlopen`. |
 *
 * @section conventions Conventions (they hold for every function below)
 *
 * - **Handles are opaque.** Every object is an incomplete struct type, created by one function and
 *   released by `peft_<type>_free(p)`, which accepts NULL and returns nothing.
 * - **Names.** A function on a handle is named `peft_<type>_<verb>` after that handle, which is its
 *   first argument; constructors are `peft_<type>_new` or `peft_<type>_open`, destructors
 *   `peft_<type>_free`. An operation that makes its result from inputs rather than acting on one
 *   handle is named for the operation (peft_convert(), peft_merge_checkpoint(),
 *   peft_merge_buffer_apply(), peft_lora_apply()). Where an older name breaks these rules, the regular
 *   name was added beside it and the older one stays, documented as its alias, with the same
 *   behaviour (the function table keeps both).
 * - **Argument order.** The handle acted on (or the input it reads) first, then the other inputs,
 *   then options (NULL means the defaults), then a callback followed by its `user_data`, and
 *   out-parameters last.
 * - **Errors are objects.** A fallible call returns `peft_error*`: NULL on success, otherwise an error
 *   the caller owns and releases with peft_error_free(). It carries a stable code (`PEFT_ERR_*`, never
 *   renumbered) and a UTF-8 message naming the file, tensor or key at fault. There is no thread-local
 *   "last error".
 * - **A failed call changes nothing.** Out-parameters are left untouched and no partial object leaks.
 * - **Ownership.** What comes back through a `**out` parameter belongs to the caller and is released
 *   with the matching free function: a `char*` with peft_string_free(), a list with
 *   peft_string_list_free(). `const` pointers returned by getters are borrowed: they stay valid as
 *   long as the handle they came from. Memory the library allocates is freed only by the library.
 * - **Children keep their parents alive** (reference counting), so handles may be freed in any order.
 * - **Types.** Only fixed-width integers, `size_t`, `double`, NUL-terminated UTF-8 `const char*` and
 *   opaque pointers. Booleans are `int32_t` (0 = false, anything else = true); enumerations are
 *   documented `int32_t` constants.
 * - **Lists.** What a handle holds is read by index: `peft_<type>_<item>_count()` and getters taking
 *   an index from 0 to count - 1. A list that is not part of a handle (names in a registry, built-in
 *   families) comes back as a #peft_string_list, a snapshot read the same way.
 * - **Sentinels.** A getter given NULL or an index out of range does not fail: it returns NULL for a
 *   pointer, -1 for a dtype or another enumeration, `SIZE_MAX` for an index, and 0 for a count, size
 *   or boolean (the error getters: "" and #PEFT_OK for NULL).
 * - **Keeping a dtype.** Where an option chooses an output dtype, #PEFT_DTYPE_KEEP keeps each
 *   tensor's own dtype.
 * - **Caller-sized structs.** A struct the caller passes with a leading `size` field (set it to
 *   `sizeof` the struct) is filled only within `size` bytes, so that callers compiled against an
 *   older header keep working.
 * - **Reproducible results.** Conversions, merges, removals and every written file are bit-identical
 *   across machines, kernel tables and thread counts; unmerged apply (peft_lora_apply()) sums in the
 *   kernel table's own order and is bounded instead (see peft_kernels()).
 * - **Threads.** Read-only handles (an opened checkpoint, a loaded adapter, a translator) may be used
 *   from many threads at once. Writers and merge jobs belong to one thread at a time. Every free
 *   function may be called from any thread.
 * - **Callbacks** return an `int32_t` status: zero to continue, nonzero to cancel the operation, which
 *   then fails cleanly with #PEFT_ERR_CANCELLED. A callback must not throw, unwind or longjmp.
 */
#ifndef PEFT_C_H
#define PEFT_C_H

#include <stddef.h>
#include <stdint.h>

/** @def PEFT_API
 *  Marks a function of the public API (exported from the shared library). */
#if defined(_WIN32) && !defined(PEFT_STATIC)
#  if defined(PEFT_BUILD)
#    define PEFT_API __declspec(dllexport)
#  else
#    define PEFT_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define PEFT_API __attribute__((visibility("default")))
#else
#  define PEFT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================================================ */
/** @defgroup version Versions
 *  Three places carry the version: these macros (what you compiled against), peft_version() and
 *  peft_abi_version() (what you run against), and the shared library's SONAME (`libpeft_c.so.<ABI>`).
 *  @{ */

#define PEFT_VERSION_MAJOR 0 /**< Major version of this header. */
#define PEFT_VERSION_MINOR 1 /**< Minor version of this header. */
#define PEFT_VERSION_PATCH 0 /**< Patch version of this header. */
/** The version as one number: major * 10000 + minor * 100 + patch. */
#define PEFT_VERSION_NUMBER (PEFT_VERSION_MAJOR * 10000 + PEFT_VERSION_MINOR * 100 + PEFT_VERSION_PATCH)
/** ABI version of this header; it equals the shared library's SONAME number. */
#define PEFT_ABI_VERSION 1

/**
 * @brief The library's version as a string such as "0.1.0".
 * @return A static string; never NULL. Thread-safe.
 */
PEFT_API const char* peft_version(void);

/**
 * @brief The library's version as #PEFT_VERSION_NUMBER computes it.
 * @return The number of the library that is running (compare with the macro to detect a mismatch).
 *         Thread-safe.
 */
PEFT_API uint32_t peft_version_number(void);

/**
 * @brief The ABI version of the library that is running.
 * @return #PEFT_ABI_VERSION of the build of the shared library. Thread-safe.
 */
PEFT_API uint32_t peft_abi_version(void);

/**
 * @brief The kernel table the library computes with: "avx512", "avx2" or "portable".
 *
 * Dtype conversions and the merge arithmetic run through one table of hand-vectorised loops,
 * chosen once per process on first use: the highest level that the CPU and the operating system
 * support, of "avx512" (AVX-512 F, BW, VL and DQ, with AVX2, FMA and F16C), "avx2" (AVX2, FMA and
 * F16C) and "portable" (plain C++ that the compiler vectorises for the baseline instruction set:
 * SSE2 on x86-64, NEON on aarch64, where it is the only table). The environment variable
 * `PEFT_C_KERNELS`, set before that first use to `portable`, `avx2` or `avx512`, lowers the choice
 * (tests use it to run every table a machine has); a level the CPU lacks gives the highest level
 * below it, and `auto` or any other value leaves the choice as it is.
 *
 * **Which results are bit-identical across tables, machines and thread counts:** dtype
 * conversions (peft_convert(), conversions on read and write), every merge (checkpoints, buffers,
 * host models, DoRA norms, several weighted adapters) and its removal, and every file written.
 * The table changes only the speed there. **Not bit-identical:** peft_lora_apply(), whose dot
 * products are summed in the table's vector width, in an order that also depends on how many rows a
 * call gives each core; its result is the exact value within the rounding error of f32 products of
 * that length (see there), rounded once to the output dtype.
 *
 * @return A static string; never NULL. Thread-safe.
 */
PEFT_API const char* peft_kernels(void);

/** @} */

/* ================================================================================================ */
/** @defgroup errors Errors
 *  Every fallible call returns a `peft_error*`. The codes are stable: a value is never renumbered.
 *
 *  Hostile input is an error, never a crash or a wait: JSON nested deeper than 256 levels (an adapter
 *  config, a base model's config.json, a shard index, a translation table, index metadata) is refused
 *  with the code of that input (#PEFT_ERR_INVALID_CONFIG, #PEFT_ERR_INVALID_CHECKPOINT,
 *  #PEFT_ERR_INVALID_ARGUMENT), and a file read by the library that is not a regular file (a FIFO, a
 *  device, a folder) is #PEFT_ERR_IO.
 *  @{ */

/** An error: a stable code and a message. Owned by the caller; release with peft_error_free(). */
typedef struct peft_error peft_error;

#define PEFT_OK 0 /**< Not an error code of an error object; returned by peft_error_code(NULL). */
/* Safetensors format errors: one per failure kind of the reference reader. */
#define PEFT_ERR_HEADER_TOO_SMALL 1 /**< The file is shorter than the 8-byte length prefix. */
#define PEFT_ERR_HEADER_TOO_LARGE 2 /**< The header length is over the cap (100,000,000 by default). */
#define PEFT_ERR_INVALID_HEADER_LENGTH 3 /**< 8 + header length is past the end of the file. */
#define PEFT_ERR_INVALID_HEADER_UTF8 4 /**< The header bytes are not valid UTF-8. */
#define PEFT_ERR_INVALID_HEADER 5 /**< The header is not the JSON the format requires. */
#define PEFT_ERR_INVALID_OFFSET 6 /**< Tensor data is not contiguous from 0 (gap, overlap, end < begin). */
#define PEFT_ERR_VALIDATION_OVERFLOW 7 /**< Shape or size arithmetic overflows 64 bits. */
#define PEFT_ERR_MISALIGNED_SLICE 8 /**< A sub-byte dtype does not fill whole bytes. */
#define PEFT_ERR_TENSOR_INVALID_INFO 9 /**< A tensor's byte span differs from elements x dtype size. */
#define PEFT_ERR_METADATA_INCOMPLETE_BUFFER 10 /**< File length differs from 8 + header + data. */
/* General errors. */
#define PEFT_ERR_IO 20 /**< An operating-system call failed (open, read, write, rename, ...). */
#define PEFT_ERR_NOT_FOUND 21 /**< A tensor, file or entry that was asked for does not exist. */
#define PEFT_ERR_UNSUPPORTED 22 /**< Valid input that this library does not handle (never done wrong). */
#define PEFT_ERR_UNRESOLVED_KEY 23 /**< Keys that a translation or a base model cannot resolve. */
#define PEFT_ERR_SHAPE_MISMATCH 24 /**< Shapes or dtypes that do not fit together. */
#define PEFT_ERR_INVALID_ARGUMENT 25 /**< A NULL, out-of-range or contradictory argument. */
#define PEFT_ERR_OUT_OF_MEMORY 26 /**< An allocation failed. */
#define PEFT_ERR_CANCELLED 27 /**< A callback asked to stop. */
#define PEFT_ERR_INVALID_CONFIG 28 /**< An adapter_config.json or other JSON file that is wrong. */
#define PEFT_ERR_INVALID_CHECKPOINT 29 /**< A checkpoint folder or index that is wrong. */
#define PEFT_ERR_OVER_BUDGET 30 /**< Memory that a budget would have to exceed (pinned data fills it). */
#define PEFT_ERR_NON_FINITE 31 /**< A computed value that is infinite or NaN (a merged weight, a LoRA scale). */
#define PEFT_ERR_INTERNAL 99 /**< A bug in peft_c. Please report it. */

/**
 * @brief The stable code of an error.
 * @param err An error, or NULL.
 * @return One of the `PEFT_ERR_*` values, or #PEFT_OK for NULL. Thread-safe.
 */
PEFT_API int32_t peft_error_code(const peft_error* err);

/**
 * @brief The error's message: UTF-8, naming the file, tensor or key at fault.
 * @param err An error, or NULL.
 * @return Borrowed; valid until peft_error_free(err). "" for NULL. Thread-safe.
 */
PEFT_API const char* peft_error_message(const peft_error* err);

/**
 * @brief Releases an error.
 * @param err An error, or NULL (then nothing happens). Thread-safe.
 */
PEFT_API void peft_error_free(peft_error* err);

/**
 * @brief The name of a code, e.g. "INVALID_OFFSET" for #PEFT_ERR_INVALID_OFFSET.
 * @param code Any integer.
 * @return A static string; "OK" for #PEFT_OK and "UNKNOWN" for a value that is not a code.
 *         Thread-safe.
 */
PEFT_API const char* peft_error_code_name(int32_t code);

/** @} */

/* ================================================================================================ */
/** @defgroup strings Strings and lists
 *  Text comes back as a `char*` out-parameter the caller frees with peft_string_free(); a list that
 *  is not part of a handle comes back as a #peft_string_list, a snapshot the caller reads by index and
 *  frees with peft_string_list_free().
 *  @{ */

/** An immutable list of UTF-8 strings. Free with peft_string_list_free(). */
typedef struct peft_string_list peft_string_list;

/**
 * @brief Releases a string the library returned through a `char**` out-parameter.
 * @param text A string from this library, or NULL. Thread-safe.
 */
PEFT_API void peft_string_free(char* text);

/**
 * @brief The number of strings in a list.
 * @param list A list, or NULL.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_string_list_count(const peft_string_list* list);

/**
 * @brief One string of a list.
 * @param list A list.
 * @param index 0 .. peft_string_list_count() - 1.
 * @return Borrowed UTF-8 string valid while @p list lives; NULL for NULL or an index out of range.
 *         Thread-safe.
 */
PEFT_API const char* peft_string_list_get(const peft_string_list* list, size_t index);

/**
 * @brief Releases a list and its strings.
 * @param list A list, or NULL. Thread-safe.
 */
PEFT_API void peft_string_list_free(peft_string_list* list);

/** @} */

/* ================================================================================================ */
/** @defgroup dtypes Data types
 *  The safetensors dtypes, numbered in the reference's order (which is also its writer's sort rank).
 *  @{ */

#define PEFT_DTYPE_BOOL 0         /**< 8 bits, 0 or 1. */
#define PEFT_DTYPE_F4 1           /**< 4 bits (E2M1), two per byte. */
#define PEFT_DTYPE_F6_E2M3 2      /**< 6 bits, four per three bytes. */
#define PEFT_DTYPE_F6_E3M2 3      /**< 6 bits, four per three bytes. */
#define PEFT_DTYPE_U8 4           /**< Unsigned 8-bit integer. */
#define PEFT_DTYPE_I8 5           /**< Signed 8-bit integer. */
#define PEFT_DTYPE_F8_E5M2 6      /**< 8-bit float, IEEE-like with infinities. */
#define PEFT_DTYPE_F8_E4M3 7      /**< 8-bit float "fn": no infinities, NaN = S.1111.111. */
#define PEFT_DTYPE_F8_E8M0 8      /**< 8-bit exponent-only scale ("fnu"), 0xFF is NaN. */
#define PEFT_DTYPE_F8_E4M3FNUZ 9  /**< 8-bit float, no negative zero, NaN = 0x80. */
#define PEFT_DTYPE_F8_E5M2FNUZ 10 /**< 8-bit float, no negative zero, NaN = 0x80. */
#define PEFT_DTYPE_I16 11         /**< Signed 16-bit integer. */
#define PEFT_DTYPE_U16 12         /**< Unsigned 16-bit integer. */
#define PEFT_DTYPE_F16 13         /**< IEEE binary16. */
#define PEFT_DTYPE_BF16 14        /**< bfloat16. */
#define PEFT_DTYPE_I32 15         /**< Signed 32-bit integer. */
#define PEFT_DTYPE_U32 16         /**< Unsigned 32-bit integer. */
#define PEFT_DTYPE_F32 17         /**< IEEE binary32. */
#define PEFT_DTYPE_C64 18         /**< Complex: two binary32, real then imaginary. */
#define PEFT_DTYPE_F64 19         /**< IEEE binary64. */
#define PEFT_DTYPE_I64 20         /**< Signed 64-bit integer. */
#define PEFT_DTYPE_U64 21         /**< Unsigned 64-bit integer. */
#define PEFT_DTYPE_COUNT 22       /**< Number of dtypes; valid values are 0 .. PEFT_DTYPE_COUNT - 1. */
#define PEFT_DTYPE_KEEP (-1)      /**< For options that choose an output dtype: keep each tensor's own. */

/**
 * @brief The safetensors name of a dtype, e.g. "BF16".
 * @param dtype A `PEFT_DTYPE_*` value.
 * @return A static string, or NULL when @p dtype is not a dtype. Thread-safe.
 */
PEFT_API const char* peft_dtype_name(int32_t dtype);

/**
 * @brief The dtype of a safetensors name (exact, case-sensitive, as the reference reads it).
 * @param name A NUL-terminated name such as "F32".
 * @return A `PEFT_DTYPE_*` value, or -1 when @p name is NULL or names no dtype. Thread-safe.
 */
PEFT_API int32_t peft_dtype_from_name(const char* name);

/**
 * @brief The size of one element in bits (4 for F4, 6 for the F6 types, 8 x bytes otherwise).
 * @param dtype A `PEFT_DTYPE_*` value.
 * @return The bit size, or 0 when @p dtype is not a dtype. Thread-safe.
 */
PEFT_API uint32_t peft_dtype_bits(int32_t dtype);

/**
 * @brief Converts @p count elements from one dtype to another.
 *
 * Supported: any of F64, F32, F16, BF16, the five F8 types (E4M3, E5M2, E8M0, E4M3FNUZ, E5M2FNUZ),
 * BOOL and the integer types into F64, F32, F16 or BF16; and any dtype into itself (a copy). C64 and
 * the sub-byte F4/F6 types convert only to themselves. Floats are rounded to nearest, ties to even; NaN
 * stays NaN (made quiet) and infinities stay infinite. F64 and integers go into F16 and BF16 through F32
 * (two roundings, exactly as torch does); into F32 and F64 they round once.
 *
 * @param src_dtype Dtype of @p src.
 * @param src @p count elements, little-endian; any alignment.
 * @param dst_dtype Dtype of @p dst.
 * @param dst Room for @p count elements of @p dst_dtype; must not overlap @p src; any alignment.
 * @param count Number of elements (for a same-dtype copy of a sub-byte dtype: elements, whole bytes).
 * @return NULL on success; #PEFT_ERR_UNSUPPORTED for a pair not listed above;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL pointers with a nonzero count or an unknown dtype.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_convert(int32_t src_dtype, const void* src, int32_t dst_dtype, void* dst,
                                  uint64_t count);

/** @} */

/* ================================================================================================ */
/** @defgroup reading Reading safetensors files and checkpoints
 *
 *  A checkpoint is one `.safetensors` file, a folder holding `model.safetensors`, or a folder holding
 *  `model.safetensors.index.json` and the shards it names. Opening validates every header completely,
 *  exactly as the reference reader does, before any tensor is touched. Tensors are then read as
 *  zero-copy views of the mapped file or converted into the caller's buffer.
 *
 *  Thread safety: a `peft_checkpoint` is read-only after opening; all its functions may be called from
 *  many threads at once.
 *
 *  @anchor file_changes
 *  **Files that change while open.** A checkpoint (and an adapter, a registered adapter, a merge's
 *  inputs) keeps its files open and reads them when tensors are needed. The library reads them with
 *  `pread` into its own or the caller's memory, never through a memory mapping, and after each read it
 *  compares the file's size and modification time with those it had when it was opened:
 *  - **Truncated** (even grown back afterwards): every later call that reads the file
 *    (peft_checkpoint_tensor_read(), peft_checkpoint_tensor_view(), peft_writer_write_from_checkpoint(),
 *    peft_adapter_module_tensor_read(), peft_adapter_export(), peft_adapter_combine(),
 *    peft_merge_checkpoint(), peft_merge_buffer_apply(), peft_registry_acquire(), ...) fails with
 *    #PEFT_ERR_IO naming the file, also when the truncation happens during the call. The host never
 *    receives SIGBUS from the library.
 *  - **Rewritten in place** (the same file, e.g. `cp new old` or a write into it): detected when its
 *    size or modification time changed, and reported as #PEFT_ERR_IO. A rewrite that keeps the size
 *    and falls within the file system's timestamp granularity (a few milliseconds) of the write before
 *    the opening, or that restores the modification time, is not detected: the new bytes are read.
 *  - **Replaced by rename** (a new file moved over the name, as atomic writers and peft_c's own
 *    writers do) or **deleted**: the open handle keeps reading the file it opened, unchanged. Open the
 *    path again to read the new file.
 *  After #PEFT_ERR_IO for a changed file, open it again (re-register an adapter) to use its new
 *  contents; the failed handle stays usable for tensors already held in memory.
 *
 *  The one exception is memory the library hands out: a zero-copy view (peft_checkpoint_tensor_view()
 *  in the default mapped mode) points into a mapping of the file, and the caller's own reads of it
 *  cannot be intercepted. Touching bytes of such a view after the file was truncated raises SIGBUS in
 *  the caller (as with any mapping, and with the reference reader), and bytes rewritten in place show
 *  through the view. A host that does not control its files should use
 *  peft_checkpoint_tensor_read(), or pread mode (peft_open_options_set_use_pread()), whose views are
 *  private copies.
 *  @{ */

/** Options for opening files. Owned by the caller; release with peft_open_options_free(). */
typedef struct peft_open_options peft_open_options;

/** A validated, opened checkpoint: one file or a folder of shards. */
typedef struct peft_checkpoint peft_checkpoint;

/**
 * @brief Creates open options with the defaults: views memory-mapped, header cap 100,000,000 bytes.
 * @param[out] out Receives the new options.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_open_options_new(peft_open_options** out);

/**
 * @brief Releases open options.
 * @param opts Options, or NULL. Thread-safe.
 */
PEFT_API void peft_open_options_free(peft_open_options* opts);

/**
 * @brief Sets the largest header length accepted (#PEFT_ERR_HEADER_TOO_LARGE above it).
 * @param opts Options.
 * @param max_bytes The cap in bytes; the default is 100,000,000 as in the reference.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_open_options_set_max_header_size(peft_open_options* opts, uint64_t max_bytes);

/**
 * @brief Chooses what peft_checkpoint_tensor_view() gives: a pointer into a memory mapping of the
 *        file (the default) or a private copy read with pread.
 *
 * Everything else reads with pread in both modes (see @ref file_changes). In mmap mode the file is
 * mapped at the first view, and views are zero-copy but share the file's fate: bytes removed by a
 * truncation raise SIGBUS when the caller touches them. With pread nothing is mapped: each tensor is
 * read when it is first viewed and then kept (in memory, until the checkpoint is freed), so views
 * stay valid whatever happens to the file, at the cost of that memory.
 * @param opts Options.
 * @param use_pread Nonzero for pread, 0 for mmap.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_open_options_set_use_pread(peft_open_options* opts, int32_t use_pread);

/**
 * @brief Opens a `.safetensors` file or a checkpoint folder and validates it completely.
 *
 * A folder must hold `model.safetensors.index.json` or, failing that, `model.safetensors`. Every
 * `weight_map` entry of an index must name a file inside the folder (no `..`, no absolute path, no
 * symbolic link leading out), and every tensor it lists must exist in the shard it names. Shards are
 * opened in sorted name order, as transformers does; a tensor a shard holds but the index does not
 * list is included (transformers loads it too), while a tensor held by two shards is refused.
 * Symbolic links that leave the folder are refused, except in a snapshot folder of the Hugging
 * Face hub cache (`models--org--name/snapshots/<revision>`), whose files link to `../../blobs/`:
 * there links may lead anywhere inside that repository's folder `models--org--name`. The same rule
 * applies to the other files a merge reads from a base folder (config.json, tokenizer files).
 *
 * @param path A file or folder path, or a model id of the hub cache (@ref hub) (UTF-8).
 * @param opts Options, or NULL for the defaults. Not kept after the call.
 * @param[out] out Receives the checkpoint; free it with peft_checkpoint_free().
 * @return NULL on success. Format errors carry the codes #PEFT_ERR_HEADER_TOO_SMALL through
 *         #PEFT_ERR_METADATA_INCOMPLETE_BUFFER; #PEFT_ERR_IO when a file cannot be read;
 *         #PEFT_ERR_INVALID_CHECKPOINT for a wrong index or folder (bad JSON, a name leaving the
 *         folder, a missing shard, a listed tensor absent from its shard, a tensor in two shards);
 *         #PEFT_ERR_NOT_FOUND for a model id not in the hub cache or an incomplete download in a
 *         hub snapshot; #PEFT_ERR_INVALID_ARGUMENT for NULL arguments. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_open(const char* path, const peft_open_options* opts,
                                          peft_checkpoint** out);

/**
 * @brief Validates a safetensors file held in memory and opens it as a one-file checkpoint.
 * @param data The file's bytes. They are copied; the caller keeps ownership of @p data.
 * @param size Number of bytes.
 * @param opts Options, or NULL for the defaults (the pread option does not apply).
 * @param[out] out Receives the checkpoint; free it with peft_checkpoint_free().
 * @return NULL on success; the format error codes as for peft_checkpoint_open() (an empty buffer,
 *         NULL with size 0, is #PEFT_ERR_HEADER_TOO_SMALL); #PEFT_ERR_INVALID_ARGUMENT when @p out
 *         is NULL or @p data is NULL with a nonzero size. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_open_memory(const void* data, size_t size,
                                                 const peft_open_options* opts, peft_checkpoint** out);

/**
 * @brief Releases a checkpoint. Views obtained from it become invalid.
 * @param ckpt A checkpoint, or NULL. Thread-safe.
 */
PEFT_API void peft_checkpoint_free(peft_checkpoint* ckpt);

/**
 * @brief Number of files: 1 for a single file, else the number of distinct shards in the index.
 * @param ckpt A checkpoint.
 * @return The count; 0 if @p ckpt is NULL. Thread-safe.
 */
PEFT_API size_t peft_checkpoint_file_count(const peft_checkpoint* ckpt);

/**
 * @brief Path of file @p file_index as opened (for a folder, the folder joined with the shard name).
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @return Borrowed UTF-8 string valid while @p ckpt lives; NULL if an argument is out of range.
 *         Thread-safe.
 */
PEFT_API const char* peft_checkpoint_file_path(const peft_checkpoint* ckpt, size_t file_index);

/**
 * @brief Whether file @p file_index has a `__metadata__` entry (which may be empty).
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @return 1 if it has, 0 if it has none or an argument is out of range. Thread-safe.
 */
PEFT_API int32_t peft_checkpoint_has_metadata(const peft_checkpoint* ckpt, size_t file_index);

/**
 * @brief Number of `__metadata__` entries of file @p file_index.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @return The number of entries (which are sorted by key bytes); 0 if none or out of range.
 *         Thread-safe.
 */
PEFT_API size_t peft_checkpoint_metadata_count(const peft_checkpoint* ckpt, size_t file_index);

/**
 * @brief Key of metadata entry @p entry of file @p file_index (entries are sorted by key bytes).
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param entry An entry index, 0 .. peft_checkpoint_metadata_count() - 1.
 * @return Borrowed UTF-8 string valid while @p ckpt lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_checkpoint_metadata_key(const peft_checkpoint* ckpt, size_t file_index,
                                                  size_t entry);

/**
 * @brief Value of metadata entry @p entry of file @p file_index.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param entry An entry index, 0 .. peft_checkpoint_metadata_count() - 1.
 * @return Borrowed UTF-8 string valid while @p ckpt lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_checkpoint_metadata_value(const peft_checkpoint* ckpt, size_t file_index,
                                                    size_t entry);

/**
 * @brief The `"metadata"` object of the checkpoint's `model.safetensors.index.json`, as compact JSON.
 * @param ckpt A checkpoint.
 * @return Borrowed UTF-8 string valid while @p ckpt lives; NULL when the checkpoint has no index or
 *         the index has no `"metadata"`. Thread-safe.
 */
PEFT_API const char* peft_checkpoint_index_metadata_json(const peft_checkpoint* ckpt);

/**
 * @brief Number of tensors in the checkpoint.
 * @param ckpt A checkpoint.
 * @return The count; 0 if @p ckpt is NULL. Thread-safe.
 */
PEFT_API size_t peft_checkpoint_tensor_count(const peft_checkpoint* ckpt);

/**
 * @brief Finds a tensor by name in O(1).
 * @param ckpt A checkpoint.
 * @param name The tensor's exact name.
 * @param[out] out_index Receives the tensor's index (0 .. count - 1).
 * @return NULL on success; #PEFT_ERR_NOT_FOUND naming the tensor if it is absent;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_find(const peft_checkpoint* ckpt, const char* name,
                                          size_t* out_index);

/**
 * @brief Finds a tensor by a name given with its length, which may contain NUL bytes (legal in
 *        safetensors names: JSON can spell `\u0000`).
 * @param ckpt A checkpoint.
 * @param name The name's bytes (UTF-8); not NUL-terminated necessarily.
 * @param name_length Number of bytes of @p name.
 * @param[out] out_index Receives the tensor's index.
 * @return As peft_checkpoint_find(). Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_find_n(const peft_checkpoint* ckpt, const char* name, size_t name_length,
                                            size_t* out_index);

/**
 * @brief Length in bytes of tensor @p index's name. It differs from `strlen` of
 *        peft_checkpoint_tensor_name() only for names that contain NUL bytes; the name's storage
 *        holds this many bytes followed by a NUL.
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return The length; 0 if out of range. Thread-safe.
 */
PEFT_API size_t peft_checkpoint_tensor_name_length(const peft_checkpoint* ckpt, size_t index);

/**
 * @brief Name of tensor @p index. Tensors are numbered file by file, each file in data order.
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return Borrowed UTF-8 string valid while @p ckpt lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_checkpoint_tensor_name(const peft_checkpoint* ckpt, size_t index);

/**
 * @brief Dtype (`PEFT_DTYPE_*`) of tensor @p index.
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return The dtype, or -1 if out of range or for a block-quantized GGUF tensor, which has none
 *         (see @ref gguf). Thread-safe.
 */
PEFT_API int32_t peft_checkpoint_tensor_dtype(const peft_checkpoint* ckpt, size_t index);

/**
 * @brief Number of dimensions of tensor @p index (0 for a scalar).
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return The rank, or 0 if out of range. Thread-safe.
 */
PEFT_API size_t peft_checkpoint_tensor_ndim(const peft_checkpoint* ckpt, size_t index);

/**
 * @brief Shape of tensor @p index: ndim values.
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return Borrowed array valid while @p ckpt lives; NULL for a scalar or out of range. Thread-safe.
 */
PEFT_API const uint64_t* peft_checkpoint_tensor_shape(const peft_checkpoint* ckpt, size_t index);

/**
 * @brief Byte range of tensor @p index in its file's data section (`data_offsets`).
 * @param[out] out_begin Receives the begin offset.
 * @param[out] out_end Receives the end offset (exclusive).
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if out of range or NULL. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_tensor_offsets(const peft_checkpoint* ckpt, size_t index,
                                                    uint64_t* out_begin, uint64_t* out_end);

/**
 * @brief Which file (0 .. file_count - 1) holds tensor @p index.
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return The file index, or SIZE_MAX if out of range. Thread-safe.
 */
PEFT_API size_t peft_checkpoint_tensor_file(const peft_checkpoint* ckpt, size_t index);

/**
 * @brief A zero-copy view of tensor @p index's bytes (little-endian, row-major).
 *
 * The pointer is valid while @p ckpt lives. Its alignment is whatever the file gives: the file data
 * start plus the tensor's offset. Files written by the reference writer (and by peft_c) place every
 * tensor at a file offset that is a multiple of its element size, and mappings start on a page, so
 * such views are aligned to the element size; other files may not be. Check before a typed access.
 * A zero-size tensor gives a non-NULL pointer and 0 bytes.
 *
 * In mmap mode (the default) the pointer is into a read-only mapping of the file, made at the first
 * view. Each call first checks that the file is unchanged (#PEFT_ERR_IO otherwise), but the bytes are
 * read by the caller, where the library cannot intercept a fault: if the file is truncated later,
 * touching the lost bytes raises SIGBUS in the caller's process, and bytes rewritten in place show
 * through (see @ref file_changes). For files that may change, read with peft_checkpoint_tensor_read()
 * or open in pread mode, where the view is a private copy taken at the first view of the tensor.
 *
 * @param[out] out_data Receives the pointer.
 * @param[out] out_nbytes Receives the byte length.
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if out of range or NULL; #PEFT_ERR_IO if the
 *         file changed since it was opened (mmap mode), or if a pread-mode read fails or finds it
 *         changed. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_tensor_view(const peft_checkpoint* ckpt, size_t index,
                                                 const void** out_data, uint64_t* out_nbytes);

/**
 * @brief Reads tensor @p index into the caller's buffer, converting to @p dtype (see peft_convert()).
 *
 * Reads the file with pread in both modes (a pread-mode tensor already viewed is copied from its
 * view), so a file truncated or rewritten since opening gives #PEFT_ERR_IO, never SIGBUS (see
 * @ref file_changes).
 * @param dtype The dtype wanted in @p dst.
 * @param dst The buffer; any alignment. May be NULL when @p dst_nbytes is 0 (a zero-size tensor).
 * @param dst_nbytes Its size: must equal elements x size of @p dtype.
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return NULL on success; #PEFT_ERR_UNSUPPORTED for a conversion peft_convert() does not do;
 *         #PEFT_ERR_INVALID_ARGUMENT for a wrong size, index or NULL; #PEFT_ERR_IO on a failed read
 *         or a file that changed since it was opened. On failure @p dst may have been partly
 *         written. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_tensor_read(const peft_checkpoint* ckpt, size_t index,
                                                 int32_t dtype, void* dst, uint64_t dst_nbytes);

/** @} */

/* ================================================================================================ */
/** @defgroup gguf GGUF files
 *
 *  peft_checkpoint_open() and peft_checkpoint_open_memory() also open GGUF files (versions 2 and 3,
 *  little-endian; told apart from safetensors by the magic `GGUF`). The whole header is validated
 *  first, as strictly as ggml's own reader and more (docs/gguf.md lists each check and its code), with
 *  the safetensors codes: e.g. #PEFT_ERR_INVALID_HEADER for a bad magic, type or duplicate name,
 *  #PEFT_ERR_INVALID_HEADER_LENGTH for metadata running past the end of the file,
 *  #PEFT_ERR_INVALID_OFFSET for misaligned or overlapping tensor data,
 *  #PEFT_ERR_METADATA_INCOMPLETE_BUFFER for data past the end, #PEFT_ERR_UNSUPPORTED for big-endian
 *  files and version 1. peft_open_options_set_max_header_size() caps the bytes before the data section.
 *
 *  A GGUF file's tensors are then read like any other: names as the file spells them
 *  (`blk.0.attn_q.weight`), shapes outermost first (GGUF's `ne` reversed, so a weight of
 *  `ne = [in, out]` has shape `{out, in}` as in PyTorch), offsets relative to the data section.
 *  F32, F16, BF16, F64 and the integer types have their dtype and convert as usual. Block-quantized
 *  tensors (Q8_0, Q4_K, ...) have no dtype (peft_checkpoint_tensor_dtype() gives -1): their ggml type
 *  is peft_checkpoint_tensor_ggml_type(), and their bytes are read with peft_checkpoint_tensor_view();
 *  peft_checkpoint_tensor_read() refuses them with #PEFT_ERR_UNSUPPORTED.
 *
 *  A split model, cut by llama.cpp's `llama-gguf-split` into `NAME-00001-of-00003.gguf`,
 *  `NAME-00002-of-00003.gguf`, ... (how large GGUF models are published), opens as one model from
 *  any of its parts: the other parts are found next to it by name, and the checkpoint holds one file
 *  per part, in part order (peft_checkpoint_file_count(), peft_checkpoint_file_path()), its tensors
 *  numbered part by part; file 0 is the first part, which holds the model's metadata. Each part is
 *  validated as a file of its own, then the parts together against their keys as llama.cpp reads
 *  them: `split.no` (U16, 0-based), `split.count` (U16) and `split.tensors.count` (I32). A file
 *  whose `split.count` is absent, 0 or 1 is a model of its own. Each refusal is
 *  #PEFT_ERR_INVALID_CHECKPOINT naming the part and the reason: a name that does not end in
 *  `-0000K-of-0000N.gguf` for the file's own split.no and split.count, a missing part, a split key
 *  missing or of another type, a part whose split.no, split.count or split.tensors.count disagrees
 *  (a duplicated part among them), a tensor in two parts, or parts holding another number of tensors
 *  than split.tensors.count. Merges into a split base write the same parts or one joined file
 *  (peft_merge_options_set_join_split()).
 *
 *  The metadata key/values are read by file and position, in file order, with their types. An array's
 *  elements are read with the same getters, by element index; a scalar is element 0. The getters
 *  below return NULL/0/-1 for a NULL checkpoint, an index out of range or a safetensors file. All
 *  are thread-safe; borrowed strings live as long as the checkpoint.
 *  @{ */

#define PEFT_FORMAT_SAFETENSORS 0 /**< A safetensors file. */
#define PEFT_FORMAT_GGUF 1        /**< A GGUF file. */

#define PEFT_GGUF_U8 0      /**< Unsigned 8-bit integer value. */
#define PEFT_GGUF_I8 1      /**< Signed 8-bit integer value. */
#define PEFT_GGUF_U16 2     /**< Unsigned 16-bit integer value. */
#define PEFT_GGUF_I16 3     /**< Signed 16-bit integer value. */
#define PEFT_GGUF_U32 4     /**< Unsigned 32-bit integer value. */
#define PEFT_GGUF_I32 5     /**< Signed 32-bit integer value. */
#define PEFT_GGUF_F32 6     /**< binary32 value. */
#define PEFT_GGUF_BOOL 7    /**< Boolean value (one byte, 0 or 1). */
#define PEFT_GGUF_STRING 8  /**< String value (bytes with a length; UTF-8 by convention). */
#define PEFT_GGUF_ARRAY 9   /**< Array of values of one type. */
#define PEFT_GGUF_U64 10    /**< Unsigned 64-bit integer value. */
#define PEFT_GGUF_I64 11    /**< Signed 64-bit integer value. */
#define PEFT_GGUF_F64 12    /**< binary64 value. */

/**
 * @brief The format of file @p file_index of a checkpoint.
 * @param ckpt A checkpoint.
 * @param file_index 0 .. peft_checkpoint_file_count() - 1.
 * @return #PEFT_FORMAT_SAFETENSORS or #PEFT_FORMAT_GGUF; -1 if out of range or NULL. Thread-safe.
 */
PEFT_API int32_t peft_checkpoint_file_format(const peft_checkpoint* ckpt, size_t file_index);

/**
 * @brief The GGUF version (2 or 3) of file @p file_index.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @return The version; 0 for a safetensors file, out of range or NULL. Thread-safe.
 */
PEFT_API uint32_t peft_checkpoint_gguf_version(const peft_checkpoint* ckpt, size_t file_index);

/**
 * @brief The ggml type of tensor @p index as stored in its GGUF file (ggml's numbering: 0 F32,
 *        1 F16, 8 Q8_0, 12 Q4_K, 30 BF16, ...).
 * @param ckpt A checkpoint.
 * @param index A tensor index, 0 .. peft_checkpoint_tensor_count() - 1.
 * @return The type; -1 for a tensor of a safetensors file, out of range or NULL. Thread-safe.
 */
PEFT_API int32_t peft_checkpoint_tensor_ggml_type(const peft_checkpoint* ckpt, size_t index);

/**
 * @brief The name of a ggml type as gguf-py spells it ("Q4_K").
 * @param ggml_type A ggml type number.
 * @return A static string; NULL for a number ggml does not define. Thread-safe.
 */
PEFT_API const char* peft_ggml_type_name(int32_t ggml_type);

/**
 * @brief The ggml type of an exact name ("BF16", "Q8_0").
 * @param name A type name (exact, case-sensitive).
 * @return The type; -1 for NULL or a name ggml does not define. Thread-safe.
 */
PEFT_API int32_t peft_ggml_type_from_name(const char* name);

/**
 * @brief Storage geometry of a ggml type: a row of n elements (n a multiple of the block size) takes
 *        n / block_size blocks of type_size bytes.
 * @param ggml_type A ggml type number.
 * @param[out] out_block_size Receives the elements per block (1 for F32, 32 for Q8_0, 256 for Q4_K).
 * @param[out] out_type_size Receives the bytes per block (4 for F32, 34 for Q8_0, 144 for Q4_K).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for an unknown type or NULL pointers. Thread-safe.
 */
PEFT_API peft_error* peft_ggml_type_geometry(int32_t ggml_type, uint32_t* out_block_size, uint32_t* out_type_size);

/**
 * @brief Number of metadata key/values of GGUF file @p file_index.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @return The count; 0 for a safetensors file, out of range or NULL. Thread-safe.
 */
PEFT_API size_t peft_checkpoint_gguf_kv_count(const peft_checkpoint* ckpt, size_t file_index);

/**
 * @brief The key of metadata entry @p kv (in file order).
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @return Borrowed string valid while @p ckpt lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_checkpoint_gguf_kv_key(const peft_checkpoint* ckpt, size_t file_index, size_t kv);

/**
 * @brief Finds a metadata entry by key.
 * @param[out] out_kv Receives its position.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param key The key (UTF-8, exact).
 * @return NULL on success; #PEFT_ERR_NOT_FOUND naming the key if the file has no such entry (also for
 *         a safetensors file); #PEFT_ERR_INVALID_ARGUMENT for NULL arguments or a file out of range.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_gguf_kv_find(const peft_checkpoint* ckpt, size_t file_index, const char* key,
                                                  size_t* out_kv);

/**
 * @brief The type (`PEFT_GGUF_*`) of metadata entry @p kv; #PEFT_GGUF_ARRAY for an array.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @return The type; -1 if out of range. Thread-safe.
 */
PEFT_API int32_t peft_checkpoint_gguf_kv_type(const peft_checkpoint* ckpt, size_t file_index, size_t kv);

/**
 * @brief The element type (`PEFT_GGUF_*`) of an array entry.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @return The type; -1 if the entry is not an array or out of range. Thread-safe.
 */
PEFT_API int32_t peft_checkpoint_gguf_kv_array_type(const peft_checkpoint* ckpt, size_t file_index, size_t kv);

/**
 * @brief The number of elements of an array entry.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @return The count; 0 if the entry is not an array or out of range. Thread-safe.
 */
PEFT_API uint64_t peft_checkpoint_gguf_kv_array_length(const peft_checkpoint* ckpt, size_t file_index, size_t kv);

/**
 * @brief An integer or boolean value (U8 .. I64, BOOL as 0 or 1): entry @p kv itself when it is a
 *        scalar (@p element 0), or element @p element of an array of such values.
 * @param[out] out Receives the value.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @param element 0 for a scalar entry; for an array, the element index.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT (naming the key) for another type, a U64
 *         above INT64_MAX (read it with peft_checkpoint_gguf_kv_uint()), an index out of range or
 *         NULL. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_gguf_kv_int(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                                 uint64_t element, int64_t* out);

/**
 * @brief As peft_checkpoint_gguf_kv_int(), for a value that is not negative (any U64 fits).
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @param element 0 for a scalar entry; for an array, the element index.
 * @param[out] out Receives the value.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for a negative value or as
 *         peft_checkpoint_gguf_kv_int(). Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_gguf_kv_uint(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                                  uint64_t element, uint64_t* out);

/**
 * @brief A floating-point value (F32 or F64; an F32 is widened exactly), scalar or array element as
 *        for peft_checkpoint_gguf_kv_int().
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @param element 0 for a scalar entry; for an array, the element index.
 * @param[out] out Receives the value.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for another type, an index out of range or
 *         NULL. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_gguf_kv_float(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                                   uint64_t element, double* out);

/**
 * @brief A string value, scalar or array element as for peft_checkpoint_gguf_kv_int().
 * @param[out] out_data Receives the bytes, followed by a NUL (the string itself may hold NUL bytes);
 *             borrowed, valid while @p ckpt lives.
 * @param[out] out_length Receives the length in bytes. May be NULL.
 * @param ckpt A checkpoint.
 * @param file_index A file index, 0 .. peft_checkpoint_file_count() - 1.
 * @param kv A metadata entry, 0 .. peft_checkpoint_gguf_kv_count() - 1 (file order).
 * @param element 0 for a scalar entry; for an array, the element index.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for another type, an index out of range or
 *         NULL. Thread-safe.
 */
PEFT_API peft_error* peft_checkpoint_gguf_kv_string(const peft_checkpoint* ckpt, size_t file_index, size_t kv,
                                                    uint64_t element, const char** out_data, size_t* out_length);

/** @} */

/* ================================================================================================ */
/** @defgroup hub Models and adapters in the Hugging Face hub cache
 *
 *  Wherever a function takes a base model or adapter folder (peft_checkpoint_open(),
 *  peft_adapter_open(), peft_adapter_options_set_base_dir(), peft_adapter_validate(),
 *  peft_translator_detect(), peft_merge_options_add_adapter_dir(), peft_merge_checkpoint(),
 *  peft_registry_register(), peft_adapter_doctor(), peft_adapter_doctor_fix()), it also takes a model id of the local Hugging Face hub cache, resolved
 *  as peft_hub_resolve() does: a path that exists is always taken as a path, and an id needs a
 *  namespace there (`org/name`, `org/name@revision`; a name ending in `.safetensors` is a file, never
 *  an id), so that a missing plain folder or file keeps its function's error. Nothing is ever downloaded: ids are looked up in the cache that
 *  `huggingface_hub`, transformers and PEFT fill, offline.
 *
 *  **The cache** is located as huggingface_hub does (see peft_hub_cache_dir()). A model repository is
 *  the folder `models--org--name` in it, with `refs/<branch or tag>` files holding commit hashes,
 *  `snapshots/<commit>/` folders whose files are relative symbolic links to `../../blobs/<sha256>`,
 *  and `blobs/`. Reading a snapshot follows those links within the repository's folder; a link
 *  leading out of it is refused with #PEFT_ERR_INVALID_CHECKPOINT, as in a plain folder.
 *
 *  **Incomplete downloads.** In a snapshot, a file that links to a missing blob (often with a partial
 *  `blobs/<sha256>.incomplete` beside it), or a shard named by the index that is missing, is
 *  #PEFT_ERR_NOT_FOUND naming the file and saying that the download is incomplete. Plain folders
 *  keep their usual errors.
 *
 *  Thread safety: the functions read the environment and the file system only; they may be called
 *  from many threads at once (as long as nothing changes the environment meanwhile).
 *  @{ */

/**
 * @brief The snapshot folder of a model id in the local hub cache, or a path that exists as it is.
 *
 * @p id_or_path is taken as a path when a file or folder of that name exists (relative to the
 * current directory), and is then returned unchanged. Otherwise it must be a model id: `name` or
 * `org/name` as huggingface_hub validates them (ASCII letters, digits, `_`, `-`, `.`; each part 1
 * to 96 characters, starting and ending with a letter, digit or `_`; no `--` or `..`; not ending in
 * `.git`), optionally followed by `@revision`. The revision (default `main`) is, in this order, a
 * full 40-digit commit hash (`snapshots/<hash>`), a branch or tag recorded under `refs/` (`main`,
 * `v1.0`, `refs/pr/3`: the commit the file holds), or a prefix of at least 4 hex digits of exactly
 * one snapshot's commit. The result is `<cache>/models--org--name/snapshots/<commit>`, the folder
 * `huggingface_hub.snapshot_download(repo_id, revision=..., local_files_only=True)` returns.
 *
 * @param id_or_path A path, or a model id such as `org/name` or `org/name@v1.0` (UTF-8).
 * @param[out] out_dir Receives the folder; free it with peft_string_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL arguments or a text that is neither
 *         an existing path nor a model id (an absolute path that does not exist, `..`, empty parts,
 *         more than one `/`), naming the reason; #PEFT_ERR_NOT_FOUND when the repository, the
 *         revision or its snapshot folder is not in the cache or a short hash matches several
 *         snapshots, saying what was looked for and in which cache folder, and that nothing is
 *         downloaded; #PEFT_ERR_IO when a ref file cannot be read. Thread-safe.
 */
PEFT_API peft_error* peft_hub_resolve(const char* id_or_path, char** out_dir);

/**
 * @brief The hub cache folder that ids are looked up in, as huggingface_hub computes it.
 *
 * From the environment: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else
 * `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`, with `~` and `$VAR` expanded
 * as Python's `os.path.expanduser` and `os.path.expandvars` do. A variable set to the empty string
 * counts as unset. The folder need not exist.
 * @param[out] out_dir Receives the folder; free it with peft_string_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out_dir is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_hub_cache_dir(char** out_dir);

/** @} */

/* ================================================================================================ */
/** @defgroup writing Writing safetensors files and checkpoints
 *
 *  A writer produces one `.safetensors` file (peft_writer_new()) or a checkpoint folder in the
 *  layout transformers writes (peft_writer_new_checkpoint()). The output is byte-identical to what
 *  Python `safetensors.torch.save_file` writes for the same tensors and metadata: tensors ordered by
 *  dtype (widest first, in the reference's dtype order) then by name bytes, compact JSON, header
 *  padded with spaces to a multiple of 8. The reference writes metadata keys in a random order; the
 *  writer sorts them by bytes, so files with at most one key are identical to every reference run.
 *
 *  A write has three phases:
 *  1. **Declare** every tensor (peft_writer_add_tensor()) and the metadata.
 *  2. **Stream** each tensor's bytes in the writer's order, which peft_writer_tensor_name() tells
 *     once peft_writer_start() has computed the header from the declarations alone. Each tensor
 *     comes from one of: a buffer in one call (peft_writer_write_tensor()), a buffer in chunks
 *     (peft_writer_begin_tensor() + peft_writer_write()), a callback (peft_writer_write_from_callback())
 *     or a tensor of an opened checkpoint (peft_writer_write_from_checkpoint()); each may convert
 *     from another dtype on the way (see peft_convert()). Memory use stays at a few fixed-size
 *     chunks (about 10 MB), whatever the tensor sizes.
 *  3. **Finish** (peft_writer_finish()).
 *
 *  Output is atomic: bytes go to a temporary file next to the target (named
 *  `.<name>.peft-tmp-XXXXXX`, created with the permissions a new file gets under the umask), which
 *  is flushed to disk and renamed over the target only by a successful peft_writer_finish(). After
 *  any failure (a full disk, a cancelling callback, a freed unfinished writer) the target holds its
 *  old content or nothing, and the temporary is removed. A killed process leaves the target
 *  untouched; only a stray temporary may remain.
 *
 *  Errors while streaming: an argument error (a tensor out of order, too many bytes, a chunk that is
 *  not whole elements) changes nothing and the call may be repeated correctly. An I/O error or a
 *  cancellation discards the output: every later call then fails with #PEFT_ERR_INVALID_ARGUMENT
 *  and the writer can only be freed.
 *
 *  Thread safety: a writer belongs to one thread at a time; different writers are independent.
 *  A name holding NUL bytes is declared with peft_writer_add_tensor_n() and written by passing NULL
 *  as the name ("the next tensor"); peft_writer_tensor_name_length() gives its full length.
 *  @{ */

/** A streaming writer of one safetensors file or of a checkpoint folder. Free with peft_writer_free(). */
typedef struct peft_writer peft_writer;

/**
 * @brief A source of tensor bytes for peft_writer_write_from_callback().
 *
 * Called repeatedly, with increasing and contiguous @p offset, until the tensor is complete.
 * @param user_data The pointer given to peft_writer_write_from_callback().
 * @param offset Byte offset of this chunk within the tensor's bytes in the source dtype.
 * @param dst Where to put the chunk; valid for this call only.
 * @param nbytes Bytes to put in @p dst: at most 4 MiB; whole elements when converting.
 * @return 0 to continue; any other value cancels the write (#PEFT_ERR_CANCELLED).
 */
typedef int32_t (*peft_tensor_source_fn)(void* user_data, uint64_t offset, void* dst, uint64_t nbytes);

/**
 * @brief Creates a writer of one `.safetensors` file.
 *
 * The metadata starts absent (no `__metadata__` entry), as with the reference's save_file without
 * metadata. Nothing is created on disk before peft_writer_start().
 * @param path Path of the file to write (UTF-8). Its folder must exist when writing starts.
 * @param[out] out Receives the writer; free it with peft_writer_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or an empty path. Thread-safe.
 */
PEFT_API peft_error* peft_writer_new(const char* path, peft_writer** out);

/**
 * @brief Creates a writer of a checkpoint folder as transformers `save_pretrained` lays it out.
 *
 * Tensors are split into shards by huggingface_hub's greedy rule, in declaration order: a tensor
 * larger than @p max_shard_size gets a shard of its own; otherwise a new shard starts when the
 * current one would grow past @p max_shard_size. Shards are named `model-00001-of-0000N.safetensors`
 * and listed in `model.safetensors.index.json` (written as transformers v4 writes it:
 * `{"metadata": {"total_size": ...}, "weight_map": {...}}`, indent 2, sorted keys, trailing newline);
 * a single shard is `model.safetensors` with no index. Every shard gets the writer's metadata, which
 * starts as `{"format":"pt"}`. The folder is created if needed.
 *
 * Replacing a checkpoint already in the folder: readers disagree when a folder holds both
 * entry points (this library opens `model.safetensors.index.json` first, transformers
 * `model.safetensors`), so a write never leaves both naming different models. Everything is
 * written to temporaries and flushed first. For a sharded output, a shard whose name is taken (by
 * an existing file or a shard the current index lists) gets a per-write token before its suffix
 * (`model-00001-of-00002.peft-Ab3dE9xZ.safetensors`; peft_writer_file_path() gives the paths,
 * which the index lists and transformers loads as any other); the shards are renamed into the
 * folder, a `model.safetensors` is moved aside, and the index is renamed over the old one: the one
 * commit point. For a single-file output, an old index is moved aside and `model.safetensors` is
 * renamed over the old one. Then the files of the older layout are removed (`model.safetensors`,
 * the index, `model-XXXXX-of-XXXXX.safetensors`, tokenized names, the shards the old index listed).
 * A failure before the commit point leaves the folder as it was. A process killed at any step
 * leaves the old or the new model, the same for both readers, except only when the layout changes
 * between one file and shards: killed between moving the old entry point aside and the commit,
 * the folder holds no model either reader loads. Temporaries of killed runs
 * (`.<name>.peft-tmp-XXXXXX`) are removed when the next write into the folder starts, and their
 * orphan shards when it commits. Two writers must not write into one folder at the same time.
 * @param folder The folder (UTF-8).
 * @param max_shard_size Largest shard in bytes of tensor data (headers not counted); 0 for no limit.
 * @param[out] out Receives the writer; free it with peft_writer_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or an empty folder. Thread-safe.
 */
PEFT_API peft_error* peft_writer_new_checkpoint(const char* folder, uint64_t max_shard_size, peft_writer** out);

/**
 * @brief Releases a writer. An unfinished output is discarded (temporaries removed, targets untouched).
 * @param writer A writer, or NULL.
 */
PEFT_API void peft_writer_free(peft_writer* writer);

/**
 * @brief Declares a tensor.
 * @param writer A writer that has not started.
 * @param name The tensor's name: UTF-8, not `__metadata__`, not declared before. Copied.
 * @param dtype Its `PEFT_DTYPE_*` in the file.
 * @param shape @p ndim dimensions (may be NULL when @p ndim is 0: a scalar). Copied.
 * @param ndim Number of dimensions.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for a duplicate, reserved or non-UTF-8 name,
 *         an unknown dtype, NULL arguments or a writer that has started;
 *         #PEFT_ERR_MISALIGNED_SLICE when a sub-byte dtype does not fill whole bytes (an odd number
 *         of F4 elements); #PEFT_ERR_VALIDATION_OVERFLOW when the size overflows 64 bits.
 */
PEFT_API peft_error* peft_writer_add_tensor(peft_writer* writer, const char* name, int32_t dtype,
                                            const uint64_t* shape, size_t ndim);

/**
 * @brief Declares a tensor whose name is given with its length (it may then hold NUL bytes).
 * @param writer A writer that has not started.
 * @param name The name's bytes (UTF-8), not necessarily NUL-terminated. Copied.
 * @param name_length Number of bytes of @p name.
 * @param dtype Its `PEFT_DTYPE_*` in the file.
 * @param shape @p ndim dimensions (may be NULL when @p ndim is 0). Copied.
 * @param ndim Number of dimensions.
 * @return As peft_writer_add_tensor().
 */
PEFT_API peft_error* peft_writer_add_tensor_n(peft_writer* writer, const char* name, size_t name_length,
                                              int32_t dtype, const uint64_t* shape, size_t ndim);

/**
 * @brief Chooses whether the file has a `__metadata__` entry at all.
 *
 * Absent (no entry), empty (`"__metadata__":{}`) and entries are three different files. 0 removes
 * the entry and every key set so far; nonzero makes it present (empty unless keys are set).
 * @param writer A writer that has not started.
 * @param present 0 or nonzero.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or a writer that has started.
 */
PEFT_API peft_error* peft_writer_set_metadata_present(peft_writer* writer, int32_t present);

/**
 * @brief Sets a metadata entry (replacing an earlier value of the key); makes the metadata present.
 * @param writer A writer that has not started.
 * @param key UTF-8 key. Copied.
 * @param value UTF-8 value. Copied.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL, non-UTF-8 text or a writer that has
 *         started.
 */
PEFT_API peft_error* peft_writer_set_metadata(peft_writer* writer, const char* key, const char* value);

/**
 * @brief Checkpoint writers: the next declared tensor starts a new shard (to keep a given layout).
 * @param writer A checkpoint writer that has not started.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL, a one-file writer or a writer that
 *         has started.
 */
PEFT_API peft_error* peft_writer_break_shard(peft_writer* writer);

/**
 * @brief Checkpoint writers: extra entries for the index's `"metadata"` object.
 *
 * Use it to carry over a source index's metadata (see peft_checkpoint_index_metadata_json()).
 * `total_size` is always computed by the writer and replaces any given value.
 * @param writer A checkpoint writer that has not started.
 * @param json_object A JSON object, e.g. `{"total_parameters": 124439808}`. Copied.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL, text that is not a JSON object, a
 *         one-file writer or a writer that has started.
 */
PEFT_API peft_error* peft_writer_set_index_metadata_json(peft_writer* writer, const char* json_object);

/**
 * @brief Ends the declarations and computes every header.
 *
 * After this, peft_writer_tensor_name() gives the order in which tensors must be written. Called
 * by the first write or by peft_writer_finish() if not called before. No file is created yet; a
 * checkpoint writer creates its folder (and missing parents). A failed start changes nothing else.
 * @param writer A writer.
 * @return NULL on success (also when already started); #PEFT_ERR_HEADER_TOO_LARGE when a header
 *         would exceed 100,000,000 bytes; #PEFT_ERR_IO if a checkpoint folder cannot be created;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL or a failed or finished writer.
 */
PEFT_API peft_error* peft_writer_start(peft_writer* writer);

/**
 * @brief Number of declared tensors.
 * @param writer A writer.
 * @return The count; 0 for NULL.
 */
PEFT_API size_t peft_writer_tensor_count(const peft_writer* writer);

/**
 * @brief Name of the tensor to write at @p position (0-based) in the writer's order.
 *
 * For a checkpoint writer the order is shard by shard, each shard in its file's order.
 * @param writer A started writer.
 * @param position 0 .. peft_writer_tensor_count() - 1.
 * @return Borrowed UTF-8 string valid while @p writer lives; NULL before peft_writer_start() or
 *         out of range.
 */
PEFT_API const char* peft_writer_tensor_name(const peft_writer* writer, size_t position);

/**
 * @brief Length in bytes of the name at @p position; differs from `strlen` of
 *        peft_writer_tensor_name() only for a name holding NUL bytes (its storage holds this many
 *        bytes followed by a NUL).
 * @param writer A started writer.
 * @param position 0 .. peft_writer_tensor_count() - 1.
 * @return The length; 0 before peft_writer_start() or out of range.
 */
PEFT_API size_t peft_writer_tensor_name_length(const peft_writer* writer, size_t position);

/**
 * @brief Declaration index (0-based, in peft_writer_add_tensor() order) of the tensor at @p position.
 * @param writer A started writer.
 * @param position 0 .. peft_writer_tensor_count() - 1.
 * @return The index; SIZE_MAX before peft_writer_start() or out of range.
 */
PEFT_API size_t peft_writer_tensor_declaration(const peft_writer* writer, size_t position);

/**
 * @brief Number of files the writer produces (1 for a one-file writer; the shards of a checkpoint).
 * @param writer A started writer.
 * @return The count; 0 before peft_writer_start() or for NULL. The index file is not counted.
 */
PEFT_API size_t peft_writer_file_count(const peft_writer* writer);

/**
 * @brief Path of output file @p file_index (for a checkpoint: the folder joined with the shard name).
 * @param writer A started writer.
 * @param file_index 0 .. peft_writer_file_count() - 1.
 * @return Borrowed UTF-8 string valid while @p writer lives; NULL before start or out of range.
 */
PEFT_API const char* peft_writer_file_path(const peft_writer* writer, size_t file_index);

/**
 * @brief Begins the next tensor, whose bytes then come through peft_writer_write().
 * @param writer A writer.
 * @param name Must be the next tensor in the writer's order; NULL means that tensor, whatever its name.
 * @param src_dtype Dtype of the bytes that will be given: the declared dtype for a plain copy, or
 *        another one to convert from (see peft_convert()).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT naming the tensor when it is not the next one
 *         or the previous one is incomplete; #PEFT_ERR_UNSUPPORTED for a conversion that is not
 *         done; #PEFT_ERR_IO if the output cannot be created or written.
 */
PEFT_API peft_error* peft_writer_begin_tensor(peft_writer* writer, const char* name, int32_t src_dtype);

/**
 * @brief Appends bytes of the tensor begun with peft_writer_begin_tensor().
 *
 * The tensor is complete once all its bytes (elements x size of the source dtype) are given.
 * @param writer A writer with a begun tensor.
 * @param data @p nbytes bytes in the source dtype, little-endian; not kept after the call.
 * @param nbytes Any number up to what the tensor has left; whole elements when converting.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT naming the tensor for more bytes than it has
 *         left, a partial element when converting, or no begun tensor (nothing is written then);
 *         #PEFT_ERR_IO when writing fails (the output is then discarded).
 */
PEFT_API peft_error* peft_writer_write(peft_writer* writer, const void* data, uint64_t nbytes);

/**
 * @brief Writes the next tensor whole from a buffer.
 * @param writer A writer.
 * @param name Must be the next tensor in the writer's order; NULL means that tensor, whatever its name.
 * @param src_dtype Dtype of @p data (the declared dtype, or one to convert from).
 * @param data The tensor's bytes, little-endian, row-major; not kept after the call.
 * @param nbytes Their number: elements x size of @p src_dtype.
 * @return NULL on success; #PEFT_ERR_TENSOR_INVALID_INFO when @p nbytes does not match;
 *         #PEFT_ERR_INVALID_ARGUMENT when @p name is not the next tensor; #PEFT_ERR_UNSUPPORTED for
 *         a conversion that is not done; #PEFT_ERR_IO when writing fails.
 */
PEFT_API peft_error* peft_writer_write_tensor(peft_writer* writer, const char* name, int32_t src_dtype,
                                              const void* data, uint64_t nbytes);

/**
 * @brief Writes the next tensor whole from a callback that fills chunks.
 * @param writer A writer.
 * @param name Must be the next tensor in the writer's order; NULL means that tensor, whatever its name.
 * @param src_dtype Dtype of the bytes the callback gives (the declared dtype, or one to convert from).
 * @param source Called for each chunk until the tensor is complete (not called for zero bytes).
 * @param user_data Passed to @p source unchanged.
 * @return NULL on success; #PEFT_ERR_CANCELLED when @p source returns nonzero (the output is then
 *         discarded); the other errors as for peft_writer_write_tensor().
 */
PEFT_API peft_error* peft_writer_write_from_callback(peft_writer* writer, const char* name, int32_t src_dtype,
                                                     peft_tensor_source_fn source, void* user_data);

/**
 * @brief Writes the next tensor from tensor @p index of an opened checkpoint.
 *
 * The bytes are read in chunks with pread (never through a mapping, so rewriting a large checkpoint
 * does not keep it resident) and converted when the declared dtype differs from the source's. A
 * source file that changed since it was opened fails with #PEFT_ERR_IO before the tensor is begun;
 * one that changes during the call fails with #PEFT_ERR_IO and discards the output, as any failed
 * write does (see @ref file_changes).
 * @param writer A writer.
 * @param name Must be the next tensor in the writer's order; NULL means that tensor, whatever its name.
 * @param ckpt The source checkpoint; only used during the call.
 * @param index The source tensor (see peft_checkpoint_find()); it must have the declared shape.
 * @return NULL on success; #PEFT_ERR_SHAPE_MISMATCH for another shape; #PEFT_ERR_UNSUPPORTED for a
 *         conversion that is not done; #PEFT_ERR_INVALID_ARGUMENT for a bad index or order;
 *         #PEFT_ERR_IO when reading or writing fails.
 */
PEFT_API peft_error* peft_writer_write_from_checkpoint(peft_writer* writer, const char* name,
                                                       const peft_checkpoint* ckpt, size_t index);

/**
 * @brief Completes the output: checks that every tensor was written, flushes every file to disk and
 *        renames it into place (a checkpoint's index last), then removes files of an older layout.
 * @param writer A writer.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT naming a tensor that is missing or incomplete
 *         (nothing changes; write it and finish again); #PEFT_ERR_IO when flushing or renaming fails
 *         (the output is then discarded).
 */
PEFT_API peft_error* peft_writer_finish(peft_writer* writer);

/** @} */

/* ================================================================================================ */
/** @defgroup adapter PEFT LoRA adapters, translation and validation
 *
 *  An adapter is a folder written by PEFT's `save_pretrained`: `adapter_config.json` and
 *  `adapter_model.safetensors`. Opening one parses every LoraConfig field (PEFT 0.6 to 0.21),
 *  resolves each tensor key to a module and a role, and computes for every LoRA module the rank,
 *  alpha and scaling PEFT computes (`rank_pattern` / `alpha_pattern`, `use_rslora`). Matching follows
 *  PEFT 0.21's `check_target_module_exists` and `get_pattern_key`, with Python regular expressions.
 *
 *  Opening is strict where PEFT is silently lossy: a key that is not a PEFT adapter key, LoRA
 *  tensors of a module the config does not target, a module with lora_A but no lora_B, DoRA or
 *  lora_bias tensors that the config does not announce, or a rank that `r` / `rank_pattern` does not
 *  give are errors that list every offending key or module; lenient loading
 *  (peft_adapter_options_set_lenient()) instead ignores what PEFT ignores and lists it. Configs whose initialisation rewrites the
 *  base weights when PEFT loads them (`init_lora_weights` pissa, olora, corda, loftq, lora_ga) and
 *  LoRA variants with another merge (QALoRA, BD-LoRA, Arrow, MonteCLoRA, VeLoRA, KaSA,
 *  `layer_replication`, Megatron) are #PEFT_ERR_UNSUPPORTED naming the field. Activated LoRA
 *  (`alora_invocation_tokens`) is read, for LoRA's Linear layers as in PEFT: it is served unmerged
 *  (peft_lora_apply() says how the host applies it), exported as a PEFT adapter or a GGUF LoRA with
 *  llama.cpp's `adapter.alora.invocation_tokens`, and imported back; every merge, swap, combination
 *  and conversion refuses it with #PEFT_ERR_UNSUPPORTED, since its delta applies only from its
 *  invocation tokens on. LoRA on stacked MoE
 *  expert parameters (`target_parameters`, PEFT's ParamWrapper) is read for the architectures whose
 *  table lists their experts (Qwen3-MoE, Mixtral, gpt-oss); it merges into safetensors checkpoints
 *  and GGUF bases (llama.cpp's stacked `ffn_*_exps` tensors), exports as a GGUF LoRA, merges into
 *  host buffers (peft_merge_buffer_apply()) and hot-swaps (see @ref serving);
 *  with DoRA, `lora_bias` or dropout, and in combination and conversion it is #PEFT_ERR_UNSUPPORTED
 *  naming why.
 *
 *  A translator maps tensor keys between HuggingFace names
 *  (`base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight`) and a host's slash-separated
 *  native names (`transformer/layer_4/attention/query/lora_a`) with a table: a built-in one per
 *  architecture family (`data/arch/<family>.json`, found through `$PEFT_C_DATA_DIR`, the install
 *  prefix or the source tree) or the caller's own, from a file or a JSON string. The format is
 *  documented in docs/translation-tables.md. HF -> native -> HF is the identity; a key that a table
 *  does not resolve is an error (#PEFT_ERR_UNRESOLVED_KEY) that lists every such key. A translator
 *  for GGUF names (peft_translator_from_gguf(), peft_translator_new_gguf()) uses GGUF tensor names
 *  (`blk.4.attn_q.weight`) as its native names.
 *
 *  Thread safety: adapters and translators are read-only after creation; all their functions may be
 *  called from many threads at once. Options belong to one thread at a time.
 *  @{ */

/** A loaded LoRA adapter. Free with peft_adapter_free(). */
typedef struct peft_adapter peft_adapter;
/** Options for peft_adapter_open(). Free with peft_adapter_options_free(). */
typedef struct peft_adapter_options peft_adapter_options;
/** A key translator backed by an architecture table. Free with peft_translator_free(). */
typedef struct peft_translator peft_translator;

/** @name Layer kinds of adapter modules (peft_adapter_module_kind())
 *  @{ */
#define PEFT_LAYER_LINEAR 0           /**< nn.Linear: base weight [out, in]; delta = scaling * B @ A. */
#define PEFT_LAYER_CONV1D 1           /**< transformers Conv1D (GPT-2): base weight [in, out]; delta transposed. */
#define PEFT_LAYER_EMBEDDING 2        /**< nn.Embedding: base [num, dim]; delta = scaling * (B @ A)^T. */
#define PEFT_LAYER_CONV2D 3           /**< nn.Conv2d: base [out, in, kh, kw]. */
#define PEFT_LAYER_FULL 4             /**< Whole tensors that replace the base's (modules_to_save, biases). */
#define PEFT_LAYER_TRAINABLE_TOKENS 5 /**< Rows that replace base embedding rows (trainable_token_indices). */
/** @} */

/**
 * @brief Creates adapter options with the defaults: no base model, architecture table detected.
 * @param[out] out Receives the options; free them with peft_adapter_options_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_options_new(peft_adapter_options** out);

/**
 * @brief Releases adapter options.
 * @param opts Options, or NULL. Thread-safe.
 */
PEFT_API void peft_adapter_options_free(peft_adapter_options* opts);

/**
 * @brief Sets the base model folder (config.json and safetensors weights) to open the adapter against.
 *
 * With a base, opening also expands `"all-linear"` and an absent `target_modules` as PEFT does, tells
 * Linear from GPT-2 Conv1D layers by the base's shapes and architecture (never by `fan_in_fan_out`
 * alone), and validates every module against the base, as peft_adapter_validate() does.
 * @param opts Options.
 * @param base_dir A folder path or a hub model id (@ref hub) (UTF-8), copied; NULL or "" for none.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_adapter_options_set_base_dir(peft_adapter_options* opts, const char* base_dir);

/**
 * @brief Makes the adapter use this translator's architecture table instead of detecting one.
 * @param opts Options.
 * @param translator A translator (its table is shared, not copied), or NULL to detect again.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_adapter_options_set_translator(peft_adapter_options* opts,
                                                         const peft_translator* translator);

/**
 * @brief Opens a PEFT LoRA adapter folder.
 *
 * The folder must hold `adapter_config.json` and `adapter_model.safetensors`. The architecture table
 * (for Conv1D layers and translation) is the one set in the options, else detected from the base's
 * config.json (`model_type`, `architectures`), else from `base_model_name_or_path`; an adapter of an
 * unknown family opens without one.
 *
 * @param dir The adapter folder, or a hub model id (@ref hub) (UTF-8).
 * @param opts Options, or NULL for the defaults. Not kept after the call.
 * @param[out] out Receives the adapter; free it with peft_adapter_free().
 * @return NULL on success, else:
 *         #PEFT_ERR_NOT_FOUND for a missing folder or file;
 *         #PEFT_ERR_UNSUPPORTED for `adapter_model.bin` (a pickle), a `peft_type` other than LORA,
 *         LOHA, LOKR, ADALORA, IA3, MISS, SHIRA, VERA, RANDLORA, FOURIERFT, OFT, BOFT, HRA, VBLORA
 *         and C3A (the
 *         message names the method and, for prompt/prefix tuning, p-tuning, X-LoRA, Poly..., why
 *         it cannot be merged), LoHa/LoKr in their CP (conv) form, or
 *         a LoRA variant this library does not merge (the message names the field);
 *         #PEFT_ERR_INVALID_CONFIG for invalid JSON, a field of the wrong type, a value PEFT rejects,
 *         modules the config does not target, or ranks / DoRA / lora_bias that do not match the
 *         tensors (the message names the field and every module at fault);
 *         #PEFT_ERR_UNRESOLVED_KEY listing every tensor key that is not a PEFT adapter key, or (with
 *         a base) every adapter tensor the base has no tensor for;
 *         #PEFT_ERR_SHAPE_MISMATCH (with a base) listing every shape that does not fit;
 *         #PEFT_ERR_INVALID_CHECKPOINT for incomplete or duplicated LoRA tensors;
 *         the format error codes of peft_checkpoint_open() for a damaged safetensors file.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_adapter_open(const char* dir, const peft_adapter_options* opts, peft_adapter** out);

/**
 * @brief Releases an adapter. Strings and arrays borrowed from it become invalid.
 * @param adapter An adapter, or NULL. Thread-safe.
 */
PEFT_API void peft_adapter_free(peft_adapter* adapter);

/**
 * @brief Validates an opened adapter against a base model folder, without changing the adapter.
 *
 * Every LoRA module must resolve to a base weight whose shape fits (lora_A [r, in] and lora_B
 * [out, r] against a Linear [out, in] or a GPT-2 Conv1D [in, out]; embeddings and Conv2d likewise),
 * every full replacement tensor must exist in the base with the same shape, and trainable-token rows
 * must fit the embedding.
 * @param adapter An adapter.
 * @param base_dir The base model folder (config.json and model.safetensors or a sharded index), or a
 *        hub model id (@ref hub).
 * @return NULL when everything fits; #PEFT_ERR_UNRESOLVED_KEY (if any tensor has no base tensor) or
 *         #PEFT_ERR_SHAPE_MISMATCH with a message listing every problem; #PEFT_ERR_NOT_FOUND /
 *         #PEFT_ERR_IO / format errors for the base folder; #PEFT_ERR_INVALID_ARGUMENT for NULL.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_adapter_validate(const peft_adapter* adapter, const char* base_dir);

/**
 * @brief The adapter's config as PEFT writes it: `json.dumps(config, indent=2, sort_keys=True)`,
 *        with every field of the file, unknown ones included.
 * @param adapter An adapter, or NULL.
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL if @p adapter is NULL. Thread-safe.
 */
PEFT_API const char* peft_adapter_config_json(const peft_adapter* adapter);

/**
 * @brief One field of the config as compact JSON (`"LORA"`, `8`, `["q_proj","v_proj"]`, `null`).
 * @param adapter An adapter.
 * @param field The field's name, e.g. "target_modules".
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL when the file has no such field
 *         or an argument is NULL. Thread-safe.
 */
PEFT_API const char* peft_adapter_config_field(const peft_adapter* adapter, const char* field);

/**
 * @brief `r` as PEFT uses it (8 when the file has none).
 * @param adapter An adapter, or NULL.
 * @return The rank; 0 if @p adapter is NULL. Thread-safe.
 */
PEFT_API int64_t peft_adapter_r(const peft_adapter* adapter);

/**
 * @brief `lora_alpha` as PEFT uses it (8 when the file has none).
 * @param adapter An adapter, or NULL.
 * @return The alpha; 0 if @p adapter is NULL. Thread-safe.
 */
PEFT_API double peft_adapter_lora_alpha(const peft_adapter* adapter);

/**
 * @brief `use_rslora`: whether scaling is lora_alpha / sqrt(r) instead of lora_alpha / r.
 * @param adapter An adapter, or NULL.
 * @return 1 or 0 (0 for NULL). Thread-safe.
 */
PEFT_API int32_t peft_adapter_use_rslora(const peft_adapter* adapter);

/**
 * @brief `use_dora`: whether this is a DoRA adapter (with lora_magnitude_vector tensors).
 * @param adapter An adapter, or NULL.
 * @return 1 or 0 (0 for NULL). Thread-safe.
 */
PEFT_API int32_t peft_adapter_use_dora(const peft_adapter* adapter);

/**
 * @brief `lora_bias`: whether lora_B carries a bias (lora_B.bias tensors).
 * @param adapter An adapter, or NULL.
 * @return 1 or 0 (0 for NULL). Thread-safe.
 */
PEFT_API int32_t peft_adapter_lora_bias(const peft_adapter* adapter);

/**
 * @brief `fan_in_fan_out` as written in the file (the layout itself is decided from the base).
 * @param adapter An adapter, or NULL.
 * @return 1 or 0 (0 for NULL). Thread-safe.
 */
PEFT_API int32_t peft_adapter_fan_in_fan_out(const peft_adapter* adapter);

/**
 * @brief `peft_type` ("LORA").
 * @param adapter An adapter, or NULL.
 * @return Borrowed string valid while @p adapter lives; NULL for NULL. Thread-safe.
 */
PEFT_API const char* peft_adapter_peft_type(const peft_adapter* adapter);

/**
 * @brief `bias`: "none", "all" or "lora_only".
 * @param adapter An adapter, or NULL.
 * @return Borrowed string valid while @p adapter lives; NULL for NULL. Thread-safe.
 */
PEFT_API const char* peft_adapter_bias(const peft_adapter* adapter);

/**
 * @brief `task_type`, e.g. "CAUSAL_LM".
 * @param adapter An adapter, or NULL.
 * @return Borrowed string valid while @p adapter lives; NULL when null or absent. Thread-safe.
 */
PEFT_API const char* peft_adapter_task_type(const peft_adapter* adapter);

/**
 * @brief `base_model_name_or_path`.
 * @param adapter An adapter, or NULL.
 * @return Borrowed string valid while @p adapter lives; NULL when null or absent. Thread-safe.
 */
PEFT_API const char* peft_adapter_base_model_name_or_path(const peft_adapter* adapter);

/**
 * @brief The architecture family whose table the adapter uses ("llama", "gpt2", ...).
 * @param adapter An adapter, or NULL.
 * @return Borrowed string valid while @p adapter lives; NULL when no table applies. Thread-safe.
 */
PEFT_API const char* peft_adapter_family(const peft_adapter* adapter);

/**
 * @brief A translator over the adapter's architecture table.
 * @param adapter An adapter.
 * @param[out] out Receives a translator; free it with peft_translator_free().
 * @return NULL on success; #PEFT_ERR_NOT_FOUND when the adapter has no table;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_translator(const peft_adapter* adapter, peft_translator** out);

/**
 * @brief Number of notes: things worth knowing that are not errors (an adapter name removed from
 *        keys, targets that could not be checked without a base, rank_pattern keys matching nothing,
 *        a fan_in_fan_out flag that contradicts the base).
 * @param adapter An adapter, or NULL.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_adapter_note_count(const peft_adapter* adapter);

/**
 * @brief Note @p index (0 .. count - 1).
 * @param adapter An adapter, or NULL.
 * @param index Note index (0 .. peft_adapter_note_count() - 1).
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_adapter_note(const peft_adapter* adapter, size_t index);

/**
 * @brief Number of modules: LoRA layers and modules with full replacement tensors, in the order of
 *        their first tensor in the file.
 * @param adapter An adapter, or NULL.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_adapter_module_count(const peft_adapter* adapter);

/**
 * @brief Finds a module by its path (without "base_model.model.").
 * @param adapter An adapter.
 * @param name A module path such as "model.layers.0.self_attn.q_proj".
 * @param[out] out_index Receives the module's index.
 * @return NULL on success; #PEFT_ERR_NOT_FOUND naming the module; #PEFT_ERR_INVALID_ARGUMENT for NULL.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_adapter_find_module(const peft_adapter* adapter, const char* name, size_t* out_index);

/**
 * @brief Path of module @p module (transformers module name, without "base_model.model.").
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_adapter_module_name(const peft_adapter* adapter, size_t module);

/**
 * @brief Kind of module @p module: one of the `PEFT_LAYER_*` values.
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @return The kind, or -1 if out of range. Thread-safe.
 */
PEFT_API int32_t peft_adapter_module_kind(const peft_adapter* adapter, size_t module);

/**
 * @brief Rank of LoRA module @p module (from `rank_pattern` or `r`, equal to the tensors' rank; for a
 *        stacked expert parameter (`target_parameters`) the factors hold it once per expert, lora_A
 *        rank x experts rows, as PEFT's ParamWrapper saves them).
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @return The rank; 0 for a full / trainable-tokens module or out of range. Thread-safe.
 */
PEFT_API int64_t peft_adapter_module_rank(const peft_adapter* adapter, size_t module);

/**
 * @brief Alpha of LoRA module @p module (from `alpha_pattern` or `lora_alpha`).
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @return The alpha; 0 for a full / trainable-tokens module or out of range. Thread-safe.
 */
PEFT_API double peft_adapter_module_alpha(const peft_adapter* adapter, size_t module);

/**
 * @brief Scaling of LoRA module @p module: alpha / rank, or alpha / sqrt(rank) with use_rslora.
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @return The scaling; 0 for a full / trainable-tokens module or out of range. Thread-safe.
 */
PEFT_API double peft_adapter_module_scaling(const peft_adapter* adapter, size_t module);

/**
 * @brief Number of tensors of module @p module.
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @return The count; 0 if out of range. Thread-safe.
 */
PEFT_API size_t peft_adapter_module_tensor_count(const peft_adapter* adapter, size_t module);

/**
 * @brief Role of tensor @p tensor of module @p module: the key's tail after the module path, e.g.
 *        "lora_A.weight", "lora_B.weight", "lora_B.bias", "lora_embedding_A", "lora_embedding_B",
 *        "lora_magnitude_vector", "token_adapter.trainable_tokens_delta", or for full tensors
 *        "weight", "bias", "base_layer.weight", ...
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @param tensor Tensor index within the module (0 .. peft_adapter_module_tensor_count() - 1).
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_adapter_module_tensor_role(const peft_adapter* adapter, size_t module, size_t tensor);

/**
 * @brief The tensor's key as stored in adapter_model.safetensors.
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @param tensor Tensor index within the module (0 .. peft_adapter_module_tensor_count() - 1).
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_adapter_module_tensor_key(const peft_adapter* adapter, size_t module, size_t tensor);

/**
 * @brief The base model tensor this tensor applies to (LoRA roles: the module's weight; lora_B.bias:
 *        its bias) or replaces (full tensors, ".base_layer" removed). Resolved against the base when
 *        the adapter was opened with one (its base_model_prefix taken into account).
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @param tensor Tensor index within the module (0 .. peft_adapter_module_tensor_count() - 1).
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_adapter_module_tensor_base_name(const peft_adapter* adapter, size_t module,
                                                          size_t tensor);

/**
 * @brief Dtype (`PEFT_DTYPE_*`) of a module's tensor.
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @param tensor Tensor index within the module (0 .. peft_adapter_module_tensor_count() - 1).
 * @return The dtype, or -1 if out of range. Thread-safe.
 */
PEFT_API int32_t peft_adapter_module_tensor_dtype(const peft_adapter* adapter, size_t module, size_t tensor);

/**
 * @brief Number of dimensions of a module's tensor.
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @param tensor Tensor index within the module (0 .. peft_adapter_module_tensor_count() - 1).
 * @return The rank; 0 if out of range. Thread-safe.
 */
PEFT_API size_t peft_adapter_module_tensor_ndim(const peft_adapter* adapter, size_t module, size_t tensor);

/**
 * @brief Shape of a module's tensor: ndim values.
 * @param adapter An adapter, or NULL.
 * @param module Module index (0 .. peft_adapter_module_count() - 1).
 * @param tensor Tensor index within the module (0 .. peft_adapter_module_tensor_count() - 1).
 * @return Borrowed array valid while @p adapter lives; NULL for a scalar or out of range. Thread-safe.
 */
PEFT_API const uint64_t* peft_adapter_module_tensor_shape(const peft_adapter* adapter, size_t module,
                                                          size_t tensor);

/**
 * @brief Reads a module's tensor into the caller's buffer, converting to @p dtype (see peft_convert()).
 * @param adapter An adapter.
 * @param module Module index.
 * @param tensor Tensor index within the module.
 * @param dtype The dtype wanted in @p dst.
 * @param dst The buffer; any alignment.
 * @param dst_nbytes Its size: must equal elements x size of @p dtype.
 * @return NULL on success; #PEFT_ERR_UNSUPPORTED for a conversion peft_convert() does not do;
 *         #PEFT_ERR_INVALID_ARGUMENT for a wrong size, index or NULL; #PEFT_ERR_IO on a failed read
 *         or when `adapter_model.safetensors` changed since the adapter was opened (see
 *         @ref file_changes). On failure @p dst may have been partly written. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_module_tensor_read(const peft_adapter* adapter, size_t module, size_t tensor,
                                                     int32_t dtype, void* dst, uint64_t dst_nbytes);

/**
 * @brief Token indices of a trainable-tokens module (rows of the embedding its tensor replaces).
 * @param adapter An adapter.
 * @param module Module index.
 * @param[out] out_count Receives the number of indices (0 for other modules or out of range).
 * @return Borrowed array valid while @p adapter lives; NULL when there are none. Thread-safe.
 */
PEFT_API const int64_t* peft_adapter_module_token_indices(const peft_adapter* adapter, size_t module,
                                                          size_t* out_count);

/**
 * @brief A translator over a built-in architecture table.
 * @param family A family such as "llama", "gpt2", "bert" (see peft_translator_builtin_families()).
 * @param[out] out Receives the translator; free it with peft_translator_free().
 * @return NULL on success; #PEFT_ERR_NOT_FOUND (naming the folders searched) when no such table is
 *         installed; #PEFT_ERR_INVALID_CONFIG for a broken table file; #PEFT_ERR_INVALID_ARGUMENT for
 *         NULL or a name that is not a family name. Thread-safe.
 */
PEFT_API peft_error* peft_translator_new_builtin(const char* family, peft_translator** out);

/**
 * @brief A translator over the caller's table in a JSON file (format: docs/translation-tables.md).
 * @param path The file (UTF-8).
 * @param[out] out Receives the translator; free it with peft_translator_free().
 * @return NULL on success; #PEFT_ERR_IO if the file cannot be read; #PEFT_ERR_INVALID_CONFIG naming
 *         the rule at fault for a malformed or non-invertible table; #PEFT_ERR_INVALID_ARGUMENT for
 *         NULL. Thread-safe.
 */
PEFT_API peft_error* peft_translator_from_file(const char* path, peft_translator** out);

/**
 * @brief A translator over the caller's table given as a JSON string.
 * @param json The table (UTF-8, NUL-terminated).
 * @param[out] out Receives the translator; free it with peft_translator_free().
 * @return NULL on success; #PEFT_ERR_INVALID_CONFIG naming the rule at fault;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_translator_from_json(const char* json, peft_translator** out);

/**
 * @brief Detects the architecture family of a base model and returns its built-in translator.
 *
 * The base's config.json decides (`model_type`, then `architectures`); failing that, @p model_name
 * (e.g. an adapter's base_model_name_or_path) is matched against the tables' name patterns.
 * @param base_dir A base model folder or hub model id (@ref hub), or NULL.
 * @param model_name A model name such as "meta-llama/Llama-3.2-1B", or NULL.
 * @param[out] out Receives the translator; free it with peft_translator_free().
 * @return NULL on success; #PEFT_ERR_NOT_FOUND when no family matches; #PEFT_ERR_INVALID_CONFIG for
 *         an unreadable config.json; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_translator_detect(const char* base_dir, const char* model_name, peft_translator** out);

/**
 * @brief The built-in families, one per line, sorted ("bert\nbloom\n..."); the older form of
 *        peft_translator_builtin_family_list().
 * @param[out] out Receives the list; free it with peft_string_free().
 * @return NULL on success (an empty string when no tables are installed);
 *         #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_translator_builtin_families(char** out);

/**
 * @brief The built-in families, sorted, as a list.
 * @param[out] out Receives the list (empty when no tables are installed); free it with
 *             peft_string_list_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL; #PEFT_ERR_OUT_OF_MEMORY.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_translator_builtin_family_list(peft_string_list** out);

/**
 * @brief Releases a translator.
 * @param translator A translator, or NULL. Thread-safe.
 */
PEFT_API void peft_translator_free(peft_translator* translator);

/**
 * @brief The table's family name.
 * @param translator A translator, or NULL.
 * @return Borrowed string valid while @p translator lives; NULL for NULL. Thread-safe.
 */
PEFT_API const char* peft_translator_family(const peft_translator* translator);

/**
 * @brief Translates one HuggingFace key (with or without "base_model.model.") to its native name.
 * @param translator A translator.
 * @param hf_key E.g. "base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight".
 * @param[out] out Receives the native name; free it with peft_string_free().
 * @return NULL on success; #PEFT_ERR_UNRESOLVED_KEY naming the key when the table does not resolve
 *         it; #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_translator_to_native(const peft_translator* translator, const char* hf_key, char** out);

/**
 * @brief Translates one native name back to its HuggingFace key.
 * @param translator A translator.
 * @param native_key E.g. "transformer/layer_4/attention/query/lora_a".
 * @param with_peft_prefix Nonzero to prepend "base_model.model." (as keys in adapter files have).
 * @param[out] out Receives the key; free it with peft_string_free().
 * @return NULL on success; #PEFT_ERR_UNRESOLVED_KEY naming the key; #PEFT_ERR_INVALID_ARGUMENT for NULL.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_translator_to_hf(const peft_translator* translator, const char* native_key,
                                          int32_t with_peft_prefix, char** out);

/**
 * @brief Translates many HuggingFace keys at once; fails listing every key that does not resolve.
 * @param translator A translator.
 * @param hf_keys @p count keys.
 * @param count Number of keys.
 * @param[out] out An array of @p count pointers; on success each receives a native name to free
 *             with peft_string_free(). On failure nothing is written.
 * @return NULL on success; #PEFT_ERR_UNRESOLVED_KEY listing every unresolved key;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments. Thread-safe.
 */
PEFT_API peft_error* peft_translator_to_native_batch(const peft_translator* translator,
                                                     const char* const* hf_keys, size_t count, char** out);

/**
 * @brief Translates many native names back at once; fails listing every name that does not resolve.
 * @param translator A translator.
 * @param native_keys @p count native names.
 * @param count Number of names.
 * @param with_peft_prefix Nonzero to prepend "base_model.model." to every result.
 * @param[out] out An array of @p count pointers; on success each receives a key to free with
 *             peft_string_free(). On failure nothing is written.
 * @return NULL on success; #PEFT_ERR_UNRESOLVED_KEY listing every unresolved name;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments. Thread-safe.
 */
PEFT_API peft_error* peft_translator_to_hf_batch(const peft_translator* translator, const char* const* native_keys,
                                                 size_t count, int32_t with_peft_prefix, char** out);

/**
 * @brief A translator for GGUF names, from a GGUF model file: its `general.architecture` picks the
 *        built-in table, and its `<arch>.attention.head_count` and `head_count_kv` are the head
 *        counts of the converter's row orders.
 *
 * A translator for GGUF names reads and writes the tensor names of GGUF model files (the tables'
 * `gguf` side; docs/gguf.md): peft_translator_to_native() turns
 * "model.layers.0.self_attn.q_proj.weight" into "blk.0.attn_q.weight" (the roles `weight` and `bias`
 * only; other keys do not resolve) and peft_translator_to_hf() back. Given to
 * peft_merge_buffer_options_set_translator() or peft_host_model_set_translator(), it makes layer
 * names GGUF tensor names ("blk.0.attn_q.weight", or "blk.0.attn_q") of buffers that hold the
 * tensors as a llama.cpp-family engine loads them from the file: shapes are given as PyTorch gives
 * them, outermost first (GGUF's `ne` reversed: [out, in] for a linear weight, [vocab, dim] for
 * `token_embd`), and rows in the order the converter wrote them. Where the converter reordered a
 * weight's rows (LLaMA's RoPE permutation of `attn_q` and `attn_k`, the tables' `gguf_rows`), the
 * rows of the adapter's lora_B (and of lora_B.bias and a DoRA magnitude) are put in the same order,
 * never the buffer's; so a merge writes exactly what peft_merge_checkpoint() writes into the GGUF
 * file, and exact removal and hot-swap restore the buffers bit for bit. GPT-2 Conv1D layers are
 * merged as Linear, since GGUF holds their weights [out, in]. A file with experts
 * (`<arch>.expert_count`) gets the table that names llama.cpp's stacked expert tensors (Mixtral's
 * among those reading "llama"), which a host model takes as [experts, out, in] buffers.
 * peft_registry_new() refuses such a translator (unmerged apply does not reorder rows).
 *
 * The translator copies what it needs; the checkpoint may be freed afterwards. A file without head
 * counts gives a translator whose reordered weights fail (#PEFT_ERR_SHAPE_MISMATCH) when they are
 * merged or added to a host model.
 * @param checkpoint A checkpoint opened on one GGUF model file (peft_checkpoint_open()).
 * @param[out] out Receives the translator; free it with peft_translator_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or a checkpoint that is not one GGUF
 *         file; #PEFT_ERR_INVALID_CHECKPOINT (naming the file) without a string
 *         `general.architecture`; #PEFT_ERR_UNSUPPORTED when no built-in table reads that
 *         architecture; #PEFT_ERR_NOT_FOUND or #PEFT_ERR_INVALID_CONFIG when the tables cannot be
 *         read. Thread-safe.
 */
PEFT_API peft_error* peft_translator_from_gguf(const peft_checkpoint* checkpoint, peft_translator** out);

/**
 * @brief A translator for GGUF names from a GGUF architecture and head counts, for hosts that hold
 *        the weights without the file (see peft_translator_from_gguf() for what it does).
 * @param architecture A GGUF `general.architecture` such as "llama", "qwen2", "gemma2" (UTF-8).
 * @param head_count The attention heads (`<arch>.attention.head_count`), at least 1.
 * @param head_count_kv The key/value heads (`<arch>.attention.head_count_kv`), or 0 for
 *        @p head_count.
 * @param[out] out Receives the translator; free it with peft_translator_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or a @p head_count of 0;
 *         #PEFT_ERR_UNSUPPORTED when no built-in table reads @p architecture;
 *         #PEFT_ERR_NOT_FOUND or #PEFT_ERR_INVALID_CONFIG when the tables cannot be read.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_translator_new_gguf(const char* architecture, uint64_t head_count, uint64_t head_count_kv,
                                              peft_translator** out);

/**
 * @brief Chooses lenient loading: what PEFT 0.21's `PeftModel.from_pretrained` (through
 *        `set_peft_model_state_dict` and `load_state_dict(strict=False)`) ignores is ignored, and
 *        each ignored item becomes a warning (peft_adapter_warning()). Strict is the default.
 *
 * Ignored, as unexpected keys PEFT drops: keys that are not PEFT adapter keys; LoRA tensors of
 * modules that `target_modules` (with `exclude_modules`, `modules_to_save`, `layers_to_transform`)
 * does not select; `lora_magnitude_vector` without `use_dora`; `lora_B.bias` without `lora_bias`;
 * trainable-token rows `trainable_token_indices` does not configure; with a base, tensors for
 * modules or weights the base does not have. Ignored, as missing keys PEFT initialises to zero so
 * that they change nothing (`init_lora_weights` true or "gaussian"): `lora_B.weight` of a module
 * holding `lora_A` (the module is left out), `lora_embedding_A` of an embedding holding
 * `lora_embedding_B`, `lora_B.bias` when `lora_bias` is true, and, with a base, every key of a base
 * module that `target_modules` selects but the file has no tensors for. The merged result equals
 * PEFT's. Everything PEFT refuses or would leave at random values stays an error with the code
 * peft_adapter_open() documents: rank or shape mismatches, `lora_A` (or `lora_embedding_B`) missing
 * where its partner is present, a DoRA module without its magnitude vector, two keys for one
 * tensor, other initialisations with factors missing, `target_modules` selecting no module of the
 * base. The options also make peft_registry_register() and peft_registry_register_memory() lenient
 * (their warnings: peft_registry_warning_list()); peft_adapter_validate() checks the adapter as loaded.
 * @param opts Options.
 * @param lenient Nonzero for lenient loading, 0 for strict (the default).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_adapter_options_set_lenient(peft_adapter_options* opts, int32_t lenient);

/**
 * @brief Number of warnings: what lenient loading ignored (peft_adapter_options_set_lenient());
 *        always 0 for an adapter opened strictly.
 * @param adapter An adapter, or NULL.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_adapter_warning_count(const peft_adapter* adapter);

/**
 * @brief Warning @p index (0 .. count - 1): a sentence starting with its stable kind, then the key
 *        as PEFT's load result names it without the adapter name, then why:
 *        `unexpected key "<key as in the file>": <why>; PEFT ignores it` or
 *        `missing key "base_model.model.<module>.<role>": <why>`.
 * @param adapter An adapter, or NULL.
 * @param index Warning index (0 .. peft_adapter_warning_count() - 1).
 * @return Borrowed UTF-8 string valid while @p adapter lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_adapter_warning(const peft_adapter* adapter, size_t index);

/** @name Adapter doctor
 *  Checks an adapter folder against a base checkpoint without merging and without the strict
 *  loader (so it also reads adapters peft_adapter_open() refuses), reports every problem at once
 *  as JSON, and writes a repaired copy. The report's schema (version 1, fields only ever added) is
 *  documented in docs/doctor.md: a `summary` (`ok`, counts), one entry per module (the base tensor
 *  it matched with shape and dtype, the host name when an architecture table is known, rank, alpha,
 *  effective scaling, DoRA convention), `problems` (each with a stable `kind` string, the keys and
 *  modules involved, a message and the fix when one is known) and the `renames` and
 *  `config_changes` a fix applies. On a base whose output embedding is tied to its input
 *  embedding (`tie_word_embeddings`), an adapter changing either side gets `tied_embeddings`: which
 *  tied case it is in (`output_only`, `input_only`, `both`, `ensure_weight_tying`,
 *  `trainable_tokens`, `modules_to_save`) and what a merge does under each policy of
 *  peft_merge_options_set_tied_embeddings(); that is not a problem. Known renames: transformers' checkpoint-conversion renames
 *  between releases (VLM `language_model.model.*` <-> `model.language_model.*` and the others of
 *  the llava and qwen2_vl families), PEFT's `base_model.model.` prefix missing or doubled,
 *  `.weight` suffix variants, `lora_A/B` <-> `lora_embedding_A/B`, kohya / LyCORIS names
 *  (`lora_down`, `lora_up`, per-module `alpha`); a module rename is proposed only when exactly one
 *  candidate name exists in the base.
 *  @{ */

/**
 * @brief Examines an adapter folder, against a base model folder when one is given.
 * @param adapter_dir A folder (or a hub model id, @ref hub) with adapter_config.json and
 *        adapter_model.safetensors (without the config, as kohya / LyCORIS files come, one is made
 *        from the tensors and reported as the problem `missing_config`).
 * @param base_dir A base model folder (config.json and safetensors weights), or NULL / "" for none
 *        (then only what the adapter itself shows is checked, and module renames are not proposed).
 * @param[out] out_json Receives the report (UTF-8 JSON, keys sorted); free it with
 *        peft_string_free(). Problems found are in the report, not errors: check `summary.ok`.
 * The report never holds NaN or Infinity: a rank, alpha or scaling that is not a finite number
 * (a kohya `alpha` tensor holding inf / NaN, a factor dimension of 2^63 or more) is null, and the
 * module gets the problem `invalid_value`.
 * @return NULL on success; #PEFT_ERR_NOT_FOUND for a missing folder or adapter_model.safetensors,
 *         or either file incompletely downloaded into the hub cache; #PEFT_ERR_UNSUPPORTED for a
 *         folder holding adapter_model.bin instead of adapter_model.safetensors;
 *         #PEFT_ERR_INVALID_CONFIG for an adapter_config.json that cannot be read or a base
 *         config.json that is not JSON; safetensors format errors naming the file;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL @p adapter_dir or @p out_json. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_doctor(const char* adapter_dir, const char* base_dir, char** out_json);

/**
 * @brief Writes a copy of an adapter with every rename the doctor knows applied.
 *
 * The output folder holds adapter_model.safetensors with keys as PEFT saves them and
 * adapter_config.json with kohya alphas and ranks as `alpha_pattern` / `rank_pattern` entries and
 * renamed modules renamed in `target_modules` / `modules_to_save`; both are written as
 * peft_adapter_export() writes them (temporaries renamed into place, the config last; a failure
 * leaves the folder as it was). Tensors whose problem has no known fix are copied under their key;
 * so are keys whose renames would meet in one key (`duplicate_key`: no tensor is dropped). Values
 * that are not finite never reach the config.
 * @param adapter_dir The adapter folder (see peft_adapter_doctor()).
 * @param base_dir A base model folder, or NULL / "" (then only renames that need no base apply).
 * @param out_dir The output folder; created if needed. Never the adapter folder itself, the base
 *        folder, or a folder inside a hub cache snapshot (`models--org--name/snapshots/<commit>` and below, whose
 *        files are links into the cache); compared after resolving links (the folder need not exist).
 * @param[out] out_json NULL, or receives the report of the input adapter (as peft_adapter_doctor()
 *        gives it); free it with peft_string_free(). Run peft_adapter_doctor() on @p out_dir to see
 *        what remains.
 * @return NULL on success; the errors of peft_adapter_doctor(); #PEFT_ERR_IO for file system
 *         failures; #PEFT_ERR_INVALID_ARGUMENT for NULL @p adapter_dir or @p out_dir or an output path
 *         that is not a folder, or @p out_dir is the adapter folder, the base folder or inside a
 *         hub cache snapshot (the message says which). Thread-safe (distinct output folders).
 */
PEFT_API peft_error* peft_adapter_doctor_fix(const char* adapter_dir, const char* base_dir, const char* out_dir,
                                             char** out_json);

/** @} */

/** @} */
/* ================================================================================================ */
/** @defgroup merge Merging adapters into checkpoints and into host buffers
 *
 *  **Checkpoint merge** (peft_merge_checkpoint()): a base model folder (config.json and one
 *  `model.safetensors` or a sharded index, any float dtype) and one or more adapters, each with a
 *  weight, become a new folder that transformers' `from_pretrained` loads unchanged, as if
 *  `PeftModel.merge_and_unload()` had been saved with `save_pretrained`:
 *  - every base tensor, under its name, in the base's order, in the base's dtype or the chosen one
 *    (only F64/F32/F16/BF16 tensors convert; integers and 8-bit floats are copied);
 *  - LoRA layers merged as W' = round(W + sum_i weight_i * scaling_i * B_i A_i), computed in f32 and
 *    rounded once (round to nearest even) to the stored dtype; DoRA layers as PEFT merges them
 *    (one adapter at a time, in the order given, the norm taken from the weight at that point);
 *    `lora_B.bias` added to the layer's bias (lora_bias=True); full tensors of the adapter
 *    (modules_to_save copies, `bias="all"` biases, saved `base_layer` weights) replacing the base's,
 *    converted to the output dtype; trainable-token rows copied over their embedding rows.
 *    A tensor that keeps its dtype is computed in it; one that changes dtype is computed in f32
 *    and rounded once to the new dtype.
 *  - the files laid out like the base's (same shards, same names, a new index when the base has
 *    one), or resharded by size as `save_pretrained(max_shard_size=...)` does;
 *  - `config.json` copied; rewritten (as transformers writes it) only when the dtype changes
 *    (`dtype` / `torch_dtype`) or tied embeddings must be untied: when an adapter swaps in a
 *    `modules_to_save` copy of the input embedding, or changes the output embedding, of a model
 *    with `tie_word_embeddings`, the flag is set to false and an output embedding the base file
 *    lacks is added with the original values, as PEFT's merged model has them. LoRA, trainable
 *    tokens and saved `base_layer` weights on a tied input embedding keep the tie (PEFT changes the
 *    one shared parameter in place);
 *  - the base folder's other files (tokenizer files, generation_config.json, README.md, ...)
 *    copied; weight files of other formats and subfolders are not.
 *
 *  Quantized bases (docs/quantized-bases.md): a base whose config.json has a `quantization_config`
 *  is merged only for the methods listed there; any other (GPTQ, AWQ, HQQ, compressed-tensors, ...)
 *  is #PEFT_ERR_UNSUPPORTED naming the method and listing what is supported. FP8 block-scale bases
 *  (`quant_method: "fp8"`, F8_E4M3 weights with F32 `weight_scale_inv` per `weight_block_size`
 *  block): with the dtype kept, a changed FP8 weight is dequantized (`q * scale_inv`), merged in f32
 *  and quantized again block by block as transformers does (`s = 448 / amax` as torch computes it,
 *  `scale_inv = 1 / s`, 1 for an all-zero block; `q = e4m3(w * s)` rounded to nearest even,
 *  saturating at ±448), its scales rewritten, everything else copied byte for byte; an infinity or
 *  NaN there is #PEFT_ERR_NON_FINITE. With an output dtype every FP8 weight is written dequantized,
 *  the scales are left out and config.json loses `quantization_config`.
 *
 *  Everything is checked before anything is written: adapter tensors whose base tensor is missing
 *  (#PEFT_ERR_UNRESOLVED_KEY, every one listed), shapes (#PEFT_ERR_SHAPE_MISMATCH), conflicts between
 *  adapters (#PEFT_ERR_INVALID_ARGUMENT: two adapters replacing one tensor, trainable-token rows set
 *  twice) and dtypes that cannot be merged (#PEFT_ERR_UNSUPPORTED). The merge then streams: tensor by
 *  tensor, reading, computing and writing overlap, and memory stays at about twice the largest
 *  merged tensor plus the adapters. The output is all or nothing: files are written to temporaries
 *  and renamed into place only when complete; after a failure or a cancellation the output folder
 *  is as it was (a folder the merge created is removed again). Results do not depend on the number
 *  of threads.
 *
 *  **Buffer merge** (peft_merge_buffer_apply()): one LoRA layer of a loaded adapter merged into a
 *  weight the host owns (F32, BF16 or F16, row-major), with the same arithmetic, and taken out again
 *  with peft_merge_record_unmerge(): bit for bit when the original rows were kept
 *  (peft_merge_buffer_options_set_keep_original_rows()), otherwise by PEFT's arithmetic unmerge, which
 *  in BF16/F16 may differ from the original in the last bit. So a server can swap adapters without
 *  reloading its base weights.
 *
 *  **Other PEFT methods** (LoHa, LoKr, AdaLoRA, IA3 on Linear and GPT-2 Conv1D layers): both merges
 *  take them as PEFT 0.21's merge_and_unload() does (docs/peft-semantics.md, "Other PEFT methods"),
 *  the merge weight multiplying their scale (IA3: ia3_l times the weight). Their arithmetic unmerge
 *  subtracts the delta again, and for IA3 divides by ia3_l + 1e-8 as PEFT does, which is not exact
 *  even in F32: keep the original rows for an exact removal. IA3 scales a non-feed-forward layer's
 *  bias too: pass the bias to peft_merge_buffer_apply() to have it scaled. In serving, host models
 *  swap them (see @ref serving); unmerged apply takes LoRA layers only. MiSS (all three forms;
 *  weight 1 only, it has no scale) and SHiRA merge the same way on Linear layers (PEFT has neither
 *  on Conv1D). VeRA, RandLoRA and FourierFT merge the same way (their projections as saved
 *  with save_projection=True, the default: an adapter saved without them is #PEFT_ERR_UNSUPPORTED;
 *  FourierFT's positions drawn as torch.randperm draws them, its inverse FFT within f32 rounding of
 *  PEFT's). VB-LoRA (logits saved whole or with save_only_topk_weights; Linear and Conv1D) and C3A
 *  (Linear only, as in PEFT) merge the same way, their deltas computed in f64 and rounded once
 *  (within f32 rounding of PEFT's; C3A's exact circulant where PEFT uses FFTs); neither has a
 *  scale, so a weight other than 1 multiplies the delta.
 *
 *  **Multiplicative methods** (OFT, BOFT, HRA on Linear layers; PEFT has no GPT-2 Conv1D form): both
 *  merges multiply the weight by the method's rotation, built in f64 (docs/peft-semantics.md, "OFT,
 *  BOFT and HRA"); the result agrees with PEFT's f32 merge within 1e-6 of the weight, not bit for
 *  bit. PEFT has no merge weight for them: a weight or scale other than 1 is #PEFT_ERR_UNSUPPORTED.
 *  PEFT's own unmerge inverts (OFT: the inverse of R; BOFT: the transpose and 1 / boft_s; HRA: the
 *  reflections in reverse), which is approximate; the arithmetic unmerge here does the same, while
 *  kept original rows restore the exact original.
 *
 *  **Replacements** (LN_TUNING norm copies, TRAINABLE_TOKENS rows, and any adapter's full tensors and
 *  trainable-token rows): both merges overwrite the base tensor or rows with the adapter's values,
 *  rounded once to the buffer's dtype; the original rows are always kept in a buffer merge and
 *  restored exactly on removal. PEFT defines no weight for them: a weight other than 1 is
 *  #PEFT_ERR_UNSUPPORTED (docs/peft-semantics.md, "Replacement methods").
 *
 *  Thread safety: options and records belong to one thread at a time. A checkpoint merge runs on
 *  the calling thread (which also receives every progress call) plus worker threads of its own.
 *  Buffer merges into different buffers may run concurrently from any threads, also with the same
 *  adapter.
 *  @{ */

/** Options of a checkpoint merge. Free with peft_merge_options_free(). */
typedef struct peft_merge_options peft_merge_options;
/** What a checkpoint merge did. Free with peft_merge_result_free(). */
typedef struct peft_merge_result peft_merge_result;
/** Options of a buffer merge. Free with peft_merge_buffer_options_free(). */
typedef struct peft_merge_buffer_options peft_merge_buffer_options;
/** One adapter layer merged into a host buffer, and what removing it needs. Free with peft_merge_record_free(). */
typedef struct peft_merge_record peft_merge_record;

/**
 * @brief Progress of a long operation.
 * @param user_data The pointer given with the callback.
 * @param done Bytes done so far (for a merge: tensor bytes written), never decreasing.
 * @param total Bytes in all; `done == total` at the end.
 * @return 0 to continue; any other value cancels the operation (#PEFT_ERR_CANCELLED).
 */
typedef int32_t (*peft_progress_fn)(void* user_data, uint64_t done, uint64_t total);

#define PEFT_MERGE_DTYPE_KEEP (-1) /**< The older name of #PEFT_DTYPE_KEEP (the same value). */

/** @name What peft_merge_result_tensor_count() counts
 *  @{ */
#define PEFT_MERGE_TENSORS_MERGED 0   /**< Tensors changed by LoRA, DoRA, lora_B.bias or token rows. */
#define PEFT_MERGE_TENSORS_REPLACED 1 /**< Tensors replaced whole by an adapter tensor. */
#define PEFT_MERGE_TENSORS_COPIED 2   /**< Base tensors written unchanged (converted if the dtype changed). */
#define PEFT_MERGE_TENSORS_ADDED 3    /**< Tensors the base file lacks (an untied output embedding). */
/** @} */

/**
 * @brief Creates merge options with the defaults: no adapters, dtypes kept, the base's shard
 *        layout, one thread per core, no progress callback.
 * @param[out] out Receives the options; free them with peft_merge_options_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_merge_options_new(peft_merge_options** out);

/**
 * @brief Releases merge options (and the adapters they hold a reference to).
 * @param opts Options, or NULL. Thread-safe.
 */
PEFT_API void peft_merge_options_free(peft_merge_options* opts);

/**
 * @brief Adds an opened adapter to merge, with a weight that multiplies its LoRA scaling.
 *
 * Adapters are applied in the order they are added. The options keep a reference to the adapter,
 * so the caller may free its handle at once. The adapter may have been opened with or without a
 * base model: it is checked against the merge's base either way.
 * @param opts Options.
 * @param adapter An adapter (see peft_adapter_open()).
 * @param weight A finite number of the f32 range (magnitude at most FLT_MAX, 3.4028234663852886e38);
 *        1.0 merges the adapter as PEFT's merge_and_unload() does.
 *        Replacement tensors and trainable-token rows are not scaled.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or a weight that is not finite or
 *         beyond the f32 range (the message names it).
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_add_adapter(peft_merge_options* opts, const peft_adapter* adapter,
                                                    double weight);

/**
 * @brief Adds an adapter folder to merge, opened by peft_merge_checkpoint() against the base.
 *
 * Equivalent to peft_adapter_open() with the base folder set, then
 * peft_merge_options_add_adapter(); errors of opening are reported by peft_merge_checkpoint().
 *
 * For a merge into a GGUF base, @p dir may also be a GGUF LoRA file (llama.cpp's
 * `convert_lora_to_gguf.py` output or peft_adapter_export_gguf()'s: general.type "adapter",
 * adapter.type "lora", pairs `<base tensor>.lora_a` / `.lora_b`), mixable with PEFT folders. Its
 * pairs name the base's tensors directly and are merged as `llama-export-lora` merges them:
 * W += s·B·A with s = @p weight · adapter.lora.alpha / rank in f32 (s = @p weight when the alpha is 0
 * or absent; an s that overflows f32 is #PEFT_ERR_NON_FINITE naming the weight and the alpha), the pair
 * on `token_embd*` transposed as llama.cpp stores it, factors F32, F16, BF16 or Q8_0. peft_merge_checkpoint() checks it before writing and lists every problem:
 * #PEFT_ERR_INVALID_ARGUMENT for a GGUF file that is not an adapter (a model file), a base that is
 * one (general.type "adapter" or an adapter.type key), or an architecture other than the base's, #PEFT_ERR_INVALID_CHECKPOINT for a pair missing its lora_a or
 * lora_b, #PEFT_ERR_UNRESOLVED_KEY for a tensor the base lacks, #PEFT_ERR_SHAPE_MISMATCH for factors
 * that do not fit their tensor, #PEFT_ERR_UNSUPPORTED for another adapter.type, tensors that are not
 * factors, or other factor or base types. With a safetensors base it is #PEFT_ERR_UNSUPPORTED:
 * convert it first with peft_adapter_import_gguf().
 * @param opts Options.
 * @param dir The adapter folder, or a hub model id (@ref hub), or a GGUF LoRA file (see above)
 *        (UTF-8). Copied.
 * @param weight A finite number of the f32 range (see peft_merge_options_add_adapter()).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL, an empty @p dir or a weight that is
 *         not finite or beyond the f32 range. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_add_adapter_dir(peft_merge_options* opts, const char* dir, double weight);

/**
 * @brief Chooses the output dtype.
 * @param opts Options.
 * @param dtype #PEFT_DTYPE_KEEP (the default), #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or
 *        #PEFT_DTYPE_F16. Only tensors of F64, F32, F16 and BF16 are converted. config.json's
 *        `dtype` / `torch_dtype` are set to match. For a GGUF base, only the merged tensors of two
 *        or more dimensions are written in it (block-quantized ones too, unquantized); see
 *        peft_merge_options_set_quant(). For an FP8 block-scale base every FP8 weight is also
 *        written dequantized in it (its scales left out, `quantization_config` removed). A
 *        bitsandbytes base (NF4, FP4, int8): with #PEFT_DTYPE_KEEP merged weights are quantized
 *        again in their format; with a dtype every quantized weight is written dequantized, its
 *        state tensors dropped and `quantization_config` removed from config.json
 *        (docs/quantized-bases.md).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or another dtype.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_dtype(peft_merge_options* opts, int32_t dtype);

/**
 * @brief Reshards the output by size instead of keeping the base's files.
 *
 * With a limit, tensors are split as `save_pretrained(max_shard_size=...)` splits them
 * (huggingface_hub's greedy rule in the base's tensor order), into `model-00001-of-0000N.safetensors`
 * with an index, or one `model.safetensors` when everything fits.
 * @param opts Options.
 * @param max_shard_size Largest shard in bytes of tensor data; 0 (the default) keeps the base's layout.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_max_shard_size(peft_merge_options* opts, uint64_t max_shard_size);

/**
 * @brief Limits the threads a merge uses.
 * @param opts Options.
 * @param threads 0 (the default) for one per core; 1 runs everything on the calling thread. The
 *        results are the same for every value.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_threads(peft_merge_options* opts, uint32_t threads);

/**
 * @brief Sets a progress callback, called on the thread that runs peft_merge_checkpoint().
 *
 * It is called with done = 0 first, then at least once per tensor (large tensors in 16 MiB steps),
 * last with done = total. A nonzero return cancels the merge, which then fails with
 * #PEFT_ERR_CANCELLED and leaves the output folder as it was.
 * @param opts Options.
 * @param fn The callback, or NULL for none.
 * @param user_data Passed to @p fn unchanged.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_progress(peft_merge_options* opts, peft_progress_fn fn,
                                                     void* user_data);

/**
 * @brief Says whether the merged model needs the base's config.json (the default: it does).
 *
 * transformers cannot load a model folder without config.json, so by default a merge fails before
 * writing anything when the base folder's config.json is missing (#PEFT_ERR_NOT_FOUND), is not a
 * regular file (a folder, a FIFO: #PEFT_ERR_INVALID_CHECKPOINT), cannot be read (#PEFT_ERR_IO) or
 * is a symbolic link leading out of the folder (#PEFT_ERR_INVALID_CHECKPOINT). With 0, a base
 * without a usable config.json is merged and the output has none.
 * @param opts Options.
 * @param require 1 (the default) or 0.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_require_config(peft_merge_options* opts, int32_t require);

/**
 * @brief Allows merged weights that are infinite or NaN (by default they are refused).
 *
 * By default every merged tensor is checked once rounded to its storage dtype, and the merge fails
 * with #PEFT_ERR_NON_FINITE naming the first tensor holding an infinity or a NaN (a LoRA scale
 * such as `lora_alpha: 1e308`, factors that overflow, a base weight that already held one), with
 * nothing written. With 1 such tensors are written as computed. A merge weight times LoRA scale that
 * exceeds the float range is refused (#PEFT_ERR_NON_FINITE) either way.
 * @param opts Options.
 * @param allow 0 (the default) or 1.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_allow_nonfinite(peft_merge_options* opts, int32_t allow);

/**
 * @brief Merges adapters into a base model folder and writes the merged model folder.
 *
 * See the description of this group for what is written. The output folder is created if absent;
 * model files of an older checkpoint in it are replaced only when the merge succeeds (older shards
 * the new layout does not use are then removed); other files in it are kept, and files of the same
 * name as the base folder's small files are replaced. The folder is replaced as
 * peft_writer_new_checkpoint() describes: a reader sees the old model or the new one, never a mix.
 * The base folder's small files are copied when they are regular files; a symbolic link among them
 * must resolve inside the base folder (or, for a Hugging Face hub cache snapshot
 * `models--org--name/snapshots/<revision>`, inside `models--org--name`), else the merge fails with
 * #PEFT_ERR_INVALID_CHECKPOINT naming it; subfolders, FIFOs and devices are not copied.
 *
 * **A GGUF base.** When @p base_dir is a GGUF file, @p out_dir is the GGUF file to write (atomically):
 * the base's metadata and tensors in their order and types, with each adapter module merged into
 * the tensor its architecture table names in GGUF (`blk.0.attn_q.weight`; LLaMA's RoPE row order
 * handled), computed in f32 from its (dequantized) values with every adapter's delta added and
 * stored once in the tensor's type, block-quantized types included (re-quantized as ggml does), or
 * in the type peft_merge_options_set_quant() or peft_merge_options_set_dtype() chooses; every other
 * tensor is copied byte for byte (docs/gguf.md). The shard size option must be unset
 * (#PEFT_ERR_INVALID_ARGUMENT). Whole tensors (modules_to_save) replace
 * the GGUF tensor of the same parameter and `lora_B.bias` is added to the module's `.bias` tensor.
 * Modules with no GGUF tensor (a bias included) are #PEFT_ERR_UNRESOLVED_KEY, and trainable tokens and
 * targets whose output type cannot be quantized here (IQ types but IQ4_NL) #PEFT_ERR_UNSUPPORTED,
 * each listed, before anything is written. GGUF LoRA
 * adapters merge into GGUF bases only (see peft_merge_options_add_adapter_dir()).
 * @param base_dir The base model folder or a hub model id (@ref hub) (UTF-8): config.json (see
 *        peft_merge_options_set_require_config()) and `model.safetensors` or
 *        `model.safetensors.index.json` with its shards; or a GGUF file.
 * @param out_dir The output folder (UTF-8), or file for a GGUF base; must not be @p base_dir.
 * @param opts Options with at least one adapter. Not changed; may be reused.
 * @param[out] out_result Receives what the merge did (free with peft_merge_result_free()), or NULL
 *             when the caller does not want it.
 * @return NULL on success, else:
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL, no adapters, @p out_dir equal to @p base_dir or not a
 *         folder, or adapters that conflict (the message lists every conflict);
 *         #PEFT_ERR_UNRESOLVED_KEY listing every adapter tensor the base has no tensor for;
 *         #PEFT_ERR_SHAPE_MISMATCH listing every shape that does not fit;
 *         #PEFT_ERR_UNSUPPORTED for tensors that cannot be merged in their dtype (e.g. an F8 or F64
 *         weight kept as it is; choose an output dtype) or an adapter kind that is not merged;
 *         #PEFT_ERR_CANCELLED when the progress callback asked to stop;
 *         #PEFT_ERR_NON_FINITE naming the tensor whose merged weights hold an infinity or a NaN
 *         (see peft_merge_options_set_allow_nonfinite());
 *         #PEFT_ERR_NOT_FOUND or #PEFT_ERR_INVALID_CHECKPOINT for a missing or unusable config.json
 *         (see peft_merge_options_set_require_config()) or a side file linked out of the folder;
 *         #PEFT_ERR_IO (also when a base or adapter file is truncated or rewritten while the merge
 *         runs; see @ref file_changes), #PEFT_ERR_OUT_OF_MEMORY, and the errors of
 *         peft_checkpoint_open() and peft_adapter_open() for the inputs. Nothing is changed in
 *         @p out_dir on failure.
 *         Thread-safe (merges into different folders may run at once).
 */
PEFT_API peft_error* peft_merge_checkpoint(const char* base_dir, const char* out_dir, const peft_merge_options* opts,
                                           peft_merge_result** out_result);

/**
 * @brief Releases a merge result.
 * @param result A result, or NULL. Thread-safe.
 */
PEFT_API void peft_merge_result_free(peft_merge_result* result);

/**
 * @brief How many tensors a merge wrote of one kind.
 * @param result A result.
 * @param which One of the `PEFT_MERGE_TENSORS_*` values.
 * @return The count; 0 for NULL or an unknown @p which. Thread-safe.
 */
PEFT_API uint64_t peft_merge_result_tensor_count(const peft_merge_result* result, int32_t which);

/**
 * @brief Tensor bytes written (the sum of the output tensors' sizes).
 * @param result A result.
 * @return The byte count; 0 for NULL. Thread-safe.
 */
PEFT_API uint64_t peft_merge_result_bytes(const peft_merge_result* result);

/**
 * @brief Number of files written into the output folder: weight files, the index, config.json and
 *        the other copied files.
 * @param result A result.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_merge_result_file_count(const peft_merge_result* result);

/**
 * @brief Name of written file @p index, relative to the output folder (weight files first, in order).
 * @param result A result.
 * @param index 0 .. peft_merge_result_file_count() - 1.
 * @return Borrowed UTF-8 string valid while @p result lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_merge_result_file_name(const peft_merge_result* result, size_t index);

/**
 * @brief Whether `tie_word_embeddings` was set to false in config.json.
 * @param result A result.
 * @return 1 or 0 (0 for NULL). Thread-safe.
 */
PEFT_API int32_t peft_merge_result_untied_embeddings(const peft_merge_result* result);

/**
 * @brief Number of notes: decisions worth knowing (untied embeddings, added tensors).
 * @param result A result.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_merge_result_note_count(const peft_merge_result* result);

/**
 * @brief Note @p index.
 * @param result A result.
 * @param index 0 .. peft_merge_result_note_count() - 1.
 * @return Borrowed UTF-8 string valid while @p result lives; NULL if out of range. Thread-safe.
 */
PEFT_API const char* peft_merge_result_note(const peft_merge_result* result, size_t index);

/**
 * @brief Chooses the ggml type merged tensors are written in, for a merge into a GGUF base.
 *
 * By default (#PEFT_DTYPE_KEEP) each merged tensor keeps its own type: a block-quantized one (Q4_K,
 * Q8_0, ...) is dequantized, the adapters' deltas are added in f32 and the sum is quantized again to
 * the same type with ggml's reference quantizer (`ggml_quantize_chunk` without an importance matrix,
 * bit-identical), so the output is what `llama-quantize` makes of the exact f32 merge, and a Q4_K_M
 * base stays about its size. With a type, every merged tensor of two or more dimensions is written
 * in it instead (tensors of one dimension, biases and norms, keep theirs); untouched tensors are
 * copied byte for byte either way. peft_merge_options_set_dtype() does the same with F32, BF16 or F16
 * (both set: #PEFT_ERR_INVALID_ARGUMENT from peft_merge_checkpoint()). Ignored for a safetensors base.
 * A merged tensor whose output type has no quantizer here (IQ1_S .. IQ3_S, IQ4_XS: ggml's need an
 * importance matrix) or whose rows do not fill whole blocks of it is refused by
 * peft_merge_checkpoint() with #PEFT_ERR_UNSUPPORTED naming the tensor, before anything is written.
 * @param opts Options.
 * @param ggml_type #PEFT_DTYPE_KEEP (-1, the default) or a ggml type number that can be quantized:
 *        F32 (0), F16 (1), BF16 (30), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL, MXFP4, NVFP4,
 *        TQ1_0, TQ2_0, Q1_0, Q2_0 (see peft_ggml_type_from_name()).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or an unknown type;
 *         #PEFT_ERR_UNSUPPORTED for a type without a quantizer. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_quant(peft_merge_options* opts, int32_t ggml_type);

/**
 * @brief Asks a merge into a GGUF base to measure what storing each merged tensor costs.
 *
 * For every merged tensor, the values stored in its output type are read back (dequantized) and
 * compared with the exact f32 merge (RMS and largest absolute difference); next to them, the same
 * figures for the unmerged base's values stored in that type, what re-quantizing costs without any
 * merge (for a Q4_K tensor kept Q4_K, quantizing its dequantized values again). Read them with
 * peft_merge_result_report_json(). Costs one more quantization per merged tensor. Ignored for a
 * safetensors base.
 * @param opts Options.
 * @param report 0 (the default) or 1.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_report(peft_merge_options* opts, int32_t report);

/**
 * @brief The per-tensor report of a merge into a GGUF base (see peft_merge_options_set_report()).
 *
 * A JSON array with one object per merged tensor, in file order:
 * `{"tensor": "blk.0.attn_q.weight", "base_type": "Q4_K", "type": "Q4_K", "values": 4194304,
 * "rms": ..., "max": ..., "base_rms": ..., "base_max": ...}`: `rms` and `max` compare the stored
 * merge with the exact f32 merge, `base_rms` and `base_max` the base stored in `type` with the base
 * itself (0 for a tensor an adapter replaced whole). A figure that is not finite (a merge with
 * peft_merge_options_set_allow_nonfinite()) is `null`, as JSON has no NaN or infinity. `[]` when
 * no report was asked for.
 * @param result A result.
 * @return Borrowed UTF-8 string valid while @p result lives; NULL for NULL. Thread-safe.
 */
PEFT_API const char* peft_merge_result_report_json(const peft_merge_result* result);

/** @name The f32 arithmetic of a merge (peft_merge_options_set_arithmetic())
 *  @{ */
#define PEFT_MERGE_ARITHMETIC_PEFT 0 /**< PEFT's order (the default): merges equal PEFT's merge_and_unload(). */
#define PEFT_MERGE_ARITHMETIC_GGML 1 /**< llama-export-lora's order on ggml's scalar (reference) CPU code. */
/** @} */

/**
 * @brief Chooses the order of a merge's f32 arithmetic for plain LoRA modules: PEFT's or ggml's.
 *
 * A LoRA delta is a sum over the rank, and the order in which its products are rounded and added
 * decides the last bits of the merged weights. #PEFT_MERGE_ARITHMETIC_PEFT (the default) follows
 * PEFT: the merge equals PEFT's `merge_and_unload()` bit for bit (the delta `scaling * B @ A` as one
 * float chain over the rank, every adapter's delta summed, added to the weight once).
 * #PEFT_MERGE_ARITHMETIC_GGML follows llama.cpp's `llama-export-lora` as ggml's scalar reference
 * code computes it (a llama.cpp build without GGML_SIMD, e.g. x86-64 with every AVX/SSE3 option
 * off, no llamafile sgemm): each delta value is the rank's float products added in double in rank
 * order and rounded to float once, then multiplied by the adapter's scale `weight * alpha / rank`
 * (evaluated in float; the weight alone when alpha is 0) in float and added to the weight in float,
 * adapter after adapter (`llama-export-lora --lora-scaled A w1 --lora-scaled B w2`: base + d1, then
 * + d2). A merge into a GGUF base with it then equals, byte for byte, ggml's quantization of
 * `llama-export-lora`'s F32 merge of the same (dequantized) base, so a Q4_K_M or Q8_0 merge is what
 * that llama.cpp build and `llama-quantize` make. SIMD builds of llama.cpp (AVX2, AVX-512, every
 * aarch64 build) add the products of a small rank in float (fused into FMAs where the target has
 * them) or in vector lanes, so their merges differ from both orders in the last bits.
 *
 * Both orders give the same bits on every CPU and kernel table. The ggml order applies to plain
 * LoRA modules (lora_B.bias keeps PEFT's arithmetic): into GGUF bases, and into safetensors bases,
 * where it is exact against ggml for F32 weights (BF16/F16 weights are rounded after each adapter).
 * With it, peft_merge_checkpoint() refuses DoRA modules and the other PEFT methods (LoHa, LoKr,
 * IA3, ...) with #PEFT_ERR_UNSUPPORTED naming each module and its method, before anything is
 * written: the ggml order is defined for plain LoRA only.
 * @param opts Options.
 * @param arithmetic #PEFT_MERGE_ARITHMETIC_PEFT or #PEFT_MERGE_ARITHMETIC_GGML.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or another value.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_arithmetic(peft_merge_options* opts, int32_t arithmetic);

/** @name What a merge does with tied embeddings (peft_merge_options_set_tied_embeddings())
 *  @{ */
#define PEFT_MERGE_TIED_UNTIE 0  /**< The merge equals the adapter's forward; untied where the sides differ (the default). */
#define PEFT_MERGE_TIED_SHARED 1 /**< PEFT's merge_and_unload: changes land in the one shared tensor. */
/** @} */

/**
 * @brief Chooses how a checkpoint merge treats a base whose output embedding is tied to its input
 *        embedding (`tie_word_embeddings: true`; transformers then saves the input embedding only).
 *
 * PEFT wraps each side in its own layer, so the adapter's forward sees an adapter on `lm_head` only
 * in the output and one on `embed_tokens` only in the input, while PEFT's `merge_and_unload()`
 * writes both into the one shared tensor, so the merged model's logits differ from the adapter's.
 * Which modules are the input and output embeddings and which config.json key ties them is
 * architecture data (the translation table's `input_embeddings`, `output_embedding` and
 * `tie_embeddings_config`); families without them (T5, which rescales its tied output) are merged
 * as before.
 *
 * #PEFT_MERGE_TIED_UNTIE (the default): the merged model gives the adapter's forward. Where the two
 * sides change differently (LoRA, DoRA or a modules_to_save copy on one side only, or different
 * changes on each), the pair is untied: the output embedding is written (`lm_head.weight`: the
 * original embedding plus the output's own changes, or the original embedding alone), the key is
 * set to false in config.json, and a note says so (peft_merge_result_note()). Changes PEFT applies
 * to both sides alike land once in the shared tensor, which stays tied: trainable tokens (PEFT ties
 * the output's token rows to the input's) and the LoRA of an adapter saved with
 * `ensure_weight_tying: true` on both embeddings (PEFT's output LoRA is the input's, transposed).
 *
 * #PEFT_MERGE_TIED_SHARED: what PEFT's `merge_and_unload()` does: LoRA, DoRA, token and saved
 * `base_layer` changes of either side land in the shared tensor (byte for byte PEFT's for a single
 * module; an `ensure_weight_tying` adapter's change is then added twice, as PEFT does); only a
 * modules_to_save copy unties, as in PEFT.
 *
 * A GGUF base of a tied model holds no `output.weight` (llama.cpp's converter leaves it out, and
 * llama.cpp then computes the output from `token_embd.weight`). An untying merge into it adds
 * `output.weight` after `token_embd.weight`: the embedding's own bytes when only the input changes,
 * else the original embedding plus the output's changes, stored in the type merged tensors get. It
 * fails with #PEFT_ERR_UNSUPPORTED, before anything is written, for an architecture whose llama.cpp
 * loader reads no `output.weight` (Gemma 1 and 2: the translation table's `gguf_output_always_tied`)
 * and for a split base written as parts (peft_merge_options_set_join_split() writes one file).
 * A GGUF LoRA cannot untie (peft_adapter_export_gguf() refuses an adapter on one side of a tied base).
 * @param opts Options.
 * @param policy #PEFT_MERGE_TIED_UNTIE or #PEFT_MERGE_TIED_SHARED.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or another value.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_tied_embeddings(peft_merge_options* opts, int32_t policy);

/**
 * @brief Chooses what a merge into a split GGUF base writes: the same parts (the default) or one
 *        joined file.
 *
 * A GGUF model that `llama-gguf-split` cut into parts (`NAME-00001-of-00003.gguf`, ...; see @ref gguf)
 * is merged, by default, into the same layout: one output part per base part, named
 * `OUT-0000K-of-0000N.gguf` after @p out_dir of peft_merge_checkpoint() (its prefix when it is itself
 * such a name, else the path without `.gguf`), each with the same tensors in the same order and the
 * same metadata as its base part (split.no, split.count and split.tensors.count included). The parts
 * appear together or not at all: every part is written to a temporary file first and renamed only
 * when all are complete; a failure removes every temporary (and parts already renamed when a rename
 * fails). peft_merge_result_file_name() lists the parts.
 *
 * With @p join nonzero the merge writes the one file @p out_dir instead, as `llama-gguf-split --merge`
 * joins parts: the first part's metadata with `split.count` set to 0 (and moved last), then every
 * tensor in part order. It has no effect on a base of one file.
 * @param opts Options.
 * @param join Nonzero for one joined file; 0 (the default) for the base's parts.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_options_set_join_split(peft_merge_options* opts, int32_t join);

/**
 * @brief Creates buffer merge options with the defaults: weight 1.0, original rows not kept, no
 *        translator (names are HuggingFace names), one thread per core.
 * @param[out] out Receives the options; free them with peft_merge_buffer_options_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_merge_buffer_options_new(peft_merge_buffer_options** out);

/**
 * @brief Releases buffer merge options.
 * @param opts Options, or NULL. Thread-safe.
 */
PEFT_API void peft_merge_buffer_options_free(peft_merge_buffer_options* opts);

/**
 * @brief Sets the weight that multiplies the layer's LoRA scaling (default 1.0).
 * @param opts Options.
 * @param weight A finite number of the f32 range (see peft_merge_options_add_adapter()).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or a weight that is not finite or
 *         beyond the f32 range. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_buffer_options_set_weight(peft_merge_buffer_options* opts, double weight);

/**
 * @brief Keeps the original bytes of every row the merge changes, so that
 *        peft_merge_record_unmerge() restores the buffer bit for bit.
 *
 * Costs up to the size of the weight in memory (rows the merge leaves unchanged cost nothing).
 * @param opts Options.
 * @param keep Nonzero to keep them; 0 (the default) to remove by arithmetic.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_buffer_options_set_keep_original_rows(peft_merge_buffer_options* opts,
                                                                      int32_t keep);

/**
 * @brief Limits the threads one buffer merge uses.
 * @param opts Options.
 * @param threads 0 (the default) for one per core. The results are the same for every value.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_buffer_options_set_threads(peft_merge_buffer_options* opts, uint32_t threads);

/**
 * @brief Makes peft_merge_buffer_apply() read names as the host's own names, through a translator.
 * @param opts Options.
 * @param translator A translator (its table is shared; the handle may be freed afterwards), or NULL
 *        for HuggingFace names (the default).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p opts is NULL.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_merge_buffer_options_set_translator(peft_merge_buffer_options* opts,
                                                              const peft_translator* translator);

/**
 * @brief Merges one LoRA layer of an adapter into a weight buffer the caller owns.
 *
 * The buffer is changed in place: W = round(W + weight * scaling * delta) (DoRA layers as PEFT
 * merges them), rounded once to its dtype. The layer's `lora_B.bias`, if any, is added to @p bias.
 * Linear weights are [out, in], GPT-2 Conv1D [in, out], embeddings [num_embeddings, dim], Conv2d
 * [out, in, kh, kw]; which of Linear and Conv1D applies follows the buffer's shape when only one
 * fits.
 * @param adapter An adapter.
 * @param name The layer: without a translator a HuggingFace module path
 *        ("model.layers.0.self_attn.q_proj") or tensor name ("...q_proj.weight"), with or without
 *        "base_model.model."; with a translator (peft_merge_buffer_options_set_translator()) the
 *        host's name of the module or of its weight ("transformer/layer_0/attention/query"); with a
 *        translator for GGUF names, the GGUF tensor name ("blk.0.attn_q.weight"), and then the delta
 *        goes in with its rows in the converter's order (see peft_translator_from_gguf()). A LoRA on
 *        a stacked expert parameter (`target_parameters`) merges into the fused parameter as
 *        transformers 5 holds it ("model.layers.0.mlp.experts.gate_up_proj", [experts, out, in], or
 *        [experts, in, out] for gpt-oss), each expert's slice by its own pair; into one per-expert
 *        tensor ("model.layers.0.mlp.experts.3.up_proj.weight", or its name through a translator:
 *        that expert's rows); or, with GGUF names, into llama.cpp's stacked tensor
 *        ("blk.0.ffn_gate_exps.weight", [experts, out, in]), each expert's share into its slice.
 * @param data The weight: row-major, @p dtype elements, any alignment. Changed in place.
 * @param dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16.
 * @param shape @p ndim dimensions of the weight. Copied.
 * @param ndim Number of dimensions (2, or 4 for Conv2d; 3 for a fused expert parameter; 1 for a replaced
 *        norm weight).
 * @param bias The layer's bias ([out] elements of @p bias_dtype), needed when the layer has a
 *        `lora_B.bias` or its replacement replaces the bias; otherwise ignored and may be NULL.
 * @param bias_dtype Dtype of @p bias (F32, BF16 or F16); ignored without a bias.
 * @param opts Options, or NULL for the defaults. Not kept.
 * @param[out] out Receives the record needed to remove the merge; free it with
 *             peft_merge_record_free() (freeing does not undo the merge).
 * @return NULL on success, and the buffers are unchanged on failure:
 *         #PEFT_ERR_NOT_FOUND when the adapter has no such layer; #PEFT_ERR_UNRESOLVED_KEY when the
 *         translator does not resolve @p name; #PEFT_ERR_UNSUPPORTED for a dtype other than
 *         F32/BF16/F16 or a replacement with a weight other than 1; #PEFT_ERR_SHAPE_MISMATCH when the shape does
 *         not fit the layer; #PEFT_ERR_INVALID_ARGUMENT for NULL arguments or a missing bias;
 *         #PEFT_ERR_OUT_OF_MEMORY when the original rows cannot be kept (they are kept while the
 *         merge runs in any case, to undo it); #PEFT_ERR_NON_FINITE naming the layer when a merged
 *         value (weight or bias) would be an infinity or a NaN in the buffer's dtype: the buffers are
 *         then put back byte for byte. Thread-safe for different buffers.
 */
PEFT_API peft_error* peft_merge_buffer_apply(const peft_adapter* adapter, const char* name, void* data, int32_t dtype,
                                             const uint64_t* shape, size_t ndim, void* bias, int32_t bias_dtype,
                                             const peft_merge_buffer_options* opts, peft_merge_record** out);

/**
 * @brief Takes a merge out of the buffers again (which may have moved, but hold the same dtype and
 *        shape).
 *
 * With original rows kept, the changed rows are copied back after checking that they still hold
 * what the merge wrote; so with several merges on one buffer, remove them in reverse order. Without
 * them, PEFT's unmerge is applied (W - delta; DoRA with the norm cached at merge time).
 * @param record A record from peft_merge_buffer_apply() that has not been removed yet.
 * @param data The weight buffer.
 * @param bias The bias buffer, needed when the merge changed a bias; otherwise ignored.
 * @return NULL on success (the record is then spent); on failure nothing is changed:
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL, a spent record, a missing bias, or (rows kept) rows
 *         that changed since the merge. Thread-safe for different records and buffers.
 */
PEFT_API peft_error* peft_merge_record_unmerge(peft_merge_record* record, void* data, void* bias);

/**
 * @brief The older name of peft_merge_record_unmerge(), with the same behaviour.
 * @param record A record from peft_merge_buffer_apply() that has not been removed yet.
 * @param data The weight buffer.
 * @param bias The bias buffer, needed when the merge changed a bias; otherwise ignored.
 * @return As peft_merge_record_unmerge(). Thread-safe for different records and buffers.
 */
PEFT_API peft_error* peft_merge_buffer_remove(peft_merge_record* record, void* data, void* bias);

/**
 * @brief Releases a record (without touching any buffer).
 * @param record A record, or NULL. Thread-safe.
 */
PEFT_API void peft_merge_record_free(peft_merge_record* record);

/**
 * @brief The adapter module the record merged (its HuggingFace path).
 * @param record A record.
 * @return Borrowed UTF-8 string valid while @p record lives; NULL for NULL. Thread-safe.
 */
PEFT_API const char* peft_merge_record_module(const peft_merge_record* record);

/**
 * @brief Whether the merge is still in the buffer (not removed yet).
 * @param record A record.
 * @return 1 or 0 (0 for NULL). Thread-safe.
 */
PEFT_API int32_t peft_merge_record_active(const peft_merge_record* record);

/**
 * @brief Bytes of original rows the record keeps for an exact removal.
 * @param record A record.
 * @return The byte count; 0 for NULL or without kept rows. Thread-safe.
 */
PEFT_API uint64_t peft_merge_record_saved_bytes(const peft_merge_record* record);

/** @} */
/* ================================================================================================ */
/** @defgroup export Exporting and combining adapters
 *
 *  Both functions write an adapter folder as PEFT's `PeftModel.save_pretrained` does, which
 *  `PeftModel.from_pretrained` loads with no missing or unexpected keys:
 *  - `adapter_model.safetensors`: every tensor under `base_model.model.<module>.<role>` (no adapter
 *    name), metadata `{"format": "pt"}`, in the order the safetensors package writes. Re-exporting
 *    an adapter that PEFT wrote reproduces its file byte for byte.
 *  - `adapter_config.json`: `json.dumps(config, indent=2, sort_keys=True)` byte for byte (Python's
 *    escapes and float spelling), with `inference_mode` true, `peft_type` "LORA", and
 *    `init_lora_weights` made true where it only chose how fresh factors were drawn (false,
 *    "gaussian", "eva", "orthogonal", "mica": loading replaces those factors, so the adapter means
 *    the same). Every other field is kept, unknown ones included, unless a target PEFT version is
 *    set (peft_export_options_set_peft_version()).
 *
 *  Writing is atomic per file: both files are written to temporaries in the output folder (created
 *  if needed), flushed, and renamed into place only when both are complete, the config last. After
 *  a failure the folder holds what it held before.
 *
 *  Thread safety: export options belong to one thread at a time. Exporting and combining only read
 *  the adapters, so several calls may run at once on the same adapters; calls writing the same
 *  output folder at the same time leave one complete result (the last rename wins).
 *  @{ */

/** Options for peft_adapter_export() and peft_adapter_combine(). Free with peft_export_options_free(). */
typedef struct peft_export_options peft_export_options;

/** @name Combination methods of peft_adapter_combine() (PEFT's `combination_type`)
 *  @{ */
#define PEFT_COMBINE_CAT 0    /**< "cat": factors stacked; rank = sum of ranks; the weighted sum of deltas, exactly. */
#define PEFT_COMBINE_LINEAR 1 /**< "linear": sqrt-weighted sums of factors; equal ranks; exact for one adapter only. */
#define PEFT_COMBINE_TIES 2   /**< "ties": "linear" after magnitude pruning, sign election and disjoint mean of each factor. */
#define PEFT_COMBINE_DARE_LINEAR 3     /**< "dare_linear": "linear" after random pruning with rescale of each factor. */
#define PEFT_COMBINE_DARE_TIES 4       /**< "dare_ties": "ties" with random pruning (with rescale) instead of magnitude. */
#define PEFT_COMBINE_MAGNITUDE_PRUNE 5 /**< "magnitude_prune": "linear" after magnitude pruning of each factor. */
#define PEFT_COMBINE_SVD 6            /**< "svd": the weighted sum of the modules' deltas, by truncated SVD at the new rank. */
#define PEFT_COMBINE_TIES_SVD 7       /**< "ties_svd": "svd" of the deltas after magnitude pruning, sign election and disjoint mean. */
#define PEFT_COMBINE_DARE_LINEAR_SVD 8 /**< "dare_linear_svd": "svd" of the deltas after random pruning with rescale. */
#define PEFT_COMBINE_DARE_TIES_SVD 9   /**< "dare_ties_svd": "ties_svd" with random pruning (with rescale) instead of magnitude. */
#define PEFT_COMBINE_MAGNITUDE_PRUNE_SVD 10 /**< "magnitude_prune_svd": "svd" of the deltas after magnitude pruning. */
/** @} */

/** @name Majority sign of the TIES combinations (PEFT's `majority_sign_method`)
 *  @{ */
#define PEFT_MAJORITY_SIGN_TOTAL 0     /**< "total": the sign of the sum of the pruned values (the default). */
#define PEFT_MAJORITY_SIGN_FREQUENCY 1 /**< "frequency": the sign of the sum of their signs. */
/** @} */

/**
 * @brief Creates export options with the defaults: tensors keep their dtypes, the config keeps every
 *        field (as the PEFT version that reads it is the current one).
 * @param[out] out Receives the options; free them with peft_export_options_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_export_options_new(peft_export_options** out);

/**
 * @brief Releases export options.
 * @param opts Options, or NULL. Thread-safe.
 */
PEFT_API void peft_export_options_free(peft_export_options* opts);

/**
 * @brief Converts the F64, F32, F16 and BF16 tensors of the output to one dtype (integer and F8
 *        tensors are kept as they are).
 *
 * Conversion rounds to nearest, ties to even, as torch's `Tensor.to(dtype)` does (see peft_convert()).
 * @param opts Options.
 * @param dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16; or #PEFT_DTYPE_KEEP to keep each
 *        tensor's dtype (the default).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or another dtype.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_export_options_set_dtype(peft_export_options* opts, int32_t dtype);

/**
 * @brief Targets an older PEFT release: the config gets only the fields that release knows.
 *
 * PEFT 0.13 and older refuse a config with a field they do not know; 0.14 and newer drop such fields
 * with a warning. With a target version, fields the release does not know are left out when that
 * changes nothing (a null, false or empty value, settings of a fresh initialisation such as
 * `eva_config`, the writer's `peft_version`); a field whose value matters (`use_dora`, `lora_bias`,
 * `exclude_modules`, `trainable_token_indices`, ...) makes the export fail with
 * #PEFT_ERR_UNSUPPORTED naming it. The export also fails when the release would read a kept field
 * differently for one of the adapter's modules (`rank_pattern` / `alpha_pattern` keys before 0.15,
 * `layers_to_transform` before 0.20). Releases 0.13 to 0.21 are known; later ones get 0.21's fields.
 * @param opts Options.
 * @param version "X.Y" or "X.Y.Z", e.g. "0.13"; NULL or "" for the current release (every field kept).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or a malformed version;
 *         #PEFT_ERR_UNSUPPORTED for a release before 0.13. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_export_options_set_peft_version(peft_export_options* opts, const char* version);

/**
 * @brief Sets PEFT's `density` for the pruning combinations of peft_adapter_combine(): the fraction
 *        of each factor's values kept (of each module's delta for the `*_svd` types).
 *
 * #PEFT_COMBINE_TIES and #PEFT_COMBINE_MAGNITUDE_PRUNE keep each factor's int(density * size)
 * largest magnitudes (equal magnitudes: the lower index first; torch's topk leaves that order
 * open); #PEFT_COMBINE_DARE_LINEAR and #PEFT_COMBINE_DARE_TIES keep each value with probability
 * @p density (see peft_export_options_set_combine_seed()) and divide the kept ones by it; their
 * `*_SVD` forms do the same to each adapter's delta. 1 prunes nothing. Those eight methods need it;
 * `cat`, `linear` and `svd` ignore it.
 * @param opts Options.
 * @param density From 0 to 1.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or a density outside [0, 1]
 *         (PEFT warns and prunes nothing above 1). Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_export_options_set_combine_density(peft_export_options* opts, double density);

/**
 * @brief Sets PEFT's `majority_sign_method` for #PEFT_COMBINE_TIES and #PEFT_COMBINE_DARE_TIES.
 * @param opts Options.
 * @param method #PEFT_MAJORITY_SIGN_TOTAL (the default) or #PEFT_MAJORITY_SIGN_FREQUENCY.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or another value.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_export_options_set_combine_majority_sign(peft_export_options* opts, int32_t method);

/**
 * @brief Sets the seed of the random masks of #PEFT_COMBINE_DARE_LINEAR and #PEFT_COMBINE_DARE_TIES.
 *
 * The masks are a function of the seed alone, the same on every machine and thread count (PEFT draws
 * them with torch.bernoulli from torch's global generator, which no other program reproduces). Value
 * e (the row-major index) of factor f (0 = lora_A, 1 = lora_B; 2 = the delta, for
 * #PEFT_COMBINE_DARE_LINEAR_SVD and #PEFT_COMBINE_DARE_TIES_SVD, laid out as PEFT's
 * `get_delta_weight` returns it: [out, in], or [in, out] for a GPT-2 Conv1D layer and
 * [num_embeddings, dim] for an embedding) of the module named M in the i-th
 * of the adapters that have that module (counting from 0, in the order given) is kept iff
 * u < density, where, with mix(x) = splitmix64's output function of
 * x + 0x9E3779B97F4A7C15 (64-bit wrapping arithmetic) and fnv1a64 the 64-bit FNV-1a hash of M's UTF-8
 * bytes: s = mix(mix(seed ^ fnv1a64(M)) ^ (2 i + f)), u = (mix(s ^ e) >> 11) * 2^-53. M is the
 * module's name without the `base_model.model.` prefix (e.g. `model.layers.0.self_attn.q_proj`).
 * @param opts Options.
 * @param seed Any value; 0 by default.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts. Not thread-safe for the
 *         same @p opts.
 */
PEFT_API peft_error* peft_export_options_set_combine_seed(peft_export_options* opts, uint64_t seed);

/**
 * @brief Sets PEFT's `svd_rank`: the rank of the adapter the `*_SVD` combinations of
 *        peft_adapter_combine() write.
 *
 * A module whose layer allows less (min(out, in) below the rank) gets its full-rank factors padded
 * with zeros (PEFT gives such a module a lora_B of min(out, in) columns, which its forward refuses). The other methods ignore it.
 * @param opts Options.
 * @param rank At least 1; or 0 for the default, the largest of the adapters' ranks (each adapter's
 *        `r` or a larger `rank_pattern` value).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or a negative @p rank.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_export_options_set_combine_svd_rank(peft_export_options* opts, int64_t rank);

/**
 * @brief Sets PEFT's `svd_clamp` for the `*_SVD` combinations of peft_adapter_combine(): after the
 *        SVD, with hi the quantile of level @p quantile of the new lora_B's and lora_A's values
 *        together (torch.quantile's linear interpolation, in f32), every value of both is clamped
 *        to [-hi, hi].
 *
 * The values depend on the sign LAPACK gives each singular vector pair; peft_c fixes it (the value
 * of largest magnitude in each column of lora_B, the first of equal ones, is positive), so the
 * clamp gives the same result with every LAPACK. PEFT's own result matches it when torch's SVD
 * happens to pick those signs. No clamp by default; the other methods ignore it.
 * @param opts Options.
 * @param quantile From 0 to 1; or NaN to clear it (no clamp).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or a value outside [0, 1].
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_export_options_set_combine_svd_clamp(peft_export_options* opts, double quantile);

/**
 * @brief Writes an opened adapter as a PEFT adapter folder (see @ref export).
 *
 * Keys are made canonical on the way (the `base_model.model.` prefix added where it was missing, a
 * `.default` adapter name removed, `lora_magnitude_vector.weight` written as `lora_magnitude_vector`),
 * so an adapter PEFT would load only partly comes out as one it loads fully. The output folder may be
 * the adapter's own folder.
 * @param adapter An adapter (only read).
 * @param out_dir The output folder (UTF-8); created with its parents if needed.
 * @param opts Options, or NULL for the defaults. Not kept after the call.
 * @return NULL on success, else:
 *         #PEFT_ERR_UNSUPPORTED naming the field when the target PEFT version cannot express the adapter,
 *         or naming the method of an adapter that is not a LoRA (LoHa, IA3, MiSS, ...: the export
 *         writes LoRA adapters only; peft_adapter_convert_to_lora() turns most methods into one);
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL @p adapter or @p out_dir, an empty path, or a path that
 *         exists and is not a folder;
 *         #PEFT_ERR_IO naming the file when the folder cannot be created or written (disk full, ...);
 *         #PEFT_ERR_IO / format codes if the adapter's file cannot be read any more.
 *         Thread-safe (see @ref export).
 */
PEFT_API peft_error* peft_adapter_export(const peft_adapter* adapter, const char* out_dir,
                                         const peft_export_options* opts);

/**
 * @brief Writes an opened LoRA adapter as a GGUF LoRA adapter that llama.cpp loads (`--lora`,
 *        `llama-export-lora`), with PEFT's exact scale for every module.
 *
 * The file holds `general.architecture` (the base's GGUF architecture), `general.type = "adapter"`,
 * `adapter.type = "lora"`, `adapter.lora.alpha` (the config's lora_alpha, f32), for an activated LoRA
 * `adapter.alora.invocation_tokens` (its `alora_invocation_tokens`, a UINT32 array), and for each module
 * `<GGUF tensor>.lora_a` and `.lora_b`, named and ordered by the base's architecture table (the
 * LLaMA family's RoPE row order applied to B). llama.cpp scales each pair by alpha / rank; where
 * PEFT's scale differs (rsLoRA, rank_pattern, alpha_pattern), B is multiplied by PEFT's scale over
 * llama.cpp's. docs/gguf.md has the details and the architectures known.
 * @param adapter A LoRA adapter (only read).
 * @param out_path The GGUF file to write (UTF-8), atomically.
 * @param base The base model: a Hugging Face model folder or hub id (its config.json), or a GGUF model
 *        file (its metadata, and its tensors to check the names against); NULL or "" for the
 *        adapter's base_model_name_or_path.
 * @param ggml_type The factors' type: 0 (F32), 1 (F16), 30 (BF16) or 8 (Q8_0; a factor whose rows
 *        are not a multiple of 32 values is written F16, as llama.cpp's converter does).
 * @return NULL on success, else:
 *         #PEFT_ERR_UNSUPPORTED listing every module GGUF cannot hold (DoRA, lora_B.bias, whole
 *         tensors, trainable tokens, conv layers; peft_adapter_export_gguf_split() merges them into a
 *         copy of the base instead), for a base architecture without GGUF names, for a LoRA on
 *         one side of a base's tied embeddings (llama.cpp computes a tied model's output from
 *         `token_embd.weight`, so no GGUF LoRA gives PEFT's forward: peft_merge_checkpoint() unties
 *         them), or, in an adapter on a vision-language model (Llava, Gemma 3...), for every module
 *         outside its language model (a GGUF model is the language model alone: llama.cpp writes the
 *         vision tower and projector to an mmproj file, to which it applies no LoRA); an
 *         `ensure_weight_tying` adapter on both embeddings is written as its `token_embd` pair alone;
 *         #PEFT_ERR_UNRESOLVED_KEY listing every module without a GGUF tensor;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments, another @p ggml_type, or no base;
 *         #PEFT_ERR_NON_FINITE for a factor holding an infinity or NaN;
 *         #PEFT_ERR_NOT_FOUND for a base that is neither a GGUF file nor a model folder (nor in
 *         the hub cache);
 *         #PEFT_ERR_IO and the errors of peft_checkpoint_open() for the base. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_export_gguf(const peft_adapter* adapter, const char* out_path, const char* base,
                                              int32_t ggml_type);

/**
 * @brief peft_adapter_export_gguf() for any LoRA adapter: what a GGUF LoRA cannot hold is merged into a
 *        copy of the base written to @p base_out, the rest is written to @p out_path, so that llama.cpp
 *        applying @p out_path to @p base_out gives PEFT's merged model.
 *
 * The modules peft_adapter_export_gguf() refuses as #PEFT_ERR_UNSUPPORTED (DoRA, lora_B.bias, whole
 * tensors such as modules_to_save, trainable tokens, conv layers, a vision-language model's vision
 * tower and projector) are merged whole (a DoRA module is
 * not separable; a lora_B.bias module is merged with its factors), PEFT-exactly, by the checkpoint
 * merge (peft_merge_checkpoint()): into a GGUF file when @p base is a GGUF model file (each tensor keeps
 * its type; trainable tokens are refused there), into a model folder that transformers loads when
 * @p base is a Hugging Face folder or hub id. Every other module is
 * written to @p out_path exactly as peft_adapter_export_gguf() writes it. On a base with tied
 * embeddings, a LoRA that changes one embedding alone (which peft_adapter_export_gguf() refuses) is
 * merged too: the copy of the base is untied (`output.weight`, or `lm_head.weight` with
 * `tie_word_embeddings` false), as peft_merge_checkpoint() unties it. With nothing to merge,
 * @p base_out is a copy of the base. docs/gguf.md has the details.
 *
 * All or nothing: the adapter is first written under a temporary name next to @p out_path, then
 * @p base_out is written (atomically), then the adapter is renamed to @p out_path. A failure leaves
 * neither output and no temporary; if that last rename fails, the files of @p base_out are removed
 * again (and its folder when this call created it). A process killed midway may leave the temporary
 * (".<name>.peft-tmp-XXXXXX") or a complete @p base_out without @p out_path.
 * @param adapter A LoRA adapter (only read).
 * @param out_path The GGUF adapter file to write (UTF-8).
 * @param base As for peft_adapter_export_gguf(): a Hugging Face model folder or hub id, or a GGUF model
 *        file; NULL or "" for the adapter's base_model_name_or_path.
 * @param ggml_type The factors' type, as for peft_adapter_export_gguf().
 * @param base_out Where the merged base goes (UTF-8): a GGUF file for a GGUF base, a folder (created
 *        if needed) for a Hugging Face base. It must not be the base or @p out_path.
 * @return NULL on success, else:
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL @p adapter, @p out_path or @p base_out, an empty path,
 *         @p base_out equal to the base or to @p out_path, another @p ggml_type, or no base;
 *         the errors of peft_adapter_export_gguf() for the exported modules, and of
 *         peft_merge_checkpoint() for the merged ones (#PEFT_ERR_UNRESOLVED_KEY
 *         listing every module without a base tensor, #PEFT_ERR_UNSUPPORTED for trainable tokens or a
 *         target whose ggml type has no quantizer (the IQ types but IQ4_NL) in a GGUF base,
 *         #PEFT_ERR_NON_FINITE, #PEFT_ERR_IO). Thread-safe.
 */
PEFT_API peft_error* peft_adapter_export_gguf_split(const peft_adapter* adapter, const char* out_path,
                                                    const char* base, int32_t ggml_type, const char* base_out);

/**
 * @brief Writes a GGUF LoRA adapter (llama.cpp's `convert_lora_to_gguf.py` output, or
 *        peft_adapter_export_gguf()'s) as a PEFT LoRA adapter folder that PEFT loads and merges to
 *        the weights llama.cpp applies.
 *
 * Each `<GGUF tensor>.weight.lora_a`/`.lora_b` pair becomes the module the architecture table
 * names (`token_embd`'s becomes PEFT's `lora_embedding_A`/`_B`, A transposed back; B of LLaMA's
 * q/k gets PyTorch's row order back). Factors of F32, F16, BF16 or Q8_0 are written F32. The
 * config keeps llama.cpp's scale alpha / rank exactly: lora_alpha = adapter.lora.alpha, r = the most
 * common rank, rank_pattern for the others (alpha 0, which llama.cpp reads as scale 1: lora_alpha
 * = r and alpha_pattern giving each other module its rank). `adapter.alora.invocation_tokens`
 * becomes `alora_invocation_tokens` (any other element type than UINT32, or a token id of 2^31 or
 * more, is #PEFT_ERR_INVALID_CHECKPOINT, as llama.cpp refuses it). docs/gguf.md has the details.
 * @param gguf_path The GGUF adapter file (UTF-8).
 * @param out_dir The folder to write adapter_model.safetensors and adapter_config.json into
 *        (created if needed; both files replaced atomically, a failure leaves the folder as it was).
 * @param base The base model, required: a Hugging Face model folder or hub id (config.json) or a
 *        GGUF model file; it gives the head counts and becomes base_model_name_or_path.
 * @return NULL on success, else:
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL or empty arguments, a file whose general.type is not
 *         "adapter", or a base of another architecture;
 *         #PEFT_ERR_UNSUPPORTED for an adapter.type other than "lora", an unknown architecture, or
 *         listing every tensor that is not a LoRA factor (norm deltas and the like);
 *         #PEFT_ERR_UNRESOLVED_KEY listing every GGUF module the architecture table does not name;
 *         #PEFT_ERR_INVALID_CHECKPOINT for incomplete pairs; #PEFT_ERR_SHAPE_MISMATCH for factors
 *         that do not fit; #PEFT_ERR_NOT_FOUND for a base that is neither a GGUF file nor a model
 *         folder (nor in the hub cache); #PEFT_ERR_IO and the errors of peft_checkpoint_open().
 *         Thread-safe.
 */
PEFT_API peft_error* peft_adapter_import_gguf(const char* gguf_path, const char* out_dir, const char* base);

/**
 * @brief Combines adapters into a new adapter folder as PEFT's `add_weighted_adapter` does.
 *
 * With `cat`, each module's new lora_A is the rows w_i * s_i * A_i and lora_B the columns B_i of the
 * adapters that have the module (s_i its scaling), zero-padded to the new rank r = the sum over
 * adapters of max(r, rank_pattern values). With `linear`, every adapter and module must have the
 * same rank r; with c_i = w_i * s_i, A = sum sign(c_i) sqrt|c_i| A_i and B = sum sqrt|c_i| B_i. One
 * adapter always combines as `linear`, as in PEFT. #PEFT_COMBINE_TIES, #PEFT_COMBINE_DARE_LINEAR,
 * #PEFT_COMBINE_DARE_TIES and #PEFT_COMBINE_MAGNITUDE_PRUNE are `linear` with the A factors and the
 * B factors each pruned and merged by PEFT's function of that name (peft/utils/merge_utils.py):
 * with T_i the factors and w_i their weights above, magnitude or random pruning
 * (peft_export_options_set_combine_density()), then the weighted sum, or for the TIES types per
 * value the mean of the weighted values whose sign is the majority sign of the pruned values
 * (peft_export_options_set_combine_majority_sign()). Like `linear`, they combine the factors, not
 * the deltas: the result has cross terms B_i A_j that none of the adapters had.
 *
 * The `*_SVD` types (PEFT's `svd`, `ties_svd`, `dare_linear_svd`, `dare_ties_svd`,
 * `magnitude_prune_svd`) combine each module's deltas instead: dW_i = s_i * B_i @ A_i in f32, pruned
 * as above for all but `svd`, summed with the weights w_i (or elected for the TIES types), then
 * factored by truncated SVD (LAPACK's sgesdd, as torch.linalg.svd on CPU): lora_B = U S and lora_A =
 * V^T of the leading r components, r = peft_export_options_set_combine_svd_rank() or the largest
 * of the adapters' ranks, clamped as peft_export_options_set_combine_svd_clamp() says. The ranks
 * may differ. The result is the best rank-r approximation of the combined delta; PEFT's differs
 * from it by the rounding of the SVD only (the factors, where the singular values at r are
 * distinct). PEFT's `svd_full_matrices` only changes how torch computes the same leading
 * components and its `svd_driver` applies to CUDA only, so neither is an option here.
 *
 * A module missing from some adapters gets contributions from the others only. Factors are computed in f32 as PEFT does on CPU and written
 * as F32 unless @p opts sets a dtype.
 *
 * The config is the first adapter's with `r` = `lora_alpha` = the new rank, `rank_pattern` =
 * `alpha_pattern` = {}, and `target_modules` = the union (a sorted list; regular expressions joined
 * as `(t1)|(t2)`); an `"all-linear"` or absent `target_modules` counts as the adapter's modules.
 * Everything else is inherited from the first adapter as in PEFT, including `use_rslora`: the new
 * scaling is then sqrt(r) instead of 1, so the result is sqrt(r) times the weighted sum, exactly as
 * PEFT's.
 *
 * @param adapters @p count adapters (only read).
 * @param weights @p count finite weights, one per adapter (negative values subtract).
 * @param count Number of adapters, at least 1.
 * @param method One of the PEFT_COMBINE_* values.
 * @param out_dir The output folder (UTF-8); created with its parents if needed.
 * @param opts Options (dtype, target PEFT version), or NULL for the defaults. Not kept after the call.
 * @return NULL on success, else:
 *         #PEFT_ERR_UNSUPPORTED for what PEFT cannot combine or would silently get wrong: DoRA,
 *         lora_bias, full replacement tensors (modules_to_save, `bias="all"`) or trainable tokens, a
 *         module the first adapter's config does not target (its `layers_to_transform`,
 *         `exclude_modules`, ... are inherited), regex and list `target_modules` mixed; also what
 *         peft_adapter_export() refuses for the target version;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments, @p count 0, an unknown @p method, a weight
 *         that is not finite, a method other than `cat` or the `*_SVD` types with unequal ranks, or
 *         a pruning method without a density;
 *         #PEFT_ERR_NON_FINITE when a module's combined delta is not finite (`*_SVD` types);
 *         #PEFT_ERR_SHAPE_MISMATCH naming the module when the adapters' factors do not fit together;
 *         #PEFT_ERR_IO as for peft_adapter_export().
 *         Thread-safe (see @ref export).
 */
PEFT_API peft_error* peft_adapter_combine(const peft_adapter* const* adapters, const double* weights, size_t count,
                                          int32_t method, const char* out_dir, const peft_export_options* opts);

/** @name Extraction and conversion to plain LoRA (truncated SVD)
 *
 *  peft_adapter_extract() makes a LoRA adapter from a fully fine-tuned checkpoint (dW = W_tuned -
 *  W_base per module); peft_adapter_convert_to_lora() re-factors an adapter's dW per module to a
 *  new rank; peft_adapter_convert_initial() turns a PiSSA / CorDA / OLoRA / LoRA-GA / LoftQ
 *  initialised adapter into a LoRA on the original base. All three write an adapter folder as
 *  described for this section, which PEFT loads with no missing or unexpected keys.
 *
 *  The truncated SVD follows PEFT's `convert_to_lora`: dW = U S V^T, lora_B = U[:, :r] S[:r],
 *  lora_A = V^T[:r] (for a GPT-2 Conv1D module, stored [in, out], the factors of the stored matrix
 *  transposed and swapped, with `fan_in_fan_out` set in the config). The SVD runs in f32 through
 *  LAPACK's sgesdd (as torch.linalg.svd on CPU), or a randomized range finder (Gaussian sketch of
 *  r + 10 columns, two power iterations, fixed seed) when asked and r + 10 is at most half of
 *  min(out, in). The rank is fixed, or chosen per module by an energy fraction f as PEFT's
 *  `_find_cutoff_index`: the smallest k whose top-k squared singular values reach f of their sum.
 *  The config is `convert_to_lora`'s: with a fixed rank r, `r` = `lora_alpha` = r; with an energy
 *  fraction, `r` = `lora_alpha` = 1 and each module's rank in `rank_pattern` and `alpha_pattern`
 *  (scaling 1 either way). Modules are factored in parallel, one dW per thread in memory.
 *
 *  The report gives, per module, the rank and the relative error ||dW - B A||_F / ||dW||_F of the
 *  f32 factors, computed from the singular values (0 for a zero dW); writing the factors as BF16
 *  or F16 adds their rounding to it.
 *  @{ */

/** Options for peft_adapter_extract() and peft_adapter_convert_to_lora(). Free with peft_lowrank_options_free(). */
typedef struct peft_lowrank_options peft_lowrank_options;
/** The per-module result of an extraction or conversion. Free with peft_lowrank_report_free(). */
typedef struct peft_lowrank_report peft_lowrank_report;

#define PEFT_SVD_EXACT 0      /**< LAPACK sgesdd of the whole matrix (the default). */
#define PEFT_SVD_RANDOMIZED 1 /**< Randomized range finder; falls back to exact where it does not pay. */

/**
 * @brief Creates low-rank options: no rank chosen yet (set a rank or an energy fraction), exact SVD,
 *        one thread per hardware thread, F32 factors, default modules.
 * @param[out] out Receives the options.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT if @p out is NULL. Thread-safe.
 */
PEFT_API peft_error* peft_lowrank_options_new(peft_lowrank_options** out);

/** @brief Releases low-rank options. @param opts Options, or NULL. Thread-safe. */
PEFT_API void peft_lowrank_options_free(peft_lowrank_options* opts);

/**
 * @brief A fixed rank for every module (clears an energy fraction).
 * @param opts Options.
 * @param rank At least 1; a module with fewer rows or columns fails the call.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or a rank below 1.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_lowrank_options_set_rank(peft_lowrank_options* opts, int64_t rank);

/**
 * @brief A rank per module chosen by an energy fraction (clears a fixed rank).
 * @param opts Options.
 * @param fraction In (0, 1]: the share of the squared singular values kept.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or a fraction outside (0, 1].
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_lowrank_options_set_energy(peft_lowrank_options* opts, double fraction);

/**
 * @brief The SVD method.
 * @param opts Options.
 * @param method #PEFT_SVD_EXACT or #PEFT_SVD_RANDOMIZED.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or another value.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_lowrank_options_set_svd(peft_lowrank_options* opts, int32_t method);

/**
 * @brief Worker threads (modules factored at once); 0 = one per hardware thread (the default).
 *
 * With more than one worker, the SVDs run on OpenBLAS's calling thread alone when the library runs on
 * OpenBLAS's pthreads build (Debian's default, libopenblas0-pthread): from the first such job to the
 * last one still running, the library sets OpenBLAS's thread count, a process-wide setting, to 1 and
 * then gives back the count it found, so that OpenBLAS calls the host makes in the meantime run on
 * one thread too. Without it each worker's OpenBLAS call also woke OpenBLAS's own pool (on 2 cores
 * the exact SVDs took 2.2x as long). With another BLAS nothing is changed; OpenBLAS's OpenMP build,
 * whose thread count is OpenMP's (OMP_NUM_THREADS), was not measured.
 * @param opts Options.
 * @param threads Number of threads, or 0.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_lowrank_options_set_threads(peft_lowrank_options* opts, uint32_t threads);

/**
 * @brief The factors' dtype: #PEFT_DTYPE_F32 (the default; #PEFT_DTYPE_KEEP means the same),
 *        #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16.
 * @param opts Options.
 * @param dtype The dtype.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts or another dtype.
 *         Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_lowrank_options_set_dtype(peft_lowrank_options* opts, int32_t dtype);

/**
 * @brief The modules peft_adapter_extract() considers, as PEFT's `target_modules` list selects them
 *        (exact module names or name suffixes such as "q_proj"); by default (count 0) the base's
 *        Linear and Conv1D layers that `"all-linear"` names. Of those, only weights that changed
 *        are extracted. Copied; not used by peft_adapter_convert_to_lora().
 * @param opts Options.
 * @param names @p count UTF-8 names (may be NULL when @p count is 0).
 * @param count Number of names; 0 restores the default.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts, NULL @p names with a
 *         nonzero @p count, or a NULL or empty name. Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_lowrank_options_set_modules(peft_lowrank_options* opts, const char* const* names,
                                                      size_t count);

/**
 * @brief The base model peft_adapter_convert_to_lora() converts against: a folder (or hub id) read
 *        as peft_merge_checkpoint() reads a base. Multiplicative methods (IA3) need it: their dW is
 *        W' - W in f32, W the base weight and W' the same values after the buffer merge of the
 *        module; additive methods take their layer shapes from it. Without one (NULL or "", the
 *        default) the base the adapter was opened with, if any, is used. Copied; not used by
 *        peft_adapter_extract().
 * @param opts Options.
 * @param base_dir The base model (UTF-8), or NULL / "" for none.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts. The folder is opened by the
 *         conversion (its errors are reported there). Not thread-safe for the same @p opts.
 */
PEFT_API peft_error* peft_lowrank_options_set_base(peft_lowrank_options* opts, const char* base_dir);

/**
 * @brief Number of modules in a report.
 * @param report A report, or NULL.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_lowrank_report_module_count(const peft_lowrank_report* report);
/**
 * @brief A module's name ("model.layers.0.self_attn.q_proj").
 * @param report A report.
 * @param index 0 .. peft_lowrank_report_module_count() - 1.
 * @return Borrowed from @p report (valid until it is freed); NULL for NULL or out of range. Thread-safe.
 */
PEFT_API const char* peft_lowrank_report_module_name(const peft_lowrank_report* report, size_t index);
/**
 * @brief A module's rank in the written adapter.
 * @param report A report.
 * @param index 0 .. peft_lowrank_report_module_count() - 1.
 * @return The rank; 0 for NULL or out of range. Thread-safe.
 */
PEFT_API int64_t peft_lowrank_report_module_rank(const peft_lowrank_report* report, size_t index);
/**
 * @brief A module's relative error ||dW - B A||_F / ||dW||_F.
 * @param report A report.
 * @param index 0 .. peft_lowrank_report_module_count() - 1.
 * @return The error; -1 for NULL or out of range. Thread-safe.
 */
PEFT_API double peft_lowrank_report_module_error(const peft_lowrank_report* report, size_t index);
/** @brief Releases a report. @param report A report, or NULL. Thread-safe. */
PEFT_API void peft_lowrank_report_free(peft_lowrank_report* report);

/**
 * @brief Extracts a LoRA adapter from a fully fine-tuned checkpoint: dW = W_tuned - W_base per
 *        module, truncated SVD, written as a PEFT adapter folder (see the group above).
 *
 * Both checkpoints are read as peft_merge_checkpoint() reads a base: a folder with
 * `model.safetensors` or a sharded index, or a hub id resolved offline in the Hugging Face cache;
 * they must have the same tensor names. dW is formed in f32 one module per thread. The config's
 * `base_model_name_or_path` is @p base as given, `task_type` null.
 * @param base The base model (UTF-8).
 * @param tuned The fine-tuned model (UTF-8).
 * @param out_dir The output folder (UTF-8); created if needed; both files replaced atomically.
 * @param opts Options; a rank or an energy fraction must be set.
 * @param[out] out_report Receives the report (free with peft_lowrank_report_free()), or NULL.
 * @return NULL on success, else:
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments, options without a rank or energy, a rank
 *         above a module's min(out, in), an unknown architecture without named modules, modules that
 *         select nothing, or no selected weight that changed;
 *         #PEFT_ERR_UNRESOLVED_KEY listing base weights the fine-tuned checkpoint lacks;
 *         #PEFT_ERR_SHAPE_MISMATCH naming a weight whose shapes differ;
 *         #PEFT_ERR_UNSUPPORTED for a selected module that is not Linear or Conv1D;
 *         #PEFT_ERR_NON_FINITE for a dW holding an infinity or NaN;
 *         #PEFT_ERR_NOT_FOUND, #PEFT_ERR_IO and the format codes of peft_checkpoint_open().
 *         Thread-safe.
 */
PEFT_API peft_error* peft_adapter_extract(const char* base, const char* tuned, const char* out_dir,
                                          const peft_lowrank_options* opts, peft_lowrank_report** out_report);

/**
 * @brief Converts an adapter to a plain LoRA of another rank by truncated SVD of each module's dW,
 *        as PEFT's `convert_to_lora` / `save_as_lora` do.
 *
 * dW is the module's change as the merge computes it, in f32: LoRA scaling * B A; LoHa, LoKr,
 * AdaLoRA (and every additive method the merge takes: VeRA, RandLoRA, FourierFT, SHiRA, which
 * take their layer's features from the base) their dense delta, PEFT's get_delta_weight;
 * IA3, OFT, BOFT, HRA and MiSS's "bat" form (multiplicative) W' - W against the base
 * (peft_lowrank_options_set_base(), or the base the adapter was opened with), the error reported
 * against that dW. MiSS in its standard and "mini" forms converts exactly, without an SVD, at its
 * own rank r whatever rank or energy is asked (lora_A sums the r-column blocks, lora_B is the
 * block transposed; error 0), as PEFT's convert_to_lora does; a rank other than the one asked goes
 * into rank_pattern / alpha_pattern. IA3 on a layer whose bias it also
 * scales (not feed-forward, the base has the bias) does not convert. PEFT's own convert_to_lora
 * takes LoHa, LoKr and MiSS (same rule and config) but not AdaLoRA or IA3. The config keeps
 * the source's `target_modules` (a list extended by the module names; "all-linear" or an absent
 * field becomes the list), `base_model_name_or_path`, `layers_to_transform`, `layers_pattern` and
 * `task_type`; the rest is a fresh LoraConfig (scaling 1, no DoRA, no rsLoRA).
 * @param adapter The adapter (only read); open it with its base for GPT-2 Conv1D modules to be
 *        recognised (the product is the same either way, the factors' orientation follows PEFT's;
 *        an IA3 Conv1D module needs it to fit its base weight).
 * @param out_dir The output folder (UTF-8).
 * @param opts Options; a rank or an energy fraction must be set (modules are ignored).
 * @param[out] out_report Receives the report, or NULL.
 * @return NULL on success, else:
 *         #PEFT_ERR_UNSUPPORTED naming what PEFT does not convert (lora_bias, DoRA, embedding and
 *         conv modules, modules_to_save and other whole tensors, trainable tokens), a multiplicative
 *         module (IA3) without a base, and an IA3 module that also scales a bias;
 *         #PEFT_ERR_NOT_FOUND when the base has no weight for a module, or the base's open errors;
 *         #PEFT_ERR_SHAPE_MISMATCH when a module's parameters do not fit its layer;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments, options without a rank or energy, or a rank
 *         above a module's min(out, in); #PEFT_ERR_NON_FINITE; #PEFT_ERR_IO. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_convert_to_lora(const peft_adapter* adapter, const char* out_dir,
                                                  const peft_lowrank_options* opts, peft_lowrank_report** out_report);

/**
 * @brief Converts a PiSSA / CorDA / OLoRA / LoRA-GA / LoftQ initialised adapter, after training, into
 *        a LoRA on the original base, exactly as PEFT's
 *        `save_pretrained(path_initial_model_for_weight_conversion=...)` does.
 *
 * dW = B A - B0 A0, so lora_A = [A; A0] (rows) and lora_B = [B, -B0] (columns): the rank doubles
 * and the result is exact (no SVD). The config is the fine-tuned adapter's with
 * `init_lora_weights` true, `r` and `rank_pattern` doubled, `lora_alpha` and `alpha_pattern`
 * doubled (with `use_rslora`, `lora_alpha` times sqrt(2)). Factors keep their dtype unless @p opts
 * sets one.
 *
 * Both are adapter folders (or hub ids), not opened adapters: peft_adapter_open() refuses a
 * `pissa`, `corda`, `olora`, `loftq` or `lora_ga` config (PEFT would rewrite the base while
 * loading it); they are opened here as PEFT opens the initial adapter for this, with
 * `init_lora_weights` taken as true.
 * @param tuned_dir The adapter after training (UTF-8 folder).
 * @param initial_dir The same adapter saved right after initialisation, before training.
 * @param out_dir The output folder (UTF-8).
 * @param opts Export options (dtype; the target PEFT version is not used), or NULL.
 * @return NULL on success, else:
 *         #PEFT_ERR_UNSUPPORTED for a tensor other than lora_A / lora_B weights in either adapter
 *         (PEFT's conversion would drop it), or `use_rslora` with rank or alpha patterns (PEFT
 *         refuses it);
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments or adapters with different modules;
 *         #PEFT_ERR_SHAPE_MISMATCH naming a factor whose shapes differ; #PEFT_ERR_IO (also for a
 *         missing file); the errors of peft_adapter_open() for configs and weights. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_convert_initial(const char* tuned_dir, const char* initial_dir, const char* out_dir,
                                                  const peft_export_options* opts);

/**
 * @brief Combines adapters in delta space: the weighted sum of each module's true weight change,
 *        written as a plain LoRA adapter, exactly or truncated by SVD.
 *
 * Unlike peft_adapter_combine() (PEFT's `add_weighted_adapter`), which combines LoRA factors (its
 * `linear` and pruning types add cross terms B_i A_j no adapter had), this combines what a merge
 * adds: dW_i is each module's change as peft_adapter_convert_to_lora() computes it (LoRA with its
 * own scaling, rsLoRA and patterns included; the dense delta of LoHa, LoKr, AdaLoRA and the other
 * additive methods; with a base, W' - W of IA3, OFT, BOFT, HRA), in the layout of PEFT's
 * `get_delta_weight` ([in, out] for a GPT-2 Conv1D layer). The inputs may mix methods and ranks.
 * With #PEFT_COMBINE_LINEAR the result is sum_i w_i dW_i; #PEFT_COMBINE_TIES,
 * #PEFT_COMBINE_DARE_LINEAR, #PEFT_COMBINE_DARE_TIES and #PEFT_COMBINE_MAGNITUDE_PRUNE prune and
 * elect on the deltas as PEFT's merge_utils functions do (density, majority sign and DARE's masks,
 * factor 2 of peft_export_options_set_combine_seed()'s formula, from @p combine_opts). When an
 * input has `lora_bias`, so does the output: each module's lora_B.bias is sum_i w_i s_i b_i over the
 * inputs that have one (what a merge adds to the base's bias; not pruned), zeros elsewhere.
 *
 * The sum is written exactly when @p opts chooses no rank or energy (or is NULL): lora_A holds the
 * rows w_i * s_i * A_i and lora_B the columns B_i of the adapters that have the module, so the rank
 * is the sum of their ranks (error 0). That needs LoRA inputs and #PEFT_COMBINE_LINEAR. With a rank
 * or an energy fraction, each module's sum is factored by truncated SVD as
 * peft_adapter_convert_to_lora() does, and the report gives its relative error. The config is
 * the one peft_adapter_convert_to_lora() writes (scaling 1; `target_modules` the modules' names;
 * `base_model_name_or_path` and `task_type` from the first adapter; a module whose rank differs
 * from `r` in `rank_pattern` and `alpha_pattern`).
 * @param adapters @p count adapters (only read).
 * @param weights @p count finite weights (negative values subtract).
 * @param count Number of adapters, at least 1.
 * @param method #PEFT_COMBINE_LINEAR, #PEFT_COMBINE_TIES, #PEFT_COMBINE_DARE_LINEAR,
 *        #PEFT_COMBINE_DARE_TIES or #PEFT_COMBINE_MAGNITUDE_PRUNE.
 * @param out_dir The output folder (UTF-8).
 * @param combine_opts The density, majority sign and seed of @p method (its dtype, PEFT version and
 *        SVD settings are not used), or NULL.
 * @param opts Rank or energy (neither: exact), SVD method, threads, dtype, and the base model
 *        (peft_lowrank_options_set_base(); default: the first adapter's), or NULL (exact, F32).
 * @param[out] out_report Receives the per-module report, or NULL.
 * @return NULL on success, else:
 *         #PEFT_ERR_UNSUPPORTED naming the adapter and module: DoRA (its change rescales W + dW
 *         per row, so it does not add),
 *         modules_to_save and other whole tensors, trainable tokens, stacked expert parameters,
 *         activated LoRA, embedding and conv modules, a multiplicative module without a base;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments, @p count 0, another @p method, a weight
 *         that is not finite, a pruning method without a density, an exact combination of a
 *         non-LoRA module or with pruning (naming it), or a rank above a module's min(out, in);
 *         #PEFT_ERR_SHAPE_MISMATCH when a module's deltas differ in shape between adapters;
 *         #PEFT_ERR_NOT_FOUND when the base has no weight for a module; #PEFT_ERR_NON_FINITE;
 *         #PEFT_ERR_IO. Thread-safe.
 */
PEFT_API peft_error* peft_adapter_combine_deltas(const peft_adapter* const* adapters, const double* weights, size_t count,
                                                 int32_t method, const char* out_dir,
                                                 const peft_export_options* combine_opts,
                                                 const peft_lowrank_options* opts, peft_lowrank_report** out_report);

/**
 * @brief Whole-model task arithmetic: combines fine-tuned checkpoints of one base into a checkpoint
 *        folder, streaming, as mergekit's task arithmetic, TIES, DARE and magnitude-prune methods.
 *
 * For every floating-point tensor W of the base, with M_i the same-named tensor of model i:
 * out = W + combine(w_i, M_i - W), the differences taken in f32 and the result rounded once to the
 * output dtype. #PEFT_COMBINE_LINEAR sums w_i (M_i - W); #PEFT_COMBINE_TIES,
 * #PEFT_COMBINE_DARE_LINEAR, #PEFT_COMBINE_DARE_TIES and #PEFT_COMBINE_MAGNITUDE_PRUNE prune and
 * elect each tensor's differences as PEFT's merge_utils functions do (the arithmetic of
 * peft_adapter_combine()'s types of those names), with the density, majority sign and seed of
 * @p combine_opts; DARE's masks follow peft_export_options_set_combine_seed()'s formula with M the
 * tensor's name, i the model's position and f = 2. Other tensors (integer buffers) are copied from
 * the base. The output has the base's files, shard names, index and other files (config.json,
 * tokenizer files), as peft_merge_checkpoint() writes them, committed all at once; one tensor is
 * combined at a time: memory is about (count + 2) f32 copies of the largest tensor ((2 count + 2)
 * for the pruning types).
 *
 * A GGUF base (a `.gguf` file) takes GGUF models and writes one GGUF file at @p out_dir with the
 * base's metadata and tensor types: each float tensor, plain (F32, F16, BF16) or block-quantized, is
 * read to f32 as ggml's to_float does (a model's tensor may have another type), combined, and stored
 * back in the base's type as ggml_quantize_chunk rounds it; integer tensors are copied. Split GGUF
 * files are refused (#PEFT_ERR_UNSUPPORTED: join them with `llama-gguf-split --merge` first), as are
 * a dtype or a maximum shard size in @p opts (#PEFT_ERR_INVALID_ARGUMENT).
 * @param base_dir The base model folder (or hub id in the offline cache), safetensors and not
 *        quantized; or a GGUF model file.
 * @param models @p count fine-tuned model folders (or hub ids) with the base's tensor names and
 *        shapes; GGUF files for a GGUF base.
 * @param weights @p count finite weights.
 * @param count Number of models, at least 1.
 * @param method #PEFT_COMBINE_LINEAR, #PEFT_COMBINE_TIES, #PEFT_COMBINE_DARE_LINEAR,
 *        #PEFT_COMBINE_DARE_TIES or #PEFT_COMBINE_MAGNITUDE_PRUNE.
 * @param out_dir The output folder (UTF-8), or the output GGUF file for a GGUF base; not one of the inputs.
 * @param combine_opts Density, majority sign and seed (the rest is not used), or NULL.
 * @param opts Merge options without adapters: their dtype, maximum shard size, progress callback,
 *        require-config and allow-non-finite settings apply (threads and the GGUF settings do not);
 *        or NULL for the defaults.
 * @param[out] out_result Receives the result (#PEFT_MERGE_TENSORS_MERGED counts the combined
 *        tensors, #PEFT_MERGE_TENSORS_COPIED the others; bytes and files), or NULL.
 * @return NULL on success, else:
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL arguments, @p count 0, a weight that is not finite,
 *         another method, a pruning method without a density, options holding adapters, or an
 *         output over an input;
 *         #PEFT_ERR_NOT_FOUND naming a base tensor a model lacks, or a missing folder;
 *         #PEFT_ERR_SHAPE_MISMATCH naming a tensor whose shape differs;
 *         #PEFT_ERR_UNSUPPORTED for a quantized safetensors base (bitsandbytes, FP8), a split GGUF
 *         file, a GGUF tensor type without a quantizer here, or a model tensor that is not a float;
 *         #PEFT_ERR_NON_FINITE naming a tensor whose result is not finite (unless allowed);
 *         #PEFT_ERR_CANCELLED; #PEFT_ERR_IO and the errors of peft_checkpoint_open(). Nothing is
 *         written on failure. Thread-safe.
 */
PEFT_API peft_error* peft_model_combine(const char* base_dir, const char* const* models, const double* weights,
                                        size_t count, int32_t method, const char* out_dir,
                                        const peft_export_options* combine_opts, const peft_merge_options* opts,
                                        peft_merge_result** out_result);

/**
 * @brief Makes a merge of several adapters (peft_merge_checkpoint()) combine their changes on the
 *        deltas, as PEFT's merge_utils does, before they go into each weight, instead of adding them
 *        one after the other: W' = round(W + combine(w_i dW_i)), each dW_i the module's own change
 *        (PEFT's `get_delta_weight`: LoRA with its scaling, every additive method's delta, IA3 and
 *        the rotations as W_i' - W), combined in f32 by #PEFT_COMBINE_TIES, #PEFT_COMBINE_DARE_LINEAR,
 *        #PEFT_COMBINE_DARE_TIES or #PEFT_COMBINE_MAGNITUDE_PRUNE with the density, majority sign and
 *        seed of @p combine_opts: the weight peft_adapter_combine_deltas() writes for the same inputs,
 *        merged in one pass and without a rank (DARE's masks are the same: M the module's name, i the
 *        adapter's position among those that have the module, f = 2). lora_B biases and trainable
 *        token rows are added as usual. Plain LoRA deltas are built and combined a slice of rows at
 *        a time (about 2^20 values), so memory stays near a plain merge's; other methods' deltas are
 *        built whole, one weight at a time. This function sits here, not with the other merge
 *        options, because it takes export options.
 * @param opts Merge options.
 * @param method #PEFT_COMBINE_LINEAR (the default: adapters added in turn) or one of the four above.
 * @param combine_opts Density, majority sign and seed (the rest is not used), or NULL for the defaults
 *        (which the pruning types refuse: they need a density). Copied.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p opts, another method, or a pruning
 *         method without a density in [0, 1]. The merge then fails, before writing anything, with
 *         #PEFT_ERR_UNSUPPORTED listing the modules that have no delta to combine (DoRA, stacked
 *         expert parameters, embedding and convolution layers, IA3 and the rotations on a quantized
 *         base) or for a GGUF base, and #PEFT_ERR_INVALID_ARGUMENT with #PEFT_MERGE_ARITHMETIC_GGML.
 *         Not thread-safe on one options object.
 */
PEFT_API peft_error* peft_merge_options_set_combine(peft_merge_options* opts, int32_t method,
                                                   const peft_export_options* combine_opts);

/** @} */

/** @} */
/* ================================================================================================ */
/** @defgroup serving Serving many adapters over one base model
 *
 *  What a model server needs to serve many LoRA adapters over one base model it already holds in
 *  memory:
 *
 *  **Registry** (#peft_registry): adapters registered under names, by folder or from bytes in
 *  memory. Registering reads and validates the config and the safetensors header only; the tensors
 *  of the LoRA layers load on first use (peft_registry_acquire()), converted once to the
 *  registry's storage dtype (F32, BF16 or F16; rounding to nearest even, as torch's `.to()`). Loaded
 *  adapters stay in memory under a byte budget, least recently used first out. An acquired adapter
 *  (a #peft_lease) is pinned: it is never evicted while any lease or host model holds it. Eviction
 *  frees an adapter's memory at once. Registering under a name that exists replaces it for new
 *  acquisitions, while leases on the old version keep working with it; the old version's memory
 *  is freed when its last lease goes. The budget counts the loaded tensors (the storage-dtype
 *  bytes of every lora_A, lora_B, lora_B.bias and DoRA magnitude), never exceeded: a load that
 *  cannot fit, even after evicting everything unpinned, fails with #PEFT_ERR_OVER_BUDGET.
 *  Registered adapters that are not loaded hold their config, their header and (for adapters
 *  registered from memory) a copy of their bytes, outside the budget.
 *
 *  **Hot-swap** (#peft_host_model): the host gives its weight buffers once (name, pointer, dtype,
 *  shape); peft_host_model_swap() then switches the adapter merged into them from one to another,
 *  or to none, in place: the current adapter is taken out and the new one merged with
 *  peft_merge_buffer_apply()'s arithmetic, from the registry's stored factors. By default the
 *  removal is exact: the first time a weight is merged, the host model copies its bytes (and its
 *  bias's, the first time a lora_bias layer changes it) and keeps the copy while it lives (memory:
 *  the size of every weight ever merged, once); taking an adapter out writes the copies back. A
 *  swap from one adapter to another costs one merge (a plain LoRA layer reads the rows from the
 *  copy and writes them with its delta in one pass) or, for DoRA and lora_bias layers, one copy of
 *  the weight back plus one merge, and the buffers hold the original bytes with the current adapter
 *  merged in, bit for bit. While the host
 *  model lives it owns the contents of the buffers: the host reads them but must not write them
 *  (whatever a buffer holds, taking an adapter out writes its original bytes back).
 *  peft_host_model_set_exact() chooses PEFT's arithmetic unmerge instead.
 *
 *  **Other PEFT methods** in serving: a registry takes LoHa, LoKr, AdaLoRA and IA3 adapters (and
 *  every method the buffer merge takes). Their parameters are not loaded into the registry's
 *  storage nor charged to the budget: a swap reads them from the adapter file (as f32) and merges
 *  each module with peft_merge_buffer_apply()'s arithmetic for that method (IA3 also scales the
 *  bias buffer given with a non-feed-forward layer's weight), so swapping among LoRA and these
 *  methods, and back to none, restores the original bits as for LoRA. peft_lora_apply() refuses
 *  their layers with #PEFT_ERR_UNSUPPORTED naming the method (peft_lease_has_module() answers 0).
 *
 *  **LoRA on stacked MoE expert parameters** (`target_parameters`, PEFT's ParamWrapper): a registry
 *  takes such adapters, and their expert factors, like the other methods' parameters, are neither
 *  loaded into the storage nor charged to the budget. A swap reads them from the adapter file (as
 *  f32) and merges each parameter into the buffer the host gave under transformers' name for it:
 *  the fused parameter as transformers 5 holds it ("model.layers.0.mlp.experts.gate_up_proj",
 *  [experts, out, in], or [experts, in, out] for gpt-oss), every expert's slice by its own pair; or,
 *  when the host gave no such buffer, each tensor a checkpoint saves per expert
 *  ("model.layers.0.mlp.experts.3.up_proj.weight": that expert's rows), all of which it needs then.
 *  With a translator, the per-expert tensors by the host's names; with GGUF names, llama.cpp's
 *  stacked expert tensors ("blk.0.ffn_gate_exps.weight", [experts, out, in]: each expert's share
 *  merged into its slice, so the buffers hold what `peftc merge` into the GGUF file writes). With a
 *  translator, a parameter whose table gives it no per-expert tensors is #PEFT_ERR_UNSUPPORTED.
 *  Swapping to none restores them bit for bit as any other layer. peft_lora_apply() refuses the layers they adapt with #PEFT_ERR_UNSUPPORTED.
 *
 *  **Unmerged LoRA** (peft_lora_apply()): for a batch of activations and one layer, adds each
 *  row's adapter contribution `scaling * (x A^T) B^T` (plus `scaling * lora_B.bias` with lora_bias)
 *  into the output the host computed with the base weight, as PEFT's forward of an unmerged model
 *  with mixed-batch `adapter_names` does. Rows are grouped by adapter and each group costs two
 *  matrix products (the library's own kernels, factors read as stored). DoRA adapters are applied too, mixed with the others, from the base
 *  weights the host gives the registry (peft_registry_set_base_weight()).
 *
 *  Names of layers: HuggingFace module paths ("model.layers.0.self_attn.q_proj") or weight names
 *  ("...q_proj.weight"), with or without "base_model.model."; with a translator given to
 *  peft_registry_new() (for peft_lora_apply()) or peft_host_model_set_translator() (for the host's
 *  weights), the host's own names.
 *
 *  **GGUF hosts** (llama.cpp-family engines that hold the base as loaded from a GGUF file): give
 *  peft_host_model_set_translator() a translator for GGUF names (peft_translator_from_gguf() on the
 *  model file, or peft_translator_new_gguf()), and each weight by its GGUF tensor name
 *  ("blk.0.attn_q.weight"), its shape outermost first as PyTorch gives it ([out, in]: GGUF's `ne`
 *  reversed) and its rows as the file holds them. Swaps then merge each adapter's delta with its
 *  rows in the converter's order (LLaMA's RoPE permutation of q and k), so the buffers hold what
 *  `peftc merge` into the GGUF file writes, and swapping to none restores them bit for bit.
 *
 *  Thread safety: a registry and its leases may be used from any number of threads at once
 *  (register, acquire, release, trim, stats, apply). A host model belongs to one thread at a time,
 *  and nothing else may read or write its buffers during a swap.
 *  @{ */

/** A registry of adapters under a memory budget. Free with peft_registry_free(). */
typedef struct peft_registry peft_registry;
/** An acquired adapter of a registry: loaded and pinned until released with peft_lease_free(). */
typedef struct peft_lease peft_lease;
/** The weight buffers of a host's model, into which adapters are swapped. Free with peft_host_model_free(). */
typedef struct peft_host_model peft_host_model;

/** Counters of a registry (peft_registry_get_stats()). */
typedef struct peft_registry_stats {
  uint64_t size;              /**< Set by the caller to sizeof(peft_registry_stats); fields past it are not written. */
  uint64_t budget_bytes;      /**< The byte budget. */
  uint64_t loaded_bytes;      /**< Bytes of adapter tensors in memory now (never above the budget). */
  uint64_t peak_loaded_bytes; /**< The highest loaded_bytes seen. */
  uint64_t registered;        /**< Names registered now. */
  uint64_t loaded;            /**< Adapter versions in memory now (replaced versions still leased included). */
  uint64_t pinned;            /**< Of those, versions held by at least one lease or host model. */
  uint64_t loads;             /**< Loads of tensors since the registry was made. */
  uint64_t hits;              /**< Acquisitions that found the tensors in memory. */
  uint64_t evictions;         /**< Loaded versions evicted to make room or by peft_registry_trim(). */
} peft_registry_stats;

/** What a swap did (peft_host_model_swap()). */
typedef struct peft_swap_stats {
  uint64_t size;             /**< Set by the caller to sizeof(peft_swap_stats); fields past it are not written. */
  double remove_seconds;     /**< Wall time taking the previous adapter out. */
  double merge_seconds;      /**< Wall time merging the new adapter in. */
  uint64_t layers_removed;   /**< Layers of the previous adapter taken out. */
  uint64_t layers_merged;    /**< Layers of the new adapter merged in. */
  uint64_t saved_bytes;      /**< Bytes of original weights kept for exact restoration. */
} peft_swap_stats;

/**
 * @brief Creates an empty registry.
 * @param storage_dtype Dtype the tensors are kept in once loaded: #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or
 *        #PEFT_DTYPE_F16.
 * @param budget_bytes Most bytes of loaded tensors held at once.
 * @param translator Makes peft_lora_apply() read layer names as the host's own names (the table is
 *        shared; the handle may be freed afterwards), or NULL for HuggingFace names.
 * @param[out] out Receives the registry; free it with peft_registry_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p out, another dtype or a translator for
 *         GGUF names (peft_translator_from_gguf()). Thread-safe.
 */
PEFT_API peft_error* peft_registry_new(int32_t storage_dtype, uint64_t budget_bytes,
                                       const peft_translator* translator, peft_registry** out);

/**
 * @brief Releases a registry. Leases and host models that hold its adapters keep them until they
 *        release them.
 * @param registry A registry, or NULL. No other call on @p registry may run at the same time.
 */
PEFT_API void peft_registry_free(peft_registry* registry);

/**
 * @brief Registers the adapter in a folder under a name, or replaces the adapter of that name.
 *
 * Opens and validates the adapter as peft_adapter_open() does (reading its config and the header
 * of `adapter_model.safetensors`, no tensor data), and checks that its LoRA layers can be served:
 * layers whose tensors are not F64/F32/F16/BF16 are refused. The weights file stays open until the
 * adapter is loaded (and while it is registered): if it is truncated or rewritten in place before a
 * load, peft_registry_acquire() fails with #PEFT_ERR_IO; register the folder again to serve the new
 * file. A file replaced by rename goes on serving the registered bytes (see @ref file_changes).
 * @param registry A registry.
 * @param name The name (UTF-8, not empty, no newline).
 * @param dir The adapter folder, or a hub model id (@ref hub).
 * @param opts Options as for peft_adapter_open() (a base model to validate against), or NULL.
 * @return NULL on success; the errors of peft_adapter_open(); #PEFT_ERR_UNSUPPORTED for tensors of
 *         another dtype; #PEFT_ERR_SHAPE_MISMATCH for a layer whose lora_B.bias or DoRA magnitude
 *         does not have one value per output feature, or a Conv2d lora_B that is not 1x1;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL, an empty name or one with a newline.
 *         On failure the registry is unchanged (an adapter of that name stays). Thread-safe.
 */
PEFT_API peft_error* peft_registry_register(peft_registry* registry, const char* name, const char* dir,
                                           const peft_adapter_options* opts);

/**
 * @brief Registers an adapter held in memory under a name, or replaces the adapter of that name.
 *
 * As peft_registry_register(), from the text of `adapter_config.json` and the bytes of
 * `adapter_model.safetensors`; both are copied.
 * @param registry A registry.
 * @param name The name (UTF-8, not empty, no newline).
 * @param config_json The config's JSON text (UTF-8, NUL-terminated).
 * @param weights The safetensors bytes.
 * @param weights_size Their length.
 * @param opts Options as for peft_adapter_open(), or NULL.
 * @return As peft_registry_register(); format errors for bytes that are not a valid safetensors
 *         file; #PEFT_ERR_INVALID_CONFIG for a config that is not valid. Thread-safe.
 */
PEFT_API peft_error* peft_registry_register_memory(peft_registry* registry, const char* name,
                                                  const char* config_json, const void* weights,
                                                  size_t weights_size, const peft_adapter_options* opts);

/**
 * @brief Removes a name. Leases on its adapter keep working; its memory goes with the last of them.
 * @param registry A registry.
 * @param name A registered name.
 * @return NULL on success; #PEFT_ERR_NOT_FOUND for a name not registered; #PEFT_ERR_INVALID_ARGUMENT
 *         for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_registry_unregister(peft_registry* registry, const char* name);

/**
 * @brief The registered names, in the order they were first registered, one per line; the older
 *        form of peft_registry_name_list().
 * @param registry A registry.
 * @param[out] out Receives the names, each followed by a newline ("" when none); free it with
 *             peft_string_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_registry_names(const peft_registry* registry, char** out);

/**
 * @brief The registered names, in the order they were first registered, as a list (a snapshot:
 *        later registrations do not change it).
 * @param registry A registry.
 * @param[out] out Receives the list; free it with peft_string_list_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL; #PEFT_ERR_OUT_OF_MEMORY. Thread-safe.
 */
PEFT_API peft_error* peft_registry_name_list(const peft_registry* registry, peft_string_list** out);

/**
 * @brief The warnings of the adapter registered under a name now: what lenient loading
 *        (peft_adapter_options_set_lenient()) ignored when it was registered, as
 *        peft_adapter_warning() gives them; an empty list for a strict registration.
 * @param registry A registry.
 * @param name A registered name.
 * @param[out] out Receives the list (a snapshot); free it with peft_string_list_free().
 * @return NULL on success; #PEFT_ERR_NOT_FOUND for a name not registered;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_registry_warning_list(const peft_registry* registry, const char* name,
                                                peft_string_list** out);

/**
 * @brief Acquires the adapter registered under a name: loads its tensors if they are not in memory
 *        and pins it until the lease is released.
 *
 * Loading reads the LoRA layers' tensors and converts them to the storage dtype; to make room it
 * first evicts unpinned adapters, least recently used first. Threads acquiring an adapter that is
 * being loaded wait for that one load.
 * @param registry A registry.
 * @param name A registered name.
 * @param[out] out Receives the lease; release it with peft_lease_free().
 * @return NULL on success; #PEFT_ERR_NOT_FOUND for a name not registered; #PEFT_ERR_OVER_BUDGET when
 *         the adapter does not fit in the budget beside the pinned ones; #PEFT_ERR_IO when reading
 *         the tensors fails or finds `adapter_model.safetensors` truncated or rewritten since
 *         registration (never SIGBUS; see @ref file_changes);
 *         #PEFT_ERR_OUT_OF_MEMORY; #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_registry_acquire(peft_registry* registry, const char* name, peft_lease** out);

/**
 * @brief Evicts every loaded adapter that nothing pins.
 * @param registry A registry.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_registry_trim(peft_registry* registry);

/**
 * @brief Changes the byte budget, evicting unpinned adapters (least recently used first) until the
 *        loaded bytes fit.
 * @param registry A registry.
 * @param budget_bytes The new budget.
 * @return NULL on success; #PEFT_ERR_OVER_BUDGET, with nothing evicted and the budget unchanged,
 *         when the pinned adapters alone take more; #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_registry_set_budget(peft_registry* registry, uint64_t budget_bytes);

/**
 * @brief Reads the registry's counters.
 * @param registry A registry.
 * @param[in,out] stats Its `size` set by the caller; the other fields are filled (one consistent
 *                snapshot).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL or a `size` below 16. Thread-safe.
 */
PEFT_API peft_error* peft_registry_get_stats(const peft_registry* registry, peft_registry_stats* stats);

/**
 * @brief Releases a lease: the adapter is unpinned (and becomes evictable once nothing else holds it).
 * @param lease A lease, or NULL. Thread-safe; each lease is released once.
 */
PEFT_API void peft_lease_free(peft_lease* lease);

/**
 * @brief The older name of peft_lease_free(), with the same behaviour.
 * @param lease A lease, or NULL. Thread-safe; each lease is released once.
 */
PEFT_API void peft_lease_release(peft_lease* lease);

/**
 * @brief The name the leased adapter was acquired under.
 * @param lease A lease.
 * @return Borrowed UTF-8 string valid while @p lease lives; NULL for NULL. Thread-safe.
 */
PEFT_API const char* peft_lease_name(const peft_lease* lease);

/**
 * @brief The version of the leased adapter: the registry numbers registrations 1, 2, 3, ... so a
 *        replacement has a higher version than what it replaced.
 * @param lease A lease.
 * @return The version; 0 for NULL. Thread-safe.
 */
PEFT_API uint64_t peft_lease_version(const peft_lease* lease);

/**
 * @brief Bytes the leased adapter's loaded tensors take (what it counts against the budget).
 * @param lease A lease.
 * @return The byte count; 0 for NULL. Thread-safe.
 */
PEFT_API uint64_t peft_lease_bytes(const peft_lease* lease);

/**
 * @brief Whether the leased adapter has a LoRA layer of that name.
 * @param lease A lease.
 * @param module A layer name (see @ref serving; host names when the registry has a translator).
 * @return 1 or 0 (0 for NULL arguments). Thread-safe.
 */
PEFT_API int32_t peft_lease_has_module(const peft_lease* lease, const char* module);

/**
 * @brief Adds the LoRA contribution of each row's adapter to one layer's output, without merging.
 *
 * For every row i with an adapter a = @p leases[@p row_lease[i]] that has a LoRA layer
 * @p module: y[i] += scaling_a * (x[i] A_a^T) B_a^T (+ scaling_a * lora_B.bias_a with lora_bias),
 * computed in F32 (the rows of one adapter together) and rounded once into @p y's dtype. Rows whose index is -1, or whose adapter has no such layer, are left unchanged (PEFT's
 * mixed-batch forward does the same). The scaling is the layer's (alpha / r, or alpha / sqrt(r) with
 * rslora, after rank and alpha patterns). Linear and GPT-2 Conv1D layers are supported; their
 * LoRA factors are the same. Factors that the registry stores as BF16 or F16 are read as stored and
 * widened in registers (no F32 copy is made), so BF16 storage costs half the memory of F32 and no
 * speed. A call of more than about two million multiply-adds (rows x rank x (in_features +
 * out_features), summed over the adapters) splits its rows between the cores, on worker threads
 * the library starts once and keeps. A call that does not split its rows (fewer than 32 rows, or
 * less work) splits the two products of each adapter with at least a quarter of a million
 * multiply-adds (a rank-32 row of a 4096 x 4096 layer) between the cores instead. A call that
 * finds the threads busy with another thread's call runs on its own thread.
 *
 * Precision: the summation order depends on the kernel table (see peft_kernels()) and on how the
 * rows and products are split between threads, so the F32 result is not bit-identical across
 * machines; it lies
 * within gamma(n) x (|y| + |scaling| x
 * (|x| |A^T|) |B^T| + |scaling x bias|) of the exact value, element by element, with
 * gamma(n) = n u / (1 - n u), u = 2^-24 and n = in_features + rank + 6 (the depth of rounded
 * operations). A BF16 or F16 @p y is that F32 result rounded once, to nearest even. The tests check
 * this bound on every kernel table (see peft_kernels()).
 *
 * DoRA layers (`use_dora`): rows of a DoRA adapter get PEFT's DoRA forward instead,
 * y[i] += (s - 1) * (y[i] - bias) + (s * (x[i] A^T) B^T) * scaling, in F32 and rounded once, where
 * s = magnitude / ||W + scaling B A|| per output feature comes from the base weight and bias given
 * with peft_registry_set_base_weight() (computed on the layer's first apply, kept until
 * peft_registry_base_weights_changed()); @p y must then be the base output with its bias. DoRA,
 * plain LoRA and adapter-less rows may share one call (PEFT refuses `adapter_names` with DoRA).
 *
 * Activated LoRA (`alora_invocation_tokens` in the adapter's config, read with
 * peft_adapter_config_field()): PEFT applies such an adapter only to the tokens from the start of the
 * last occurrence of that token sequence in the sequence's input ids on, the sequence itself included,
 * and to every token generated after it; before it, and in a sequence without it, the output is the
 * base model's. This function applies to the rows it is given, so the host gives those rows the
 * adapter's lease and the others -1 (as PEFT's `calculate_alora_offsets` and its aLoRA forward do);
 * the tokens before the invocation then keep the base model's keys and values, which is what lets a
 * host reuse their cache. Such an adapter is never merged (PEFT refuses too): merges, swaps and
 * combinations refuse it with #PEFT_ERR_UNSUPPORTED.
 * @param module The layer (see @ref serving).
 * @param leases The adapters of this batch.
 * @param lease_count Their number (at least 1).
 * @param row_lease @p rows indices into @p leases, or -1 for no adapter; NULL when every row uses
 *        @p leases[0].
 * @param x Activations: @p rows x @p in_features, row-major, @p x_dtype elements.
 * @param x_dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16.
 * @param rows Number of rows (tokens); 0 does nothing.
 * @param in_features The layer's input features.
 * @param y The layer's output for the same rows, @p rows x @p out_features, row-major; changed in place.
 * @param y_dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16.
 * @param out_features The layer's output features.
 * @return NULL on success, and @p y is unchanged on failure: #PEFT_ERR_SHAPE_MISMATCH naming the
 *         adapter when its layer's features differ from @p in_features / @p out_features;
 *         #PEFT_ERR_UNSUPPORTED for an embedding or Conv2d layer, a layer of another PEFT method, a
 *         layer a LoRA on stacked expert parameters adapts, or another dtype;
 *         #PEFT_ERR_NOT_FOUND naming the layer and the adapter for a DoRA layer whose base weight
 *         was not given with peft_registry_set_base_weight(); #PEFT_ERR_SHAPE_MISMATCH when that
 *         weight's shape or bias does not fit the layer; #PEFT_ERR_UNRESOLVED_KEY when the registry's translator
 *         does not resolve @p module; #PEFT_ERR_INVALID_ARGUMENT for NULL arguments or an index
 *         out of range; #PEFT_ERR_OUT_OF_MEMORY. Thread-safe; calls writing different outputs may
 *         run at once, also with the same leases.
 */
PEFT_API peft_error* peft_lora_apply(const char* module, const peft_lease* const* leases, size_t lease_count,
                                     const int32_t* row_lease, const void* x, int32_t x_dtype, uint64_t rows,
                                     uint64_t in_features, void* y, int32_t y_dtype, uint64_t out_features);

/**
 * @brief Creates a host model with no weights.
 * @param[out] out Receives it; free it with peft_host_model_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_host_model_new(peft_host_model** out);

/**
 * @brief Releases a host model and its hold on the merged adapter, without touching the buffers
 *        (swap to none first to leave them as they were).
 * @param host A host model, or NULL.
 */
PEFT_API void peft_host_model_free(peft_host_model* host);

/**
 * @brief Makes the host model read weight names as the host's own names, through a translator.
 * @param host A host model with no weights added yet.
 * @param translator A translator (its table is shared; the handle may be freed afterwards), or NULL
 *        for HuggingFace names (the default); a translator for GGUF names makes them GGUF tensor names
 *        (see GGUF hosts in @ref serving).
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p host or after weights were added.
 */
PEFT_API peft_error* peft_host_model_set_translator(peft_host_model* host, const peft_translator* translator);

/**
 * @brief Chooses how swaps take adapters out: exactly (the default), by writing back a copy of each
 *        weight's original bytes, taken at the weight's first exact merge and kept while the host
 *        model lives (memory: the size of the adapted weights, once); or by PEFT's arithmetic
 *        unmerge (no copy; in BF16/F16 it may change last bits, swap after swap).
 *
 * Layers come out the way they went in, whatever the mode is at the swap. So when exact mode is
 * switched on with an adapter merged arithmetically, the next swap takes that adapter out
 * arithmetically; then, before merging the new one into a weight, it writes back the weight's
 * original bytes if it kept them before (dropping what arithmetic unmerges left), or otherwise
 * copies the buffer as it is then as the original. Switching exact mode off keeps the copies.
 * @param host A host model.
 * @param exact Nonzero for exact restoration; takes effect at the next merge.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL.
 */
PEFT_API peft_error* peft_host_model_set_exact(peft_host_model* host, int32_t exact);

/**
 * @brief Gives the host model one weight buffer (owned by the caller, which keeps it valid and in
 *        place while the host model lives, and does not write into it then: the host model owns
 *        its contents, see Hot-swap in @ref serving).
 * @param host A host model.
 * @param name The weight's name or its layer's (see @ref serving).
 * @param data The weight: row-major, @p dtype elements.
 * @param dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16.
 * @param shape @p ndim dimensions ([out, in] for Linear, [in, out] for GPT-2 Conv1D,
 *        [num_embeddings, dim] for embeddings, [experts, out, in] for a fused expert parameter
 *        ([experts, in, out] for gpt-oss); a GGUF tensor's `ne` reversed). Copied.
 * @param ndim 2, 3 for a fused expert parameter or a stacked GGUF expert tensor (see @ref serving),
 *        or 4 for Conv2d.
 * @param bias The layer's bias buffer (needed by adapters with lora_bias), or NULL.
 * @param bias_dtype Dtype of @p bias; ignored without one.
 * @param bias_elements Number of elements of @p bias (the layer's output features: shape[0] of a
 *        Linear or Conv2d weight, shape[1] of a GPT-2 Conv1D weight, shape[1] of an embedding);
 *        ignored without a bias. A swap refuses a layer whose output features differ.
 *
 * A buffer given again under another name (the same @p data: tied embeddings, where the input
 * embedding and `lm_head` share memory) is one tensor with two names. A swap merges an adapter's
 * change into it once: it accepts an adapter whose layers on such a buffer are the same change on
 * every name (ensure_weight_tying: PEFT ties the output embedding's LoRA to the input embedding's,
 * merged once through the name given first), and refuses, before any byte changes, one that changes
 * one name alone or the names by layers of their own (#PEFT_ERR_UNSUPPORTED naming the layers and
 * both names: the adapter's forward changes only one side, a merge would change both; the way out
 * is a buffer of its own for each name, or peft_merge_checkpoint(), whose tied embeddings policy
 * unties them, see peft_merge_options_set_tied_embeddings()).
 * @return NULL on success; #PEFT_ERR_UNRESOLVED_KEY when the translator does not resolve @p name;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL, a layer given twice or while an adapter is merged,
 *         or the buffer of a weight given before with another dtype or shape;
 *         #PEFT_ERR_UNSUPPORTED for another dtype; #PEFT_ERR_SHAPE_MISMATCH for a zero dimension,
 *         fewer than 2 or more than 4 dimensions, or (GGUF names) rows that the weight's row order
 *         cannot split into the translator's heads.
 */
PEFT_API peft_error* peft_host_model_add_weight(peft_host_model* host, const char* name, void* data, int32_t dtype,
                                                const uint64_t* shape, size_t ndim, void* bias, int32_t bias_dtype,
                                                uint64_t bias_elements);

/**
 * @brief Switches the adapter merged into the host's buffers: takes the current one out (if any)
 *        and merges @p lease's in (if not NULL), scaled by @p weight.
 *
 * Everything is checked before a buffer changes: every LoRA layer of the new adapter must have
 * its weight in the host model, with a fitting shape. The host model holds the new adapter (pinned
 * in its registry) until the next swap or peft_host_model_free(); the caller may release its own
 * lease at once.
 * @param host A host model.
 * @param lease The adapter to merge, or NULL for none.
 * @param weight Multiplies the adapter's scaling (1.0 for the adapter as trained); finite and of the
 *        f32 range (see peft_merge_options_add_adapter()).
 * @param[in,out] stats NULL, or counters whose `size` the caller set.
 * @return NULL on success; on failure the previous adapter stays merged (a failure midway
 *         merges it back: bit for bit in exact mode, up to last bits in arithmetic mode; should
 *         that fail too, the message says so, peft_host_model_current() returns NULL and the next
 *         swap takes out the layers still merged):
 *         #PEFT_ERR_UNRESOLVED_KEY listing the adapter's layers the host model has no weight for;
 *         #PEFT_ERR_SHAPE_MISMATCH naming a layer whose weight, or whose lora_B.bias (against the
 *         bias's element count), does not fit;
 *         #PEFT_ERR_UNSUPPORTED when the adapter changes a buffer given under several names
 *         otherwise than alike on every name (see peft_host_model_add_weight()), or when it replaces whole tensors (modules_to_save, LN tuning,
 *         trainable tokens, biases saved with bias="all", base-layer weights saved with
 *         save_embedding_layers), which a swap does not do (the message names LN_TUNING or
 *         TRAINABLE_TOKENS and points to peft_merge_buffer_apply()), or when it adapts a stacked
 *         expert parameter saved fused and the host model has a translator; #PEFT_ERR_INVALID_ARGUMENT for NULL @p host, a weight
 *         that is not finite, a missing bias buffer, or two layers of the adapter on one weight;
 *         #PEFT_ERR_OUT_OF_MEMORY (the first exact merge of a weight allocates its copy);
 *         #PEFT_ERR_NON_FINITE naming the weight whose merged values would hold an infinity or a
 *         NaN in its dtype (see peft_merge_buffer_apply()).
 */
PEFT_API peft_error* peft_host_model_swap(peft_host_model* host, const peft_lease* lease, double weight,
                                          peft_swap_stats* stats);

/**
 * @brief The name of the adapter merged into the host's buffers.
 * @param host A host model.
 * @return Borrowed UTF-8 string valid until the next swap; NULL when none (or for NULL).
 */
PEFT_API const char* peft_host_model_current(const peft_host_model* host);

/**
 * @brief Gives the registry the host's base weight of one layer, which peft_lora_apply() needs for
 *        DoRA layers: their weight norm ||W + scaling B A|| per output feature, and the layer's bias.
 *
 * PEFT's DoRA forward adds `(s - 1) * (base(x) - bias) + s * scaling * (x A^T) B^T` to the base
 * layer's output base(x), with s = magnitude / ||W + scaling B A||. peft_lora_apply() computes s
 * the first time an adapter version's DoRA layer is applied (with the norm of the DoRA merge,
 * accumulated in F64 and rounded to F32; then s = magnitude / norm in F32) and keeps it until
 * peft_registry_base_weights_changed() or another call of this function; its `y` must be the full
 * base output, bias included, which it takes out again with the bias given here. Plain LoRA layers
 * need no base weight.
 *
 * The buffers are borrowed, not copied: the host keeps them valid, and their contents as they were,
 * while any peft_lora_apply() on this registry's leases may run (until the registry and all its
 * leases are freed, or the layer is given again); after changing their contents it calls
 * peft_registry_base_weights_changed(). They must hold the base weights without any adapter merged
 * (not a #peft_host_model's buffers while it has an adapter merged).
 * @param registry A registry.
 * @param name The weight's name or its layer's (see @ref serving; the registry's translator applies).
 *        Giving a layer again replaces its buffers.
 * @param data The weight: row-major, @p dtype elements.
 * @param dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16.
 * @param shape @p ndim dimensions: [out, in] for Linear, [in, out] for GPT-2 Conv1D. Copied.
 * @param ndim 2.
 * @param bias The layer's bias (what the host's base output includes), or NULL for a layer without.
 * @param bias_dtype Dtype of @p bias (#PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16); ignored
 *        without one.
 * @param bias_elements Number of elements of @p bias (the output features); ignored without a bias.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p registry, @p name, @p data or
 *         @p shape; #PEFT_ERR_UNSUPPORTED for another dtype; #PEFT_ERR_SHAPE_MISMATCH for another
 *         number of dimensions, a zero dimension or a bias of 0 elements; #PEFT_ERR_UNRESOLVED_KEY
 *         when the translator does not resolve @p name. Whether the shape fits a DoRA layer is
 *         checked by peft_lora_apply() (#PEFT_ERR_SHAPE_MISMATCH). Thread-safe.
 */
PEFT_API peft_error* peft_registry_set_base_weight(peft_registry* registry, const char* name, const void* data,
                                                   int32_t dtype, const uint64_t* shape, size_t ndim, const void* bias,
                                                   int32_t bias_dtype, uint64_t bias_elements);

/**
 * @brief Tells the registry that the host changed the contents of the base weights (or biases) it
 *        gave with peft_registry_set_base_weight(): every DoRA layer's scale is computed again, from
 *        the buffers as they are then, at its next peft_lora_apply().
 * @param registry A registry.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe; applies running at the
 *         same time finish with the scales they started with.
 */
PEFT_API peft_error* peft_registry_base_weights_changed(peft_registry* registry);

/** @} */
/* ================================================================================================ */
/** @defgroup control Control vectors (steering vectors)
 *  A control vector holds one direction of `n_embd` values per decoder layer; a host adds
 *  `strength` x the direction of layer N to the output of its 0-based decoder layer N (the residual
 *  stream after the layer), the way llama.cpp applies `--control-vector` (after each layer's residual
 *  add) and repeng steers. Files:
 *  - llama.cpp's GGUF (architecture `controlvector`, as repeng and llama.cpp's cvector-generator
 *    write it): an F32 tensor `direction.N` per layer, N >= 1 (llama.cpp never steers layer 0 and
 *    refuses `direction.0`), `controlvector.model_hint` and `controlvector.layer_count`;
 *  - safetensors: one vector per layer named `direction.N`, `model.layers.N`, `layers.N` or just `N`
 *    (a `{layer: vector}` dict saved as is), of any float dtype, `model_hint` in the metadata.
 *
 *  Thread safety: the const functions may run at once on one vector; the others need the vector
 *  to themselves.
 *  @{ */

/** A control vector: directions by layer. Create with peft_control_vector_open() or
 *  peft_control_vector_new(), free with peft_control_vector_free(). */
typedef struct peft_control_vector peft_control_vector;
/** What an exact removal of peft_control_vector_apply() needs; free with peft_control_record_free(). */
typedef struct peft_control_record peft_control_record;

/**
 * @brief Reads a control vector from one GGUF or safetensors file (the format is told by its
 *        contents), checking what llama.cpp's loader checks and more: every tensor a direction with
 *        a canonical layer number (`direction.01` is refused), each layer once, every direction one
 *        vector (outer dimensions of 1 allowed) of one length, F32 in GGUF, every value finite, at
 *        least one direction; a GGUF file whose `general.architecture` is not `controlvector` is
 *        refused.
 * @param path The file.
 * @param[out] out Receives the vector (values converted to f32); free it with peft_control_vector_free().
 * @return NULL on success; #PEFT_ERR_IO and the format's errors for a file that does not open;
 *         #PEFT_ERR_INVALID_CHECKPOINT naming the tensor or key for a file that is no control
 *         vector; #PEFT_ERR_NON_FINITE naming the tensor for an infinite or NaN value;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL. Thread-safe.
 */
PEFT_API peft_error* peft_control_vector_open(const char* path, peft_control_vector** out);

/**
 * @brief Makes an empty control vector, to be filled with peft_control_vector_set_direction() or
 *        peft_control_vector_add().
 * @param n_embd Values per direction, in [1, 2^31].
 * @param model_hint The model it was made for (written as `controlvector.model_hint`), or NULL for none. Copied.
 * @param[out] out Receives the vector; free it with peft_control_vector_free().
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL @p out or @p n_embd out of range.
 *         Thread-safe.
 */
PEFT_API peft_error* peft_control_vector_new(uint64_t n_embd, const char* model_hint, peft_control_vector** out);

/** @brief Releases a vector. @param vector A vector, or NULL. Not concurrently with other calls on it. */
PEFT_API void peft_control_vector_free(peft_control_vector* vector);

/**
 * @brief Values per direction (the model's hidden size).
 * @param vector A vector.
 * @return n_embd; 0 for NULL. Thread-safe.
 */
PEFT_API uint64_t peft_control_vector_n_embd(const peft_control_vector* vector);

/**
 * @brief The model the vector was made for, as its file names it.
 * @param vector A vector.
 * @return Borrowed UTF-8 string ("" when none), valid until the vector is changed or freed; NULL for
 *         NULL. Thread-safe.
 */
PEFT_API const char* peft_control_vector_model_hint(const peft_control_vector* vector);

/**
 * @brief How many layers have a direction.
 * @param vector A vector.
 * @return The count; 0 for NULL. Thread-safe.
 */
PEFT_API size_t peft_control_vector_layer_count(const peft_control_vector* vector);

/**
 * @brief The layer number of the @p index-th direction, layers in ascending order.
 * @param vector A vector.
 * @param index In [0, peft_control_vector_layer_count()).
 * @return The layer (0-based decoder layer index); -1 for NULL or out of range. Thread-safe.
 */
PEFT_API int64_t peft_control_vector_layer(const peft_control_vector* vector, size_t index);

/**
 * @brief One layer's direction.
 * @param vector A vector.
 * @param layer A layer number.
 * @return Borrowed array of peft_control_vector_n_embd() f32 values, valid until the vector is changed
 *         or freed; NULL for NULL or a layer without a direction. Thread-safe.
 */
PEFT_API const float* peft_control_vector_direction(const peft_control_vector* vector, int64_t layer);

/**
 * @brief Sets one layer's direction, replacing what the layer had.
 * @param vector A vector.
 * @param layer The 0-based decoder layer whose output the direction steers (>= 0).
 * @param dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16, #PEFT_DTYPE_F16 or #PEFT_DTYPE_F64.
 * @param data peft_control_vector_n_embd() elements of @p dtype, any alignment. Copied (as f32).
 * @return NULL on success, the vector unchanged on failure: #PEFT_ERR_INVALID_ARGUMENT for NULL, a
 *         negative layer or another dtype; #PEFT_ERR_NON_FINITE for an infinite or NaN value.
 */
PEFT_API peft_error* peft_control_vector_set_direction(peft_control_vector* vector, int64_t layer, int32_t dtype,
                                                       const void* data);

/**
 * @brief Adds @p strength x @p src to @p dst, layer by layer (a layer @p dst lacks starts at zero),
 *        with llama.cpp's arithmetic when it loads several vectors (`--control-vector-scaled`): each
 *        element `src * (float)strength` in f32, then added in f32.
 * @param dst The vector changed.
 * @param src The vector added (may be @p dst itself).
 * @param strength The factor; negative values subtract.
 * @return NULL on success, @p dst unchanged on failure: #PEFT_ERR_SHAPE_MISMATCH when the n_embd
 *         differ; #PEFT_ERR_NON_FINITE naming the layer when a sum is infinite or NaN;
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL.
 */
PEFT_API peft_error* peft_control_vector_add(peft_control_vector* dst, const peft_control_vector* src, double strength);

/**
 * @brief Writes the vector to a file, atomically (a temporary renamed over @p path).
 *        #PEFT_FORMAT_GGUF: llama.cpp's layout, byte for byte as gguf-py writes it (repeng's
 *        `export_gguf`): `general.architecture` = `controlvector`, `controlvector.model_hint` when
 *        set, `controlvector.layer_count`, then `direction.N` F32 in ascending N.
 *        #PEFT_FORMAT_SAFETENSORS: `direction.N` F32 tensors, `model_hint` in the metadata when set,
 *        byte for byte as Python's `safetensors.torch.save_file` writes them.
 * @param vector A vector.
 * @param path The file to write.
 * @param format #PEFT_FORMAT_GGUF or #PEFT_FORMAT_SAFETENSORS.
 * @return NULL on success; #PEFT_ERR_INVALID_ARGUMENT for NULL, another format, a vector without
 *         directions, or (GGUF) a direction for layer 0, which llama.cpp refuses; #PEFT_ERR_IO when
 *         the file cannot be written (nothing is left at @p path then). Thread-safe.
 */
PEFT_API peft_error* peft_control_vector_save(const peft_control_vector* vector, const char* path, int32_t format);

/**
 * @brief Adds one layer's direction x @p strength to a host's buffer, in place: to each of @p rows
 *        rows of peft_control_vector_n_embd() elements, y = round(x + d * (float)strength), the
 *        product and the sum in f32 as llama.cpp computes them, rounded once to the buffer's dtype.
 *        The buffer is the layer's output (activations [rows, n_embd]) or a bias the host adds after
 *        the layer ([1, n_embd], as llama.cpp keeps its control-vector tensors). A layer without a
 *        direction leaves the buffer as it is (llama.cpp's zero vector).
 * @param vector A vector.
 * @param layer The 0-based decoder layer whose output the buffer is.
 * @param strength The factor of the direction.
 * @param data The buffer: row-major, @p dtype elements, any alignment. Changed in place.
 * @param dtype #PEFT_DTYPE_F32, #PEFT_DTYPE_BF16 or #PEFT_DTYPE_F16.
 * @param rows Rows of the buffer (>= 1).
 * @param[out] out NULL, or receives a record with which peft_control_record_remove() takes the
 *             direction out again exactly; it keeps twice the buffer's bytes.
 * @return NULL on success, the buffer unchanged on failure: #PEFT_ERR_INVALID_ARGUMENT for NULL, another
 *         dtype or zero rows; #PEFT_ERR_VALIDATION_OVERFLOW when the buffer's size overflows 64 bits;
 *         #PEFT_ERR_NON_FINITE naming the layer when a finite element would become infinite or NaN.
 *         Thread-safe for different buffers.
 */
PEFT_API peft_error* peft_control_vector_apply(const peft_control_vector* vector, int64_t layer, double strength,
                                               void* data, int32_t dtype, uint64_t rows, peft_control_record** out);

/**
 * @brief Takes an applied direction out of the buffer again, exactly: puts back the bytes the buffer
 *        held before, after checking that it still holds what the apply wrote (with several applies
 *        on one buffer, remove them in reverse order).
 * @param record A record from peft_control_vector_apply() not removed yet.
 * @param data The same buffer (it may have moved, with the same contents).
 * @return NULL on success (the record is then spent); nothing changed on failure:
 *         #PEFT_ERR_INVALID_ARGUMENT for NULL, a spent record, or a buffer that changed since the
 *         apply. Thread-safe for different records.
 */
PEFT_API peft_error* peft_control_record_remove(peft_control_record* record, void* data);

/** @brief Releases a record without touching any buffer. @param record A record, or NULL. Thread-safe. */
PEFT_API void peft_control_record_free(peft_control_record* record);

/** @} */
/* ================================================================================================ */
/** @defgroup plugin The function table (for dlopen)
 *  A plugin or a host that loads `libpeft_c.so.<ABI>` with `dlopen` needs one symbol,
 *  `peft_get_api`, to reach every function: it returns a table of function pointers. The table is
 *  append-only within an ABI version: a function added later goes at its end, nothing is removed,
 *  reordered or retyped (tests/abi checks this against a committed baseline), so a table from a
 *  newer library serves an older caller unchanged. A caller compiled against a newer header reads
 *  only the entries that lie within `size` bytes.
 *  @{ */

/** Every function of this header, in a stable order. Each entry points to the function named in
 *  its comment, with the same signature and documentation. */
typedef struct peft_api {
  uint32_t abi;  /**< The ABI version this table implements (#PEFT_ABI_VERSION). */
  uint32_t size; /**< sizeof(peft_api) in the library that filled the table. */
  const char* (*version)(void); /**< peft_version() */
  uint32_t (*version_number)(void); /**< peft_version_number() */
  uint32_t (*abi_version)(void); /**< peft_abi_version() */
  int32_t (*error_code)(const peft_error* err); /**< peft_error_code() */
  const char* (*error_message)(const peft_error* err); /**< peft_error_message() */
  void (*error_free)(peft_error* err); /**< peft_error_free() */
  const char* (*error_code_name)(int32_t code); /**< peft_error_code_name() */
  const char* (*dtype_name)(int32_t dtype); /**< peft_dtype_name() */
  int32_t (*dtype_from_name)(const char* name); /**< peft_dtype_from_name() */
  uint32_t (*dtype_bits)(int32_t dtype); /**< peft_dtype_bits() */
  peft_error* (*convert)(int32_t src_dtype, const void* src, int32_t dst_dtype, void* dst, uint64_t count); /**< peft_convert() */
  peft_error* (*open_options_new)(peft_open_options** out); /**< peft_open_options_new() */
  void (*open_options_free)(peft_open_options* opts); /**< peft_open_options_free() */
  peft_error* (*open_options_set_max_header_size)(peft_open_options* opts, uint64_t max_bytes); /**< peft_open_options_set_max_header_size() */
  peft_error* (*open_options_set_use_pread)(peft_open_options* opts, int32_t use_pread); /**< peft_open_options_set_use_pread() */
  peft_error* (*checkpoint_open)(const char* path, const peft_open_options* opts, peft_checkpoint** out); /**< peft_checkpoint_open() */
  peft_error* (*checkpoint_open_memory)(const void* data, size_t size, const peft_open_options* opts, peft_checkpoint** out); /**< peft_checkpoint_open_memory() */
  void (*checkpoint_free)(peft_checkpoint* ckpt); /**< peft_checkpoint_free() */
  size_t (*checkpoint_file_count)(const peft_checkpoint* ckpt); /**< peft_checkpoint_file_count() */
  const char* (*checkpoint_file_path)(const peft_checkpoint* ckpt, size_t file_index); /**< peft_checkpoint_file_path() */
  int32_t (*checkpoint_has_metadata)(const peft_checkpoint* ckpt, size_t file_index); /**< peft_checkpoint_has_metadata() */
  size_t (*checkpoint_metadata_count)(const peft_checkpoint* ckpt, size_t file_index); /**< peft_checkpoint_metadata_count() */
  const char* (*checkpoint_metadata_key)(const peft_checkpoint* ckpt, size_t file_index, size_t entry); /**< peft_checkpoint_metadata_key() */
  const char* (*checkpoint_metadata_value)(const peft_checkpoint* ckpt, size_t file_index, size_t entry); /**< peft_checkpoint_metadata_value() */
  const char* (*checkpoint_index_metadata_json)(const peft_checkpoint* ckpt); /**< peft_checkpoint_index_metadata_json() */
  size_t (*checkpoint_tensor_count)(const peft_checkpoint* ckpt); /**< peft_checkpoint_tensor_count() */
  peft_error* (*checkpoint_find)(const peft_checkpoint* ckpt, const char* name, size_t* out_index); /**< peft_checkpoint_find() */
  peft_error* (*checkpoint_find_n)(const peft_checkpoint* ckpt, const char* name, size_t name_length, size_t* out_index); /**< peft_checkpoint_find_n() */
  size_t (*checkpoint_tensor_name_length)(const peft_checkpoint* ckpt, size_t index); /**< peft_checkpoint_tensor_name_length() */
  const char* (*checkpoint_tensor_name)(const peft_checkpoint* ckpt, size_t index); /**< peft_checkpoint_tensor_name() */
  int32_t (*checkpoint_tensor_dtype)(const peft_checkpoint* ckpt, size_t index); /**< peft_checkpoint_tensor_dtype() */
  size_t (*checkpoint_tensor_ndim)(const peft_checkpoint* ckpt, size_t index); /**< peft_checkpoint_tensor_ndim() */
  const uint64_t* (*checkpoint_tensor_shape)(const peft_checkpoint* ckpt, size_t index); /**< peft_checkpoint_tensor_shape() */
  peft_error* (*checkpoint_tensor_offsets)(const peft_checkpoint* ckpt, size_t index, uint64_t* out_begin, uint64_t* out_end); /**< peft_checkpoint_tensor_offsets() */
  size_t (*checkpoint_tensor_file)(const peft_checkpoint* ckpt, size_t index); /**< peft_checkpoint_tensor_file() */
  peft_error* (*checkpoint_tensor_view)(const peft_checkpoint* ckpt, size_t index, const void** out_data, uint64_t* out_nbytes); /**< peft_checkpoint_tensor_view() */
  peft_error* (*checkpoint_tensor_read)(const peft_checkpoint* ckpt, size_t index, int32_t dtype, void* dst, uint64_t dst_nbytes); /**< peft_checkpoint_tensor_read() */
  peft_error* (*writer_new)(const char* path, peft_writer** out); /**< peft_writer_new() */
  peft_error* (*writer_new_checkpoint)(const char* folder, uint64_t max_shard_size, peft_writer** out); /**< peft_writer_new_checkpoint() */
  void (*writer_free)(peft_writer* writer); /**< peft_writer_free() */
  peft_error* (*writer_add_tensor)(peft_writer* writer, const char* name, int32_t dtype, const uint64_t* shape, size_t ndim); /**< peft_writer_add_tensor() */
  peft_error* (*writer_add_tensor_n)(peft_writer* writer, const char* name, size_t name_length, int32_t dtype, const uint64_t* shape, size_t ndim); /**< peft_writer_add_tensor_n() */
  peft_error* (*writer_set_metadata_present)(peft_writer* writer, int32_t present); /**< peft_writer_set_metadata_present() */
  peft_error* (*writer_set_metadata)(peft_writer* writer, const char* key, const char* value); /**< peft_writer_set_metadata() */
  peft_error* (*writer_break_shard)(peft_writer* writer); /**< peft_writer_break_shard() */
  peft_error* (*writer_set_index_metadata_json)(peft_writer* writer, const char* json_object); /**< peft_writer_set_index_metadata_json() */
  peft_error* (*writer_start)(peft_writer* writer); /**< peft_writer_start() */
  size_t (*writer_tensor_count)(const peft_writer* writer); /**< peft_writer_tensor_count() */
  const char* (*writer_tensor_name)(const peft_writer* writer, size_t position); /**< peft_writer_tensor_name() */
  size_t (*writer_tensor_name_length)(const peft_writer* writer, size_t position); /**< peft_writer_tensor_name_length() */
  size_t (*writer_tensor_declaration)(const peft_writer* writer, size_t position); /**< peft_writer_tensor_declaration() */
  size_t (*writer_file_count)(const peft_writer* writer); /**< peft_writer_file_count() */
  const char* (*writer_file_path)(const peft_writer* writer, size_t file_index); /**< peft_writer_file_path() */
  peft_error* (*writer_begin_tensor)(peft_writer* writer, const char* name, int32_t src_dtype); /**< peft_writer_begin_tensor() */
  peft_error* (*writer_write)(peft_writer* writer, const void* data, uint64_t nbytes); /**< peft_writer_write() */
  peft_error* (*writer_write_tensor)(peft_writer* writer, const char* name, int32_t src_dtype, const void* data, uint64_t nbytes); /**< peft_writer_write_tensor() */
  peft_error* (*writer_write_from_callback)(peft_writer* writer, const char* name, int32_t src_dtype, peft_tensor_source_fn source, void* user_data); /**< peft_writer_write_from_callback() */
  peft_error* (*writer_write_from_checkpoint)(peft_writer* writer, const char* name, const peft_checkpoint* ckpt, size_t index); /**< peft_writer_write_from_checkpoint() */
  peft_error* (*writer_finish)(peft_writer* writer); /**< peft_writer_finish() */
  void (*string_free)(char* text); /**< peft_string_free() */
  peft_error* (*adapter_options_new)(peft_adapter_options** out); /**< peft_adapter_options_new() */
  void (*adapter_options_free)(peft_adapter_options* opts); /**< peft_adapter_options_free() */
  peft_error* (*adapter_options_set_base_dir)(peft_adapter_options* opts, const char* base_dir); /**< peft_adapter_options_set_base_dir() */
  peft_error* (*adapter_options_set_translator)(peft_adapter_options* opts, const peft_translator* translator); /**< peft_adapter_options_set_translator() */
  peft_error* (*adapter_open)(const char* dir, const peft_adapter_options* opts, peft_adapter** out); /**< peft_adapter_open() */
  void (*adapter_free)(peft_adapter* adapter); /**< peft_adapter_free() */
  peft_error* (*adapter_validate)(const peft_adapter* adapter, const char* base_dir); /**< peft_adapter_validate() */
  const char* (*adapter_config_json)(const peft_adapter* adapter); /**< peft_adapter_config_json() */
  const char* (*adapter_config_field)(const peft_adapter* adapter, const char* field); /**< peft_adapter_config_field() */
  int64_t (*adapter_r)(const peft_adapter* adapter); /**< peft_adapter_r() */
  double (*adapter_lora_alpha)(const peft_adapter* adapter); /**< peft_adapter_lora_alpha() */
  int32_t (*adapter_use_rslora)(const peft_adapter* adapter); /**< peft_adapter_use_rslora() */
  int32_t (*adapter_use_dora)(const peft_adapter* adapter); /**< peft_adapter_use_dora() */
  int32_t (*adapter_lora_bias)(const peft_adapter* adapter); /**< peft_adapter_lora_bias() */
  int32_t (*adapter_fan_in_fan_out)(const peft_adapter* adapter); /**< peft_adapter_fan_in_fan_out() */
  const char* (*adapter_peft_type)(const peft_adapter* adapter); /**< peft_adapter_peft_type() */
  const char* (*adapter_bias)(const peft_adapter* adapter); /**< peft_adapter_bias() */
  const char* (*adapter_task_type)(const peft_adapter* adapter); /**< peft_adapter_task_type() */
  const char* (*adapter_base_model_name_or_path)(const peft_adapter* adapter); /**< peft_adapter_base_model_name_or_path() */
  const char* (*adapter_family)(const peft_adapter* adapter); /**< peft_adapter_family() */
  peft_error* (*adapter_translator)(const peft_adapter* adapter, peft_translator** out); /**< peft_adapter_translator() */
  size_t (*adapter_note_count)(const peft_adapter* adapter); /**< peft_adapter_note_count() */
  const char* (*adapter_note)(const peft_adapter* adapter, size_t index); /**< peft_adapter_note() */
  size_t (*adapter_module_count)(const peft_adapter* adapter); /**< peft_adapter_module_count() */
  peft_error* (*adapter_find_module)(const peft_adapter* adapter, const char* name, size_t* out_index); /**< peft_adapter_find_module() */
  const char* (*adapter_module_name)(const peft_adapter* adapter, size_t module); /**< peft_adapter_module_name() */
  int32_t (*adapter_module_kind)(const peft_adapter* adapter, size_t module); /**< peft_adapter_module_kind() */
  int64_t (*adapter_module_rank)(const peft_adapter* adapter, size_t module); /**< peft_adapter_module_rank() */
  double (*adapter_module_alpha)(const peft_adapter* adapter, size_t module); /**< peft_adapter_module_alpha() */
  double (*adapter_module_scaling)(const peft_adapter* adapter, size_t module); /**< peft_adapter_module_scaling() */
  size_t (*adapter_module_tensor_count)(const peft_adapter* adapter, size_t module); /**< peft_adapter_module_tensor_count() */
  const char* (*adapter_module_tensor_role)(const peft_adapter* adapter, size_t module, size_t tensor); /**< peft_adapter_module_tensor_role() */
  const char* (*adapter_module_tensor_key)(const peft_adapter* adapter, size_t module, size_t tensor); /**< peft_adapter_module_tensor_key() */
  const char* (*adapter_module_tensor_base_name)(const peft_adapter* adapter, size_t module, size_t tensor); /**< peft_adapter_module_tensor_base_name() */
  int32_t (*adapter_module_tensor_dtype)(const peft_adapter* adapter, size_t module, size_t tensor); /**< peft_adapter_module_tensor_dtype() */
  size_t (*adapter_module_tensor_ndim)(const peft_adapter* adapter, size_t module, size_t tensor); /**< peft_adapter_module_tensor_ndim() */
  const uint64_t* (*adapter_module_tensor_shape)(const peft_adapter* adapter, size_t module, size_t tensor); /**< peft_adapter_module_tensor_shape() */
  peft_error* (*adapter_module_tensor_read)(const peft_adapter* adapter, size_t module, size_t tensor, int32_t dtype, void* dst, uint64_t dst_nbytes); /**< peft_adapter_module_tensor_read() */
  const int64_t* (*adapter_module_token_indices)(const peft_adapter* adapter, size_t module, size_t* out_count); /**< peft_adapter_module_token_indices() */
  peft_error* (*translator_new_builtin)(const char* family, peft_translator** out); /**< peft_translator_new_builtin() */
  peft_error* (*translator_from_file)(const char* path, peft_translator** out); /**< peft_translator_from_file() */
  peft_error* (*translator_from_json)(const char* json, peft_translator** out); /**< peft_translator_from_json() */
  peft_error* (*translator_detect)(const char* base_dir, const char* model_name, peft_translator** out); /**< peft_translator_detect() */
  peft_error* (*translator_builtin_families)(char** out); /**< peft_translator_builtin_families() */
  void (*translator_free)(peft_translator* translator); /**< peft_translator_free() */
  const char* (*translator_family)(const peft_translator* translator); /**< peft_translator_family() */
  peft_error* (*translator_to_native)(const peft_translator* translator, const char* hf_key, char** out); /**< peft_translator_to_native() */
  peft_error* (*translator_to_hf)(const peft_translator* translator, const char* native_key, int32_t with_peft_prefix, char** out); /**< peft_translator_to_hf() */
  peft_error* (*translator_to_native_batch)(const peft_translator* translator, const char* const* hf_keys, size_t count, char** out); /**< peft_translator_to_native_batch() */
  peft_error* (*translator_to_hf_batch)(const peft_translator* translator, const char* const* native_keys, size_t count, int32_t with_peft_prefix, char** out); /**< peft_translator_to_hf_batch() */
  peft_error* (*merge_options_new)(peft_merge_options** out); /**< peft_merge_options_new() */
  void (*merge_options_free)(peft_merge_options* opts); /**< peft_merge_options_free() */
  peft_error* (*merge_options_add_adapter)(peft_merge_options* opts, const peft_adapter* adapter, double weight); /**< peft_merge_options_add_adapter() */
  peft_error* (*merge_options_add_adapter_dir)(peft_merge_options* opts, const char* dir, double weight); /**< peft_merge_options_add_adapter_dir() */
  peft_error* (*merge_options_set_dtype)(peft_merge_options* opts, int32_t dtype); /**< peft_merge_options_set_dtype() */
  peft_error* (*merge_options_set_max_shard_size)(peft_merge_options* opts, uint64_t max_shard_size); /**< peft_merge_options_set_max_shard_size() */
  peft_error* (*merge_options_set_threads)(peft_merge_options* opts, uint32_t threads); /**< peft_merge_options_set_threads() */
  peft_error* (*merge_options_set_progress)(peft_merge_options* opts, peft_progress_fn fn, void* user_data); /**< peft_merge_options_set_progress() */
  peft_error* (*merge_checkpoint)(const char* base_dir, const char* out_dir, const peft_merge_options* opts, peft_merge_result** out_result); /**< peft_merge_checkpoint() */
  void (*merge_result_free)(peft_merge_result* result); /**< peft_merge_result_free() */
  uint64_t (*merge_result_tensor_count)(const peft_merge_result* result, int32_t which); /**< peft_merge_result_tensor_count() */
  uint64_t (*merge_result_bytes)(const peft_merge_result* result); /**< peft_merge_result_bytes() */
  size_t (*merge_result_file_count)(const peft_merge_result* result); /**< peft_merge_result_file_count() */
  const char* (*merge_result_file_name)(const peft_merge_result* result, size_t index); /**< peft_merge_result_file_name() */
  int32_t (*merge_result_untied_embeddings)(const peft_merge_result* result); /**< peft_merge_result_untied_embeddings() */
  size_t (*merge_result_note_count)(const peft_merge_result* result); /**< peft_merge_result_note_count() */
  const char* (*merge_result_note)(const peft_merge_result* result, size_t index); /**< peft_merge_result_note() */
  peft_error* (*merge_buffer_options_new)(peft_merge_buffer_options** out); /**< peft_merge_buffer_options_new() */
  void (*merge_buffer_options_free)(peft_merge_buffer_options* opts); /**< peft_merge_buffer_options_free() */
  peft_error* (*merge_buffer_options_set_weight)(peft_merge_buffer_options* opts, double weight); /**< peft_merge_buffer_options_set_weight() */
  peft_error* (*merge_buffer_options_set_keep_original_rows)(peft_merge_buffer_options* opts, int32_t keep); /**< peft_merge_buffer_options_set_keep_original_rows() */
  peft_error* (*merge_buffer_options_set_threads)(peft_merge_buffer_options* opts, uint32_t threads); /**< peft_merge_buffer_options_set_threads() */
  peft_error* (*merge_buffer_options_set_translator)(peft_merge_buffer_options* opts, const peft_translator* translator); /**< peft_merge_buffer_options_set_translator() */
  peft_error* (*merge_buffer_apply)(const peft_adapter* adapter, const char* name, void* data, int32_t dtype, const uint64_t* shape, size_t ndim, void* bias, int32_t bias_dtype, const peft_merge_buffer_options* opts, peft_merge_record** out); /**< peft_merge_buffer_apply() */
  peft_error* (*merge_buffer_remove)(peft_merge_record* record, void* data, void* bias); /**< peft_merge_buffer_remove() (older name of peft_merge_record_unmerge()) */
  void (*merge_record_free)(peft_merge_record* record); /**< peft_merge_record_free() */
  const char* (*merge_record_module)(const peft_merge_record* record); /**< peft_merge_record_module() */
  int32_t (*merge_record_active)(const peft_merge_record* record); /**< peft_merge_record_active() */
  uint64_t (*merge_record_saved_bytes)(const peft_merge_record* record); /**< peft_merge_record_saved_bytes() */
  peft_error* (*export_options_new)(peft_export_options** out); /**< peft_export_options_new() */
  void (*export_options_free)(peft_export_options* opts); /**< peft_export_options_free() */
  peft_error* (*export_options_set_dtype)(peft_export_options* opts, int32_t dtype); /**< peft_export_options_set_dtype() */
  peft_error* (*export_options_set_peft_version)(peft_export_options* opts, const char* version); /**< peft_export_options_set_peft_version() */
  peft_error* (*adapter_export)(const peft_adapter* adapter, const char* out_dir, const peft_export_options* opts); /**< peft_adapter_export() */
  peft_error* (*adapter_combine)(const peft_adapter* const* adapters, const double* weights, size_t count, int32_t method, const char* out_dir, const peft_export_options* opts); /**< peft_adapter_combine() */
  peft_error* (*registry_new)(int32_t storage_dtype, uint64_t budget_bytes, const peft_translator* translator, peft_registry** out); /**< peft_registry_new() */
  void (*registry_free)(peft_registry* registry); /**< peft_registry_free() */
  peft_error* (*registry_register)(peft_registry* registry, const char* name, const char* dir, const peft_adapter_options* opts); /**< peft_registry_register() */
  peft_error* (*registry_register_memory)(peft_registry* registry, const char* name, const char* config_json, const void* weights, size_t weights_size, const peft_adapter_options* opts); /**< peft_registry_register_memory() */
  peft_error* (*registry_unregister)(peft_registry* registry, const char* name); /**< peft_registry_unregister() */
  peft_error* (*registry_names)(const peft_registry* registry, char** out); /**< peft_registry_names() */
  peft_error* (*registry_acquire)(peft_registry* registry, const char* name, peft_lease** out); /**< peft_registry_acquire() */
  peft_error* (*registry_trim)(peft_registry* registry); /**< peft_registry_trim() */
  peft_error* (*registry_set_budget)(peft_registry* registry, uint64_t budget_bytes); /**< peft_registry_set_budget() */
  peft_error* (*registry_get_stats)(const peft_registry* registry, peft_registry_stats* stats); /**< peft_registry_get_stats() */
  void (*lease_release)(peft_lease* lease); /**< peft_lease_release() (older name of peft_lease_free()) */
  const char* (*lease_name)(const peft_lease* lease); /**< peft_lease_name() */
  uint64_t (*lease_version)(const peft_lease* lease); /**< peft_lease_version() */
  uint64_t (*lease_bytes)(const peft_lease* lease); /**< peft_lease_bytes() */
  int32_t (*lease_has_module)(const peft_lease* lease, const char* module); /**< peft_lease_has_module() */
  peft_error* (*lora_apply)(const char* module, const peft_lease* const* leases, size_t lease_count, const int32_t* row_lease, const void* x, int32_t x_dtype, uint64_t rows, uint64_t in_features, void* y, int32_t y_dtype, uint64_t out_features); /**< peft_lora_apply() */
  peft_error* (*host_model_new)(peft_host_model** out); /**< peft_host_model_new() */
  void (*host_model_free)(peft_host_model* host); /**< peft_host_model_free() */
  peft_error* (*host_model_set_translator)(peft_host_model* host, const peft_translator* translator); /**< peft_host_model_set_translator() */
  peft_error* (*host_model_set_exact)(peft_host_model* host, int32_t exact); /**< peft_host_model_set_exact() */
  peft_error* (*host_model_add_weight)(peft_host_model* host, const char* name, void* data, int32_t dtype, const uint64_t* shape, size_t ndim, void* bias, int32_t bias_dtype, uint64_t bias_elements); /**< peft_host_model_add_weight() */
  peft_error* (*host_model_swap)(peft_host_model* host, const peft_lease* lease, double weight, peft_swap_stats* stats); /**< peft_host_model_swap() */
  const char* (*host_model_current)(const peft_host_model* host); /**< peft_host_model_current() */
  const char* (*kernels)(void); /**< peft_kernels() */
  peft_error* (*merge_options_set_require_config)(peft_merge_options* opts, int32_t require); /**< peft_merge_options_set_require_config() */
  peft_error* (*merge_options_set_allow_nonfinite)(peft_merge_options* opts, int32_t allow); /**< peft_merge_options_set_allow_nonfinite() */
  size_t (*string_list_count)(const peft_string_list* list); /**< peft_string_list_count() */
  const char* (*string_list_get)(const peft_string_list* list, size_t index); /**< peft_string_list_get() */
  void (*string_list_free)(peft_string_list* list); /**< peft_string_list_free() */
  peft_error* (*translator_builtin_family_list)(peft_string_list** out); /**< peft_translator_builtin_family_list() */
  peft_error* (*registry_name_list)(const peft_registry* registry, peft_string_list** out); /**< peft_registry_name_list() */
  void (*lease_free)(peft_lease* lease); /**< peft_lease_free() */
  peft_error* (*merge_record_unmerge)(peft_merge_record* record, void* data, void* bias); /**< peft_merge_record_unmerge() */
  peft_error* (*hub_resolve)(const char* id_or_path, char** out_dir); /**< peft_hub_resolve() */
  peft_error* (*hub_cache_dir)(char** out_dir); /**< peft_hub_cache_dir() */
  peft_error* (*adapter_options_set_lenient)(peft_adapter_options* opts, int32_t lenient); /**< peft_adapter_options_set_lenient() */
  size_t (*adapter_warning_count)(const peft_adapter* adapter); /**< peft_adapter_warning_count() */
  const char* (*adapter_warning)(const peft_adapter* adapter, size_t index); /**< peft_adapter_warning() */
  peft_error* (*adapter_doctor)(const char* adapter_dir, const char* base_dir, char** out_json); /**< peft_adapter_doctor() */
  peft_error* (*adapter_doctor_fix)(const char* adapter_dir, const char* base_dir, const char* out_dir, char** out_json); /**< peft_adapter_doctor_fix() */
  peft_error* (*registry_warning_list)(const peft_registry* registry, const char* name, peft_string_list** out); /**< peft_registry_warning_list() */
  int32_t (*checkpoint_file_format)(const peft_checkpoint* ckpt, size_t file_index); /**< peft_checkpoint_file_format() */
  uint32_t (*checkpoint_gguf_version)(const peft_checkpoint* ckpt, size_t file_index); /**< peft_checkpoint_gguf_version() */
  int32_t (*checkpoint_tensor_ggml_type)(const peft_checkpoint* ckpt, size_t index); /**< peft_checkpoint_tensor_ggml_type() */
  const char* (*ggml_type_name)(int32_t ggml_type); /**< peft_ggml_type_name() */
  int32_t (*ggml_type_from_name)(const char* name); /**< peft_ggml_type_from_name() */
  peft_error* (*ggml_type_geometry)(int32_t ggml_type, uint32_t* out_block_size, uint32_t* out_type_size); /**< peft_ggml_type_geometry() */
  size_t (*checkpoint_gguf_kv_count)(const peft_checkpoint* ckpt, size_t file_index); /**< peft_checkpoint_gguf_kv_count() */
  const char* (*checkpoint_gguf_kv_key)(const peft_checkpoint* ckpt, size_t file_index, size_t kv); /**< peft_checkpoint_gguf_kv_key() */
  peft_error* (*checkpoint_gguf_kv_find)(const peft_checkpoint* ckpt, size_t file_index, const char* key, size_t* out_kv); /**< peft_checkpoint_gguf_kv_find() */
  int32_t (*checkpoint_gguf_kv_type)(const peft_checkpoint* ckpt, size_t file_index, size_t kv); /**< peft_checkpoint_gguf_kv_type() */
  int32_t (*checkpoint_gguf_kv_array_type)(const peft_checkpoint* ckpt, size_t file_index, size_t kv); /**< peft_checkpoint_gguf_kv_array_type() */
  uint64_t (*checkpoint_gguf_kv_array_length)(const peft_checkpoint* ckpt, size_t file_index, size_t kv); /**< peft_checkpoint_gguf_kv_array_length() */
  peft_error* (*checkpoint_gguf_kv_int)(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element, int64_t* out); /**< peft_checkpoint_gguf_kv_int() */
  peft_error* (*checkpoint_gguf_kv_uint)(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element, uint64_t* out); /**< peft_checkpoint_gguf_kv_uint() */
  peft_error* (*checkpoint_gguf_kv_float)(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element, double* out); /**< peft_checkpoint_gguf_kv_float() */
  peft_error* (*checkpoint_gguf_kv_string)(const peft_checkpoint* ckpt, size_t file_index, size_t kv, uint64_t element, const char** out_data, size_t* out_length); /**< peft_checkpoint_gguf_kv_string() */
  peft_error* (*adapter_export_gguf)(const peft_adapter* adapter, const char* out_path, const char* base, int32_t ggml_type); /**< peft_adapter_export_gguf() */
  peft_error* (*adapter_import_gguf)(const char* gguf_path, const char* out_dir, const char* base); /**< peft_adapter_import_gguf() */
  peft_error* (*translator_from_gguf)(const peft_checkpoint* checkpoint, peft_translator** out); /**< peft_translator_from_gguf() */
  peft_error* (*translator_new_gguf)(const char* architecture, uint64_t head_count, uint64_t head_count_kv, peft_translator** out); /**< peft_translator_new_gguf() */
  peft_error* (*adapter_export_gguf_split)(const peft_adapter* adapter, const char* out_path, const char* base, int32_t ggml_type, const char* base_out); /**< peft_adapter_export_gguf_split() */
  peft_error* (*registry_set_base_weight)(peft_registry* registry, const char* name, const void* data, int32_t dtype, const uint64_t* shape, size_t ndim, const void* bias, int32_t bias_dtype, uint64_t bias_elements); /**< peft_registry_set_base_weight() */
  peft_error* (*registry_base_weights_changed)(peft_registry* registry); /**< peft_registry_base_weights_changed() */
  peft_error* (*lowrank_options_new)(peft_lowrank_options** out); /**< peft_lowrank_options_new() */
  void (*lowrank_options_free)(peft_lowrank_options* opts); /**< peft_lowrank_options_free() */
  peft_error* (*lowrank_options_set_rank)(peft_lowrank_options* opts, int64_t rank); /**< peft_lowrank_options_set_rank() */
  peft_error* (*lowrank_options_set_energy)(peft_lowrank_options* opts, double fraction); /**< peft_lowrank_options_set_energy() */
  peft_error* (*lowrank_options_set_svd)(peft_lowrank_options* opts, int32_t method); /**< peft_lowrank_options_set_svd() */
  peft_error* (*lowrank_options_set_threads)(peft_lowrank_options* opts, uint32_t threads); /**< peft_lowrank_options_set_threads() */
  peft_error* (*lowrank_options_set_dtype)(peft_lowrank_options* opts, int32_t dtype); /**< peft_lowrank_options_set_dtype() */
  peft_error* (*lowrank_options_set_modules)(peft_lowrank_options* opts, const char* const* names, size_t count); /**< peft_lowrank_options_set_modules() */
  size_t (*lowrank_report_module_count)(const peft_lowrank_report* report); /**< peft_lowrank_report_module_count() */
  const char* (*lowrank_report_module_name)(const peft_lowrank_report* report, size_t index); /**< peft_lowrank_report_module_name() */
  int64_t (*lowrank_report_module_rank)(const peft_lowrank_report* report, size_t index); /**< peft_lowrank_report_module_rank() */
  double (*lowrank_report_module_error)(const peft_lowrank_report* report, size_t index); /**< peft_lowrank_report_module_error() */
  void (*lowrank_report_free)(peft_lowrank_report* report); /**< peft_lowrank_report_free() */
  peft_error* (*adapter_extract)(const char* base, const char* tuned, const char* out_dir, const peft_lowrank_options* opts, peft_lowrank_report** out_report); /**< peft_adapter_extract() */
  peft_error* (*adapter_convert_to_lora)(const peft_adapter* adapter, const char* out_dir, const peft_lowrank_options* opts, peft_lowrank_report** out_report); /**< peft_adapter_convert_to_lora() */
  peft_error* (*adapter_convert_initial)(const char* tuned_dir, const char* initial_dir, const char* out_dir, const peft_export_options* opts); /**< peft_adapter_convert_initial() */
  peft_error* (*merge_options_set_quant)(peft_merge_options* opts, int32_t ggml_type); /**< peft_merge_options_set_quant() */
  peft_error* (*merge_options_set_report)(peft_merge_options* opts, int32_t report); /**< peft_merge_options_set_report() */
  const char* (*merge_result_report_json)(const peft_merge_result* result); /**< peft_merge_result_report_json() */
  peft_error* (*lowrank_options_set_base)(peft_lowrank_options* opts, const char* base_dir); /**< peft_lowrank_options_set_base() */
  peft_error* (*merge_options_set_arithmetic)(peft_merge_options* opts, int32_t arithmetic); /**< peft_merge_options_set_arithmetic() */
  peft_error* (*merge_options_set_tied_embeddings)(peft_merge_options* opts, int32_t policy); /**< peft_merge_options_set_tied_embeddings() */
  peft_error* (*export_options_set_combine_density)(peft_export_options* opts, double density); /**< peft_export_options_set_combine_density() */
  peft_error* (*export_options_set_combine_majority_sign)(peft_export_options* opts, int32_t method); /**< peft_export_options_set_combine_majority_sign() */
  peft_error* (*export_options_set_combine_seed)(peft_export_options* opts, uint64_t seed); /**< peft_export_options_set_combine_seed() */
  peft_error* (*merge_options_set_join_split)(peft_merge_options* opts, int32_t join); /**< peft_merge_options_set_join_split() */
  peft_error* (*export_options_set_combine_svd_rank)(peft_export_options* opts, int64_t rank); /**< peft_export_options_set_combine_svd_rank() */
  peft_error* (*export_options_set_combine_svd_clamp)(peft_export_options* opts, double quantile); /**< peft_export_options_set_combine_svd_clamp() */
  peft_error* (*adapter_combine_deltas)(const peft_adapter* const* adapters, const double* weights, size_t count, int32_t method, const char* out_dir, const peft_export_options* combine_opts, const peft_lowrank_options* opts, peft_lowrank_report** out_report); /**< peft_adapter_combine_deltas() */
  peft_error* (*model_combine)(const char* base_dir, const char* const* models, const double* weights, size_t count, int32_t method, const char* out_dir, const peft_export_options* combine_opts, const peft_merge_options* opts, peft_merge_result** out_result); /**< peft_model_combine() */
  peft_error* (*control_vector_open)(const char* path, peft_control_vector** out); /**< peft_control_vector_open() */
  peft_error* (*control_vector_new)(uint64_t n_embd, const char* model_hint, peft_control_vector** out); /**< peft_control_vector_new() */
  void (*control_vector_free)(peft_control_vector* vector); /**< peft_control_vector_free() */
  uint64_t (*control_vector_n_embd)(const peft_control_vector* vector); /**< peft_control_vector_n_embd() */
  const char* (*control_vector_model_hint)(const peft_control_vector* vector); /**< peft_control_vector_model_hint() */
  size_t (*control_vector_layer_count)(const peft_control_vector* vector); /**< peft_control_vector_layer_count() */
  int64_t (*control_vector_layer)(const peft_control_vector* vector, size_t index); /**< peft_control_vector_layer() */
  const float* (*control_vector_direction)(const peft_control_vector* vector, int64_t layer); /**< peft_control_vector_direction() */
  peft_error* (*control_vector_set_direction)(peft_control_vector* vector, int64_t layer, int32_t dtype, const void* data); /**< peft_control_vector_set_direction() */
  peft_error* (*control_vector_add)(peft_control_vector* dst, const peft_control_vector* src, double strength); /**< peft_control_vector_add() */
  peft_error* (*control_vector_save)(const peft_control_vector* vector, const char* path, int32_t format); /**< peft_control_vector_save() */
  peft_error* (*control_vector_apply)(const peft_control_vector* vector, int64_t layer, double strength, void* data, int32_t dtype, uint64_t rows, peft_control_record** out); /**< peft_control_vector_apply() */
  peft_error* (*control_record_remove)(peft_control_record* record, void* data); /**< peft_control_record_remove() */
  void (*control_record_free)(peft_control_record* record); /**< peft_control_record_free() */
  peft_error* (*merge_options_set_combine)(peft_merge_options* opts, int32_t method, const peft_export_options* combine_opts); /**< peft_merge_options_set_combine() */
} peft_api;

/**
 * @brief The function table of an ABI version: the one entry point a dlopen plugin needs.
 * @param abi_version The ABI version the caller was compiled for (#PEFT_ABI_VERSION).
 * @return A static table, valid for the life of the process; NULL when this library does not
 *         implement @p abi_version. Thread-safe.
 */
PEFT_API const peft_api* peft_get_api(uint32_t abi_version);

/** The type of peft_get_api(), for `dlsym`. */
typedef const peft_api* (*peft_get_api_fn)(uint32_t abi_version);

/** @} */
#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PEFT_C_H */
