/* The merge section of the C API, from C99: every function of checkpoint merges (options, result,
 * progress and cancellation) and of buffer merges (options, apply, remove, records), with the
 * documented errors. Prints "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
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

static char scratch[256];
static char path_buf[512];

static const char* data_path(const char* rel) {
  snprintf(path_buf, sizeof path_buf, "%s/%s", PEFT_TEST_DATA, rel);
  return path_buf;
}

static const char* scratch_path(const char* rel) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", scratch, rel);
  return buf;
}

struct progress_log {
  uint64_t calls;
  uint64_t last_done;
  uint64_t total;
  int monotone;
  uint64_t cancel_at; /* 0: never */
};

static int32_t on_progress(void* user, uint64_t done, uint64_t total) {
  struct progress_log* log = (struct progress_log*)user;
  if (log->calls > 0 && done < log->last_done) log->monotone = 0;
  log->calls++;
  log->last_done = done;
  log->total = total;
  return log->cancel_at != 0 && log->calls >= log->cancel_at ? 1 : 0;
}

/* A tensor of a checkpoint folder read as `dtype`, malloc'd; *nbytes receives its size. */
static void* read_tensor(const char* folder, const char* name, int32_t dtype, uint64_t* nbytes) {
  peft_checkpoint* ckpt = NULL;
  size_t index = 0;
  uint64_t elements = 1;
  size_t d;
  void* data = NULL;
  if (peft_checkpoint_open(folder, NULL, &ckpt) != NULL) return NULL;
  if (peft_checkpoint_find(ckpt, name, &index) == NULL) {
    for (d = 0; d < peft_checkpoint_tensor_ndim(ckpt, index); ++d) elements *= peft_checkpoint_tensor_shape(ckpt, index)[d];
    *nbytes = elements * (peft_dtype_bits(dtype) / 8);
    data = malloc((size_t)*nbytes);
    if (data != NULL && peft_checkpoint_tensor_read(ckpt, index, dtype, data, *nbytes) != NULL) {
      free(data);
      data = NULL;
    }
  }
  peft_checkpoint_free(ckpt);
  return data;
}

