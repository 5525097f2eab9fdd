/* Split GGUF models through the C API, on files built byte by byte here: a model of two parts
 * (model-00001-of-00002.gguf, model-00002-of-00002.gguf) opens as one from either part; a missing
 * part, a duplicated part and a tensor total that disagrees are #PEFT_ERR_INVALID_CHECKPOINT naming
 * the part; a GGUF LoRA merged into the split base gives the same two parts (split keys kept), or one
 * joined file with peft_merge_options_set_join_split(), holding the same values.
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

static unsigned char buf[4096];
static size_t len = 0;

static void put(const void* data, size_t n) {
  memcpy(buf + len, data, n);
  len += n;
}
static void put_u16(uint16_t v) {
  unsigned char b[2];
  b[0] = (unsigned char)(v & 0xFF);
  b[1] = (unsigned char)(v >> 8);
  put(b, 2);
}
static void put_u32(uint32_t v) {
  unsigned char b[4];
  int i;
  for (i = 0; i < 4; ++i) b[i] = (unsigned char)((v >> (8 * i)) & 0xFF);
  put(b, 4);
}
static void put_u64(uint64_t v) {
  unsigned char b[8];
  int i;
  for (i = 0; i < 8; ++i) b[i] = (unsigned char)((v >> (8 * i)) & 0xFF);
  put(b, 8);
}
static void put_str(const char* s) {
  put_u64(strlen(s));
  put(s, strlen(s));
}
static void pad_to_32(void) {
  while (len % 32 != 0) buf[len++] = 0;
}

/* One GGUF file of F32 tensors of 2 x 2 values (ne [2, 2]); metadata as the callers put it. */
struct Kv {
  const char* key;
  uint32_t type; /* PEFT_GGUF_U16, PEFT_GGUF_I32, PEFT_GGUF_STRING or PEFT_GGUF_F32 */
  uint32_t number;
  const char* text;
  float real;
};

static int write_gguf(const char* path, const struct Kv* kvs, size_t n_kv, const char* const* names, size_t n_tensors,
                      float first_value) {
  size_t i;
  len = 0;
  put("GGUF", 4);
  put_u32(3);
  put_u64(n_tensors);
  put_u64(n_kv);
  for (i = 0; i < n_kv; ++i) {
    put_str(kvs[i].key);
    put_u32(kvs[i].type);
    if (kvs[i].type == PEFT_GGUF_U16) put_u16((uint16_t)kvs[i].number);
    if (kvs[i].type == PEFT_GGUF_I32) put_u32(kvs[i].number);
    if (kvs[i].type == PEFT_GGUF_STRING) put_str(kvs[i].text);
    if (kvs[i].type == PEFT_GGUF_F32) put(&kvs[i].real, 4);
  }
  for (i = 0; i < n_tensors; ++i) {
    put_str(names[i]);
    put_u32(2);
    put_u64(2);
    put_u64(2);
    put_u32(0); /* F32 */
    put_u64(32 * i);
  }
  pad_to_32();
  for (i = 0; i < n_tensors; ++i) {
    float values[4];
    int k;
    for (k = 0; k < 4; ++k) values[k] = first_value + (float)(i * 4 + (size_t)k) * 0.25f;
    put(values, sizeof values);
    pad_to_32();
  }
  return write_bytes(path, buf, len);
}

static char dir[] = "/tmp/peft_capi_gguf_split_XXXXXX";
static char part1[256], part2[256], lora[256], out[256], out1[256], out2[256], joined[256];

static const char* const kPart1Tensors[] = {"blk.0.attn_v.weight"};
static const char* const kPart2Tensors[] = {"blk.0.ffn_down.weight"};

