#include "gguf_metadata.hpp"

#include <cmath>
#include <cstdio>

#include "json_text.hpp"

namespace peftc {
namespace {

const char* type_name(int32_t type) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return type >= 0 && type < 13 ? kNames[type] : "?";
}

std::string float_text(double value, int32_t type) {
  if (std::isnan(value)) return "\"nan\"";
  if (std::isinf(value)) return value > 0 ? "\"inf\"" : "\"-inf\"";
  char buf[40];
  std::snprintf(buf, sizeof buf, type == PEFT_GGUF_F32 ? "%.9g" : "%.17g", value);
  return buf;
}

// One scalar (the entry itself or an array element) as JSON.
std::string value_json(const peft_checkpoint* ckpt, size_t file, size_t kv, uint64_t element, int32_t type) {
  switch (type) {
    case PEFT_GGUF_STRING: {
      const char* data = nullptr;
      size_t length = 0;
      peft_error_free(peft_checkpoint_gguf_kv_string(ckpt, file, kv, element, &data, &length));
      return data != nullptr ? json_string(data, length) : "null";
    }
    case PEFT_GGUF_F32:
    case PEFT_GGUF_F64: {
      double value = 0;
      peft_error_free(peft_checkpoint_gguf_kv_float(ckpt, file, kv, element, &value));
      return float_text(value, type);
    }
    case PEFT_GGUF_BOOL: {
      int64_t value = 0;
      peft_error_free(peft_checkpoint_gguf_kv_int(ckpt, file, kv, element, &value));
      return value ? "true" : "false";
    }
    case PEFT_GGUF_U64: {
      uint64_t value = 0;
      peft_error_free(peft_checkpoint_gguf_kv_uint(ckpt, file, kv, element, &value));
      return std::to_string(value);
    }
    case PEFT_GGUF_ARRAY:
      return "null";  // nested arrays: the C API reads one level
    default: {
      int64_t value = 0;
      peft_error_free(peft_checkpoint_gguf_kv_int(ckpt, file, kv, element, &value));
      return std::to_string(value);
    }
  }
}

std::string array_json(const peft_checkpoint* ckpt, size_t file, size_t kv, uint64_t max_elements) {
  const int32_t element_type = peft_checkpoint_gguf_kv_array_type(ckpt, file, kv);
  const uint64_t length = peft_checkpoint_gguf_kv_array_length(ckpt, file, kv);
  std::string out = "[";
  for (uint64_t e = 0; e < length && e < max_elements; ++e) {
    if (e) out += ",";
    out += value_json(ckpt, file, kv, e, element_type);
  }
  if (length > max_elements) out += ", ... (" + std::to_string(length) + " elements)";
  return out + "]";
}

}  // namespace

void print_gguf_metadata_json(const peft_checkpoint* ckpt, size_t file, std::FILE* out) {
  std::fputs("{", out);
  const size_t count = peft_checkpoint_gguf_kv_count(ckpt, file);
  for (size_t kv = 0; kv < count; ++kv) {
    const int32_t type = peft_checkpoint_gguf_kv_type(ckpt, file, kv);
    std::string entry = kv ? "," : "";
    entry += json_string(peft_checkpoint_gguf_kv_key(ckpt, file, kv)) + ":{\"type\":" + json_string(type_name(type));
    if (type == PEFT_GGUF_ARRAY) {
      entry += ",\"element_type\":" + json_string(type_name(peft_checkpoint_gguf_kv_array_type(ckpt, file, kv))) +
               ",\"value\":" + array_json(ckpt, file, kv, UINT64_MAX);
    } else {
      entry += ",\"value\":" + value_json(ckpt, file, kv, 0, type);
    }
    entry += "}";
    std::fputs(entry.c_str(), out);
  }
  std::fputs("}", out);
}

void print_gguf_metadata_text(const peft_checkpoint* ckpt, size_t file, size_t max_elements, std::FILE* out) {
  const size_t count = peft_checkpoint_gguf_kv_count(ckpt, file);
  for (size_t kv = 0; kv < count; ++kv) {
    const int32_t type = peft_checkpoint_gguf_kv_type(ckpt, file, kv);
    std::string type_text = type_name(type);
    std::string value;
    if (type == PEFT_GGUF_ARRAY) {
      type_text += std::string(" of ") + type_name(peft_checkpoint_gguf_kv_array_type(ckpt, file, kv));
      value = array_json(ckpt, file, kv, max_elements);
    } else {
      value = value_json(ckpt, file, kv, 0, type);
    }
    const std::string line =
        "  " + std::string(peft_checkpoint_gguf_kv_key(ckpt, file, kv)) + " (" + type_text + ") = " + value + "\n";
    std::fputs(line.c_str(), out);
  }
}

std::string ggml_type_text(int32_t ggml_type) {
  const char* name = peft_ggml_type_name(ggml_type);
  return name != nullptr ? name : "ggml type " + std::to_string(ggml_type);
}

}  // namespace peftc
