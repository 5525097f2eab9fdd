/* Host buffers named by GGUF names, from C99: the fixture LLaMA's weights held as a llama.cpp-family
 * engine holds them (GGUF tensor names, shapes outermost first, the rows of attn_q and attn_k in the
 * converter's RoPE order, permuted here independently of the library), adapters merged through
 * peft_merge_buffer_apply and swapped through a host model with a translator for GGUF names, and
 * compared byte for byte with the same merges into HuggingFace-named buffers permuted the same way;
 * swaps back to none and unmerges restore the bytes exactly. Also: peft_translator_from_gguf on
 * GGUF files built byte by byte here, GGUF name translation, and the documented errors.
 * Prints "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peft_c.h"
#include "check.h"
#include "files.h"
#include "peft_test_paths.h"

static const char* data_path(const char* rel) {
  static char buffers[8][512];
  static int next = 0;
  char* out = buffers[next++ % 8];
  snprintf(out, sizeof buffers[0], "%s/%s", PEFT_TEST_DATA, rel);
  return out;
}

/* The fixture LLaMA: 2 attention heads, 1 key/value head, head_dim 8. */
#define HEADS 2
#define KV_HEADS 1

#define MAX_WEIGHTS 32
struct weights {
  size_t count;
  int32_t dtype;
  char hf[MAX_WEIGHTS][128];   /* HuggingFace names */
  char gguf[MAX_WEIGHTS][64];  /* GGUF names */
  uint64_t shapes[MAX_WEIGHTS][2];
  uint64_t nbytes[MAX_WEIGHTS];
  unsigned char* data[MAX_WEIGHTS];
};

/* The heads whose RoPE order a GGUF weight has (0: none). */
static uint64_t rope_heads(const char* gguf) {
  if (strstr(gguf, ".attn_q.weight") != NULL) return HEADS;
  if (strstr(gguf, ".attn_k.weight") != NULL) return KV_HEADS;
  return 0;
}

/* llama.cpp's permute: GGUF row h*d + 2i + j holds PyTorch row h*d + j*d/2 + i (heads of d rows). */
static void to_gguf_rows(unsigned char* data, uint64_t rows, uint64_t row_bytes, uint64_t heads) {
  unsigned char* copy = (unsigned char*)malloc((size_t)(rows * row_bytes));
  uint64_t d = rows / heads, r;
  memcpy(copy, data, (size_t)(rows * row_bytes));
  for (r = 0; r < rows; ++r) {
    uint64_t h = r / d, i = (r % d) / 2, j = r % 2;
    memcpy(data + r * row_bytes, copy + (h * d + j * (d / 2) + i) * row_bytes, (size_t)row_bytes);
  }
  free(copy);
}

/* Every 2-D ".weight" of the fixture that has a GGUF name, in `dtype`. */
static int load_weights(const peft_translator* gguf, int32_t dtype, struct weights* w) {
  peft_checkpoint* ckpt = NULL;
  size_t i;
  memset(w, 0, sizeof *w);
  w->dtype = dtype;
  if (peft_checkpoint_open(data_path("models/llama"), NULL, &ckpt) != NULL) return 0;
  for (i = 0; i < peft_checkpoint_tensor_count(ckpt) && w->count < MAX_WEIGHTS; ++i) {
    const char* name = peft_checkpoint_tensor_name(ckpt, i);
    const uint64_t* shape = peft_checkpoint_tensor_shape(ckpt, i);
    char* native = NULL;
    size_t k = w->count;
    peft_error* err;
    if (peft_checkpoint_tensor_ndim(ckpt, i) != 2 || strlen(name) >= sizeof w->hf[k]) continue;
    err = peft_translator_to_native(gguf, name, &native);
    if (err != NULL) { /* norms have no GGUF name */
      peft_error_free(err);
      continue;
    }
    snprintf(w->hf[k], sizeof w->hf[k], "%s", name);
    snprintf(w->gguf[k], sizeof w->gguf[k], "%s", native);
    peft_string_free(native);
    w->shapes[k][0] = shape[0];
    w->shapes[k][1] = shape[1];
    w->nbytes[k] = shape[0] * shape[1] * (peft_dtype_bits(dtype) / 8);
    w->data[k] = (unsigned char*)malloc((size_t)w->nbytes[k]);
    if (w->data[k] == NULL || peft_checkpoint_tensor_read(ckpt, i, dtype, w->data[k], w->nbytes[k]) != NULL) break;
    w->count++;
  }
  peft_checkpoint_free(ckpt);
  return w->count > 0;
}