/* Part `no` (0 or 1) with split.tensors.count `total`, holding `names`. */
static int write_part(const char* path, uint32_t no, uint32_t total, const char* const* names) {
  struct Kv kvs[5];
  size_t n = 0;
  if (no == 0) {
    kvs[n].key = "general.architecture";
    kvs[n].type = PEFT_GGUF_STRING;
    kvs[n++].text = "llama";
  }
  kvs[n].key = "split.no";
  kvs[n].type = PEFT_GGUF_U16;
  kvs[n++].number = no;
  kvs[n].key = "split.tensors.count";
  kvs[n].type = PEFT_GGUF_I32;
  kvs[n++].number = total;
  kvs[n].key = "split.count";
  kvs[n].type = PEFT_GGUF_U16;
  kvs[n++].number = 2;
  return write_gguf(path, kvs, n, names, 1, no == 0 ? 1.0f : -1.0f);
}

static void write_model(void) {
  CHECK(write_part(part1, 0, 2, kPart1Tensors));
  CHECK(write_part(part2, 1, 2, kPart2Tensors));
}

static float first_value(const peft_checkpoint* ckpt, const char* name) {
  size_t index = 0;
  float values[4] = {0, 0, 0, 0};
  CHECK_OK(peft_checkpoint_find(ckpt, name, &index));
  CHECK_OK(peft_checkpoint_tensor_read(ckpt, index, PEFT_DTYPE_F32, values, sizeof values));
  return values[0];
}

static void test_open(void) {
  peft_checkpoint* ckpt = NULL;
  write_model();
  CHECK_OK(peft_checkpoint_open(part2, NULL, &ckpt));
  if (ckpt != NULL) {
    CHECK(peft_checkpoint_file_count(ckpt) == 2);
    CHECK(strcmp(peft_checkpoint_file_path(ckpt, 0), part1) == 0);
    CHECK(strcmp(peft_checkpoint_file_path(ckpt, 1), part2) == 0);
    CHECK(peft_checkpoint_tensor_count(ckpt) == 2);
    CHECK(strcmp(peft_checkpoint_tensor_name(ckpt, 0), "blk.0.attn_v.weight") == 0);
    CHECK(peft_checkpoint_tensor_file(ckpt, 1) == 1);
    CHECK(first_value(ckpt, "blk.0.ffn_down.weight") == -1.0f);
    peft_checkpoint_free(ckpt);
    ckpt = NULL;
  }

  /* A missing part. */
  CHECK(unlink(part2) == 0);
  CHECK_CODE_NAMING(peft_checkpoint_open(part1, NULL, &ckpt), PEFT_ERR_INVALID_CHECKPOINT, part2);
  CHECK(ckpt == NULL);
  /* A duplicated part: the first part copied as the second. */
  CHECK(copy_file(part1, part2));
  CHECK_CODE_NAMING(peft_checkpoint_open(part1, NULL, &ckpt), PEFT_ERR_INVALID_CHECKPOINT, "split.no is 0, not 1");
  /* A tensor total that disagrees with the parts. */
  CHECK(write_part(part1, 0, 3, kPart1Tensors));
  CHECK(write_part(part2, 1, 3, kPart2Tensors));
  CHECK_CODE_NAMING(peft_checkpoint_open(part2, NULL, &ckpt), PEFT_ERR_INVALID_CHECKPOINT,
                    "split.tensors.count is 3, but the 2 parts hold 2 tensors");
  CHECK(ckpt == NULL);
  write_model();
}

static void merge(const char* base, const char* out_path, int32_t join, peft_merge_result** result) {
  peft_merge_options* opts = NULL;
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, lora, 1.0));
  CHECK_OK(peft_merge_options_set_join_split(opts, join));
  CHECK_OK(peft_merge_checkpoint(base, out_path, opts, result));
  peft_merge_options_free(opts);
}

