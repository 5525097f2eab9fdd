/* The GGUF part of the reading API, from C99, on GGUF files built byte by byte here: format and
 * version, typed metadata (every scalar type, arrays, lookups, wrong-type and range errors), ggml
 * types, tensors (shape outermost first, F16 converted on read, a Q8_0 tensor readable only as
 * bytes), the same file opened from disk, and safetensors-only getters on a GGUF file.
 * Prints "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peft_c.h"
#include "check.h"
#include "files.h"

/* ---- a little-endian byte builder ------------------------------------------------------------ */

static unsigned char buf[8192];
static size_t len = 0;

static void put(const void* data, size_t n) {
  memcpy(buf + len, data, n);
  len += n;
}
static void put_u8(uint8_t v) { put(&v, 1); }
static void put_u32(uint32_t v) {
  unsigned char b[4];
  int i;
  for (i = 0; i < 4; ++i) b[i] = (unsigned char)(v >> (8 * i));
  put(b, 4);
}
static void put_u64(uint64_t v) {
  unsigned char b[8];
  int i;
  for (i = 0; i < 8; ++i) b[i] = (unsigned char)(v >> (8 * i));
  put(b, 8);
}
static void put_str(const char* s) {
  put_u64(strlen(s));
  put(s, strlen(s));
}
static void pad_to(size_t alignment) {
  while (len % alignment) put_u8(0);
}

/* F32 values 1..6 as F16, and 32 Q8_0 quants with an f16 scale of 1.0. */
static const uint16_t kHalf[6] = {0x3C00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};

/* metadata: general.architecture (string), general.alignment (u32 64), a.u8, a.i8, a.u16, a.i16,
 * a.i32, a.f32, a.bool, a.u64 (2^64 - 1), a.i64 (-5), a.f64, a.tokens (array of 3 strings), a.ids
 * (array of 2 i32); tensors: "w" F16 ne=[3,2], "q" Q8_0 ne=[32,1]. */
static void build(void) {
  int i;
  len = 0;
  put("GGUF", 4);
  put_u32(3);
  put_u64(2);  /* tensors */
  put_u64(14); /* key/values */
  put_str("general.architecture"); put_u32(8); put_str("llama");
  put_str("general.alignment"); put_u32(4); put_u32(64);
  put_str("a.u8"); put_u32(0); put_u8(200);
  put_str("a.i8"); put_u32(1); put_u8(0xFE);
  put_str("a.u16"); put_u32(2); put_u8(0x34); put_u8(0x12);
  put_str("a.i16"); put_u32(3); put_u8(0xFF); put_u8(0xFF);
  put_str("a.i32"); put_u32(5); put_u32((uint32_t)-7);
  put_str("a.f32"); put_u32(6); put_u32(0x3FC00000u); /* 1.5 */
  put_str("a.bool"); put_u32(7); put_u8(1);
  put_str("a.u64"); put_u32(10); put_u64(UINT64_MAX);
  put_str("a.i64"); put_u32(11); put_u64((uint64_t)-5);
  put_str("a.f64"); put_u32(12); put_u64(0x400921FB54442D18ull); /* pi */
  put_str("a.tokens"); put_u32(9); put_u32(8); put_u64(3); put_str("<s>"); put_str(""); put_str("hello");
  put_str("a.ids"); put_u32(9); put_u32(5); put_u64(2); put_u32(10); put_u32((uint32_t)-20);
  put_str("w"); put_u32(2); put_u64(3); put_u64(2); put_u32(1); put_u64(0);
  put_str("q"); put_u32(2); put_u64(32); put_u64(1); put_u32(8); put_u64(64);
  pad_to(64);
  for (i = 0; i < 6; ++i) { put_u8((uint8_t)(kHalf[i] & 0xFF)); put_u8((uint8_t)(kHalf[i] >> 8)); }
  pad_to(64);
  put_u8(0x00); put_u8(0x3C); /* scale 1.0 */
  for (i = 0; i < 32; ++i) put_u8((uint8_t)(i - 16));
}

static size_t kv(const peft_checkpoint* ckpt, const char* key) {
  size_t at = SIZE_MAX;
  CHECK_OK(peft_checkpoint_gguf_kv_find(ckpt, 0, key, &at));
  return at;
}