/* HuggingFace-ordered buffers to GGUF-ordered ones. */
static void permute_all(struct weights* w) {
  size_t k;
  for (k = 0; k < w->count; ++k)
    if (rope_heads(w->gguf[k]) > 0)
      to_gguf_rows(w->data[k], w->shapes[k][0], w->nbytes[k] / w->shapes[k][0], rope_heads(w->gguf[k]));
}

static int same_weights(const struct weights* x, const struct weights* y) {
  size_t k;
  for (k = 0; k < x->count; ++k)
    if (memcmp(x->data[k], y->data[k], (size_t)x->nbytes[k]) != 0) return 0;
  return 1;
}

static void free_weights(struct weights* w) {
  size_t k;
  for (k = 0; k < w->count; ++k) free(w->data[k]);
}

/* Merges every module of an adapter into `w` with peft_merge_buffer_apply, by HuggingFace names
 * (no translator) or by GGUF names (translator `gguf`). */
static int merge_all(const char* adapter_dir, double weight, const peft_translator* gguf, struct weights* w) {
  peft_adapter* adapter = NULL;
  peft_merge_buffer_options* opts = NULL;
  size_t m, k;
  int ok = peft_adapter_open(adapter_dir, NULL, &adapter) == NULL && peft_merge_buffer_options_new(&opts) == NULL &&
           peft_merge_buffer_options_set_weight(opts, weight) == NULL &&
           peft_merge_buffer_options_set_translator(opts, gguf) == NULL;
  for (m = 0; ok && m < peft_adapter_module_count(adapter); ++m) {
    char name[160];
    snprintf(name, sizeof name, "%s.weight", peft_adapter_module_name(adapter, m));
    for (k = 0; k < w->count && strcmp(w->hf[k], name) != 0; ++k) {
    }
    if (k == w->count) {
      ok = 0;
    } else {
      peft_merge_record* record = NULL;
      peft_error* err = peft_merge_buffer_apply(adapter, gguf ? w->gguf[k] : w->hf[k], w->data[k], w->dtype,
                                                w->shapes[k], 2, NULL, 0, opts, &record);
      if (err != NULL) {
        fprintf(stderr, "merge of %s failed: %s\n", name, peft_error_message(err));
        peft_error_free(err);
        ok = 0;
      }
      peft_merge_record_free(record);
    }
  }
  peft_merge_buffer_options_free(opts);
  peft_adapter_free(adapter);
  return ok;
}

static peft_lease* acquire(peft_registry* registry, const char* name) {
  peft_lease* lease = NULL;
  CHECK_OK(peft_registry_acquire(registry, name, &lease));
  return lease;
}

static void test_names(const peft_translator* gguf) {
  char* out = NULL;
  CHECK(strcmp(peft_translator_family(gguf), "llama") == 0);
  CHECK_OK(peft_translator_to_native(gguf, "model.layers.1.mlp.down_proj.weight", &out));
  CHECK(out != NULL && strcmp(out, "blk.1.ffn_down.weight") == 0);
  peft_string_free(out);
  out = NULL;
  CHECK_OK(peft_translator_to_native(gguf, "base_model.model.model.layers.0.self_attn.q_proj.weight", &out));
  CHECK(out != NULL && strcmp(out, "blk.0.attn_q.weight") == 0);
  peft_string_free(out);
  out = NULL;
  CHECK_OK(peft_translator_to_hf(gguf, "output.weight", 0, &out));
  CHECK(out != NULL && strcmp(out, "lm_head.weight") == 0);
  peft_string_free(out);
  out = NULL;
  CHECK_OK(peft_translator_to_hf(gguf, "blk.1.attn_k.bias", 1, &out));
  CHECK(out != NULL && strcmp(out, "base_model.model.model.layers.1.self_attn.k_proj.bias") == 0);
  peft_string_free(out);
  out = NULL;
  /* Adapter factor keys and native names are not GGUF tensor names. */
  CHECK_CODE_NAMING(peft_translator_to_native(gguf, "model.layers.0.self_attn.q_proj.lora_A.weight", &out),
                    PEFT_ERR_UNRESOLVED_KEY, "GGUF");
  CHECK_CODE(peft_translator_to_hf(gguf, "transformer/layer_0/attention/query/weight", 0, &out), PEFT_ERR_UNRESOLVED_KEY);
  CHECK(out == NULL);
}

/* peft_merge_buffer_apply by GGUF names equals the HuggingFace-named merge permuted; with the
 * original rows kept, unmerging restores the bytes. */