static void test_merge(void) {
  static const char* const kLora[] = {"blk.0.ffn_down.weight.lora_a", "blk.0.ffn_down.weight.lora_b"};
  struct Kv kvs[4];
  peft_merge_result* result = NULL;
  peft_checkpoint* ckpt = NULL;
  float merged = 0.0f;
  kvs[0].key = "general.architecture";
  kvs[0].type = PEFT_GGUF_STRING;
  kvs[0].text = "llama";
  kvs[1].key = "general.type";
  kvs[1].type = PEFT_GGUF_STRING;
  kvs[1].text = "adapter";
  kvs[2].key = "adapter.type";
  kvs[2].type = PEFT_GGUF_STRING;
  kvs[2].text = "lora";
  kvs[3].key = "adapter.lora.alpha";
  kvs[3].type = PEFT_GGUF_F32;
  kvs[3].real = 2.0f;
  CHECK(write_gguf(lora, kvs, 4, kLora, 2, 0.5f));  /* rank 2: A and B both 2 x 2 */

  CHECK_CODE(peft_merge_options_set_join_split(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  merge(part1, out, 0, &result);
  if (result != NULL) {
    CHECK(peft_merge_result_file_count(result) == 2);
    CHECK(strcmp(peft_merge_result_file_name(result, 0), "out-00001-of-00002.gguf") == 0);
    CHECK(strcmp(peft_merge_result_file_name(result, 1), "out-00002-of-00002.gguf") == 0);
    peft_merge_result_free(result);
    result = NULL;
  }
  CHECK_OK(peft_checkpoint_open(out1, NULL, &ckpt));
  if (ckpt != NULL) {
    size_t kv = 0;
    uint64_t value = 0;
    CHECK(peft_checkpoint_file_count(ckpt) == 2);
    CHECK(strcmp(peft_checkpoint_file_path(ckpt, 1), out2) == 0);
    CHECK_OK(peft_checkpoint_gguf_kv_find(ckpt, 1, "split.no", &kv));
    CHECK_OK(peft_checkpoint_gguf_kv_uint(ckpt, 1, kv, 0, &value));
    CHECK(value == 1);
    CHECK(first_value(ckpt, "blk.0.attn_v.weight") == 1.0f); /* copied */
    merged = first_value(ckpt, "blk.0.ffn_down.weight");
    CHECK(merged != -1.0f);
    peft_checkpoint_free(ckpt);
    ckpt = NULL;
  }

  merge(part2, joined, 1, &result);
  if (result != NULL) {
    CHECK(peft_merge_result_file_count(result) == 1);
    peft_merge_result_free(result);
  }
  CHECK_OK(peft_checkpoint_open(joined, NULL, &ckpt));
  if (ckpt != NULL) {
    size_t kv = 0;
    uint64_t value = 7;
    CHECK(peft_checkpoint_file_count(ckpt) == 1);
    CHECK_OK(peft_checkpoint_gguf_kv_find(ckpt, 0, "split.count", &kv));
    CHECK(kv == peft_checkpoint_gguf_kv_count(ckpt, 0) - 1);
    CHECK_OK(peft_checkpoint_gguf_kv_uint(ckpt, 0, kv, 0, &value));
    CHECK(value == 0);
    CHECK(first_value(ckpt, "blk.0.ffn_down.weight") == merged);
    peft_checkpoint_free(ckpt);
  }
}

int main(void) {
  if (mkdtemp(dir) == NULL) {
    fprintf(stderr, "mkdtemp failed\n");
    return 1;
  }
  snprintf(part1, sizeof part1, "%s/model-00001-of-00002.gguf", dir);
  snprintf(part2, sizeof part2, "%s/model-00002-of-00002.gguf", dir);
  snprintf(lora, sizeof lora, "%s/lora.gguf", dir);
  snprintf(out, sizeof out, "%s/out.gguf", dir);
  snprintf(out1, sizeof out1, "%s/out-00001-of-00002.gguf", dir);
  snprintf(out2, sizeof out2, "%s/out-00002-of-00002.gguf", dir);
  snprintf(joined, sizeof joined, "%s/joined.gguf", dir);
  test_open();
  test_merge();
  remove_tree(dir);
  return check_summary();
}