static void test_checkpoint_options(void) {
  peft_merge_options* opts = NULL;
  peft_adapter* adapter = NULL;
  CHECK_CODE(peft_merge_options_new(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_adapter_open(data_path("adapters/llama_lora"), NULL, &adapter));
  CHECK_CODE(peft_merge_options_add_adapter(NULL, adapter, 1.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter(opts, NULL, 1.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter(opts, adapter, NAN), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter(opts, adapter, INFINITY), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter_dir(NULL, "x", 1.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter_dir(opts, NULL, 1.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter_dir(opts, "", 1.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter_dir(opts, "x", NAN), PEFT_ERR_INVALID_ARGUMENT);
  /* a weight beyond the f32 range is refused when given, naming it (not reported later as "weight
   * 1.0 times scale inf") */
  CHECK_CODE(peft_merge_options_add_adapter(opts, adapter, 1e39), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_add_adapter_dir(opts, "x", -1e39), PEFT_ERR_INVALID_ARGUMENT);
  {
    peft_error* err = peft_merge_options_add_adapter_dir(opts, "x", 1e39);
    CHECK(err != NULL && strstr(peft_error_message(err), "the merge weight 1e+39 is not a finite 32-bit float") != NULL);
    peft_error_free(err);
  }
  CHECK_CODE(peft_merge_options_set_dtype(NULL, PEFT_DTYPE_F32), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_set_dtype(opts, PEFT_DTYPE_I32), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_set_dtype(opts, PEFT_DTYPE_F64), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_set_dtype(opts, PEFT_DTYPE_F16));
  CHECK_OK(peft_merge_options_set_dtype(opts, PEFT_DTYPE_BF16));
  CHECK_OK(peft_merge_options_set_dtype(opts, PEFT_DTYPE_F32));
  CHECK_OK(peft_merge_options_set_dtype(opts, PEFT_MERGE_DTYPE_KEEP));
  CHECK_CODE(peft_merge_options_set_max_shard_size(NULL, 0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_set_max_shard_size(opts, 0));
  CHECK_CODE(peft_merge_options_set_threads(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_set_threads(opts, 2));
  CHECK_CODE(peft_merge_options_set_progress(NULL, on_progress, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_set_progress(opts, NULL, NULL));

  /* No adapter yet. */
  CHECK_CODE_NAMING(peft_merge_checkpoint(data_path("models/llama"), scratch_path("none"), opts, NULL),
                    PEFT_ERR_INVALID_ARGUMENT, "no adapter");
  CHECK_OK(peft_merge_options_add_adapter(opts, adapter, 1.0));
  peft_adapter_free(adapter); /* the options keep their own reference */
  CHECK_CODE(peft_merge_checkpoint(NULL, scratch_path("x"), opts, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_checkpoint(data_path("models/llama"), NULL, opts, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_checkpoint(data_path("models/llama"), scratch_path("x"), NULL, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_checkpoint(data_path("models/llama"), data_path("models/llama"), opts, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_checkpoint(data_path("models/no_such_model"), scratch_path("x"), opts, NULL),
             PEFT_ERR_NOT_FOUND);
  CHECK(!exists(scratch_path("x")));
  /* Without a result. */
  CHECK_OK(peft_merge_checkpoint(data_path("models/llama"), scratch_path("plain"), opts, NULL));
  CHECK(exists(scratch_path("plain/model.safetensors")));
  peft_merge_options_free(opts);
  peft_merge_options_free(NULL);
}

/* peft_merge_options_set_require_config() and peft_merge_options_set_allow_nonfinite(): a base
 * folder without config.json is refused (NOT_FOUND, nothing written) unless no config is required. */
static void test_checkpoint_inputs(void) {
  char base[512], out[512], file[600], model[600];
  peft_merge_options* opts = NULL;
  CHECK_CODE(peft_merge_options_set_require_config(NULL, 0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_options_set_allow_nonfinite(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(peft_error_code_name(PEFT_ERR_NON_FINITE), "NON_FINITE") == 0);
  snprintf(base, sizeof base, "%s", scratch_path("noconfig"));
  snprintf(out, sizeof out, "%s", scratch_path("noconfig_out"));
  snprintf(model, sizeof model, "%s", data_path("models/llama/model.safetensors"));
  snprintf(file, sizeof file, "%s/model.safetensors", base);
  CHECK(mkdir(base, 0755) == 0);
  CHECK(copy_file(model, file));
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/llama_lora"), 1.0));
  CHECK_CODE_NAMING(peft_merge_checkpoint(base, out, opts, NULL), PEFT_ERR_NOT_FOUND, "config.json");
  CHECK(!exists(out));
  CHECK_OK(peft_merge_options_set_require_config(opts, 0));
  CHECK_OK(peft_merge_options_set_allow_nonfinite(opts, 1));
  CHECK_OK(peft_merge_checkpoint(base, out, opts, NULL));
  snprintf(file, sizeof file, "%s/model.safetensors", out);
  CHECK(exists(file));
  snprintf(file, sizeof file, "%s/config.json", out);
  CHECK(!exists(file));
  peft_merge_options_free(opts);
}

static void test_checkpoint_merge(void) {
  peft_merge_options* opts = NULL;
  peft_merge_result* result = NULL;
  struct progress_log plog = {0, 0, 0, 1, 0};
  size_t i;
  int saw_config = 0;
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/llama_lora"), 0.5));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/llama_lora_second"), 0.5));
  CHECK_OK(peft_merge_options_set_dtype(opts, PEFT_DTYPE_BF16));
  CHECK_OK(peft_merge_options_set_max_shard_size(opts, 10000));
  CHECK_OK(peft_merge_options_set_threads(opts, 0));
  CHECK_OK(peft_merge_options_set_progress(opts, on_progress, &plog));
  CHECK_OK(peft_merge_checkpoint(data_path("models/llama"), scratch_path("two"), opts, &result));
  CHECK(result != NULL);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_MERGED) == 14);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_REPLACED) == 0);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_COPIED) == 7);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_ADDED) == 0);
  CHECK(peft_merge_result_tensor_count(result, 99) == 0);
  CHECK(peft_merge_result_bytes(result) == 6736 * 2);
  CHECK(peft_merge_result_file_count(result) >= 4);
  CHECK(strcmp(peft_merge_result_file_name(result, 0), "model-00001-of-00002.safetensors") == 0);
  for (i = 0; i < peft_merge_result_file_count(result); ++i) {
    saw_config = saw_config || strcmp(peft_merge_result_file_name(result, i), "config.json") == 0;
  }
  CHECK(saw_config);
  CHECK(peft_merge_result_file_name(result, peft_merge_result_file_count(result)) == NULL);
  CHECK(peft_merge_result_untied_embeddings(result) == 0);
  CHECK(peft_merge_result_note_count(result) == 0);
  CHECK(peft_merge_result_note(result, 0) == NULL);
  CHECK(exists(scratch_path("two/model.safetensors.index.json")));
  CHECK(plog.calls >= 22 && plog.monotone && plog.last_done == plog.total && plog.total == 6736 * 2);
  peft_merge_result_free(result);
  peft_merge_result_free(NULL);
  CHECK(peft_merge_result_tensor_count(NULL, PEFT_MERGE_TENSORS_MERGED) == 0);
  CHECK(peft_merge_result_bytes(NULL) == 0);
  CHECK(peft_merge_result_file_count(NULL) == 0);
  CHECK(peft_merge_result_file_name(NULL, 0) == NULL);
  CHECK(peft_merge_result_untied_embeddings(NULL) == 0);
  CHECK(peft_merge_result_note_count(NULL) == 0);
  CHECK(peft_merge_result_note(NULL, 0) == NULL);

  /* Cancelling leaves no folder behind; a callback that never cancels does no harm. */
  plog.calls = 0;
  plog.cancel_at = 3;
  result = NULL;
  CHECK_CODE(peft_merge_checkpoint(data_path("models/llama"), scratch_path("cancelled"), opts, &result),
             PEFT_ERR_CANCELLED);
  CHECK(result == NULL);
  CHECK(!exists(scratch_path("cancelled")));
  peft_merge_options_free(opts);

  /* Adapters of another model: every unresolved tensor is reported, nothing is written. */
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/gpt2_lora"), 1.0));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/bert_seqcls_lora"), 1.0));
  CHECK_CODE_NAMING(peft_merge_checkpoint(data_path("models/llama"), scratch_path("wrong"), opts, NULL),
                    PEFT_ERR_UNRESOLVED_KEY, "classifier");
  CHECK(!exists(scratch_path("wrong")));
  peft_merge_options_free(opts);
  /* Two adapters replacing the same tensors conflict. */
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/bert_seqcls_lora"), 1.0));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/bert_seqcls_lora"), 1.0));
  CHECK_CODE_NAMING(peft_merge_checkpoint(data_path("models/bert"), scratch_path("conflict"), opts, NULL),
                    PEFT_ERR_INVALID_ARGUMENT, "replaced by both");
  peft_merge_options_free(opts);
}