static void test_metadata(const peft_checkpoint* ckpt) {
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  const char* s = NULL;
  size_t n = 0, at;

  CHECK(peft_checkpoint_file_format(ckpt, 0) == PEFT_FORMAT_GGUF);
  CHECK(peft_checkpoint_file_format(ckpt, 1) == -1);
  CHECK(peft_checkpoint_gguf_version(ckpt, 0) == 3);
  CHECK(peft_checkpoint_gguf_kv_count(ckpt, 0) == 14);
  CHECK(strcmp(peft_checkpoint_gguf_kv_key(ckpt, 0, 0), "general.architecture") == 0);
  CHECK(peft_checkpoint_gguf_kv_key(ckpt, 0, 14) == NULL);
  CHECK(peft_checkpoint_gguf_kv_type(ckpt, 0, 0) == PEFT_GGUF_STRING);
  CHECK_OK(peft_checkpoint_gguf_kv_string(ckpt, 0, 0, 0, &s, &n));
  CHECK(s != NULL && n == 5 && strcmp(s, "llama") == 0);

  CHECK_OK(peft_checkpoint_gguf_kv_uint(ckpt, 0, kv(ckpt, "general.alignment"), 0, &u));
  CHECK(u == 64);
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.u8"), 0, &i));
  CHECK(i == 200);
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.i8"), 0, &i));
  CHECK(i == -2);
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.u16"), 0, &i));
  CHECK(i == 0x1234);
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.i16"), 0, &i));
  CHECK(i == -1);
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.i32"), 0, &i));
  CHECK(i == -7);
  CHECK_CODE_NAMING(peft_checkpoint_gguf_kv_uint(ckpt, 0, kv(ckpt, "a.i32"), 0, &u), PEFT_ERR_INVALID_ARGUMENT,
                    "a.i32");
  CHECK_OK(peft_checkpoint_gguf_kv_float(ckpt, 0, kv(ckpt, "a.f32"), 0, &f));
  CHECK(f == 1.5);
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.bool"), 0, &i));
  CHECK(i == 1);
  CHECK(peft_checkpoint_gguf_kv_type(ckpt, 0, kv(ckpt, "a.bool")) == PEFT_GGUF_BOOL);
  CHECK_OK(peft_checkpoint_gguf_kv_uint(ckpt, 0, kv(ckpt, "a.u64"), 0, &u));
  CHECK(u == UINT64_MAX);
  CHECK_CODE_NAMING(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.u64"), 0, &i), PEFT_ERR_INVALID_ARGUMENT,
                    "unsigned");
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.i64"), 0, &i));
  CHECK(i == -5);
  CHECK_OK(peft_checkpoint_gguf_kv_float(ckpt, 0, kv(ckpt, "a.f64"), 0, &f));
  CHECK(f > 3.14159265358979 && f < 3.14159265358980);
  CHECK_CODE_NAMING(peft_checkpoint_gguf_kv_float(ckpt, 0, kv(ckpt, "a.i64"), 0, &f), PEFT_ERR_INVALID_ARGUMENT,
                    "floating-point");
  CHECK_CODE_NAMING(peft_checkpoint_gguf_kv_string(ckpt, 0, kv(ckpt, "a.u8"), 0, &s, NULL), PEFT_ERR_INVALID_ARGUMENT,
                    "a string");
  CHECK_CODE_NAMING(peft_checkpoint_gguf_kv_int(ckpt, 0, kv(ckpt, "a.u8"), 1, &i), PEFT_ERR_INVALID_ARGUMENT,
                    "scalar");

  at = kv(ckpt, "a.tokens");
  CHECK(peft_checkpoint_gguf_kv_type(ckpt, 0, at) == PEFT_GGUF_ARRAY);
  CHECK(peft_checkpoint_gguf_kv_array_type(ckpt, 0, at) == PEFT_GGUF_STRING);
  CHECK(peft_checkpoint_gguf_kv_array_length(ckpt, 0, at) == 3);
  CHECK_OK(peft_checkpoint_gguf_kv_string(ckpt, 0, at, 2, &s, &n));
  CHECK(n == 5 && strcmp(s, "hello") == 0);
  CHECK_OK(peft_checkpoint_gguf_kv_string(ckpt, 0, at, 1, &s, &n));
  CHECK(n == 0 && s[0] == '\0');
  CHECK_CODE_NAMING(peft_checkpoint_gguf_kv_string(ckpt, 0, at, 3, &s, &n), PEFT_ERR_INVALID_ARGUMENT, "out of range");
  at = kv(ckpt, "a.ids");
  CHECK(peft_checkpoint_gguf_kv_array_type(ckpt, 0, at) == PEFT_GGUF_I32);
  CHECK_OK(peft_checkpoint_gguf_kv_int(ckpt, 0, at, 1, &i));
  CHECK(i == -20);
  CHECK(peft_checkpoint_gguf_kv_array_type(ckpt, 0, kv(ckpt, "a.u8")) == -1);
  CHECK(peft_checkpoint_gguf_kv_array_length(ckpt, 0, kv(ckpt, "a.u8")) == 0);

  CHECK_CODE_NAMING(peft_checkpoint_gguf_kv_find(ckpt, 0, "no.such.key", &at), PEFT_ERR_NOT_FOUND, "no.such.key");
  CHECK_CODE(peft_checkpoint_gguf_kv_find(ckpt, 1, "a.u8", &at), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_gguf_kv_find(ckpt, 0, NULL, &at), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_gguf_kv_int(ckpt, 0, 99, 0, &i), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_gguf_kv_int(NULL, 0, 0, 0, &i), PEFT_ERR_INVALID_ARGUMENT);
  /* The safetensors metadata getters see nothing in a GGUF file. */
  CHECK(peft_checkpoint_has_metadata(ckpt, 0) == 0);
  CHECK(peft_checkpoint_metadata_count(ckpt, 0) == 0);
}