static void test_buffer_merge(const peft_translator* gguf, int32_t dtype, const char* adapter_rel) {
  struct weights by_gguf, expected, original;
  peft_adapter* adapter = NULL;
  peft_merge_buffer_options* opts = NULL;
  peft_merge_record* record = NULL;
  size_t q;
  CHECK(load_weights(gguf, dtype, &by_gguf));
  CHECK(load_weights(gguf, dtype, &expected));
  CHECK(load_weights(gguf, dtype, &original));
  CHECK(merge_all(data_path(adapter_rel), 0.5, NULL, &expected));
  permute_all(&expected);
  permute_all(&by_gguf);
  permute_all(&original);
  CHECK(!same_weights(&by_gguf, &expected));
  CHECK(merge_all(data_path(adapter_rel), 0.5, gguf, &by_gguf));
  CHECK(same_weights(&by_gguf, &expected));

  /* One layer in and out again, by its GGUF module name. */
  for (q = 0; q < original.count && strcmp(original.gguf[q], "blk.1.attn_q.weight") != 0; ++q) {
  }
  CHECK(q < original.count);
  if (q < original.count) {
    CHECK_OK(peft_adapter_open(data_path(adapter_rel), NULL, &adapter));
    CHECK_OK(peft_merge_buffer_options_new(&opts));
    CHECK_OK(peft_merge_buffer_options_set_translator(opts, gguf));
    CHECK_OK(peft_merge_buffer_options_set_keep_original_rows(opts, 1));
    CHECK_OK(peft_merge_buffer_options_set_weight(opts, 0.5));
    memcpy(by_gguf.data[q], original.data[q], (size_t)original.nbytes[q]);
    CHECK_OK(peft_merge_buffer_apply(adapter, "blk.1.attn_q", by_gguf.data[q], dtype, original.shapes[q], 2, NULL, 0,
                                     opts, &record));
    CHECK(memcmp(by_gguf.data[q], expected.data[q], (size_t)original.nbytes[q]) == 0);
    CHECK_OK(peft_merge_record_unmerge(record, by_gguf.data[q], NULL));
    CHECK(memcmp(by_gguf.data[q], original.data[q], (size_t)original.nbytes[q]) == 0);
    peft_merge_record_free(record);
    record = NULL;
    CHECK_CODE_NAMING(peft_merge_buffer_apply(adapter, "blk.0.attn_norm.weight", by_gguf.data[q], dtype,
                                              original.shapes[q], 2, NULL, 0, opts, &record),
                      PEFT_ERR_UNRESOLVED_KEY, "blk.0.attn_norm.weight");
    peft_merge_buffer_options_free(opts);
    peft_adapter_free(adapter);
  }
  free_weights(&by_gguf);
  free_weights(&expected);
  free_weights(&original);
}

/* A host model with a translator for GGUF names swaps adapters into GGUF-ordered buffers. */
static void test_swaps(const peft_translator* gguf, int32_t dtype) {
  struct weights buffers, original, with_a, with_dora;
  peft_registry* registry = NULL;
  peft_host_model* host = NULL;
  peft_lease* lease = NULL;
  peft_swap_stats stats;
  size_t k;
  CHECK(load_weights(gguf, dtype, &buffers));
  CHECK(load_weights(gguf, dtype, &original));
  CHECK(load_weights(gguf, dtype, &with_a));
  CHECK(load_weights(gguf, dtype, &with_dora));
  CHECK(merge_all(data_path("adapters/llama_lora"), 0.75, NULL, &with_a));
  CHECK(merge_all(data_path("adapters/llama_dora"), 1.0, NULL, &with_dora));
  permute_all(&buffers);
  permute_all(&original);
  permute_all(&with_a);
  permute_all(&with_dora);

  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 24, NULL, &registry));
  CHECK_OK(peft_registry_register(registry, "a", data_path("adapters/llama_lora"), NULL));
  CHECK_OK(peft_registry_register(registry, "dora", data_path("adapters/llama_dora"), NULL));
  CHECK_OK(peft_host_model_new(&host));
  CHECK_OK(peft_host_model_set_translator(host, gguf));
  for (k = 0; k < buffers.count; ++k)
    CHECK_OK(peft_host_model_add_weight(host, buffers.gguf[k], buffers.data[k], dtype, buffers.shapes[k], 2, NULL, 0, 0));

  lease = acquire(registry, "a");
  memset(&stats, 0, sizeof stats);
  stats.size = sizeof stats;
  CHECK_OK(peft_host_model_swap(host, lease, 0.75, &stats));
  peft_lease_free(lease);
  CHECK(stats.layers_merged == 14);
  CHECK(same_weights(&buffers, &with_a));

  lease = acquire(registry, "dora");
  CHECK_OK(peft_host_model_swap(host, lease, 1.0, NULL));
  peft_lease_free(lease);
  CHECK(same_weights(&buffers, &with_dora));

  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));
  CHECK(same_weights(&buffers, &original));

  /* Arithmetic mode merges the same bytes; back in exact mode, the originals of the weights the
   * next adapter adapts go back before it goes in. */
  CHECK_OK(peft_host_model_set_exact(host, 0));
  lease = acquire(registry, "a");
  CHECK_OK(peft_host_model_swap(host, lease, 0.75, NULL));
  peft_lease_free(lease);
  CHECK(same_weights(&buffers, &with_a));
  CHECK_OK(peft_host_model_set_exact(host, 1));
  lease = acquire(registry, "a");
  CHECK_OK(peft_host_model_swap(host, lease, 0.75, NULL));
  peft_lease_free(lease);
  CHECK(same_weights(&buffers, &with_a));
  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));
  CHECK(same_weights(&buffers, &original));

  peft_host_model_free(host);
  peft_registry_free(registry);
  free_weights(&buffers);
  free_weights(&original);
  free_weights(&with_a);
  free_weights(&with_dora);
}

