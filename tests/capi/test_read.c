/* The reading section of the C API, from C99: every function, every documented error path, and
 * the promise that a failed call leaves its out-parameters untouched. Prints "N passed, M failed"
 * and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peft_c.h"
#include "check.h"
#include "peft_test_paths.h"

/* A sentinel no call should ever write through a failed out-parameter. */
static peft_checkpoint* const kUntouchedCkpt = (peft_checkpoint*)(uintptr_t)0x5eed;

/* ---- a small file built in memory ------------------------------------------------------------ */

/* "w": F32 [2,2] = 1,2,3,4; "e": F32 [0]; "s": I32 scalar = 7; metadata {"format":"pt","a":"b"}.
 * Data order: w [0,16], e [16,16], s [16,20]. */
static const char kHeader[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"a\":\"b\"},"
    "\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[16,20]},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
    "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,16]}}";

static size_t build_file(unsigned char* out, size_t capacity) {
  size_t header_len = strlen(kHeader);
  size_t padded = (header_len + 7) / 8 * 8;
  float w[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  int32_t s = 7;
  size_t i;
  size_t total = 8 + padded + 20;
  if (total > capacity) return 0;
  for (i = 0; i < 8; ++i) out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  memcpy(out + 8, kHeader, header_len);
  memset(out + 8 + header_len, ' ', padded - header_len);
  memcpy(out + 8 + padded, w, 16); /* little-endian host, as the library requires */
  memcpy(out + 8 + padded + 16, &s, 4);
  return total;
}

static int write_bytes(const char* path, const unsigned char* bytes, size_t size) {
  FILE* f = fopen(path, "wb");
  size_t written;
  if (f == NULL) return 0;
  written = fwrite(bytes, 1, size, f);
  return fclose(f) == 0 && written == size;
}

/* ---- options ---------------------------------------------------------------------------------- */

static void test_options(void) {
  peft_open_options* opts = NULL;
  peft_open_options* untouched = (peft_open_options*)(uintptr_t)0x5eed;
  CHECK_CODE(peft_open_options_new(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_open_options_new(&opts));
  CHECK(opts != NULL);
  CHECK_OK(peft_open_options_set_max_header_size(opts, 1234));
  CHECK_OK(peft_open_options_set_use_pread(opts, 1));
  CHECK_OK(peft_open_options_set_use_pread(opts, 0));
  CHECK_CODE(peft_open_options_set_max_header_size(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_open_options_set_use_pread(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  peft_open_options_free(opts);
  peft_open_options_free(NULL);
  (void)untouched;
}

/* ---- every getter on the in-memory file, in one opening mode ------------------------------------ */

static void check_small_checkpoint(const peft_checkpoint* ckpt) {
  size_t index = 99;
  const void* data = NULL;
  const void* untouched_data = (const void*)(uintptr_t)0x5eed;
  uint64_t nbytes = 0, begin = 0, end = 0;
  float w[4];
  double w64[4];
  int32_t s = 0;
  unsigned char small[4];

  CHECK(peft_checkpoint_file_count(ckpt) == 1);
  CHECK(peft_checkpoint_file_path(ckpt, 0) != NULL);
  CHECK(peft_checkpoint_file_path(ckpt, 1) == NULL);
  CHECK(peft_checkpoint_has_metadata(ckpt, 0) == 1);
  CHECK(peft_checkpoint_has_metadata(ckpt, 1) == 0);
  CHECK(peft_checkpoint_metadata_count(ckpt, 0) == 2);
  CHECK(peft_checkpoint_metadata_count(ckpt, 1) == 0);
  CHECK(strcmp(peft_checkpoint_metadata_key(ckpt, 0, 0), "a") == 0); /* sorted by key */
  CHECK(strcmp(peft_checkpoint_metadata_value(ckpt, 0, 0), "b") == 0);
  CHECK(strcmp(peft_checkpoint_metadata_key(ckpt, 0, 1), "format") == 0);
  CHECK(strcmp(peft_checkpoint_metadata_value(ckpt, 0, 1), "pt") == 0);
  CHECK(peft_checkpoint_metadata_key(ckpt, 0, 2) == NULL);
  CHECK(peft_checkpoint_metadata_value(ckpt, 0, 2) == NULL);
  CHECK(peft_checkpoint_metadata_key(ckpt, 1, 0) == NULL);
  CHECK(peft_checkpoint_metadata_value(ckpt, 1, 0) == NULL);
  CHECK(peft_checkpoint_index_metadata_json(ckpt) == NULL);

  CHECK(peft_checkpoint_tensor_count(ckpt) == 3);
  CHECK(strcmp(peft_checkpoint_tensor_name(ckpt, 0), "w") == 0); /* data order */
  CHECK(strcmp(peft_checkpoint_tensor_name(ckpt, 1), "e") == 0);
  CHECK(strcmp(peft_checkpoint_tensor_name(ckpt, 2), "s") == 0);
  CHECK(peft_checkpoint_tensor_name(ckpt, 3) == NULL);

  CHECK_OK(peft_checkpoint_find(ckpt, "s", &index));
  CHECK(index == 2);
  index = 99;
  CHECK_CODE(peft_checkpoint_find(ckpt, "missing", &index), PEFT_ERR_NOT_FOUND);
  CHECK_CODE(peft_checkpoint_find(ckpt, NULL, &index), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_find(ckpt, "s", NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_find(NULL, "s", &index), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(index == 99);

  CHECK(peft_checkpoint_tensor_dtype(ckpt, 0) == PEFT_DTYPE_F32);
  CHECK(peft_checkpoint_tensor_dtype(ckpt, 2) == PEFT_DTYPE_I32);
  CHECK(peft_checkpoint_tensor_dtype(ckpt, 3) == -1);
  CHECK(peft_checkpoint_tensor_ndim(ckpt, 0) == 2);
  CHECK(peft_checkpoint_tensor_ndim(ckpt, 1) == 1);
  CHECK(peft_checkpoint_tensor_ndim(ckpt, 2) == 0);
  CHECK(peft_checkpoint_tensor_ndim(ckpt, 3) == 0);
  CHECK(peft_checkpoint_tensor_shape(ckpt, 0) != NULL && peft_checkpoint_tensor_shape(ckpt, 0)[0] == 2 &&
        peft_checkpoint_tensor_shape(ckpt, 0)[1] == 2);
  CHECK(peft_checkpoint_tensor_shape(ckpt, 1) != NULL && peft_checkpoint_tensor_shape(ckpt, 1)[0] == 0);
  CHECK(peft_checkpoint_tensor_shape(ckpt, 2) == NULL); /* scalar */
  CHECK(peft_checkpoint_tensor_shape(ckpt, 3) == NULL);

  CHECK_OK(peft_checkpoint_tensor_offsets(ckpt, 2, &begin, &end));
  CHECK(begin == 16 && end == 20);
  CHECK_OK(peft_checkpoint_tensor_offsets(ckpt, 1, &begin, &end));
  CHECK(begin == 16 && end == 16);
  begin = end = 77;
  CHECK_CODE(peft_checkpoint_tensor_offsets(ckpt, 3, &begin, &end), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_offsets(ckpt, 0, NULL, &end), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_offsets(ckpt, 0, &begin, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_offsets(NULL, 0, &begin, &end), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(begin == 77 && end == 77);

  CHECK(peft_checkpoint_tensor_file(ckpt, 2) == 0);
  CHECK(peft_checkpoint_tensor_file(ckpt, 3) == SIZE_MAX);

  CHECK_OK(peft_checkpoint_tensor_view(ckpt, 0, &data, &nbytes));
  CHECK(data != NULL && nbytes == 16);
  if (data != NULL && nbytes == 16) {
    memcpy(w, data, 16);
    CHECK(w[0] == 1.0f && w[3] == 4.0f);
  }
  data = NULL;
  nbytes = 5;
  CHECK_OK(peft_checkpoint_tensor_view(ckpt, 1, &data, &nbytes));
  CHECK(data != NULL && nbytes == 0); /* zero-size tensor: non-NULL pointer, 0 bytes */
  data = untouched_data;
  nbytes = 77;
  CHECK_CODE(peft_checkpoint_tensor_view(ckpt, 3, &data, &nbytes), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_view(ckpt, 0, NULL, &nbytes), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_view(ckpt, 0, &data, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_view(NULL, 0, &data, &nbytes), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(data == untouched_data && nbytes == 77);

  memset(w, 0, sizeof w);
  CHECK_OK(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_F32, w, sizeof w));
  CHECK(w[0] == 1.0f && w[1] == 2.0f && w[2] == 3.0f && w[3] == 4.0f);
  CHECK_OK(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_F64, w64, sizeof w64));
  CHECK(w64[0] == 1.0 && w64[3] == 4.0);
  CHECK_OK(peft_checkpoint_tensor_read(ckpt, 2, PEFT_DTYPE_I32, &s, sizeof s));
  CHECK(s == 7);
  CHECK_OK(peft_checkpoint_tensor_read(ckpt, 2, PEFT_DTYPE_F64, w64, sizeof(double)));
  CHECK(w64[0] == 7.0);
  CHECK_OK(peft_checkpoint_tensor_read(ckpt, 1, PEFT_DTYPE_F32, NULL, 0)); /* nothing to read */
  CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_F32, w, sizeof w - 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_F64, w64, sizeof w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_U8, small, sizeof small), PEFT_ERR_UNSUPPORTED);
  CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 0, -1, w, sizeof w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_COUNT, w, sizeof w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 3, PEFT_DTYPE_F32, w, sizeof w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_F32, NULL, sizeof w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_tensor_read(NULL, 0, PEFT_DTYPE_F32, w, sizeof w), PEFT_ERR_INVALID_ARGUMENT);
}

static void test_null_handle_getters(void) {
  CHECK(peft_checkpoint_file_count(NULL) == 0);
  CHECK(peft_checkpoint_file_path(NULL, 0) == NULL);
  CHECK(peft_checkpoint_has_metadata(NULL, 0) == 0);
  CHECK(peft_checkpoint_metadata_count(NULL, 0) == 0);
  CHECK(peft_checkpoint_metadata_key(NULL, 0, 0) == NULL);
  CHECK(peft_checkpoint_metadata_value(NULL, 0, 0) == NULL);
  CHECK(peft_checkpoint_index_metadata_json(NULL) == NULL);
  CHECK(peft_checkpoint_tensor_count(NULL) == 0);
  CHECK(peft_checkpoint_tensor_name(NULL, 0) == NULL);
  CHECK(peft_checkpoint_tensor_dtype(NULL, 0) == -1);
  CHECK(peft_checkpoint_tensor_ndim(NULL, 0) == 0);
  CHECK(peft_checkpoint_tensor_shape(NULL, 0) == NULL);
  CHECK(peft_checkpoint_tensor_file(NULL, 0) == SIZE_MAX);
  peft_checkpoint_free(NULL);
}

static void test_memory(const unsigned char* bytes, size_t size) {
  peft_checkpoint* ckpt = kUntouchedCkpt;
  peft_open_options* tight = NULL;
  CHECK_CODE(peft_checkpoint_open_memory(NULL, size, NULL, &ckpt), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_open_memory(bytes, size, NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_open_memory(bytes, 4, NULL, &ckpt), PEFT_ERR_HEADER_TOO_SMALL);
  CHECK_CODE(peft_checkpoint_open_memory(NULL, 0, NULL, &ckpt), PEFT_ERR_HEADER_TOO_SMALL);
  CHECK_CODE(peft_checkpoint_open_memory(bytes, size - 1, NULL, &ckpt), PEFT_ERR_METADATA_INCOMPLETE_BUFFER);
  CHECK_OK(peft_open_options_new(&tight));
  CHECK_OK(peft_open_options_set_max_header_size(tight, 16));
  CHECK_CODE(peft_checkpoint_open_memory(bytes, size, tight, &ckpt), PEFT_ERR_HEADER_TOO_LARGE);
  CHECK(ckpt == kUntouchedCkpt);

  CHECK_OK(peft_checkpoint_open_memory(bytes, size, NULL, &ckpt));
  peft_open_options_free(tight);
  if (ckpt == kUntouchedCkpt) return;
  CHECK(strcmp(peft_checkpoint_file_path(ckpt, 0), "<memory>") == 0);
  check_small_checkpoint(ckpt);
  peft_checkpoint_free(ckpt);
}

/* The same file on disk, opened with mmap and with pread; the bytes must outlive the caller's copy. */
static void test_file(const unsigned char* bytes, size_t size) {
  char dir[] = "/tmp/peft_test_read_XXXXXX";
  char path[128];
  int mode;
  if (mkdtemp(dir) == NULL) {
    CHECK(!"mkdtemp");
    return;
  }
  snprintf(path, sizeof path, "%s/small.safetensors", dir);
  CHECK(write_bytes(path, bytes, size));
  for (mode = 0; mode < 2; ++mode) {
    peft_open_options* opts = NULL;
    peft_checkpoint* ckpt = NULL;
    CHECK_OK(peft_open_options_new(&opts));
    CHECK_OK(peft_open_options_set_use_pread(opts, mode));
    CHECK_OK(peft_checkpoint_open(path, opts, &ckpt));
    peft_open_options_free(opts); /* options are not kept */
    if (ckpt == NULL) continue;
    CHECK(strcmp(peft_checkpoint_file_path(ckpt, 0), path) == 0);
    check_small_checkpoint(ckpt);
    peft_checkpoint_free(ckpt);
  }
  remove(path);
  rmdir(dir);
}

/* ---- fixtures: missing, malformed, sharded ------------------------------------------------------- */

static void test_open_errors(void) {
  peft_checkpoint* ckpt = kUntouchedCkpt;
  peft_error* err;
  CHECK_CODE(peft_checkpoint_open(NULL, NULL, &ckpt), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_open(PEFT_TEST_DATA "/safetensors", NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  err = peft_checkpoint_open(PEFT_TEST_DATA "/no/such/file.safetensors", NULL, &ckpt);
  CHECK(peft_error_code(err) == PEFT_ERR_IO);
  CHECK(strstr(peft_error_message(err), "no/such/file.safetensors") != NULL);
  peft_error_free(err);
  /* A folder with neither an index nor model.safetensors. */
  CHECK_CODE(peft_checkpoint_open(PEFT_TEST_DATA, NULL, &ckpt), PEFT_ERR_INVALID_CHECKPOINT);
  CHECK(ckpt == kUntouchedCkpt);
}

/* One malformed fixture per format error code, in both opening modes. */
static void test_malformed(void) {
  static const struct {
    const char* file;
    int32_t code;
  } cases[] = {
      {"too_small_empty.safetensors", PEFT_ERR_HEADER_TOO_SMALL},
      {"too_large_100000001.safetensors", PEFT_ERR_HEADER_TOO_LARGE},
      {"length_past_eof_by_1.safetensors", PEFT_ERR_INVALID_HEADER_LENGTH},
      {"utf8_in_key.safetensors", PEFT_ERR_INVALID_HEADER_UTF8},
      {"json_not_json.safetensors", PEFT_ERR_INVALID_HEADER},
      {"offset_gap.safetensors", PEFT_ERR_INVALID_OFFSET},
      {"overflow_shape_product.safetensors", PEFT_ERR_VALIDATION_OVERFLOW},
      {"misaligned_f4_odd.safetensors", PEFT_ERR_MISALIGNED_SLICE},
      {"info_span_too_large.safetensors", PEFT_ERR_TENSOR_INVALID_INFO},
      {"incomplete_trailing_byte.safetensors", PEFT_ERR_METADATA_INCOMPLETE_BUFFER},
  };
  size_t i;
  int mode;
  for (mode = 0; mode < 2; ++mode) {
    peft_open_options* opts = NULL;
    CHECK_OK(peft_open_options_new(&opts));
    CHECK_OK(peft_open_options_set_use_pread(opts, mode));
    for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
      char path[512];
      peft_checkpoint* ckpt = kUntouchedCkpt;
      peft_error* err;
      snprintf(path, sizeof path, "%s/malformed/%s", PEFT_TEST_DATA, cases[i].file);
      err = peft_checkpoint_open(path, opts, &ckpt);
      if (peft_error_code(err) == cases[i].code && strstr(peft_error_message(err), path) != NULL) {
        ++passed;
      } else {
        ++failed;
        fprintf(stderr, "%s: expected %s, got %s: %s\n", path, peft_error_code_name(cases[i].code),
                peft_error_code_name(peft_error_code(err)), peft_error_message(err));
      }
      peft_error_free(err);
      CHECK(ckpt == kUntouchedCkpt);
    }
    peft_open_options_free(opts);
  }
}

/* The transformers-saved sharded fixture: 3 shards, numbered in shard-name order, index metadata. */
static void test_sharded(void) {
  const char* folder = PEFT_TEST_DATA "/safetensors/sharded";
  peft_checkpoint* ckpt = NULL;
  size_t index = 0, i, count;
  const char* json;
  const void* data = NULL;
  uint64_t nbytes = 0;
  CHECK_OK(peft_checkpoint_open(folder, NULL, &ckpt));
  if (ckpt == NULL) return;
  CHECK(peft_checkpoint_file_count(ckpt) == 3);
  CHECK(strstr(peft_checkpoint_file_path(ckpt, 0), "sharded/model-00001-of-00003.safetensors") != NULL);
  CHECK(strstr(peft_checkpoint_file_path(ckpt, 2), "sharded/model-00003-of-00003.safetensors") != NULL);
  CHECK(peft_checkpoint_file_path(ckpt, 3) == NULL);
  count = peft_checkpoint_tensor_count(ckpt);
  CHECK(count == 21);
  CHECK(strcmp(peft_checkpoint_tensor_name(ckpt, 0), "model.embed_tokens.weight") == 0);
  CHECK(strcmp(peft_checkpoint_tensor_name(ckpt, count - 1), "lm_head.weight") == 0);
  CHECK(peft_checkpoint_tensor_file(ckpt, 0) == 0);
  CHECK(peft_checkpoint_tensor_file(ckpt, 7) == 1);
  CHECK(peft_checkpoint_tensor_file(ckpt, count - 1) == 2);
  for (i = 1; i < count; ++i) CHECK(peft_checkpoint_tensor_file(ckpt, i - 1) <= peft_checkpoint_tensor_file(ckpt, i));
  CHECK_OK(peft_checkpoint_find(ckpt, "lm_head.weight", &index));
  CHECK(index == count - 1);
  CHECK_OK(peft_checkpoint_tensor_view(ckpt, index, &data, &nbytes));
  CHECK(data != NULL && nbytes > 0);
  json = peft_checkpoint_index_metadata_json(ckpt);
  CHECK(json != NULL && strstr(json, "\"total_size\":6816") != NULL);
  CHECK(peft_checkpoint_has_metadata(ckpt, 0) == 1);
  CHECK(peft_checkpoint_metadata_count(ckpt, 0) == 1);
  CHECK(strcmp(peft_checkpoint_metadata_key(ckpt, 0, 0), "format") == 0);
  CHECK(strcmp(peft_checkpoint_metadata_value(ckpt, 0, 0), "pt") == 0);
  peft_checkpoint_free(ckpt);
}

/* A reference-written file with no metadata, and one with "__metadata__": {} (present but empty). */
static void test_metadata_presence(void) {
  peft_checkpoint* ckpt = NULL;
  CHECK_OK(peft_checkpoint_open(PEFT_TEST_DATA "/safetensors/no_metadata.safetensors", NULL, &ckpt));
  if (ckpt != NULL) {
    CHECK(peft_checkpoint_has_metadata(ckpt, 0) == 0);
    CHECK(peft_checkpoint_metadata_count(ckpt, 0) == 0);
    CHECK(peft_checkpoint_metadata_key(ckpt, 0, 0) == NULL);
    peft_checkpoint_free(ckpt);
  }
  ckpt = NULL;
  CHECK_OK(peft_checkpoint_open(PEFT_TEST_DATA "/safetensors/metadata_empty.safetensors", NULL, &ckpt));
  if (ckpt != NULL) {
    CHECK(peft_checkpoint_has_metadata(ckpt, 0) == 1);
    CHECK(peft_checkpoint_metadata_count(ckpt, 0) == 0);
    peft_checkpoint_free(ckpt);
  }
}

/* pread mode on a reference-written file: the view is read once and matches a same-dtype read. */
static void test_pread_view_matches_read(void) {
  peft_checkpoint* ckpt = NULL;
  peft_open_options* opts = NULL;
  const void* data = NULL;
  const void* again = NULL;
  uint64_t nbytes = 0;
  void* copy;
  CHECK_OK(peft_open_options_new(&opts));
  CHECK_OK(peft_open_options_set_use_pread(opts, 1));
  CHECK_OK(peft_checkpoint_open(PEFT_TEST_DATA "/safetensors/dtype_f32.safetensors", opts, &ckpt));
  peft_open_options_free(opts); /* not kept by the checkpoint */
  if (ckpt == NULL) return;
  CHECK_OK(peft_checkpoint_tensor_view(ckpt, 0, &data, &nbytes));
  CHECK_OK(peft_checkpoint_tensor_view(ckpt, 0, &again, &nbytes));
  CHECK(data != NULL && data == again && nbytes >= 4);
  copy = malloc(nbytes + 1);
  if (copy != NULL && data != NULL) {
    CHECK_OK(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_F32, copy, nbytes));
    CHECK(memcmp(copy, data, nbytes) == 0);
    CHECK_CODE(peft_checkpoint_tensor_read(ckpt, 0, PEFT_DTYPE_F32, copy, nbytes + 1), PEFT_ERR_INVALID_ARGUMENT);
  }
  free(copy);
  peft_checkpoint_free(ckpt);
}

/* Names may hold NUL bytes (JSON "\u0000"): the length-aware accessors see all of them. */
static void test_names_with_nul(void) {
  static const char header[] = "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}";
  unsigned char bytes[256];
  size_t n = sizeof header - 1, padded = (n + 7) / 8 * 8, i;
  peft_checkpoint* ckpt = NULL;
  size_t found = 99;
  for (i = 0; i < 8; ++i) bytes[i] = (unsigned char)((padded >> (8 * i)) & 0xff);
  memcpy(bytes + 8, header, n);
  memset(bytes + 8 + n, ' ', padded - n);
  bytes[8 + padded] = 7;
  bytes[9 + padded] = 9;
  CHECK_OK(peft_checkpoint_open_memory(bytes, 10 + padded, NULL, &ckpt));
  if (ckpt == NULL) return;
  CHECK(peft_checkpoint_tensor_name_length(ckpt, 0) == 3);
  CHECK(memcmp(peft_checkpoint_tensor_name(ckpt, 0), "a\0b", 4) == 0);
  CHECK(peft_checkpoint_tensor_name_length(ckpt, 1) == 1);
  CHECK(peft_checkpoint_tensor_name_length(ckpt, 2) == 0);
  CHECK(peft_checkpoint_tensor_name_length(NULL, 0) == 0);
  CHECK_OK(peft_checkpoint_find_n(ckpt, "a\0b", 3, &found));
  CHECK(found == 0);
  CHECK_OK(peft_checkpoint_find_n(ckpt, "a\0b", 1, &found));
  CHECK(found == 1);
  found = 99;
  CHECK_CODE(peft_checkpoint_find_n(ckpt, "a\0c", 3, &found), PEFT_ERR_NOT_FOUND);
  CHECK(found == 99);
  CHECK_CODE(peft_checkpoint_find_n(ckpt, NULL, 3, &found), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_checkpoint_find_n(NULL, "a", 1, &found), PEFT_ERR_INVALID_ARGUMENT);
  peft_checkpoint_free(ckpt);
}

int main(void) {
  test_names_with_nul();
  unsigned char bytes[512];
  size_t size = build_file(bytes, sizeof bytes);
  CHECK(size > 0);
  test_options();
  test_null_handle_getters();
  test_memory(bytes, size);
  test_file(bytes, size);
  test_open_errors();
  test_malformed();
  test_sharded();
  test_metadata_presence();
  test_pread_view_matches_read();
  return check_summary();
}
