/* The writing section of the C API, from C99: every writer function, the three metadata states,
 * every source of tensor bytes (buffer, chunks, callback, checkpoint) with and without conversion,
 * checkpoint folders, and the documented errors. Prints "N passed, M failed" and exits nonzero on
 * any failure. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peft_c.h"
#include "check.h"
#include "files.h"

static char scratch[256];

static const char* in_scratch(const char* name, char* buf, size_t size) {
  snprintf(buf, size, "%s/%s", scratch, name);
  return buf;
}

static long file_size(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Counts the entries of the scratch folder whose names contain `part`. */
static int count_entries(const char* folder, const char* part) {
  int n = 0;
  DIR* dir = opendir(folder);
  struct dirent* e;
  if (dir == NULL) return -1;
  while ((e = readdir(dir)) != NULL) {
    if (strstr(e->d_name, part) != NULL) ++n;
  }
  closedir(dir);
  return n;
}

/* ---- callbacks ---------------------------------------------------------------------------- */

struct source_state {
  const float* values;
  int calls;
  int cancel_at; /* call number that cancels; 0 = never */
};

static int32_t fill_from_floats(void* user_data, uint64_t offset, void* dst, uint64_t nbytes) {
  struct source_state* s = (struct source_state*)user_data;
  s->calls++;
  if (s->cancel_at != 0 && s->calls >= s->cancel_at) return 1;
  memcpy(dst, (const char*)s->values + offset, (size_t)nbytes);
  return 0;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_one_file(void) {
  char path[512];
  peft_writer* w = NULL;
  peft_checkpoint* ck = NULL;
  const uint64_t shape_w[2] = {2, 3};
  const uint64_t shape_b[1] = {3};
  const float weight[6] = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  const float bias_f32[3] = {0.5f, -1.f, 2.f};
  const int64_t step = 42;
  struct source_state src = {weight, 0, 0};
  size_t index = 0;
  const void* view = NULL;
  uint64_t nbytes = 0;
  uint16_t bias_bf16[3];
  uint16_t got[3];

  in_scratch("one.safetensors", path, sizeof path);
  CHECK_CODE(peft_writer_new(NULL, &w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_new(path, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_new("", &w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(w == NULL);
  CHECK_OK(peft_writer_new(path, &w));
  if (w == NULL) return;

  CHECK_OK(peft_writer_add_tensor(w, "w", PEFT_DTYPE_F32, shape_w, 2));
  CHECK_OK(peft_writer_add_tensor(w, "b", PEFT_DTYPE_BF16, shape_b, 1));
  CHECK_OK(peft_writer_add_tensor(w, "step", PEFT_DTYPE_I64, NULL, 0));
  CHECK_CODE_NAMING(peft_writer_add_tensor(w, "w", PEFT_DTYPE_F32, shape_w, 2), PEFT_ERR_INVALID_ARGUMENT, "\"w\"");
  CHECK_CODE(peft_writer_add_tensor(w, "__metadata__", PEFT_DTYPE_F32, shape_w, 2), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_add_tensor(w, "bad\xff", PEFT_DTYPE_F32, shape_w, 2), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_add_tensor(w, "odd", PEFT_DTYPE_F4, shape_b, 1), PEFT_ERR_MISALIGNED_SLICE);
  CHECK_CODE(peft_writer_add_tensor(w, "x", 99, shape_b, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_add_tensor(w, "x", PEFT_DTYPE_F32, NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(peft_writer_tensor_count(w) == 3);
  CHECK_OK(peft_writer_set_metadata(w, "format", "pt"));
  CHECK_OK(peft_writer_set_metadata(w, "a", "1"));
  CHECK_CODE(peft_writer_set_metadata(w, "k", NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_break_shard(w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_set_index_metadata_json(w, "{}"), PEFT_ERR_INVALID_ARGUMENT);

  /* Before start, the order is unknown. */
  CHECK(peft_writer_tensor_name(w, 0) == NULL);
  CHECK(peft_writer_tensor_declaration(w, 0) == SIZE_MAX);
  CHECK(peft_writer_file_count(w) == 0);
  CHECK_OK(peft_writer_start(w));
  CHECK_OK(peft_writer_start(w)); /* again: nothing happens */
  CHECK(strcmp(peft_writer_tensor_name(w, 0), "step") == 0);
  CHECK(strcmp(peft_writer_tensor_name(w, 1), "w") == 0);
  CHECK(strcmp(peft_writer_tensor_name(w, 2), "b") == 0);
  CHECK(peft_writer_tensor_name(w, 3) == NULL);
  CHECK(peft_writer_tensor_declaration(w, 0) == 2);
  CHECK(peft_writer_tensor_declaration(w, 2) == 1);
  CHECK(peft_writer_file_count(w) == 1);
  CHECK(strcmp(peft_writer_file_path(w, 0), path) == 0);
  CHECK(peft_writer_file_path(w, 1) == NULL);
  CHECK_CODE(peft_writer_add_tensor(w, "late", PEFT_DTYPE_F32, shape_b, 1), PEFT_ERR_INVALID_ARGUMENT);

  /* Wrong order, wrong sizes: refused, nothing changes. */
  CHECK_CODE_NAMING(peft_writer_begin_tensor(w, "w", PEFT_DTYPE_F32), PEFT_ERR_INVALID_ARGUMENT, "\"step\"");
  CHECK_CODE(peft_writer_write(w, &step, 8), PEFT_ERR_INVALID_ARGUMENT); /* nothing begun */
  CHECK_CODE(peft_writer_write_tensor(w, "step", PEFT_DTYPE_I64, &step, 4), PEFT_ERR_TENSOR_INVALID_INFO);
  CHECK_OK(peft_writer_write_tensor(w, "step", PEFT_DTYPE_I64, &step, 8));
  /* w from a callback. */
  CHECK_OK(peft_writer_write_from_callback(w, "w", PEFT_DTYPE_F32, fill_from_floats, &src));
  CHECK(src.calls == 1);
  /* b in chunks, converted from f32. */
  CHECK_CODE(peft_writer_begin_tensor(w, "b", PEFT_DTYPE_I64 + 100), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_writer_begin_tensor(w, "b", PEFT_DTYPE_F32));
  CHECK_CODE_NAMING(peft_writer_write(w, bias_f32, 2), PEFT_ERR_INVALID_ARGUMENT, "\"b\""); /* half an element */
  CHECK_CODE_NAMING(peft_writer_write(w, bias_f32, 16), PEFT_ERR_INVALID_ARGUMENT, "\"b\""); /* too many */
  CHECK_OK(peft_writer_write(w, bias_f32, 4));
  CHECK_CODE_NAMING(peft_writer_finish(w), PEFT_ERR_INVALID_ARGUMENT, "\"b\""); /* incomplete */
  CHECK(file_size(path) == -1);                                                /* nothing yet */
  CHECK(count_entries(scratch, ".peft-tmp-") == 1);
  CHECK_OK(peft_writer_write(w, bias_f32 + 1, 8));
  CHECK_OK(peft_writer_finish(w));
  CHECK(count_entries(scratch, ".peft-tmp-") == 0);
  CHECK_CODE(peft_writer_finish(w), PEFT_ERR_INVALID_ARGUMENT);
  peft_writer_free(w);

  /* Read back. */
  CHECK_OK(peft_checkpoint_open(path, NULL, &ck));
  if (ck == NULL) return;
  CHECK(peft_checkpoint_tensor_count(ck) == 3);
  CHECK(peft_checkpoint_metadata_count(ck, 0) == 2);
  CHECK(strcmp(peft_checkpoint_metadata_key(ck, 0, 0), "a") == 0);
  CHECK_OK(peft_checkpoint_find(ck, "w", &index));
  CHECK_OK(peft_checkpoint_tensor_view(ck, index, &view, &nbytes));
  CHECK(nbytes == 24 && memcmp(view, weight, 24) == 0);
  CHECK_OK(peft_checkpoint_find(ck, "b", &index));
  CHECK(peft_checkpoint_tensor_dtype(ck, index) == PEFT_DTYPE_BF16);
  CHECK_OK(peft_convert(PEFT_DTYPE_F32, bias_f32, PEFT_DTYPE_BF16, bias_bf16, 3));
  CHECK_OK(peft_checkpoint_tensor_read(ck, index, PEFT_DTYPE_BF16, got, sizeof got));
  CHECK(memcmp(got, bias_bf16, sizeof got) == 0);
  peft_checkpoint_free(ck);
}

/* Absent, empty and filled metadata are three different files. */
static void test_metadata_states(void) {
  char path[512];
  long sizes[3];
  int state;
  for (state = 0; state < 3; ++state) {
    peft_writer* w = NULL;
    peft_checkpoint* ck = NULL;
    in_scratch("md.safetensors", path, sizeof path);
    CHECK_OK(peft_writer_new(path, &w));
    if (w == NULL) return;
    if (state >= 1) CHECK_OK(peft_writer_set_metadata_present(w, 1));
    if (state == 2) CHECK_OK(peft_writer_set_metadata(w, "format", "pt"));
    CHECK_OK(peft_writer_finish(w));
    peft_writer_free(w);
    sizes[state] = file_size(path);
    CHECK_OK(peft_checkpoint_open(path, NULL, &ck));
    CHECK(peft_checkpoint_has_metadata(ck, 0) == (state >= 1));
    CHECK(peft_checkpoint_metadata_count(ck, 0) == (size_t)(state == 2));
    peft_checkpoint_free(ck);
  }
  CHECK(sizes[0] == 16);                 /* {} + 6 spaces */
  CHECK(sizes[1] == 32);                 /* {"__metadata__":{}} + 5 spaces */
  CHECK(sizes[2] == 8 + 32);             /* {"__metadata__":{"format":"pt"}} */
  /* Present then absent again drops the entries. */
  {
    peft_writer* w = NULL;
    CHECK_OK(peft_writer_new(path, &w));
    CHECK_OK(peft_writer_set_metadata(w, "k", "v"));
    CHECK_OK(peft_writer_set_metadata_present(w, 0));
    CHECK_OK(peft_writer_finish(w));
    peft_writer_free(w);
    CHECK(file_size(path) == 16);
  }
}

static void test_cancel_and_free(void) {
  char path[512];
  peft_writer* w = NULL;
  static float big[1 << 21]; /* 8 MiB: two callback chunks */
  const uint64_t shape[1] = {1 << 21};
  struct source_state src = {big, 0, 2};
  FILE* f;
  in_scratch("keep.safetensors", path, sizeof path);
  f = fopen(path, "wb");
  fputs("old", f);
  fclose(f);
  CHECK_OK(peft_writer_new(path, &w));
  CHECK_OK(peft_writer_add_tensor(w, "big", PEFT_DTYPE_F32, shape, 1));
  CHECK_CODE_NAMING(peft_writer_write_from_callback(w, "big", PEFT_DTYPE_F32, fill_from_floats, &src),
                    PEFT_ERR_CANCELLED, "\"big\"");
  CHECK(src.calls == 2);
  CHECK(file_size(path) == 3);
  CHECK(count_entries(scratch, ".peft-tmp-") == 0);
  CHECK_CODE(peft_writer_finish(w), PEFT_ERR_INVALID_ARGUMENT); /* a failed writer can only be freed */
  peft_writer_free(w);

  /* Freeing an unfinished writer removes its temporary. */
  w = NULL;
  CHECK_OK(peft_writer_new(path, &w));
  CHECK_OK(peft_writer_add_tensor(w, "big", PEFT_DTYPE_F32, shape, 1));
  CHECK_OK(peft_writer_begin_tensor(w, "big", PEFT_DTYPE_F32));
  CHECK_OK(peft_writer_write(w, big, 1024));
  CHECK(count_entries(scratch, ".peft-tmp-") == 1);
  peft_writer_free(w);
  CHECK(count_entries(scratch, ".peft-tmp-") == 0);
  CHECK(file_size(path) == 3);
  peft_writer_free(NULL);
}

/* A checkpoint folder from a checkpoint source, converted to bf16 and split into shards. */
static void test_checkpoint_folder(void) {
  char src_path[512], folder[512], index_path[512];
  peft_writer* w = NULL;
  peft_checkpoint* src = NULL;
  peft_checkpoint* out = NULL;
  static float values[4][256];
  const uint64_t shape[2] = {16, 16};
  const char* names[4] = {"layer.0.w", "layer.1.w", "layer.2.w", "layer.3.w"};
  size_t i, p;
  for (i = 0; i < 4; ++i) {
    for (p = 0; p < 256; ++p) values[i][p] = (float)(i * 1000 + p) / 7.0f;
  }
  in_scratch("src.safetensors", src_path, sizeof src_path);
  CHECK_OK(peft_writer_new(src_path, &w));
  for (i = 0; i < 4; ++i) CHECK_OK(peft_writer_add_tensor(w, names[i], PEFT_DTYPE_F32, shape, 2));
  for (i = 0; i < 4; ++i) CHECK_OK(peft_writer_write_tensor(w, names[i], PEFT_DTYPE_F32, values[i], sizeof values[i]));
  CHECK_OK(peft_writer_finish(w));
  peft_writer_free(w);
  CHECK_OK(peft_checkpoint_open(src_path, NULL, &src));
  if (src == NULL) return;

  in_scratch("ckpt", folder, sizeof folder);
  w = NULL;
  CHECK_CODE(peft_writer_new_checkpoint(NULL, 0, &w), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_writer_new_checkpoint(folder, 1024, &w)); /* 512 bytes per bf16 tensor: 2 per shard */
  CHECK_CODE(peft_writer_set_index_metadata_json(w, "[]"), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_writer_set_index_metadata_json(w, "{\"total_parameters\": 1024}"));
  for (i = 0; i < 4; ++i) CHECK_OK(peft_writer_add_tensor(w, names[i], PEFT_DTYPE_BF16, shape, 2));
  CHECK_OK(peft_writer_start(w));
  CHECK(peft_writer_file_count(w) == 2);
  CHECK(strstr(peft_writer_file_path(w, 1), "ckpt/model-00002-of-00002.safetensors") != NULL);
  CHECK_CODE(peft_writer_write_from_checkpoint(w, peft_writer_tensor_name(w, 0), src, 99), PEFT_ERR_INVALID_ARGUMENT);
  for (p = 0; p < 4; ++p) {
    size_t index = 0;
    const char* name = peft_writer_tensor_name(w, p);
    CHECK_OK(peft_checkpoint_find(src, name, &index));
    CHECK_OK(peft_writer_write_from_checkpoint(w, name, src, index));
  }
  CHECK_OK(peft_writer_finish(w));
  peft_writer_free(w);
  CHECK(count_entries(folder, "model-0000") == 2);
  CHECK(count_entries(folder, ".peft-tmp-") == 0);
  in_scratch("ckpt/model.safetensors.index.json", index_path, sizeof index_path);
  CHECK(file_size(index_path) > 0);

  CHECK_OK(peft_checkpoint_open(folder, NULL, &out));
  if (out != NULL) {
    CHECK(peft_checkpoint_file_count(out) == 2);
    CHECK(peft_checkpoint_tensor_count(out) == 4);
    CHECK(strstr(peft_checkpoint_index_metadata_json(out), "\"total_parameters\":1024") != NULL);
    CHECK(strstr(peft_checkpoint_index_metadata_json(out), "\"total_size\":2048") != NULL);
    for (i = 0; i < 4; ++i) {
      size_t index = 0;
      uint16_t expected[256], got[256];
      CHECK_OK(peft_checkpoint_find(out, names[i], &index));
      CHECK(peft_checkpoint_tensor_dtype(out, index) == PEFT_DTYPE_BF16);
      CHECK_OK(peft_convert(PEFT_DTYPE_F32, values[i], PEFT_DTYPE_BF16, expected, 256));
      CHECK_OK(peft_checkpoint_tensor_read(out, index, PEFT_DTYPE_BF16, got, sizeof got));
      CHECK(memcmp(expected, got, sizeof got) == 0);
      CHECK(strcmp(peft_checkpoint_metadata_value(out, peft_checkpoint_tensor_file(out, index), 0), "pt") == 0);
    }
    peft_checkpoint_free(out);
  }
  /* Shape mismatch and unsupported conversion from a checkpoint source. */
  {
    const uint64_t other[1] = {256};
    w = NULL;
    CHECK_OK(peft_writer_new_checkpoint(folder, 0, &w));
    CHECK_OK(peft_writer_add_tensor(w, "flat", PEFT_DTYPE_F32, other, 1));
    CHECK_OK(peft_writer_add_tensor(w, "ints", PEFT_DTYPE_I32, shape, 2));
    CHECK_CODE(peft_writer_write_from_checkpoint(w, "flat", src, 0), PEFT_ERR_SHAPE_MISMATCH);
    CHECK_OK(peft_writer_write_tensor(w, "flat", PEFT_DTYPE_F32, values[0], sizeof values[0]));
    CHECK_CODE(peft_writer_write_from_checkpoint(w, "ints", src, 0), PEFT_ERR_UNSUPPORTED);
    peft_writer_free(w); /* unfinished: the old checkpoint stays */
    CHECK(count_entries(folder, "model-0000") == 2);
    CHECK(count_entries(folder, ".peft-tmp-") == 0);
  }
  peft_checkpoint_free(src);
}

/* Names holding NUL bytes: declared with their length, written with a NULL name ("the next"). */
static void test_names_with_nul(void) {
  char path[512];
  peft_writer* w = NULL;
  peft_checkpoint* ck = NULL;
  const char name[] = "a\0b";
  const uint64_t shape[1] = {2};
  const float values[2] = {1.f, 2.f};
  size_t index = 99;
  in_scratch("nul.safetensors", path, sizeof path);
  CHECK_OK(peft_writer_new(path, &w));
  CHECK_OK(peft_writer_add_tensor_n(w, name, 3, PEFT_DTYPE_F32, shape, 1));
  CHECK_OK(peft_writer_add_tensor(w, "a", PEFT_DTYPE_F32, shape, 1)); /* not a duplicate of "a\0b" */
  CHECK_CODE(peft_writer_add_tensor_n(w, name, 3, PEFT_DTYPE_F32, shape, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_writer_add_tensor_n(w, NULL, 3, PEFT_DTYPE_F32, shape, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(peft_writer_tensor_name_length(w, 0) == 0); /* not started */
  CHECK_OK(peft_writer_start(w));
  CHECK(peft_writer_tensor_name_length(w, 0) == 1);
  CHECK(peft_writer_tensor_name_length(w, 1) == 3);
  CHECK(memcmp(peft_writer_tensor_name(w, 1), name, 4) == 0);
  CHECK(peft_writer_tensor_name_length(w, 2) == 0);
  CHECK_OK(peft_writer_write_tensor(w, NULL, PEFT_DTYPE_F32, values, sizeof values));
  CHECK_OK(peft_writer_begin_tensor(w, NULL, PEFT_DTYPE_F32));
  CHECK_OK(peft_writer_write(w, values, sizeof values));
  CHECK_CODE(peft_writer_write_tensor(w, NULL, PEFT_DTYPE_F32, values, sizeof values), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_writer_finish(w));
  peft_writer_free(w);
  CHECK_OK(peft_checkpoint_open(path, NULL, &ck));
  if (ck == NULL) return;
  CHECK_OK(peft_checkpoint_find_n(ck, name, 3, &index));
  CHECK(index == 1);
  CHECK(peft_checkpoint_tensor_name_length(ck, 1) == 3);
  peft_checkpoint_free(ck);
}

int main(void) {
  snprintf(scratch, sizeof scratch, "/tmp/peft_test_write_XXXXXX");
  if (mkdtemp(scratch) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_one_file();
  test_metadata_states();
  test_cancel_and_free();
  test_checkpoint_folder();
  test_names_with_nul();
  remove_tree(scratch);
  return check_summary();
}