/* ---- GGUF files built byte by byte ---------------------------------------------------------- */

static unsigned char buf[1024];
static size_t len = 0;

static void put(const void* data, size_t n) {
  memcpy(buf + len, data, n);
  len += n;
}
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

/* A GGUF file with no tensors: general.architecture (unless NULL) and, with heads > 0, the head
 * counts. Returns the path. */
static const char* gguf_file(const char* dir, const char* file, const char* architecture, uint32_t heads,
                             uint32_t kv_heads) {
  static char path[600];
  uint64_t count = (architecture ? 1 : 0) + (heads > 0 ? 2 : 0);
  len = 0;
  put("GGUF", 4);
  put_u32(3);
  put_u64(0);
  put_u64(count);
  if (architecture) {
    char key[128];
    put_str("general.architecture"); put_u32(8); put_str(architecture);
    if (heads > 0) {
      snprintf(key, sizeof key, "%s.attention.head_count", architecture);
      put_str(key); put_u32(4); put_u32(heads);
      snprintf(key, sizeof key, "%s.attention.head_count_kv", architecture);
      put_str(key); put_u32(4); put_u32(kv_heads);
    }
  }
  snprintf(path, sizeof path, "%s/%s", dir, file);
  CHECK(write_bytes(path, buf, len));
  return path;
}

static peft_checkpoint* open_checkpoint(const char* path) {
  peft_checkpoint* ckpt = NULL;
  CHECK_OK(peft_checkpoint_open(path, NULL, &ckpt));
  return ckpt;
}