/* peft_merge_options_set_arithmetic(): its errors, and the ggml order refusing DoRA before writing. */
static void test_checkpoint_arithmetic(void) {
  peft_merge_options* opts = NULL;
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_CODE(peft_merge_options_set_arithmetic(NULL, PEFT_MERGE_ARITHMETIC_GGML), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE_NAMING(peft_merge_options_set_arithmetic(opts, 2), PEFT_ERR_INVALID_ARGUMENT, "PEFT_MERGE_ARITHMETIC_GGML");
  CHECK_CODE(peft_merge_options_set_arithmetic(opts, -1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_set_arithmetic(opts, PEFT_MERGE_ARITHMETIC_PEFT));
  CHECK_OK(peft_merge_options_set_arithmetic(opts, PEFT_MERGE_ARITHMETIC_GGML));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/llama_lora"), 1.0));
  CHECK_OK(peft_merge_checkpoint(data_path("models/llama"), scratch_path("ggml"), opts, NULL));
  CHECK(exists(scratch_path("ggml/config.json")));
  peft_merge_options_free(opts);
  /* DoRA has no ggml order: refused naming the module and DoRA, nothing written. */
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_merge_options_set_arithmetic(opts, PEFT_MERGE_ARITHMETIC_GGML));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/llama_dora"), 1.0));
  CHECK_CODE_NAMING(peft_merge_checkpoint(data_path("models/llama"), scratch_path("ggml_dora"), opts, NULL),
                    PEFT_ERR_UNSUPPORTED, "DoRA");
  CHECK(!exists(scratch_path("ggml_dora")));
  peft_merge_options_free(opts);
}

/* A LoRA on lm_head of the tied gemma fixture (16 x 64), written here: factors of small integers. */
static void write_lm_head_adapter(const char* dir) {
  static const char config[] =
      "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": 2, \"lora_alpha\": 2, "
      "\"target_modules\": [\"lm_head\"], \"bias\": \"none\"}";
  char path[600];
  float a[2 * 16], b[64 * 2];
  const uint64_t a_shape[2] = {2, 16}, b_shape[2] = {64, 2};
  peft_writer* writer = NULL;
  size_t k;
  for (k = 0; k < 2 * 16; ++k) a[k] = (float)((int)(k % 5) - 2) * 0.125f;
  for (k = 0; k < 64 * 2; ++k) b[k] = (float)((int)(k % 7) - 3) * 0.25f;
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  CHECK(write_bytes(path, config, sizeof config - 1));
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  CHECK_OK(peft_writer_new(path, &writer));
  CHECK_OK(peft_writer_add_tensor(writer, "base_model.model.lm_head.lora_A.weight", PEFT_DTYPE_F32, a_shape, 2));
  CHECK_OK(peft_writer_add_tensor(writer, "base_model.model.lm_head.lora_B.weight", PEFT_DTYPE_F32, b_shape, 2));
  CHECK_OK(peft_writer_start(writer));
  CHECK_OK(peft_writer_write_tensor(writer, "base_model.model.lm_head.lora_A.weight", PEFT_DTYPE_F32, a, sizeof a));
  CHECK_OK(peft_writer_write_tensor(writer, "base_model.model.lm_head.lora_B.weight", PEFT_DTYPE_F32, b, sizeof b));
  CHECK_OK(peft_writer_finish(writer));
  peft_writer_free(writer);
}

/* peft_merge_options_set_tied_embeddings(): its errors; a LoRA on the tied lm_head unties the pair by
   default (lm_head.weight added, tie_word_embeddings false, a note) and lands in the shared tensor with
   PEFT_MERGE_TIED_SHARED. (Logits against PEFT: tests/interop/test_tied_embeddings.py.) */
static void test_checkpoint_tied_embeddings(void) {
  peft_merge_options* opts = NULL;
  peft_merge_result* result = NULL;
  char* config = NULL;
  size_t size = 0, k;
  int noted = 0;
  const char* adapter = scratch_path("tied_adapter");
  char adapter_dir[512];
  snprintf(adapter_dir, sizeof adapter_dir, "%s", adapter);
  write_lm_head_adapter(adapter_dir);
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_CODE(peft_merge_options_set_tied_embeddings(NULL, PEFT_MERGE_TIED_SHARED), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE_NAMING(peft_merge_options_set_tied_embeddings(opts, 2), PEFT_ERR_INVALID_ARGUMENT, "PEFT_MERGE_TIED_SHARED");
  CHECK_CODE(peft_merge_options_set_tied_embeddings(opts, -1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, adapter_dir, 1.0));
  CHECK_OK(peft_merge_checkpoint(data_path("models/gemma"), scratch_path("tied_untie"), opts, &result));
  CHECK(peft_merge_result_untied_embeddings(result) == 1);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_ADDED) == 1);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_MERGED) == 0);
  for (k = 0; k < peft_merge_result_note_count(result); ++k)
    if (strstr(peft_merge_result_note(result, k), "\"lm_head.weight\" was added")) noted = 1;
  CHECK(noted);
  config = slurp(scratch_path("tied_untie/config.json"), &size);
  CHECK(config && strstr(config, "\"tie_word_embeddings\": false"));
  free(config);
  peft_merge_result_free(result);
  result = NULL;

  CHECK_OK(peft_merge_options_set_tied_embeddings(opts, PEFT_MERGE_TIED_SHARED));
  CHECK_OK(peft_merge_checkpoint(data_path("models/gemma"), scratch_path("tied_shared"), opts, &result));
  CHECK(peft_merge_result_untied_embeddings(result) == 0);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_ADDED) == 0);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_MERGED) == 1);
  config = slurp(scratch_path("tied_shared/config.json"), &size);
  CHECK(config && strstr(config, "\"tie_word_embeddings\": true"));
  free(config);
  peft_merge_result_free(result);
  peft_merge_options_free(opts);
}

