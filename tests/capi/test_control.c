/* Control vectors from C99: building one, reading it back from both formats, llama.cpp's sum,
 * the buffer apply and its exact removal, and the documented errors (NULL arguments, dtypes,
 * layer 0 in GGUF, a changed buffer, a spent record). Byte equality with gguf-py and Python
 * safetensors and llama.cpp's own reading are in tests/interop/test_control_vector.py.
 * Prints "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peft_c.h"
#include "check.h"
#include "files.h"

#define N_EMBD 4

static char dir[64];

static const char* in_dir(char* buf, size_t size, const char* name) {
  snprintf(buf, size, "%s/%s", dir, name);
  return buf;
}

static peft_control_vector* sample(void) {
  static const float one[N_EMBD] = {1.0f, -2.0f, 0.5f, 4.0f};
  static const double three[N_EMBD] = {0.25, 0.125, -8.0, 3.0};
  peft_control_vector* v = NULL;
  CHECK_OK(peft_control_vector_new(N_EMBD, "llama", &v));
  CHECK_OK(peft_control_vector_set_direction(v, 1, PEFT_DTYPE_F32, one));
  CHECK_OK(peft_control_vector_set_direction(v, 3, PEFT_DTYPE_F64, three));
  return v;
}

static void test_build_and_read(void) {
  peft_control_vector* v = sample();
  const float* d;
  CHECK(peft_control_vector_n_embd(v) == N_EMBD);
  CHECK(strcmp(peft_control_vector_model_hint(v), "llama") == 0);
  CHECK(peft_control_vector_layer_count(v) == 2);
  CHECK(peft_control_vector_layer(v, 0) == 1 && peft_control_vector_layer(v, 1) == 3);
  CHECK(peft_control_vector_layer(v, 2) == -1);
  d = peft_control_vector_direction(v, 3);
  CHECK(d != NULL && d[0] == 0.25f && d[2] == -8.0f);
  CHECK(peft_control_vector_direction(v, 2) == NULL);
  /* NULL handles answer with the documented defaults. */
  CHECK(peft_control_vector_n_embd(NULL) == 0 && peft_control_vector_model_hint(NULL) == NULL);
  CHECK(peft_control_vector_layer_count(NULL) == 0 && peft_control_vector_layer(NULL, 0) == -1);
  CHECK(peft_control_vector_direction(NULL, 1) == NULL);
  peft_control_vector_free(NULL);
  peft_control_record_free(NULL);
  peft_control_vector_free(v);
}

static void test_save_and_open(void) {
  char a[128], b[128], c[128];
  peft_control_vector* v = sample();
  peft_control_vector* back = NULL;
  size_t format;
  const char* paths[2];
  paths[0] = in_dir(a, sizeof a, "v.gguf");
  paths[1] = in_dir(b, sizeof b, "v.safetensors");
  CHECK_OK(peft_control_vector_save(v, paths[0], PEFT_FORMAT_GGUF));
  CHECK_OK(peft_control_vector_save(v, paths[1], PEFT_FORMAT_SAFETENSORS));
  for (format = 0; format < 2; ++format) {
    CHECK_OK(peft_control_vector_open(paths[format], &back));
    CHECK(peft_control_vector_layer_count(back) == 2);
    CHECK(strcmp(peft_control_vector_model_hint(back), "llama") == 0);
    CHECK(memcmp(peft_control_vector_direction(back, 1), peft_control_vector_direction(v, 1), N_EMBD * 4) == 0);
    CHECK(memcmp(peft_control_vector_direction(back, 3), peft_control_vector_direction(v, 3), N_EMBD * 4) == 0);
    peft_control_vector_free(back);
    back = NULL;
  }
  CHECK_CODE(peft_control_vector_save(v, in_dir(c, sizeof c, "v.bin"), 7), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_vector_save(NULL, c, PEFT_FORMAT_GGUF), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_vector_open(in_dir(c, sizeof c, "missing.gguf"), &back), PEFT_ERR_IO);
  CHECK_CODE(peft_control_vector_open(NULL, &back), PEFT_ERR_INVALID_ARGUMENT);
  /* Layer 0 has no place in llama.cpp's file, and nothing is written. */
  {
    static const float zero_layer[N_EMBD] = {1, 1, 1, 1};
    CHECK_OK(peft_control_vector_set_direction(v, 0, PEFT_DTYPE_F32, zero_layer));
    CHECK_CODE_NAMING(peft_control_vector_save(v, in_dir(c, sizeof c, "zero.gguf"), PEFT_FORMAT_GGUF),
                      PEFT_ERR_INVALID_ARGUMENT, "layer 0");
    CHECK(access(c, F_OK) != 0);
  }
  peft_control_vector_free(v);
}

