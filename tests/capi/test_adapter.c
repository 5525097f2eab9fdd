/* The adapter section of the C API, from C99: opening adapters (with and without a base), config
 * getters, modules and their tensors, translators (built-in, user JSON, detection, batches), and the
 * error contract (stable codes, untouched out-parameters on failure). Uses the fixture adapters and
 * the real corpus where present. Prints "N passed, M failed" and exits nonzero on any failure. */
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

static peft_adapter* const kUntouchedAdapter = (peft_adapter*)(uintptr_t)0x5eed;
static peft_translator* const kUntouchedTranslator = (peft_translator*)(uintptr_t)0x5eed;

static int is_dir(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_role(const peft_adapter* a, size_t m, const char* role, size_t* out_tensor) {
  size_t t;
  for (t = 0; t < peft_adapter_module_tensor_count(a, m); ++t) {
    if (strcmp(peft_adapter_module_tensor_role(a, m, t), role) == 0) {
      *out_tensor = t;
      return 1;
    }
  }
  return 0;
}

static void test_fixture_adapter(void) {
  const char* dir = PEFT_TEST_DATA "/adapters/llama_rank_alpha_pattern";
  const char* base = PEFT_TEST_DATA "/models/llama";
  peft_adapter_options* opts = NULL;
  peft_adapter* a = NULL;
  size_t m, t, count, lora = 0;
  if (!is_dir(dir) || !is_dir(base)) {
    printf("skipped: fixture adapters not generated (%s)\n", dir);
    return;
  }
  CHECK_OK(peft_adapter_options_new(&opts));
  CHECK_OK(peft_adapter_options_set_base_dir(opts, base));
  CHECK_OK(peft_adapter_open(dir, opts, &a));
  peft_adapter_options_free(opts);
  if (a == NULL) return;

  CHECK(strcmp(peft_adapter_peft_type(a), "LORA") == 0);
  CHECK(peft_adapter_r(a) > 0);
  CHECK(peft_adapter_lora_alpha(a) > 0);
  CHECK(peft_adapter_use_rslora(a) == 0);
  CHECK(peft_adapter_use_dora(a) == 0);
  CHECK(strcmp(peft_adapter_bias(a), "none") == 0);
  CHECK(strcmp(peft_adapter_family(a), "llama") == 0);
  CHECK(strstr(peft_adapter_config_json(a), "\"peft_type\": \"LORA\"") != NULL);
  CHECK(peft_adapter_config_field(a, "rank_pattern") != NULL);
  CHECK(peft_adapter_config_field(a, "rank_pattern")[0] == '{');
  CHECK(peft_adapter_config_field(a, "no_such_field") == NULL);
  CHECK(peft_adapter_config_field(NULL, "r") == NULL);

  count = peft_adapter_module_count(a);
  CHECK(count > 0);
  for (m = 0; m < count; ++m) {
    int32_t kind = peft_adapter_module_kind(a, m);
    if (kind == PEFT_LAYER_LINEAR) {
      size_t ta, tb;
      int64_t r = peft_adapter_module_rank(a, m);
      ++lora;
      CHECK(has_role(a, m, "lora_A.weight", &ta));
      CHECK(has_role(a, m, "lora_B.weight", &tb));
      CHECK(peft_adapter_module_tensor_ndim(a, m, ta) == 2);
      CHECK(peft_adapter_module_tensor_shape(a, m, ta)[0] == (uint64_t)r);
      CHECK(peft_adapter_module_tensor_shape(a, m, tb)[1] == (uint64_t)r);
      CHECK(fabs(peft_adapter_module_scaling(a, m) - peft_adapter_module_alpha(a, m) / (double)r) < 1e-12);
      CHECK(strstr(peft_adapter_module_tensor_key(a, m, ta), "base_model.model.") == peft_adapter_module_tensor_key(a, m, ta));
      {
        const char* base_name = peft_adapter_module_tensor_base_name(a, m, ta);
        size_t len = strlen(base_name);
        CHECK(len > 7 && strcmp(base_name + len - 7, ".weight") == 0);
      }
      {
        uint64_t n = peft_adapter_module_tensor_shape(a, m, ta)[0] * peft_adapter_module_tensor_shape(a, m, ta)[1];
        float* buffer = (float*)malloc(n * sizeof(float));
        CHECK_OK(peft_adapter_module_tensor_read(a, m, ta, PEFT_DTYPE_F32, buffer, n * sizeof(float)));
        CHECK_CODE(peft_adapter_module_tensor_read(a, m, ta, PEFT_DTYPE_F32, buffer, 3), PEFT_ERR_INVALID_ARGUMENT);
        free(buffer);
      }
    }
  }
  CHECK(lora == count);
  /* Out of range: sentinels, never a crash. */
  CHECK(peft_adapter_module_name(a, count) == NULL);
  CHECK(peft_adapter_module_kind(a, count) == -1);
  CHECK(peft_adapter_module_rank(a, count) == 0);
  CHECK(peft_adapter_module_tensor_role(a, 0, 99) == NULL);
  CHECK(peft_adapter_module_tensor_shape(a, count, 0) == NULL);
  CHECK(peft_adapter_module_tensor_dtype(a, 0, 99) == -1);
  CHECK_CODE(peft_adapter_module_tensor_read(a, count, 0, PEFT_DTYPE_F32, NULL, 0), PEFT_ERR_INVALID_ARGUMENT);

  CHECK_OK(peft_adapter_find_module(a, peft_adapter_module_name(a, 0), &t));
  CHECK(t == 0);
  t = 77;
  CHECK_CODE(peft_adapter_find_module(a, "no.such.module", &t), PEFT_ERR_NOT_FOUND);
  CHECK(t == 77);
  CHECK_OK(peft_adapter_validate(a, base));
  CHECK_CODE(peft_adapter_validate(a, PEFT_TEST_DATA "/models/gpt2"), PEFT_ERR_UNRESOLVED_KEY);
  CHECK_CODE(peft_adapter_validate(a, "/nonexistent/base"), PEFT_ERR_NOT_FOUND);

  {
    peft_translator* tr = NULL;
    char* native = NULL;
    char* back = NULL;
    size_t ta;
    CHECK_OK(peft_adapter_translator(a, &tr));
    CHECK(has_role(a, 0, "lora_A.weight", &ta));
    CHECK_OK(peft_translator_to_native(tr, peft_adapter_module_tensor_key(a, 0, ta), &native));
    CHECK_OK(peft_translator_to_hf(tr, native, 1, &back));
    CHECK(back && strcmp(back, peft_adapter_module_tensor_key(a, 0, ta)) == 0);
    peft_string_free(native);
    peft_string_free(back);
    peft_translator_free(tr);
  }
  peft_adapter_free(a);
}

static void test_gpt2_conv1d(void) {
  const char* dir = PEFT_TEST_DATA "/adapters/gpt2_lora";
  peft_adapter* a = NULL;
  size_t m, conv1d = 0;
  if (!is_dir(dir)) {
    printf("skipped: %s not generated\n", dir);
    return;
  }
  CHECK_OK(peft_adapter_open(dir, NULL, &a));
  if (a == NULL) return;
  for (m = 0; m < peft_adapter_module_count(a); ++m)
    if (peft_adapter_module_kind(a, m) == PEFT_LAYER_CONV1D) ++conv1d;
  CHECK(conv1d > 0);
  peft_adapter_free(a);
}

static void test_errors(void) {
  peft_adapter* a = kUntouchedAdapter;
  peft_adapter_options* opts = NULL;
  CHECK_CODE(peft_adapter_open("/nonexistent/adapter", NULL, &a), PEFT_ERR_NOT_FOUND);
  CHECK(a == kUntouchedAdapter);
  CHECK_CODE(peft_adapter_open(NULL, NULL, &a), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_open("/tmp", NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(a == kUntouchedAdapter);
  CHECK_CODE(peft_adapter_options_new(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_options_set_base_dir(NULL, "x"), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_adapter_options_new(&opts));
  CHECK_OK(peft_adapter_options_set_base_dir(opts, NULL));
  CHECK_OK(peft_adapter_options_set_translator(opts, NULL));
  peft_adapter_options_free(opts);
  CHECK_CODE(peft_adapter_validate(NULL, "x"), PEFT_ERR_INVALID_ARGUMENT);
  if (is_dir(PEFT_TEST_DATA "/adapters/mixtral_target_parameters")) {
    /* LoRA on stacked expert parameters (target_parameters): one module per wrapped parameter. */
    peft_adapter* experts = NULL;
    CHECK_OK(peft_adapter_open(PEFT_TEST_DATA "/adapters/mixtral_target_parameters", NULL, &experts));
    CHECK(peft_adapter_module_count(experts) > 0);
    peft_adapter_free(experts);
  }
  /* Getters accept NULL. */
  CHECK(peft_adapter_module_count(NULL) == 0);
  CHECK(peft_adapter_peft_type(NULL) == NULL);
  CHECK(peft_adapter_config_json(NULL) == NULL);
  CHECK(peft_adapter_note_count(NULL) == 0);
  CHECK(peft_adapter_note(NULL, 0) == NULL);
  CHECK(peft_adapter_r(NULL) == 0);
  peft_adapter_free(NULL);
  peft_adapter_options_free(NULL);
  peft_translator_free(NULL);
  peft_string_free(NULL);
}

static void test_translators(void) {
  peft_translator* tr = NULL;
  peft_translator* untouched = kUntouchedTranslator;
  char* out = NULL;
  char* list = NULL;
  const char* keys[3];
  char* results[3] = {NULL, NULL, NULL};
  char* sentinel = (char*)(uintptr_t)0x5eed;

  CHECK_OK(peft_translator_builtin_families(&list));
  CHECK(list && strstr(list, "llama\n") != NULL && strstr(list, "gpt2\n") != NULL);
  {
    /* The list form holds the same families in the same (sorted) order. */
    peft_string_list* families = NULL;
    size_t offset = 0;
    CHECK_CODE(peft_translator_builtin_family_list(NULL), PEFT_ERR_INVALID_ARGUMENT);
    CHECK_OK(peft_translator_builtin_family_list(&families));
    CHECK(peft_string_list_count(families) > 1);
    for (size_t i = 0; list && i < peft_string_list_count(families); ++i) {
      const char* family = peft_string_list_get(families, i);
      size_t length = strlen(family);
      CHECK(strncmp(list + offset, family, length) == 0 && list[offset + length] == '\n');
      if (i > 0) CHECK(strcmp(peft_string_list_get(families, i - 1), family) < 0);
      offset += length + 1;
    }
    CHECK(list && list[offset] == '\0');
    peft_string_list_free(families);
  }
  peft_string_free(list);

  CHECK_CODE(peft_translator_new_builtin("no_such_family", &untouched), PEFT_ERR_NOT_FOUND);
  CHECK_CODE(peft_translator_new_builtin("../etc", &untouched), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(untouched == kUntouchedTranslator);
  CHECK_OK(peft_translator_new_builtin("llama", &tr));
  if (tr == NULL) return;
  CHECK(strcmp(peft_translator_family(tr), "llama") == 0);
  CHECK_OK(peft_translator_to_native(tr, "model.layers.4.self_attn.q_proj.lora_A.weight", &out));
  CHECK(out && strcmp(out, "transformer/layer_4/attention/query/lora_a") == 0);
  peft_string_free(out);
  out = sentinel;
  CHECK_CODE(peft_translator_to_native(tr, "model.layers.4.self_attn.nope.lora_A.weight", &out), PEFT_ERR_UNRESOLVED_KEY);
  CHECK(out == sentinel);
  CHECK_OK(peft_translator_to_hf(tr, "transformer/layer_4/mlp/down/lora_b", 1, &out));
  CHECK(out && strcmp(out, "base_model.model.model.layers.4.mlp.down_proj.lora_B.weight") == 0);
  peft_string_free(out);

  keys[0] = "model.layers.0.mlp.up_proj.weight";
  keys[1] = "model.layers.0.mlp.sideways.weight";
  keys[2] = "model.nothing.weight";
  results[0] = sentinel;
  {
    peft_error* err = peft_translator_to_native_batch(tr, keys, 3, results);
    CHECK(peft_error_code(err) == PEFT_ERR_UNRESOLVED_KEY);
    CHECK(err && strstr(peft_error_message(err), "sideways") && strstr(peft_error_message(err), "model.nothing"));
    peft_error_free(err);
  }
  CHECK(results[0] == sentinel);
  CHECK_OK(peft_translator_to_native_batch(tr, keys, 1, results));
  CHECK(strcmp(results[0], "transformer/layer_0/mlp/up/weight") == 0);
  {
    const char* natives[1];
    char* back[1] = {NULL};
    natives[0] = results[0];
    CHECK_OK(peft_translator_to_hf_batch(tr, natives, 1, 0, back));
    CHECK(back[0] && strcmp(back[0], keys[0]) == 0);
    peft_string_free(back[0]);
  }
  peft_string_free(results[0]);
  CHECK_CODE(peft_translator_to_native_batch(tr, NULL, 2, results), PEFT_ERR_INVALID_ARGUMENT);
  peft_translator_free(tr);

  tr = NULL;
  CHECK_OK(peft_translator_from_json(
      "{\"family\": \"mine\", \"modules\": [{\"hf\": \"blocks.{i}.proj\", \"native\": \"b{i}/p\"}]}", &tr));
  CHECK_OK(peft_translator_to_native(tr, "base_model.model.blocks.2.proj.lora_A.weight", &out));
  CHECK(out && strcmp(out, "b2/p/lora_a") == 0);
  peft_string_free(out);
  peft_translator_free(tr);
  untouched = kUntouchedTranslator;
  CHECK_CODE(peft_translator_from_json("{\"family\": \"x\"}", &untouched), PEFT_ERR_INVALID_CONFIG);
  CHECK_CODE(peft_translator_from_file("/nonexistent/table.json", &untouched), PEFT_ERR_IO);
  CHECK(untouched == kUntouchedTranslator);

  tr = NULL;
  CHECK_OK(peft_translator_detect(NULL, "Qwen/Qwen2.5-0.5B-Instruct", &tr));
  CHECK(tr && strcmp(peft_translator_family(tr), "qwen2") == 0);
  peft_translator_free(tr);
  CHECK_CODE(peft_translator_detect(NULL, "my-own-model", &untouched), PEFT_ERR_NOT_FOUND);
  if (is_dir(PEFT_TEST_DATA "/models/bert")) {
    tr = NULL;
    CHECK_OK(peft_translator_detect(PEFT_TEST_DATA "/models/bert", NULL, &tr));
    CHECK(tr && strcmp(peft_translator_family(tr), "bert") == 0);
    peft_translator_free(tr);
  }
}

static void test_corpus(void) {
  const char* dir = PEFT_CORPUS "/Karangarg01__peft-hate-speech-detection/model";
  peft_adapter* a = NULL;
  size_t m, full = 0;
  if (!is_dir(dir)) {
    printf("skipped: corpus not found at %s\n", PEFT_CORPUS);
    return;
  }
  CHECK_OK(peft_adapter_open(dir, NULL, &a));
  if (a == NULL) return;
  CHECK(strcmp(peft_adapter_task_type(a), "SEQ_CLS") == 0);
  CHECK(strcmp(peft_adapter_base_model_name_or_path(a), "distilbert-base-uncased") == 0);
  CHECK(strcmp(peft_adapter_family(a), "distilbert") == 0);
  for (m = 0; m < peft_adapter_module_count(a); ++m) {
    if (peft_adapter_module_kind(a, m) == PEFT_LAYER_FULL) {
      ++full;
      CHECK(peft_adapter_module_rank(a, m) == 0);
    } else {
      CHECK(peft_adapter_module_rank(a, m) == 8);
      CHECK(peft_adapter_module_scaling(a, m) == 2.0);
    }
  }
  CHECK(full == 2); /* classifier and pre_classifier */
  peft_adapter_free(a);
}

/* Lenient loading: the fixture llama_lora with down_proj left out of target_modules. Strict opening
 * refuses it; lenient opening drops its four down_proj tensors (PEFT's unexpected keys), one
 * warning each, and so does a registry registered with the same options, which keeps them
 * (peft_registry_warning_list). */
static void test_lenient(void) {
  const char* fixture = PEFT_TEST_DATA "/adapters/llama_lora";
  char dir[] = "/tmp/peft_capi_lenient_XXXXXX";
  char path[512];
  size_t size = 0;
  char* config;
  char* cut;
  peft_adapter_options* opts = NULL;
  peft_adapter* a = kUntouchedAdapter;
  peft_registry* registry = NULL;

  if (mkdtemp(dir) == NULL) {
    CHECK(0);
    return;
  }
  snprintf(path, sizeof path, "%s/adapter_config.json", fixture);
  config = slurp(path, &size);
  CHECK(config != NULL);
  if (config == NULL) return;
  cut = strstr(config, "\"down_proj\",");
  CHECK(cut != NULL);
  if (cut) memset(cut, ' ', strlen("\"down_proj\","));
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  CHECK(write_bytes(path, config, strlen(config)));
  free(config);
  {
    char from[512];
    snprintf(from, sizeof from, "%s/adapter_model.safetensors", fixture);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    CHECK(copy_file(from, path));
  }

  CHECK_CODE(peft_adapter_open(dir, NULL, &a), PEFT_ERR_INVALID_CONFIG);
  CHECK(a == kUntouchedAdapter);
  CHECK_CODE(peft_adapter_options_set_lenient(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_adapter_options_new(&opts));
  CHECK_OK(peft_adapter_options_set_base_dir(opts, PEFT_TEST_DATA "/models/llama"));
  CHECK_OK(peft_adapter_options_set_lenient(opts, 1));
  CHECK_OK(peft_adapter_open(dir, opts, &a));
  if (a != kUntouchedAdapter) {
    size_t i;
    CHECK(peft_adapter_warning_count(a) == 4);
    CHECK(peft_adapter_module_count(a) == 12);
    for (i = 0; i < peft_adapter_warning_count(a); ++i) {
      const char* w = peft_adapter_warning(a, i);
      const char* start = "unexpected key \"base_model.model.model.layers.";
      CHECK(w != NULL && strncmp(w, start, strlen(start)) == 0);
      CHECK(w != NULL && strstr(w, "down_proj.lora_") != NULL);
    }
    CHECK(peft_adapter_warning(a, 4) == NULL);
    peft_adapter_free(a);
  }
  CHECK(peft_adapter_warning_count(NULL) == 0);
  CHECK(peft_adapter_warning(NULL, 0) == NULL);

  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 0, NULL, &registry));
  CHECK_CODE(peft_registry_register(registry, "strict", dir, NULL), PEFT_ERR_INVALID_CONFIG);
  CHECK_OK(peft_registry_register(registry, "lenient", dir, opts));
  CHECK_OK(peft_registry_register(registry, "plain", fixture, NULL));
  {
    peft_string_list* warnings = NULL;
    size_t i;
    CHECK_OK(peft_registry_warning_list(registry, "lenient", &warnings));
    CHECK(peft_string_list_count(warnings) == 4);
    for (i = 0; i < peft_string_list_count(warnings); ++i)
      CHECK(strstr(peft_string_list_get(warnings, i), "down_proj.lora_") != NULL);
    peft_string_list_free(warnings);
    warnings = NULL;
    CHECK_OK(peft_registry_warning_list(registry, "plain", &warnings));
    CHECK(peft_string_list_count(warnings) == 0);
    peft_string_list_free(warnings);
    warnings = NULL;
    CHECK_CODE(peft_registry_warning_list(registry, "strict", &warnings), PEFT_ERR_NOT_FOUND);
    CHECK(warnings == NULL);
    CHECK_CODE(peft_registry_warning_list(registry, NULL, &warnings), PEFT_ERR_INVALID_ARGUMENT);
    CHECK_CODE(peft_registry_warning_list(NULL, "plain", &warnings), PEFT_ERR_INVALID_ARGUMENT);
  }
  peft_registry_free(registry);

  /* Strict again: the option can be switched off. */
  CHECK_OK(peft_adapter_options_set_lenient(opts, 0));
  a = kUntouchedAdapter;
  CHECK_CODE(peft_adapter_open(dir, opts, &a), PEFT_ERR_INVALID_CONFIG);
  CHECK(a == kUntouchedAdapter);
  peft_adapter_options_free(opts);
  remove_tree(dir);
}

int main(void) {
  test_fixture_adapter();
  test_lenient();
  test_gpt2_conv1d();
  test_errors();
  test_translators();
  test_corpus();
  return check_summary();
}
