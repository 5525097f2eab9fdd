/* Hostile JSON and non-regular files through the C API, from C99 (issue 13): every JSON input nested
 * 100,000 and 1,000,000 levels deep gives its coded error instead of a stack overflow (an adapter
 * config from memory and from a folder, a base model's config.json in a merge with a dtype change and
 * in validation and detection, a shard index, a translation table, a writer's index metadata); an
 * adapter_config.json that is a FIFO gives PEFT_ERR_IO instead of blocking forever.
 * Prints "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>
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

#define LLAMA_LORA PEFT_TEST_DATA "/adapters/llama_lora"
#define LLAMA_BASE PEFT_TEST_DATA "/models/llama"

static char root[] = "/tmp/peft_json_limits_XXXXXX";

static void path_in(char* out, const char* folder, const char* name) {
  snprintf(out, 4096, "%s/%s/%s", root, folder, name);
}

static int copy_into_folder(const char* from, const char* folder, const char* name) {
  char to[4096];
  path_in(to, folder, name);
  return copy_file(from, to);
}

/* prefix, then `depth` times `open`, then `middle`, then `depth` times `close`, then suffix. */
static char* nested(const char* prefix, const char* open, const char* middle, const char* close, size_t depth,
                    const char* suffix) {
  size_t size = strlen(prefix) + depth * (strlen(open) + strlen(close)) + strlen(middle) + strlen(suffix) + 1;
  char* text = malloc(size);
  char* p = text;
  size_t i;
  if (text == NULL) return NULL;
  p += sprintf(p, "%s", prefix);
  for (i = 0; i < depth; ++i) p += sprintf(p, "%s", open);
  p += sprintf(p, "%s", middle);
  for (i = 0; i < depth; ++i) p += sprintf(p, "%s", close);
  sprintf(p, "%s", suffix);
  return text;
}

static void make_folder(const char* name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", root, name);
  mkdir(path, 0700);
}

