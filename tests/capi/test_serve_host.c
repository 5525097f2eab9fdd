/* The host-model functions of the serving section, from C99: a registry's adapters swapped into the
 * fixture LLaMA's weights (F32 and BF16 buffers) and out again, compared with peft_merge_buffer_apply
 * byte for byte, the swap counters, and the documented errors (NULL arguments included).
 * Prints "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "peft_c.h"
#include "check.h"
#include "files.h"
#include "peft_test_paths.h"

/* A fixture path; each call returns a different one of 8 buffers, so a few may be held at once. */
static const char* data_path(const char* rel) {
  static char buffers[8][512];
  static int next = 0;
  char* out = buffers[next++ % 8];
  snprintf(out, sizeof buffers[0], "%s/%s", PEFT_TEST_DATA, rel);
  return out;
}

/* The 2-D weights of a fixture model (the 16 of the LLaMA fixture), held as the host would. */
#define MAX_WEIGHTS 32
struct host_weights {
  size_t count;
  int32_t dtype;
  char names[MAX_WEIGHTS][128];
  uint64_t shapes[MAX_WEIGHTS][2];
  uint64_t nbytes[MAX_WEIGHTS];
  unsigned char* data[MAX_WEIGHTS];
};

static int load_weights(const char* folder, int32_t dtype, struct host_weights* w) {
  peft_checkpoint* ckpt = NULL;
  size_t i;
  memset(w, 0, sizeof *w);
  w->dtype = dtype;
  if (peft_checkpoint_open(folder, NULL, &ckpt) != NULL) return 0;
  for (i = 0; i < peft_checkpoint_tensor_count(ckpt) && w->count < MAX_WEIGHTS; ++i) {
    const char* name = peft_checkpoint_tensor_name(ckpt, i);
    const uint64_t* shape = peft_checkpoint_tensor_shape(ckpt, i);
    size_t length = strlen(name);
    size_t k = w->count;
    if (peft_checkpoint_tensor_ndim(ckpt, i) != 2 || length < 7 || strcmp(name + length - 7, ".weight") != 0 ||
        length >= sizeof w->names[k])
      continue;
    memcpy(w->names[k], name, length + 1);
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

static void copy_weights(const struct host_weights* from, struct host_weights* to) {
  size_t k;
  for (k = 0; k < from->count; ++k) memcpy(to->data[k], from->data[k], (size_t)from->nbytes[k]);
}

static int same_weights(const struct host_weights* x, const struct host_weights* y) {
  size_t k;
  for (k = 0; k < x->count; ++k)
    if (memcmp(x->data[k], y->data[k], (size_t)x->nbytes[k]) != 0) return 0;
  return 1;
}

static void free_weights(struct host_weights* w) {
  size_t k;
  for (k = 0; k < w->count; ++k) free(w->data[k]);
}

static peft_error* add_all(peft_host_model* host, struct host_weights* w) {
  size_t k;
  for (k = 0; k < w->count; ++k) {
    peft_error* err = peft_host_model_add_weight(host, w->names[k], w->data[k], w->dtype, w->shapes[k], 2, NULL, 0, 0);
    if (err != NULL) return err;
  }
  return NULL;
}

/* peft_merge_buffer_apply of every module of an adapter into `w` (the reference a swap must equal
 * when the registry stores F32 factors). */
static int buffer_merge(const char* adapter_dir, double weight, struct host_weights* w) {
  peft_adapter* adapter = NULL;
  peft_merge_buffer_options* opts = NULL;
  size_t m, k;
  int ok = peft_adapter_open(adapter_dir, NULL, &adapter) == NULL && peft_merge_buffer_options_new(&opts) == NULL &&
           peft_merge_buffer_options_set_weight(opts, weight) == NULL;
  for (m = 0; ok && m < peft_adapter_module_count(adapter); ++m) {
    char name[160];
    snprintf(name, sizeof name, "%s.weight", peft_adapter_module_name(adapter, m));
    for (k = 0; k < w->count && strcmp(w->names[k], name) != 0; ++k) {
    }
    if (k == w->count) {
      ok = 0;
    } else {
      peft_merge_record* record = NULL;
      ok = peft_merge_buffer_apply(adapter, name, w->data[k], w->dtype, w->shapes[k], 2, NULL, 0, opts, &record) == NULL;
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

static void test_swaps(int32_t dtype) {
  struct host_weights buffers, original, with_a, with_b, spare;
  peft_registry* registry = NULL;
  peft_host_model* host = NULL;
  peft_host_model* arithmetic = NULL;
  peft_lease* lease = NULL;
  peft_swap_stats stats;
  uint64_t adapted_bytes = 0;
  size_t k;
  const char* a_dir = data_path("adapters/llama_lora");
  const char* llama = data_path("models/llama");
  CHECK(load_weights(llama, dtype, &buffers));
  CHECK(load_weights(llama, dtype, &original));
  CHECK(load_weights(llama, dtype, &with_a));
  CHECK(load_weights(llama, dtype, &with_b));
  CHECK(load_weights(llama, dtype, &spare));
  for (k = 0; k < buffers.count; ++k) /* the 14 projections the adapters adapt */
    if (strstr(buffers.names[k], "_proj.weight") != NULL) adapted_bytes += buffers.nbytes[k];
  CHECK(buffer_merge(a_dir, 0.75, &with_a));
  CHECK(buffer_merge(data_path("adapters/llama_lora_second"), 1.0, &with_b));

  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 24, NULL, &registry));
  CHECK_OK(peft_registry_register(registry, "a", a_dir, NULL));
  CHECK_OK(peft_registry_register(registry, "b", data_path("adapters/llama_lora_second"), NULL));
  CHECK_OK(peft_host_model_new(&host));
  CHECK_OK(add_all(host, &buffers));
  CHECK(peft_host_model_current(host) == NULL);

  /* none -> a; the caller's lease may go at once. */
  lease = acquire(registry, "a");
  memset(&stats, 0, sizeof stats);
  stats.size = sizeof stats;
  CHECK_OK(peft_host_model_swap(host, lease, 0.75, &stats));
  peft_lease_free(lease);
  CHECK(stats.size == sizeof stats);
  CHECK(stats.layers_removed == 0);
  CHECK(stats.layers_merged == 14);
  CHECK(stats.saved_bytes == adapted_bytes); /* their originals, kept from now on */
  CHECK(stats.remove_seconds >= 0 && stats.merge_seconds >= 0);
  CHECK(peft_host_model_current(host) != NULL && strcmp(peft_host_model_current(host), "a") == 0);
  CHECK(same_weights(&buffers, &with_a));

  /* a -> b, with counters only up to remove_seconds: the fields past `size` stay as they were. */
  lease = acquire(registry, "b");
  memset(&stats, 0xAB, sizeof stats);
  stats.size = 16;
  CHECK_OK(peft_host_model_swap(host, lease, 1.0, &stats));
  peft_lease_free(lease);
  CHECK(stats.size == 16);
  CHECK(stats.remove_seconds >= 0);
  CHECK(stats.layers_merged == UINT64_C(0xABABABABABABABAB));
  CHECK(strcmp(peft_host_model_current(host), "b") == 0);
  CHECK(same_weights(&buffers, &with_b));

  /* b -> none: the original bytes. */
  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));
  CHECK(peft_host_model_current(host) == NULL);
  CHECK(same_weights(&buffers, &original));

  /* Arithmetic mode (PEFT's unmerge); the originals the exact swaps kept stay. */
  CHECK_OK(peft_host_model_set_exact(host, 0));
  lease = acquire(registry, "a");
  stats.size = sizeof stats;
  CHECK_OK(peft_host_model_swap(host, lease, 0.75, &stats));
  peft_lease_free(lease);
  CHECK(stats.saved_bytes == adapted_bytes);
  CHECK(same_weights(&buffers, &with_a));
  /* Exact again with a merged arithmetically: a comes out arithmetically, then the originals go
   * back before b goes in. */
  CHECK_OK(peft_host_model_set_exact(host, 1));
  lease = acquire(registry, "b");
  CHECK_OK(peft_host_model_swap(host, lease, 1.0, NULL));
  peft_lease_free(lease);
  CHECK(same_weights(&buffers, &with_b));
  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));
  CHECK(same_weights(&buffers, &original));

  /* A host model that never merged exactly keeps nothing. */
  CHECK_OK(peft_host_model_new(&arithmetic));
  CHECK_OK(peft_host_model_set_exact(arithmetic, 0));
  CHECK_OK(add_all(arithmetic, &spare));
  lease = acquire(registry, "a");
  CHECK_OK(peft_host_model_swap(arithmetic, lease, 0.75, &stats));
  peft_lease_free(lease);
  CHECK(stats.saved_bytes == 0);
  CHECK(same_weights(&spare, &with_a));
  peft_host_model_free(arithmetic);

  /* The host model keeps its adapter after the registry is gone; freeing it leaves the buffers. */
  lease = acquire(registry, "a");
  CHECK_OK(peft_host_model_swap(host, lease, 0.75, NULL));
  peft_lease_free(lease);
  peft_registry_free(registry);
  CHECK(strcmp(peft_host_model_current(host), "a") == 0);
  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));
  CHECK(same_weights(&buffers, &original));
  peft_host_model_free(host);
  CHECK(same_weights(&buffers, &original));

  free_weights(&buffers);
  free_weights(&original);
  free_weights(&with_a);
  free_weights(&with_b);
  free_weights(&spare);
}