static void test_buffer_merge(void) {
  peft_adapter* adapter = NULL;
  peft_adapter* biased = NULL;
  peft_merge_buffer_options* opts = NULL;
  peft_merge_record* record = NULL;
  peft_merge_record* second = NULL;
  peft_merge_options* merge_opts = NULL;
  peft_translator* llama = NULL;
  uint64_t nbytes = 0, merged_bytes = 0, bias_bytes = 0, wb = 0;
  const uint64_t shape[2] = {16, 16};
  const uint64_t bad_shape[2] = {16, 15};
  float* weight = read_tensor(data_path("models/llama"), "model.layers.0.self_attn.q_proj.weight", PEFT_DTYPE_F32, &nbytes);
  float* original = malloc((size_t)nbytes);
  float* merged = NULL;
  uint16_t* bf16 = read_tensor(data_path("models/llama"), "model.layers.0.self_attn.q_proj.weight", PEFT_DTYPE_BF16, &wb);
  uint16_t* bf16_original = malloc((size_t)wb);
  float* qweight = read_tensor(data_path("models/qwen2"), "model.layers.0.self_attn.q_proj.weight", PEFT_DTYPE_F32, &nbytes);
  float* qbias = read_tensor(data_path("models/qwen2"), "model.layers.0.self_attn.q_proj.bias", PEFT_DTYPE_F32, &bias_bytes);
  float* qbias_original = malloc((size_t)bias_bytes);
  CHECK(weight != NULL && original != NULL && bf16 != NULL && qweight != NULL && qbias != NULL);
  if (weight == NULL || original == NULL || bf16 == NULL || bf16_original == NULL || qweight == NULL ||
      qbias == NULL || qbias_original == NULL)
    return;
  memcpy(original, weight, (size_t)nbytes);
  memcpy(bf16_original, bf16, (size_t)wb);
  memcpy(qbias_original, qbias, (size_t)bias_bytes);

  CHECK_OK(peft_adapter_open(data_path("adapters/llama_lora"), NULL, &adapter));
  CHECK_CODE(peft_merge_buffer_options_new(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_buffer_options_new(&opts));
  CHECK_CODE(peft_merge_buffer_options_set_weight(NULL, 1.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_buffer_options_set_weight(opts, NAN), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_buffer_options_set_weight(opts, 1e39), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_buffer_options_set_weight(opts, 3.4e38));
  CHECK_OK(peft_merge_buffer_options_set_weight(opts, 1.0));
  CHECK_CODE(peft_merge_buffer_options_set_keep_original_rows(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_buffer_options_set_keep_original_rows(opts, 1));
  CHECK_CODE(peft_merge_buffer_options_set_threads(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_buffer_options_set_threads(opts, 2));
  CHECK_CODE(peft_merge_buffer_options_set_translator(NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_buffer_options_set_translator(opts, NULL));

  /* Errors change nothing. */
  CHECK_CODE(peft_merge_buffer_apply(NULL, "model.layers.0.self_attn.q_proj", weight, PEFT_DTYPE_F32, shape, 2, NULL, 0,
                                     opts, &record), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_buffer_apply(adapter, NULL, weight, PEFT_DTYPE_F32, shape, 2, NULL, 0, opts, &record),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_buffer_apply(adapter, "model.layers.0.self_attn.q_proj", NULL, PEFT_DTYPE_F32, shape, 2, NULL,
                                     0, opts, &record), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_buffer_apply(adapter, "model.layers.0.self_attn.q_proj", weight, PEFT_DTYPE_F32, shape, 2,
                                     NULL, 0, opts, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_buffer_apply(adapter, "model.layers.0.self_attn.q_proj", weight, PEFT_DTYPE_F32, NULL, 2,
                                     NULL, 0, opts, &record), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_buffer_apply(adapter, "model.layers.0.self_attn.q_proj", weight, PEFT_DTYPE_I32, shape, 2,
                                     NULL, 0, opts, &record), PEFT_ERR_UNSUPPORTED);
  CHECK_CODE(peft_merge_buffer_apply(adapter, "model.layers.0.self_attn.q_proj", weight, PEFT_DTYPE_F32, bad_shape, 2,
                                     NULL, 0, opts, &record), PEFT_ERR_SHAPE_MISMATCH);
  CHECK_CODE_NAMING(peft_merge_buffer_apply(adapter, "model.layers.9.self_attn.q_proj", weight, PEFT_DTYPE_F32, shape,
                                            2, NULL, 0, opts, &record), PEFT_ERR_NOT_FOUND, "layers.9");
  CHECK(record == NULL);
  CHECK(memcmp(weight, original, (size_t)nbytes) == 0);

  /* Merge with kept rows: equals the checkpoint merge, and comes off bit for bit. */
  CHECK_OK(peft_merge_buffer_apply(adapter, "model.layers.0.self_attn.q_proj.weight", weight, PEFT_DTYPE_F32, shape, 2,
                                   NULL, 0, opts, &record));
  CHECK(record != NULL);
  CHECK(strcmp(peft_merge_record_module(record), "model.layers.0.self_attn.q_proj") == 0);
  CHECK(peft_merge_record_active(record) == 1);
  CHECK(peft_merge_record_saved_bytes(record) > 0);
  CHECK(memcmp(weight, original, (size_t)nbytes) != 0);
  CHECK_OK(peft_merge_options_new(&merge_opts));
  CHECK_OK(peft_merge_options_add_adapter_dir(merge_opts, data_path("adapters/llama_lora"), 1.0));
  CHECK_OK(peft_merge_checkpoint(data_path("models/llama"), scratch_path("single"), merge_opts, NULL));
  peft_merge_options_free(merge_opts);
  merged = read_tensor(scratch_path("single"), "model.layers.0.self_attn.q_proj.weight", PEFT_DTYPE_F32, &merged_bytes);
  CHECK(merged != NULL && merged_bytes == nbytes && memcmp(weight, merged, (size_t)nbytes) == 0);
  free(merged);
  /* A second merge on top must come off first. */
  CHECK_OK(peft_translator_new_builtin("llama", &llama));
  CHECK_OK(peft_merge_buffer_options_set_translator(opts, llama));
  peft_translator_free(llama); /* the options keep the table */
  CHECK_CODE(peft_merge_buffer_apply(adapter, "no/such/module", weight, PEFT_DTYPE_F32, shape, 2, NULL, 0, opts,
                                     &second), PEFT_ERR_UNRESOLVED_KEY);
  CHECK_OK(peft_merge_buffer_apply(adapter, "transformer/layer_0/attention/query", weight, PEFT_DTYPE_F32, shape, 2,
                                   NULL, 0, opts, &second));
  CHECK_CODE(peft_merge_record_unmerge(record, weight, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_record_unmerge(second, weight, NULL));
  CHECK(peft_merge_record_active(second) == 0);
  CHECK_CODE(peft_merge_record_unmerge(second, weight, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_record_unmerge(NULL, weight, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_merge_record_unmerge(record, NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_record_unmerge(record, weight, NULL));
  CHECK(memcmp(weight, original, (size_t)nbytes) == 0);
  peft_merge_record_free(record);
  peft_merge_record_free(second);
  peft_merge_record_free(NULL);
  CHECK(peft_merge_record_module(NULL) == NULL);
  CHECK(peft_merge_record_active(NULL) == 0);
  CHECK(peft_merge_record_saved_bytes(NULL) == 0);

  /* Without kept rows (default options): PEFT's arithmetic unmerge, close to the original. */
  record = NULL;
  CHECK_OK(peft_merge_buffer_apply(adapter, "model.layers.0.self_attn.q_proj", bf16, PEFT_DTYPE_BF16, shape, 2, NULL,
                                   0, NULL, &record));
  CHECK(peft_merge_record_saved_bytes(record) == 0);
  CHECK(memcmp(bf16, bf16_original, (size_t)wb) != 0);
  CHECK_OK(peft_merge_buffer_remove(record, bf16, NULL)); /* the older name of peft_merge_record_unmerge() */
  {
    /* Each element back within one bf16 rounding of the merged weight's scale. */
    size_t k, far = 0;
    float now = 0.0f, before = 0.0f, scale = 0.0f;
    for (k = 0; k < wb / 2; ++k) {
      CHECK_OK(peft_convert(PEFT_DTYPE_BF16, &bf16_original[k], PEFT_DTYPE_F32, &before, 1));
      if (fabsf(before) > scale) scale = fabsf(before);
    }
    for (k = 0; k < wb / 2; ++k) {
      peft_error_free(peft_convert(PEFT_DTYPE_BF16, &bf16[k], PEFT_DTYPE_F32, &now, 1));
      peft_error_free(peft_convert(PEFT_DTYPE_BF16, &bf16_original[k], PEFT_DTYPE_F32, &before, 1));
      if (fabsf(now - before) > scale / 128.0f) ++far;
    }
    CHECK(far == 0);
  }
  peft_merge_record_free(record);

  /* lora_B.bias: the bias buffer is required, and restored too. */
  CHECK_OK(peft_adapter_open(data_path("adapters/qwen2_lora_bias"), NULL, &biased));
  CHECK_OK(peft_merge_buffer_options_set_translator(opts, NULL));
  record = NULL;
  CHECK_CODE_NAMING(peft_merge_buffer_apply(biased, "model.layers.0.self_attn.q_proj", qweight, PEFT_DTYPE_F32, shape,
                                            2, NULL, PEFT_DTYPE_F32, opts, &record), PEFT_ERR_INVALID_ARGUMENT, "bias");
  CHECK_OK(peft_merge_buffer_apply(biased, "model.layers.0.self_attn.q_proj", qweight, PEFT_DTYPE_F32, shape, 2, qbias,
                                   PEFT_DTYPE_F32, opts, &record));
  CHECK(memcmp(qbias, qbias_original, (size_t)bias_bytes) != 0);
  CHECK_CODE(peft_merge_buffer_remove(record, qweight, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_buffer_remove(record, qweight, qbias));
  CHECK(memcmp(qbias, qbias_original, (size_t)bias_bytes) == 0);
  peft_merge_record_free(record);

  peft_merge_buffer_options_free(opts);
  peft_merge_buffer_options_free(NULL);
  peft_adapter_free(adapter);
  peft_adapter_free(biased);
  free(weight);
  free(original);
  free(bf16);
  free(bf16_original);
  free(qweight);
  free(qbias);
  free(qbias_original);
}

/* A merge whose result overflows the buffer's dtype (a large weight into a buffer holding the
 * largest finite value) is refused NON_FINITE naming the layer, and the buffer keeps its bytes: with
 * and without kept rows, F32 and BF16. The same buffer merged with weight 1 stays finite. */
static void test_buffer_merge_non_finite(void) {
  const char* layer = "model.layers.0.self_attn.q_proj";
  const uint64_t shape[2] = {16, 16};
  float weight[256], before[256];
  uint16_t bf16[256], bf16_before[256];
  peft_adapter* adapter = NULL;
  peft_merge_buffer_options* opts = NULL;
  peft_merge_record* record = NULL;
  for (int i = 0; i < 256; ++i) {
    weight[i] = (i % 2) ? 3.4028234e38f : -3.4028234e38f;
    bf16[i] = (i % 2) ? 0x7F7F : 0xFF7F;
  }
  memcpy(before, weight, sizeof weight);
  memcpy(bf16_before, bf16, sizeof bf16);
  CHECK_OK(peft_adapter_open(data_path("adapters/llama_lora"), NULL, &adapter));
  CHECK_OK(peft_merge_buffer_options_new(&opts));
  for (int keep = 0; keep <= 1; ++keep) {
    CHECK_OK(peft_merge_buffer_options_set_keep_original_rows(opts, keep));
    CHECK_OK(peft_merge_buffer_options_set_weight(opts, 1e37));
    CHECK_CODE_NAMING(peft_merge_buffer_apply(adapter, layer, weight, PEFT_DTYPE_F32, shape, 2, NULL, 0, opts, &record),
                      PEFT_ERR_NON_FINITE, layer);
    CHECK(record == NULL);
    CHECK(memcmp(weight, before, sizeof weight) == 0);
    CHECK_CODE_NAMING(peft_merge_buffer_apply(adapter, layer, bf16, PEFT_DTYPE_BF16, shape, 2, NULL, 0, opts, &record),
                      PEFT_ERR_NON_FINITE, layer);
    CHECK(record == NULL);
    CHECK(memcmp(bf16, bf16_before, sizeof bf16) == 0);
  }
  CHECK_OK(peft_merge_buffer_options_set_weight(opts, 1.0));
  CHECK_OK(peft_merge_buffer_apply(adapter, layer, weight, PEFT_DTYPE_F32, shape, 2, NULL, 0, opts, &record));
  CHECK(record != NULL);
  int finite = 1;
  for (int i = 0; i < 256; ++i) finite &= isfinite(weight[i]) != 0;
  CHECK(finite);
  peft_merge_record_free(record);
  peft_merge_buffer_options_free(opts);
  peft_adapter_free(adapter);
}

/* peft_model_combine: the base with itself (every difference 0) gives the base's tensors back; the result
 * counts; argument errors; nothing written on failure. The numerics are in tests/interop/test_model_combine.py. */
static void test_model_combine(void) {
  char base[512], out[512];
  const char* models[2];
  const double weights[2] = {0.5, 1.5};
  peft_export_options* combine = NULL;
  peft_merge_options* opts = NULL;
  peft_merge_result* result = NULL;
  snprintf(base, sizeof base, "%s", data_path("models/llama"));
  models[0] = base;
  models[1] = base;
  snprintf(out, sizeof out, "%s", scratch_path("combined"));
  CHECK_OK(peft_model_combine(base, models, weights, 2, PEFT_COMBINE_LINEAR, out, NULL, NULL, &result));
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_MERGED) > 0);
  CHECK(peft_merge_result_tensor_count(result, PEFT_MERGE_TENSORS_COPIED) == 0);
  CHECK(peft_merge_result_file_count(result) >= 2);
  peft_merge_result_free(result);
  result = NULL;
  {
    uint64_t n1 = 0, n2 = 0;
    void* ours = read_tensor(out, "model.layers.0.self_attn.q_proj.weight", PEFT_DTYPE_F32, &n1);
    void* theirs = read_tensor(base, "model.layers.0.self_attn.q_proj.weight", PEFT_DTYPE_F32, &n2);
    CHECK(ours != NULL && theirs != NULL && n1 == n2 && memcmp(ours, theirs, n1) == 0);
    free(ours);
    free(theirs);
  }
  CHECK_OK(peft_export_options_new(&combine));
  CHECK_OK(peft_merge_options_new(&opts));
  snprintf(out, sizeof out, "%s", scratch_path("combine_failed"));
  CHECK_CODE_NAMING(peft_model_combine(base, models, weights, 2, PEFT_COMBINE_TIES, out, combine, opts, NULL),
                    PEFT_ERR_INVALID_ARGUMENT, "density");
  CHECK_CODE(peft_model_combine(base, models, weights, 2, PEFT_COMBINE_SVD, out, combine, opts, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_model_combine(base, models, weights, 2, PEFT_COMBINE_CAT, out, combine, opts, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_model_combine(base, models, weights, 0, PEFT_COMBINE_LINEAR, out, NULL, NULL, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_model_combine(NULL, models, weights, 2, PEFT_COMBINE_LINEAR, out, NULL, NULL, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_model_combine(base, NULL, weights, 2, PEFT_COMBINE_LINEAR, out, NULL, NULL, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_model_combine(base, models, weights, 2, PEFT_COMBINE_LINEAR, base, NULL, NULL, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, data_path("adapters/llama_lora"), 1.0));
  CHECK_CODE_NAMING(peft_model_combine(base, models, weights, 2, PEFT_COMBINE_LINEAR, out, NULL, opts, NULL),
                    PEFT_ERR_INVALID_ARGUMENT, "adapters");
  CHECK(!exists(out));
  peft_merge_options_free(opts);
  peft_export_options_free(combine);
}

int main(void) {
  char model_file[512];
  snprintf(model_file, sizeof model_file, "%s/models/llama/model.safetensors", PEFT_TEST_DATA);
  if (!exists(model_file)) {
    printf("SKIP: fixtures not generated (%s is absent)\n", model_file);
    return 0;
  }
  snprintf(scratch, sizeof scratch, "/tmp/peft_test_merge_XXXXXX");
  if (mkdtemp(scratch) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_checkpoint_options();
  test_checkpoint_inputs();
  test_checkpoint_merge();
  test_checkpoint_arithmetic();
  test_checkpoint_tied_embeddings();
  test_buffer_merge();
  test_buffer_merge_non_finite();
  test_model_combine();
  remove_tree(scratch);
  return check_summary();
}