static void test_add(void) {
  peft_control_vector* sum = NULL;
  peft_control_vector* v = sample();
  peft_control_vector* other = NULL;
  const float strength = 0.3f;
  const float* d;
  const float* s;
  size_t j;
  CHECK_OK(peft_control_vector_new(N_EMBD, NULL, &sum));
  CHECK(strcmp(peft_control_vector_model_hint(sum), "") == 0);
  CHECK_OK(peft_control_vector_add(sum, v, 0.3));
  CHECK_OK(peft_control_vector_add(sum, sum, 1.0)); /* itself: doubled */
  d = peft_control_vector_direction(v, 1);
  s = peft_control_vector_direction(sum, 1);
  for (j = 0; j < N_EMBD; ++j) {
    volatile float once = d[j] * strength;
    volatile float twice = once + once;
    CHECK(s[j] == twice);
  }
  CHECK_OK(peft_control_vector_new(N_EMBD + 1, NULL, &other));
  CHECK_CODE(peft_control_vector_add(sum, other, 1.0), PEFT_ERR_SHAPE_MISMATCH);
  CHECK_CODE(peft_control_vector_add(NULL, other, 1.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_vector_new(0, NULL, &other), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_vector_set_direction(sum, -1, PEFT_DTYPE_F32, d), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_vector_set_direction(sum, 1, PEFT_DTYPE_I32, d), PEFT_ERR_INVALID_ARGUMENT);
  {
    const float bad[N_EMBD] = {1.0f, (float)INFINITY, 0.0f, 0.0f};
    CHECK_CODE(peft_control_vector_set_direction(sum, 1, PEFT_DTYPE_F32, bad), PEFT_ERR_NON_FINITE);
  }
  peft_control_vector_free(other);
  peft_control_vector_free(sum);
  peft_control_vector_free(v);
}

static void test_apply_and_remove(void) {
  peft_control_vector* v = sample();
  peft_control_record* record = NULL;
  float buffer[2 * N_EMBD], original[2 * N_EMBD];
  const float* d = peft_control_vector_direction(v, 1);
  size_t i;
  for (i = 0; i < 2 * N_EMBD; ++i) buffer[i] = original[i] = 0.1f * (float)i;
  CHECK_OK(peft_control_vector_apply(v, 1, 2.0, buffer, PEFT_DTYPE_F32, 2, &record));
  for (i = 0; i < 2 * N_EMBD; ++i) {
    volatile float product = d[i % N_EMBD] * 2.0f;
    CHECK(buffer[i] == original[i] + product);
  }
  buffer[0] += 1.0f;
  CHECK_CODE(peft_control_record_remove(record, buffer), PEFT_ERR_INVALID_ARGUMENT);
  buffer[0] -= 1.0f;
  CHECK_OK(peft_control_record_remove(record, buffer));
  CHECK(memcmp(buffer, original, sizeof buffer) == 0);
  CHECK_CODE(peft_control_record_remove(record, buffer), PEFT_ERR_INVALID_ARGUMENT);
  peft_control_record_free(record);
  /* Without a record; a layer without a direction; wrong arguments leave the buffer alone. */
  CHECK_OK(peft_control_vector_apply(v, 2, 2.0, buffer, PEFT_DTYPE_F32, 2, NULL));
  CHECK(memcmp(buffer, original, sizeof buffer) == 0);
  CHECK_CODE(peft_control_vector_apply(v, 1, 2.0, buffer, PEFT_DTYPE_F64, 1, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_vector_apply(v, 1, 2.0, buffer, PEFT_DTYPE_F32, 0, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_vector_apply(v, 1, 2.0, NULL, PEFT_DTYPE_F32, 1, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_control_record_remove(NULL, buffer), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(memcmp(buffer, original, sizeof buffer) == 0);
  peft_control_vector_free(v);
}

int main(void) {
  char* made;
  snprintf(dir, sizeof dir, "/tmp/peft_capi_control_XXXXXX");
  made = mkdtemp(dir);
  if (made == NULL) return 1;
  test_build_and_read();
  test_save_and_open();
  test_add();
  test_apply_and_remove();
  {
    char buf[128];
    remove(in_dir(buf, sizeof buf, "v.gguf"));
    remove(in_dir(buf, sizeof buf, "v.safetensors"));
    rmdir(dir);
  }
  return check_summary();
}