/* Weights named by the host's own names, read through a translator. */
static void test_translator(void) {
  struct host_weights buffers, original, with_a;
  peft_registry* registry = NULL;
  peft_host_model* host = NULL;
  peft_translator* llama = NULL;
  peft_lease* lease = NULL;
  uint64_t shape[2] = {16, 16};
  size_t k;
  CHECK(load_weights(data_path("models/llama"), PEFT_DTYPE_BF16, &buffers));
  CHECK(load_weights(data_path("models/llama"), PEFT_DTYPE_BF16, &original));
  CHECK(load_weights(data_path("models/llama"), PEFT_DTYPE_BF16, &with_a));
  CHECK(buffer_merge(data_path("adapters/llama_lora"), 1.0, &with_a));
  CHECK_OK(peft_translator_new_builtin("llama", &llama));
  CHECK_OK(peft_host_model_new(&host));
  CHECK_OK(peft_host_model_set_translator(host, llama));
  for (k = 0; k < buffers.count; ++k) {
    char* native = NULL;
    CHECK_OK(peft_translator_to_native(llama, buffers.names[k], &native));
    if (native != NULL)
      CHECK_OK(peft_host_model_add_weight(host, native, buffers.data[k], PEFT_DTYPE_BF16, buffers.shapes[k], 2, NULL, 0, 0));
    peft_string_free(native);
  }
  peft_translator_free(llama); /* the host model shares the table */
  CHECK_CODE(peft_host_model_set_translator(host, NULL), PEFT_ERR_INVALID_ARGUMENT); /* weights were added */
  CHECK_CODE(peft_host_model_add_weight(host, "no/such/thing", buffers.data[0], PEFT_DTYPE_BF16, shape, 2, NULL, 0, 0),
             PEFT_ERR_UNRESOLVED_KEY);

  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 24, NULL, &registry));
  CHECK_OK(peft_registry_register(registry, "a", data_path("adapters/llama_lora"), NULL));
  lease = acquire(registry, "a");
  CHECK_OK(peft_host_model_swap(host, lease, 1.0, NULL));
  CHECK(same_weights(&buffers, &with_a));
  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));
  CHECK(same_weights(&buffers, &original));
  peft_lease_free(lease);
  peft_registry_free(registry);
  peft_host_model_free(host);
  free_weights(&buffers);
  free_weights(&original);
  free_weights(&with_a);
}

