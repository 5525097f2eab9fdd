// The C boundary: the error object, the one wrapper that every extern "C" body goes through so
// that no exception crosses into C, and the checks and copies of arguments that several C API
// files share.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "peft/buffer_merge/named_buffer_merge.hpp"
#include "peft_c.h"

struct peft_error {
  int32_t code;
  std::string message;
};

namespace peft::capi {

// Allocates an error object; never throws (falls back to a static out-of-memory error).
peft_error* make_error(int32_t code, const std::string& message) noexcept;

// Runs body(); returns NULL on success or the error it threw. Every fallible C function is
// `return guarded([&] { ... });`.
template <class Body>
peft_error* guarded(Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const peft::Error& e) {
    return make_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_error(PEFT_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_error(PEFT_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return make_error(PEFT_ERR_INTERNAL, "internal error: unknown exception");
  }
}

// Throws INVALID_ARGUMENT naming the argument when a required pointer is NULL.
inline void require_arg(const void* pointer, const char* name) {
  if (pointer == nullptr) peft::fail(PEFT_ERR_INVALID_ARGUMENT, std::string(name) + " must not be NULL");
}

// The body of a peft_*_new() whose handle starts out default-made: *out receives it.
template <class Handle>
peft_error* new_handle(Handle** out) noexcept {
  return guarded([&] {
    require_arg(out, "out");
    *out = new Handle();
  });
}

// The body of an options setter: checks the handle, then set(opts->impl) under guarded():
// `return set_option(opts, [&](auto& o) { o.threads = threads; });`.
template <class Handle, class Set>
peft_error* set_option(Handle* opts, Set&& set) noexcept {
  return guarded([&] {
    require_arg(opts, "opts");
    set(opts->impl);
  });
}

// The C++ options an options handle holds (its `impl`), or the defaults for a NULL handle.
template <class Handle>
auto options_of(const Handle* handle) {
  return handle != nullptr ? handle->impl : decltype(handle->impl){};
}

// A malloc'd copy of text, which the caller releases with peft_string_free(). Throws bad_alloc.
inline char* copy_string(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

// The dimensions of a caller's buffer (`shape` may be NULL when `ndim` is 0). A dimension of 0 or
// above INT64_MAX is PEFT_ERR_SHAPE_MISMATCH "<what>dimension <i> is <value>".
inline std::vector<int64_t> buffer_shape(const uint64_t* shape, size_t ndim, const std::string& what) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < ndim; ++i) {
    if (shape[i] == 0 || shape[i] > static_cast<uint64_t>(INT64_MAX))
      peft::fail(PEFT_ERR_SHAPE_MISMATCH, what + "dimension " + std::to_string(i) + " is " + std::to_string(shape[i]));
    dims.push_back(static_cast<int64_t>(shape[i]));
  }
  return dims;
}

// A caller's weight buffer: `data` (and `shape` when ndim > 0) must not be NULL, the dtype must be one
// a buffer merge takes (require_buffer_dtype), the dimensions as buffer_shape checks them.
struct WeightBufferArg {
  peft::DType dtype;
  std::vector<int64_t> dims;
};
inline WeightBufferArg weight_buffer_arg(const void* data, int32_t dtype, const uint64_t* shape, size_t ndim,
                                         const std::string& what) {
  require_arg(data, "data");
  if (ndim > 0) require_arg(shape, "shape");
  const auto weight_dtype = static_cast<peft::DType>(dtype);
  peft::require_buffer_dtype(weight_dtype, "weight");
  return {weight_dtype, buffer_shape(shape, ndim, what)};
}

// "F32, BF16 or F16" (with `also` last when given).
inline std::string join_dtype_names(std::span<const peft::DType> dtypes, const std::string& also) {
  std::vector<std::string> names;
  for (peft::DType d : dtypes) names.emplace_back(peft::dtype_name(d));
  if (!also.empty()) names.push_back(also);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// The floating-point dtypes of outputs and storage: F32, BF16, F16.
inline constexpr peft::DType kFloatDTypes[] = {peft::DType::F32, peft::DType::BF16, peft::DType::F16};

// The one check of a dtype argument: a PEFT_DTYPE_* value and, when `allowed` is not empty, one of
// those. Otherwise PEFT_ERR_INVALID_ARGUMENT: "<what> <n> is not a PEFT_DTYPE_* value", or
// "<what> <name> is not F32, BF16 or F16" (the allowed names, then `also`).
inline peft::DType dtype_arg(int32_t dtype, const std::string& what, std::span<const peft::DType> allowed = {},
                             const std::string& also = {}) {
  if (!peft::is_valid_dtype(dtype))
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, what + " " + std::to_string(dtype) + " is not a PEFT_DTYPE_* value" +
                                              (allowed.empty() ? std::string() : " (" + join_dtype_names(allowed, also) + ")"));
  const auto value = static_cast<peft::DType>(dtype);
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), value) == allowed.end())
    peft::fail(PEFT_ERR_INVALID_ARGUMENT, what + " " + std::string(peft::dtype_name(value)) + " is not " +
                                              join_dtype_names(allowed, also));
  return value;
}

// An option that chooses an output dtype: PEFT_DTYPE_KEEP gives nothing (each tensor keeps its own),
// F32, BF16 and F16 themselves; anything else fails as dtype_arg.
inline std::optional<peft::DType> output_dtype_option(int32_t dtype, const std::string& what) {
  if (dtype == PEFT_DTYPE_KEEP) return std::nullopt;
  return dtype_arg(dtype, what, kFloatDTypes, "PEFT_DTYPE_KEEP");
}

// Fills a struct whose first field, `uint64_t size`, the caller set to the size of the struct it
// was compiled with, and whose other fields are 8 bytes each: copies the fields of `filled` that
// lie wholly within that size (an older caller's struct is smaller, a newer caller's larger), and
// leaves `size` and everything past it as they are.
template <class Sized>
void copy_to_sized(const Sized& filled, Sized* out) {
  static_assert(offsetof(Sized, size) == 0 && sizeof(filled.size) == 8 && sizeof(Sized) % 8 == 0);
  const uint64_t within = out->size < sizeof(Sized) ? out->size : sizeof(Sized);
  const size_t end = static_cast<size_t>(within / 8 * 8);
  if (end > sizeof filled.size)
    std::memcpy(reinterpret_cast<char*>(out) + sizeof filled.size,
                reinterpret_cast<const char*>(&filled) + sizeof filled.size, end - sizeof filled.size);
}

}  // namespace peft::capi