static void test_from_gguf(void) {
  char dir[] = "/tmp/peft_c_serve_gguf_XXXXXX";
  peft_checkpoint* ckpt = NULL;
  peft_translator* t = NULL;
  struct weights w;
  peft_host_model* host = NULL;
  size_t k;
  if (mkdtemp(dir) == NULL) {
    CHECK(0);
    return;
  }
  /* From the file's metadata: the same merges as peft_translator_new_gguf("llama", 2, 1). */
  ckpt = open_checkpoint(gguf_file(dir, "llama.gguf", "llama", HEADS, KV_HEADS));
  CHECK_OK(peft_translator_from_gguf(ckpt, &t));
  peft_checkpoint_free(ckpt); /* the translator copied what it needs */
  if (t != NULL) {
    test_names(t);
    test_buffer_merge(t, PEFT_DTYPE_F32, "adapters/llama_lora");
    peft_translator_free(t);
    t = NULL;
  }

  /* A file without head counts: weights in RoPE order cannot be added. */
  ckpt = open_checkpoint(gguf_file(dir, "no_heads.gguf", "llama", 0, 0));
  CHECK_OK(peft_translator_from_gguf(ckpt, &t));
  peft_checkpoint_free(ckpt);
  if (t != NULL && load_weights(t, PEFT_DTYPE_F32, &w)) {
    CHECK_OK(peft_host_model_new(&host));
    CHECK_OK(peft_host_model_set_translator(host, t));
    for (k = 0; k < w.count; ++k) {
      if (rope_heads(w.gguf[k]) > 0)
        CHECK_CODE_NAMING(peft_host_model_add_weight(host, w.gguf[k], w.data[k], PEFT_DTYPE_F32, w.shapes[k], 2, NULL, 0, 0),
                          PEFT_ERR_SHAPE_MISMATCH, "head count");
      else
        CHECK_OK(peft_host_model_add_weight(host, w.gguf[k], w.data[k], PEFT_DTYPE_F32, w.shapes[k], 2, NULL, 0, 0));
    }
    peft_host_model_free(host);
    free_weights(&w);
  }
  peft_translator_free(t);
  t = NULL;

  ckpt = open_checkpoint(gguf_file(dir, "no_arch.gguf", NULL, 0, 0));
  CHECK_CODE_NAMING(peft_translator_from_gguf(ckpt, &t), PEFT_ERR_INVALID_CHECKPOINT, "general.architecture");
  peft_checkpoint_free(ckpt);
  ckpt = open_checkpoint(gguf_file(dir, "unknown.gguf", "nosucharch", 4, 4));
  CHECK_CODE_NAMING(peft_translator_from_gguf(ckpt, &t), PEFT_ERR_UNSUPPORTED, "nosucharch");
  peft_checkpoint_free(ckpt);
  ckpt = open_checkpoint(data_path("models/llama"));
  CHECK_CODE(peft_translator_from_gguf(ckpt, &t), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_translator_from_gguf(ckpt, NULL), PEFT_ERR_INVALID_ARGUMENT);
  peft_checkpoint_free(ckpt);
  CHECK_CODE(peft_translator_from_gguf(NULL, &t), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(t == NULL);
  remove_tree(dir);
}

static void test_errors(const peft_translator* gguf) {
  peft_translator* t = NULL;
  peft_registry* registry = NULL;
  peft_host_model* host = NULL;
  struct weights w;
  size_t k;
  CHECK_CODE(peft_translator_new_gguf(NULL, 2, 1, &t), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_translator_new_gguf("llama", 2, 1, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_translator_new_gguf("llama", 0, 1, &t), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE_NAMING(peft_translator_new_gguf("nosucharch", 2, 1, &t), PEFT_ERR_UNSUPPORTED, "nosucharch");
  CHECK(t == NULL);
  /* Unmerged apply does not read GGUF names. */
  CHECK_CODE_NAMING(peft_registry_new(PEFT_DTYPE_F32, 1u << 20, gguf, &registry), PEFT_ERR_INVALID_ARGUMENT, "GGUF");
  CHECK(registry == NULL);

  /* Three heads do not split the 16 rows of attn_q; a norm has no GGUF name. */
  CHECK_OK(peft_translator_new_gguf("llama", 3, 0, &t));
  CHECK(load_weights(gguf, PEFT_DTYPE_F32, &w));
  CHECK_OK(peft_host_model_new(&host));
  CHECK_OK(peft_host_model_set_translator(host, t));
  for (k = 0; k < w.count; ++k)
    if (strcmp(w.gguf[k], "blk.0.attn_q.weight") == 0) {
      CHECK_CODE_NAMING(peft_host_model_add_weight(host, w.gguf[k], w.data[k], PEFT_DTYPE_F32, w.shapes[k], 2, NULL, 0, 0),
                        PEFT_ERR_SHAPE_MISMATCH, "blk.0.attn_q.weight");
      CHECK_CODE_NAMING(peft_host_model_add_weight(host, "blk.0.attn_norm.weight", w.data[k], PEFT_DTYPE_F32, w.shapes[k],
                                                   2, NULL, 0, 0),
                        PEFT_ERR_UNRESOLVED_KEY, "blk.0.attn_norm.weight");
      CHECK_CODE_NAMING(peft_host_model_add_weight(host, "model.layers.0.self_attn.q_proj.weight", w.data[k],
                                                   PEFT_DTYPE_F32, w.shapes[k], 2, NULL, 0, 0),
                        PEFT_ERR_UNRESOLVED_KEY, "q_proj");
    }
  peft_host_model_free(host);
  peft_translator_free(t);
  free_weights(&w);
}

int main(void) {
  struct stat st;
  peft_translator* gguf = NULL;
  const char* model_file = data_path("models/llama/model.safetensors");
  if (stat(model_file, &st) != 0) {
    printf("SKIP: fixtures not generated (%s is absent)\n", model_file);
    return 0;
  }
  CHECK_OK(peft_translator_new_gguf("llama", HEADS, KV_HEADS, &gguf));
  if (gguf != NULL) {
    test_names(gguf);
    test_buffer_merge(gguf, PEFT_DTYPE_F32, "adapters/llama_lora");
    test_buffer_merge(gguf, PEFT_DTYPE_BF16, "adapters/llama_lora");
    test_buffer_merge(gguf, PEFT_DTYPE_F16, "adapters/llama_dora");
    test_swaps(gguf, PEFT_DTYPE_F32);
    test_swaps(gguf, PEFT_DTYPE_BF16);
    test_errors(gguf);
  }
  peft_translator_free(gguf);
  test_from_gguf();
  return check_summary();
}