static void test_depth(size_t depth) {
  char dir[4096], path[4096];
  char* deep_config = nested("{\"peft_type\": \"LORA\", \"r\": 4, \"x\": ", "[", "", "]", depth, "}");
  char* deep_base = nested("{\"model_type\": \"llama\", \"x\": ", "{\"a\": ", "1", "}", depth, "}");
  char* deep_index = nested("{\"weight_map\": {\"x\": \"model.safetensors\"}, \"metadata\": ", "{\"a\": ", "1", "}",
                            depth, "}");
  char* deep_table = nested("{\"_comment\": ", "[", "", "]", depth, "}");
  char* deep_metadata = nested("{\"x\": ", "[", "", "]", depth, "}");
  size_t weights_size = 0;
  char* weights = slurp(LLAMA_LORA "/adapter_model.safetensors", &weights_size);
  peft_registry* registry = NULL;
  peft_adapter* adapter = NULL;
  peft_adapter* good = NULL;
  peft_translator* translator = NULL;
  peft_checkpoint* ckpt = NULL;
  peft_writer* writer = NULL;
  peft_merge_options* merge = NULL;
  peft_merge_result* result = NULL;

  CHECK(deep_config && deep_base && deep_index && deep_table && deep_metadata && weights);
  if (!(deep_config && deep_base && deep_index && deep_table && deep_metadata && weights)) goto done;
  make_folder("adapter");
  make_folder("base");
  make_folder("index");
  CHECK(copy_into_folder(LLAMA_LORA "/adapter_model.safetensors", "adapter", "adapter_model.safetensors"));
  CHECK(copy_into_folder(LLAMA_BASE "/model.safetensors", "base", "model.safetensors"));
  CHECK(copy_into_folder(LLAMA_BASE "/model.safetensors", "index", "model.safetensors"));
  path_in(path, "adapter", "adapter_config.json");
  CHECK(write_bytes(path, deep_config, strlen(deep_config)));
  path_in(path, "base", "config.json");
  CHECK(write_bytes(path, deep_base, strlen(deep_base)));
  path_in(path, "index", "model.safetensors.index.json");
  CHECK(write_bytes(path, deep_index, strlen(deep_index)));

  /* adapter_config.json: from memory (a registry) and from a folder */
  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 20, NULL, &registry));
  CHECK_CODE_NAMING(peft_registry_register_memory(registry, "m", deep_config, weights, weights_size, NULL),
                    PEFT_ERR_INVALID_CONFIG, "nested deeper than 256 levels");
  snprintf(dir, sizeof dir, "%s/adapter", root);
  CHECK_CODE_NAMING(peft_registry_register(registry, "f", dir, NULL), PEFT_ERR_INVALID_CONFIG, "nested deeper");
  CHECK_CODE_NAMING(peft_adapter_open(dir, NULL, &adapter), PEFT_ERR_INVALID_CONFIG, "adapter_config.json");
  CHECK(adapter == NULL);

  /* the base model's config.json: validation, detection, and a merge that rewrites it (--dtype bf16) */
  snprintf(dir, sizeof dir, "%s/base", root);
  CHECK_OK(peft_adapter_open(LLAMA_LORA, NULL, &good));
  if (good != NULL) CHECK_CODE_NAMING(peft_adapter_validate(good, dir), PEFT_ERR_INVALID_CONFIG, "config.json");
  CHECK_CODE_NAMING(peft_translator_detect(dir, NULL, &translator), PEFT_ERR_INVALID_CONFIG, "nested deeper");
  CHECK(translator == NULL);
  CHECK_OK(peft_merge_options_new(&merge));
  if (merge != NULL) {
    char out[4096];
    snprintf(out, sizeof out, "%s/merged", root);
    CHECK_OK(peft_merge_options_add_adapter_dir(merge, LLAMA_LORA, 1.0));
    CHECK_OK(peft_merge_options_set_dtype(merge, PEFT_DTYPE_BF16));
    CHECK_CODE_NAMING(peft_merge_checkpoint(dir, out, merge, &result), PEFT_ERR_INVALID_CONFIG, "nested deeper");
    CHECK(result == NULL);
  }

  /* a shard index */
  snprintf(dir, sizeof dir, "%s/index", root);
  CHECK_CODE_NAMING(peft_checkpoint_open(dir, NULL, &ckpt), PEFT_ERR_INVALID_CHECKPOINT, "nested deeper");
  CHECK(ckpt == NULL);

  /* a translation table, and a writer's index metadata */
  CHECK_CODE_NAMING(peft_translator_from_json(deep_table, &translator), PEFT_ERR_INVALID_CONFIG, "nested deeper");
  CHECK(translator == NULL);
  snprintf(dir, sizeof dir, "%s/written", root);
  CHECK_OK(peft_writer_new_checkpoint(dir, 0, &writer));
  if (writer != NULL)
    CHECK_CODE_NAMING(peft_writer_set_index_metadata_json(writer, deep_metadata), PEFT_ERR_INVALID_ARGUMENT,
                      "nested deeper");

done:
  peft_writer_free(writer);
  peft_merge_options_free(merge);
  peft_adapter_free(good);
  peft_registry_free(registry);
  free(weights);
  free(deep_config);
  free(deep_base);
  free(deep_index);
  free(deep_table);
  free(deep_metadata);
}

static void test_fifo_config(void) {
  char dir[4096], path[4096];
  peft_registry* registry = NULL;
  peft_adapter* adapter = NULL;
  make_folder("fifo");
  CHECK(copy_into_folder(LLAMA_LORA "/adapter_model.safetensors", "fifo", "adapter_model.safetensors"));
  path_in(path, "fifo", "adapter_config.json");
  CHECK(mkfifo(path, 0600) == 0);
  snprintf(dir, sizeof dir, "%s/fifo", root);
  /* Without a writer on the FIFO, a blocking open would never return. */
  CHECK_CODE_NAMING(peft_adapter_open(dir, NULL, &adapter), PEFT_ERR_IO, "not a regular file");
  CHECK(adapter == NULL);
  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 20, NULL, &registry));
  CHECK_CODE_NAMING(peft_registry_register(registry, "f", dir, NULL), PEFT_ERR_IO, "not a regular file");
  peft_registry_free(registry);
}

int main(void) {
  char command[4200];
  if (mkdtemp(root) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  alarm(120); /* a hang is a failure, not a stuck test run */
  test_depth(100000);
  test_depth(1000000);
  test_fifo_config();
  snprintf(command, sizeof command, "rm -rf '%s'", root);
  if (system(command) != 0) fprintf(stderr, "could not remove %s\n", root);
  return check_summary();
}