static void test_tensors(const peft_checkpoint* ckpt) {
  size_t w = SIZE_MAX, q = SIZE_MAX;
  const uint64_t* shape;
  float values[6];
  const void* data = NULL;
  uint64_t nbytes = 0, begin = 0, end = 0;
  uint8_t raw[34];
  int k, same = 1;

  CHECK(peft_checkpoint_tensor_count(ckpt) == 2);
  CHECK_OK(peft_checkpoint_find(ckpt, "w", &w));
  CHECK_OK(peft_checkpoint_find(ckpt, "q", &q));
  CHECK(peft_checkpoint_tensor_dtype(ckpt, w) == PEFT_DTYPE_F16);
  CHECK(peft_checkpoint_tensor_ggml_type(ckpt, w) == 1);
  shape = peft_checkpoint_tensor_shape(ckpt, w);
  CHECK(peft_checkpoint_tensor_ndim(ckpt, w) == 2 && shape != NULL && shape[0] == 2 && shape[1] == 3);
  CHECK_OK(peft_checkpoint_tensor_read(ckpt, w, PEFT_DTYPE_F32, values, sizeof values));
  for (k = 0; k < 6; ++k) same = same && values[k] == (float)(k + 1);
  CHECK(same);

  CHECK(peft_checkpoint_tensor_dtype(ckpt, q) == -1);
  CHECK(peft_checkpoint_tensor_ggml_type(ckpt, q) == 8);
  CHECK(strcmp(peft_ggml_type_name(peft_checkpoint_tensor_ggml_type(ckpt, q)), "Q8_0") == 0);
  shape = peft_checkpoint_tensor_shape(ckpt, q);
  CHECK(peft_checkpoint_tensor_ndim(ckpt, q) == 2 && shape[0] == 1 && shape[1] == 32);
  CHECK_OK(peft_checkpoint_tensor_offsets(ckpt, q, &begin, &end));
  CHECK(begin == 64 && end == 64 + 34);
  CHECK_OK(peft_checkpoint_tensor_view(ckpt, q, &data, &nbytes));
  CHECK(nbytes == 34 && ((const uint8_t*)data)[1] == 0x3C && ((const uint8_t*)data)[2] == (uint8_t)-16);
  memcpy(raw, data, sizeof raw);
  CHECK(raw[33] == 15);
  CHECK_CODE_NAMING(peft_checkpoint_tensor_read(ckpt, q, PEFT_DTYPE_F32, values, 32 * sizeof(float)),
                    PEFT_ERR_UNSUPPORTED, "block-quantized");
  CHECK(peft_checkpoint_tensor_ggml_type(ckpt, 2) == -1);
}

static void test_ggml_types(void) {
  uint32_t block = 0, size = 0;
  CHECK(strcmp(peft_ggml_type_name(12), "Q4_K") == 0);
  CHECK(peft_ggml_type_name(4) == NULL); /* the removed Q4_2 */
  CHECK(peft_ggml_type_name(-1) == NULL);
  CHECK(peft_ggml_type_from_name("BF16") == 30);
  CHECK(peft_ggml_type_from_name("bf16") == -1);
  CHECK(peft_ggml_type_from_name(NULL) == -1);
  CHECK_OK(peft_ggml_type_geometry(8, &block, &size));
  CHECK(block == 32 && size == 34);
  CHECK_OK(peft_ggml_type_geometry(14, &block, &size));
  CHECK(block == 256 && size == 210);
  CHECK_CODE(peft_ggml_type_geometry(31, &block, &size), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_ggml_type_geometry(0, NULL, &size), PEFT_ERR_INVALID_ARGUMENT);
}

int main(void) {
  peft_checkpoint* ckpt = NULL;
  char path[] = "/tmp/peft_capi_gguf_XXXXXX";
  int fd;

  build();
  CHECK_OK(peft_checkpoint_open_memory(buf, len, NULL, &ckpt));
  if (ckpt != NULL) {
    test_metadata(ckpt);
    test_tensors(ckpt);
    peft_checkpoint_free(ckpt);
    ckpt = NULL;
  }
  test_ggml_types();

  /* The same bytes from disk, in both read modes; then cut short. */
  fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) {
    peft_open_options* opts = NULL;
    close(fd);
    CHECK(write_bytes(path, buf, len));
    CHECK_OK(peft_open_options_new(&opts));
    CHECK_OK(peft_open_options_set_use_pread(opts, 1));
    CHECK_OK(peft_checkpoint_open(path, opts, &ckpt));
    if (ckpt != NULL) {
      test_tensors(ckpt);
      peft_checkpoint_free(ckpt);
      ckpt = NULL;
    }
    CHECK(write_bytes(path, buf, len - 1));
    CHECK_CODE_NAMING(peft_checkpoint_open(path, NULL, &ckpt), PEFT_ERR_METADATA_INCOMPLETE_BUFFER, path);
    CHECK(ckpt == NULL);
    peft_open_options_free(opts);
    unlink(path);
  }
  return check_summary();
}