static void test_errors(void) {
  struct host_weights buffers, merged;
  peft_registry* registry = NULL;
  peft_host_model* host = NULL;
  peft_lease* all = NULL;
  peft_lease* attention = NULL;
  peft_lease* classifier = NULL;
  uint64_t shape[2] = {16, 16};
  uint64_t zero[2] = {16, 0};
  uint64_t five[5] = {1, 4, 4, 16, 1};
  size_t k;
  CHECK(load_weights(data_path("models/llama"), PEFT_DTYPE_BF16, &buffers));
  CHECK(load_weights(data_path("models/llama"), PEFT_DTYPE_BF16, &merged));

  CHECK_CODE(peft_host_model_new(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_host_model_set_translator(NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_host_model_set_exact(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_host_model_add_weight(NULL, "w", buffers.data[0], PEFT_DTYPE_BF16, shape, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_host_model_swap(NULL, NULL, 1.0, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(peft_host_model_current(NULL) == NULL);
  peft_host_model_free(NULL);

  CHECK_OK(peft_host_model_new(&host));
  CHECK_CODE(peft_host_model_add_weight(host, NULL, buffers.data[0], PEFT_DTYPE_BF16, shape, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_host_model_add_weight(host, "w", NULL, PEFT_DTYPE_BF16, shape, 2, NULL, 0, 0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_host_model_add_weight(host, "w", buffers.data[0], PEFT_DTYPE_BF16, NULL, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_host_model_add_weight(host, "w", buffers.data[0], PEFT_DTYPE_I32, shape, 2, NULL, 0, 0),
             PEFT_ERR_UNSUPPORTED);
  CHECK_CODE(peft_host_model_add_weight(host, "w", buffers.data[0], PEFT_DTYPE_BF16, shape, 2, buffers.data[1], 99, 4),
             PEFT_ERR_UNSUPPORTED);
  CHECK_CODE(peft_host_model_add_weight(host, "w", buffers.data[0], PEFT_DTYPE_BF16, zero, 2, NULL, 0, 0),
             PEFT_ERR_SHAPE_MISMATCH);
  /* 2 dimensions, 3 for a fused expert parameter, 4 for Conv2d. */
  CHECK_CODE(peft_host_model_add_weight(host, "w", buffers.data[0], PEFT_DTYPE_BF16, five, 5, NULL, 0, 0),
             PEFT_ERR_SHAPE_MISMATCH);
  CHECK_CODE(peft_host_model_add_weight(host, "w", buffers.data[0], PEFT_DTYPE_BF16, five, 1, NULL, 0, 0),
             PEFT_ERR_SHAPE_MISMATCH);

  /* Only the attention projections. */
  for (k = 0; k < buffers.count; ++k)
    if (strstr(buffers.names[k], "self_attn") != NULL)
      CHECK_OK(peft_host_model_add_weight(host, buffers.names[k], buffers.data[k], PEFT_DTYPE_BF16, buffers.shapes[k], 2,
                                          NULL, 0, 0));
  CHECK_CODE_NAMING(peft_host_model_add_weight(host, "model.layers.0.self_attn.q_proj", buffers.data[0], PEFT_DTYPE_BF16,
                                               shape, 2, NULL, 0, 0),
                    PEFT_ERR_INVALID_ARGUMENT, "model.layers.0.self_attn.q_proj");

  CHECK_OK(peft_registry_new(PEFT_DTYPE_BF16, 1u << 24, NULL, &registry));
  CHECK_OK(peft_registry_register(registry, "all", data_path("adapters/llama_lora"), NULL));
  CHECK_OK(peft_registry_register(registry, "attention", data_path("adapters/llama_rslora"), NULL));
  CHECK_OK(peft_registry_register(registry, "classifier", data_path("adapters/bert_seqcls_lora"), NULL));
  all = acquire(registry, "all");
  attention = acquire(registry, "attention");
  classifier = acquire(registry, "classifier");

  CHECK_OK(peft_host_model_swap(host, attention, 1.0, NULL));
  copy_weights(&buffers, &merged); /* what a refused swap must leave */
  CHECK_CODE_NAMING(peft_host_model_swap(host, all, 1.0, NULL), PEFT_ERR_UNRESOLVED_KEY, "model.layers.1.mlp.gate_proj");
  CHECK_CODE_NAMING(peft_host_model_swap(host, classifier, 1.0, NULL), PEFT_ERR_UNSUPPORTED, "modules_to_save");
  CHECK_CODE(peft_host_model_swap(host, all, NAN, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE_NAMING(peft_host_model_swap(host, attention, 1e39, NULL), PEFT_ERR_INVALID_ARGUMENT, "merge weight 1e+39");
  CHECK_CODE(peft_host_model_add_weight(host, "extra", buffers.data[0], PEFT_DTYPE_BF16, shape, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK(same_weights(&buffers, &merged));
  CHECK(strcmp(peft_host_model_current(host), "attention") == 0);
  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));

  peft_lease_free(all);
  peft_lease_free(attention);
  peft_lease_free(classifier);
  peft_registry_free(registry);
  peft_host_model_free(host);
  free_weights(&buffers);
  free_weights(&merged);
}

/* Tied embeddings in a host model: one buffer (a vocabulary of 64, hidden 16) given under both
 * names. An adapter writing LoRA factors (F32, small integers) on the embedding, on lm_head, or on
 * both with ensure_weight_tying (lm_head's factors the embedding's, transposed: the same change). */
enum { VOCAB = 64, HIDDEN = 16, RANK = 2 };

static void write_tied_adapter(const char* dir, int embed, int head, int tied) {
  char config[400], path[600];
  float ea[RANK * VOCAB], eb[HIDDEN * RANK], ha[RANK * HIDDEN], hb[VOCAB * RANK];
  const uint64_t ea_shape[2] = {RANK, VOCAB}, eb_shape[2] = {HIDDEN, RANK};
  const uint64_t ha_shape[2] = {RANK, HIDDEN}, hb_shape[2] = {VOCAB, RANK};
  peft_writer* writer = NULL;
  size_t i, j;
  for (i = 0; i < RANK * VOCAB; ++i) ea[i] = (float)((int)(i % 5) - 2) * 0.125f;
  for (i = 0; i < HIDDEN * RANK; ++i) eb[i] = (float)((int)(i % 7) - 3) * 0.25f;
  for (i = 0; i < RANK; ++i) /* lm_head's lora_A = the embedding's lora_B transposed, lora_B = its lora_A transposed */
    for (j = 0; j < HIDDEN; ++j) ha[i * HIDDEN + j] = tied ? eb[j * RANK + i] : (float)((int)((i + j) % 3) - 1) * 0.5f;
  for (i = 0; i < VOCAB; ++i)
    for (j = 0; j < RANK; ++j) hb[i * RANK + j] = tied ? ea[j * VOCAB + i] : (float)((int)((i * j) % 4) - 2) * 0.25f;
  snprintf(config, sizeof config,
           "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %d, \"target_modules\": [%s%s%s], "
           "\"ensure_weight_tying\": %s}",
           RANK, RANK, embed ? "\"embed_tokens\"" : "", embed && head ? ", " : "", head ? "\"lm_head\"" : "",
           tied ? "true" : "false");
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  CHECK(write_bytes(path, config, strlen(config)));
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  CHECK_OK(peft_writer_new(path, &writer));
  if (embed) {
    CHECK_OK(peft_writer_add_tensor(writer, "base_model.model.model.embed_tokens.lora_embedding_A", PEFT_DTYPE_F32, ea_shape, 2));
    CHECK_OK(peft_writer_add_tensor(writer, "base_model.model.model.embed_tokens.lora_embedding_B", PEFT_DTYPE_F32, eb_shape, 2));
  }
  if (head) {
    CHECK_OK(peft_writer_add_tensor(writer, "base_model.model.lm_head.lora_A.weight", PEFT_DTYPE_F32, ha_shape, 2));
    CHECK_OK(peft_writer_add_tensor(writer, "base_model.model.lm_head.lora_B.weight", PEFT_DTYPE_F32, hb_shape, 2));
  }
  CHECK_OK(peft_writer_start(writer)); /* written in the header's (sorted) order */
  if (head) {
    CHECK_OK(peft_writer_write_tensor(writer, "base_model.model.lm_head.lora_A.weight", PEFT_DTYPE_F32, ha, sizeof ha));
    CHECK_OK(peft_writer_write_tensor(writer, "base_model.model.lm_head.lora_B.weight", PEFT_DTYPE_F32, hb, sizeof hb));
  }
  if (embed) {
    CHECK_OK(peft_writer_write_tensor(writer, "base_model.model.model.embed_tokens.lora_embedding_A", PEFT_DTYPE_F32, ea, sizeof ea));
    CHECK_OK(peft_writer_write_tensor(writer, "base_model.model.model.embed_tokens.lora_embedding_B", PEFT_DTYPE_F32, eb, sizeof eb));
  }
  CHECK_OK(peft_writer_finish(writer));
  peft_writer_free(writer);
}

/* One buffer under "model.embed_tokens.weight" and "lm_head.weight": an adapter changing one name
 * alone, or both by layers of their own, is refused before a byte changes (UNSUPPORTED naming both
 * names and the way out); ensure_weight_tying's one change is merged once (as
 * peft_merge_buffer_apply of the embedding alone), and taken out again. */
static void test_tied_embeddings(void) {
  static float shared[VOCAB * HIDDEN], before[VOCAB * HIDDEN], expected[VOCAB * HIDDEN];
  const uint64_t shape[2] = {VOCAB, HIDDEN}, other[2] = {HIDDEN, VOCAB};
  char scratch[] = "/tmp/peft_host_tied_XXXXXX", dir[4][300];
  const char* names[4] = {"embed", "head", "both", "tied"};
  peft_registry* registry = NULL;
  peft_host_model* host = NULL;
  peft_adapter* adapter = NULL;
  peft_merge_record* record = NULL;
  peft_lease* lease = NULL;
  size_t i;
  for (i = 0; i < VOCAB * HIDDEN; ++i) shared[i] = (float)((int)(i % 11) - 5) * 0.0625f;
  memcpy(before, shared, sizeof shared);
  memcpy(expected, shared, sizeof shared);
  CHECK(mkdtemp(scratch) != NULL);
  for (i = 0; i < 4; ++i) snprintf(dir[i], sizeof dir[i], "%s/%s", scratch, names[i]);
  write_tied_adapter(dir[0], 1, 0, 0);
  write_tied_adapter(dir[1], 0, 1, 0);
  write_tied_adapter(dir[2], 1, 1, 0);
  write_tied_adapter(dir[3], 1, 1, 1);

  CHECK_OK(peft_host_model_new(&host));
  CHECK_OK(peft_host_model_add_weight(host, "model.embed_tokens.weight", shared, PEFT_DTYPE_F32, shape, 2, NULL, 0, 0));
  CHECK_CODE_NAMING(peft_host_model_add_weight(host, "lm_head.weight", shared, PEFT_DTYPE_F32, other, 2, NULL, 0, 0),
                    PEFT_ERR_INVALID_ARGUMENT, "model.embed_tokens.weight");
  CHECK_CODE_NAMING(peft_host_model_add_weight(host, "lm_head.weight", shared, PEFT_DTYPE_BF16, shape, 2, NULL, 0, 0),
                    PEFT_ERR_INVALID_ARGUMENT, "another dtype or shape");
  CHECK_OK(peft_host_model_add_weight(host, "lm_head.weight", shared, PEFT_DTYPE_F32, shape, 2, NULL, 0, 0));
  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 24, NULL, &registry));
  for (i = 0; i < 4; ++i) CHECK_OK(peft_registry_register(registry, names[i], dir[i], NULL));

  for (i = 0; i < 3; ++i) {
    lease = acquire(registry, names[i]);
    CHECK_CODE_NAMING(peft_host_model_swap(host, lease, 1.0, NULL), PEFT_ERR_UNSUPPORTED, "\"lm_head.weight\"");
    CHECK_CODE_NAMING(peft_host_model_swap(host, lease, 1.0, NULL), PEFT_ERR_UNSUPPORTED, "\"model.embed_tokens.weight\"");
    CHECK_CODE_NAMING(peft_host_model_swap(host, lease, 1.0, NULL), PEFT_ERR_UNSUPPORTED, "a buffer of its own for each name");
    peft_lease_free(lease);
    CHECK(memcmp(shared, before, sizeof shared) == 0);
    CHECK(peft_host_model_current(host) == NULL);
  }

  CHECK_OK(peft_adapter_open(dir[3], NULL, &adapter));
  CHECK_OK(peft_merge_buffer_apply(adapter, "model.embed_tokens.weight", expected, PEFT_DTYPE_F32, shape, 2, NULL, 0,
                                   NULL, &record));
  lease = acquire(registry, "tied");
  CHECK_OK(peft_host_model_swap(host, lease, 1.0, NULL));
  peft_lease_free(lease);
  CHECK(memcmp(shared, expected, sizeof shared) == 0); /* the change once, not twice */
  CHECK(memcmp(shared, before, sizeof shared) != 0);
  CHECK_OK(peft_host_model_swap(host, NULL, 1.0, NULL));
  CHECK(memcmp(shared, before, sizeof shared) == 0);

  peft_merge_record_free(record);
  peft_adapter_free(adapter);
  peft_registry_free(registry);
  peft_host_model_free(host);
  remove_tree(scratch);
}

int main(void) {
  struct stat st;
  const char* model_file = data_path("models/llama/model.safetensors");
  if (stat(model_file, &st) != 0) {
    printf("SKIP: fixtures not generated (%s is absent)\n", model_file);
    return 0;
  }
  test_swaps(PEFT_DTYPE_F32);
  test_swaps(PEFT_DTYPE_BF16);
  test_translator();
  test_errors();
  test_tied_embeddings();
  return check_summary();
}
