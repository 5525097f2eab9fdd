/* LoRA extraction and conversion to plain LoRA, from C99: low-rank options and their errors, the
 * report, peft_adapter_convert_to_lora and peft_adapter_convert_initial on the fixture adapters
 * (ranks read back through the API), an IA3 adapter against a base (peft_lowrank_options_set_base),
 * peft_adapter_extract's documented errors. Numerics against
 * numpy and PEFT are in tests/interop/test_lora_extract.py.
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

static char scratch[256];

static const char* path(char* buf, size_t size, const char* a, const char* b) {
  snprintf(buf, size, "%s/%s", a, b);
  return buf;
}

static peft_adapter* open_adapter(const char* name) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/adapters/%s", PEFT_TEST_DATA, name);
  peft_adapter* a = NULL;
  CHECK_OK(peft_adapter_open(dir, NULL, &a));
  return a;
}

static void test_options(void) {
  peft_lowrank_options* o = NULL;
  CHECK_CODE(peft_lowrank_options_new(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_lowrank_options_new(&o));
  CHECK_CODE(peft_lowrank_options_set_rank(o, 0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_lowrank_options_set_rank(NULL, 4), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_lowrank_options_set_energy(o, 0.0), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_lowrank_options_set_energy(o, 1.5), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_lowrank_options_set_svd(o, 7), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_lowrank_options_set_dtype(o, PEFT_DTYPE_I32), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_lowrank_options_set_modules(o, NULL, 2), PEFT_ERR_INVALID_ARGUMENT);
  const char* empty[] = {"q_proj", ""};
  CHECK_CODE(peft_lowrank_options_set_modules(o, empty, 2), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_lowrank_options_set_modules(o, NULL, 0));
  CHECK_OK(peft_lowrank_options_set_svd(o, PEFT_SVD_RANDOMIZED));
  CHECK_OK(peft_lowrank_options_set_threads(o, 1));
  CHECK_OK(peft_lowrank_options_set_energy(o, 0.5));
  peft_lowrank_options_free(o);
  peft_lowrank_options_free(NULL);
  /* report sentinels */
  CHECK(peft_lowrank_report_module_count(NULL) == 0);
  CHECK(peft_lowrank_report_module_name(NULL, 0) == NULL);
  CHECK(peft_lowrank_report_module_rank(NULL, 0) == 0);
  CHECK(peft_lowrank_report_module_error(NULL, 0) == -1.0);
  peft_lowrank_report_free(NULL);
}

static void test_convert(void) {
  char out[512];
  peft_adapter* lora = open_adapter("llama_lora");
  peft_lowrank_options* o = NULL;
  CHECK_OK(peft_lowrank_options_new(&o));
  peft_lowrank_report* report = NULL;
  /* neither a rank nor an energy */
  CHECK_CODE(peft_adapter_convert_to_lora(lora, path(out, sizeof out, scratch, "none"), o, &report),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK(report == NULL);
  CHECK_OK(peft_lowrank_options_set_rank(o, 2));
  CHECK_OK(peft_adapter_convert_to_lora(lora, path(out, sizeof out, scratch, "r2"), o, &report));
  size_t n = peft_lowrank_report_module_count(report);
  CHECK(n == peft_adapter_module_count(lora));
  for (size_t i = 0; i < n; ++i) {
    CHECK(peft_lowrank_report_module_rank(report, i) == 2);
    double e = peft_lowrank_report_module_error(report, i);
    CHECK(e >= 0.0 && e < 1.0);
    CHECK(peft_lowrank_report_module_name(report, i) != NULL);
  }
  CHECK(peft_lowrank_report_module_name(report, n) == NULL);
  peft_lowrank_report_free(report);
  peft_adapter* r2 = NULL;
  CHECK_OK(peft_adapter_open(out, NULL, &r2));
  for (size_t i = 0; r2 != NULL && i < peft_adapter_module_count(r2); ++i) CHECK(peft_adapter_module_rank(r2, i) == 2);
  peft_adapter_free(r2);
  /* the rank above a module's dimensions */
  CHECK_OK(peft_lowrank_options_set_rank(o, 100000));
  CHECK_CODE(peft_adapter_convert_to_lora(lora, path(out, sizeof out, scratch, "big"), o, NULL),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_lowrank_options_set_rank(o, 2));
  peft_adapter* dora = open_adapter("llama_dora");
  CHECK_CODE_NAMING(peft_adapter_convert_to_lora(dora, path(out, sizeof out, scratch, "dora"), o, NULL),
                    PEFT_ERR_UNSUPPORTED, "DoRA");
  /* the initial-adapter conversion doubles the rank */
  char lora_dir[512], dora_dir[512];
  snprintf(lora_dir, sizeof lora_dir, "%s/adapters/llama_lora", PEFT_TEST_DATA);
  snprintf(dora_dir, sizeof dora_dir, "%s/adapters/llama_dora", PEFT_TEST_DATA);
  CHECK_OK(peft_adapter_convert_initial(lora_dir, lora_dir, path(out, sizeof out, scratch, "doubled"), NULL));
  peft_adapter* doubled = NULL;
  CHECK_OK(peft_adapter_open(out, NULL, &doubled));
  for (size_t i = 0; doubled != NULL && i < peft_adapter_module_count(doubled); ++i)
    CHECK(peft_adapter_module_rank(doubled, i) == 2 * peft_adapter_module_rank(lora, i));
  peft_adapter_free(doubled);
  CHECK_CODE(peft_adapter_convert_initial(lora_dir, dora_dir, path(out, sizeof out, scratch, "mixed"), NULL),
             PEFT_ERR_UNSUPPORTED);
  CHECK_CODE(peft_adapter_convert_initial(NULL, lora_dir, out, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_convert_initial(lora_dir, scratch, path(out, sizeof out, scratch, "z"), NULL), PEFT_ERR_IO);
  peft_adapter_free(dora);
  peft_adapter_free(lora);
  peft_lowrank_options_free(o);
}

/* An IA3 adapter on the llama fixture's layer-0 k_proj (8 x 16), written here: ia3_l = 1 + i / 16. */
static void write_ia3_adapter(const char* dir) {
  char file[600];
  mkdir(dir, 0755);
  FILE* f = fopen(path(file, sizeof file, dir, "adapter_config.json"), "w");
  if (f == NULL) return;
  fputs("{\"peft_type\": \"IA3\", \"target_modules\": [\"k_proj\"], \"feedforward_modules\": [], "
        "\"task_type\": \"CAUSAL_LM\"}", f);
  fclose(f);
  const char* header = "{\"base_model.model.model.layers.0.self_attn.k_proj.ia3_l\": "
                       "{\"dtype\": \"F32\", \"shape\": [8, 1], \"data_offsets\": [0, 32]}}";
  uint64_t n = strlen(header);
  float l[8];
  for (int i = 0; i < 8; ++i) l[i] = 1.0f + (float)i / 16.0f;
  f = fopen(path(file, sizeof file, dir, "adapter_model.safetensors"), "wb");
  if (f == NULL) return;
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = (unsigned char)(n >> (8 * i));
  fwrite(len, 1, 8, f);
  fwrite(header, 1, n, f);
  fwrite(l, sizeof l[0], 8, f);
  fclose(f);
}

/* A multiplicative adapter (IA3) converts against a base only: peft_lowrank_options_set_base(). */
static void test_convert_against_base(void) {
  char dir[512], out[512], base[512];
  snprintf(base, sizeof base, "%s/models/llama", PEFT_TEST_DATA);
  path(dir, sizeof dir, scratch, "ia3");
  write_ia3_adapter(dir);
  peft_adapter* ia3 = NULL;
  CHECK_OK(peft_adapter_open(dir, NULL, &ia3));
  peft_lowrank_options* o = NULL;
  CHECK_OK(peft_lowrank_options_new(&o));
  CHECK_CODE(peft_lowrank_options_set_base(NULL, base), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_lowrank_options_set_rank(o, 2));
  CHECK_CODE_NAMING(peft_adapter_convert_to_lora(ia3, path(out, sizeof out, scratch, "ia3_nobase"), o, NULL),
                    PEFT_ERR_UNSUPPORTED, "IA3");
  CHECK_OK(peft_lowrank_options_set_base(o, base));
  peft_lowrank_report* report = NULL;
  CHECK_OK(peft_adapter_convert_to_lora(ia3, path(out, sizeof out, scratch, "ia3_lora"), o, &report));
  CHECK(peft_lowrank_report_module_count(report) == 1);
  CHECK(peft_lowrank_report_module_rank(report, 0) == 2);
  const double e = peft_lowrank_report_module_error(report, 0);
  CHECK(e > 0.0 && e < 1.0); /* dW = W diag-scaled rows: full rank, so rank 2 loses some */
  peft_lowrank_report_free(report);
  peft_adapter* converted = NULL;
  CHECK_OK(peft_adapter_open(out, NULL, &converted));
  CHECK(converted != NULL && peft_adapter_module_count(converted) == 1);
  peft_adapter_free(converted);
  /* NULL clears the base again */
  CHECK_OK(peft_lowrank_options_set_base(o, NULL));
  CHECK_CODE(peft_adapter_convert_to_lora(ia3, path(out, sizeof out, scratch, "ia3_cleared"), o, NULL),
             PEFT_ERR_UNSUPPORTED);
  /* a base without the module's weight */
  snprintf(base, sizeof base, "%s/models/gpt2", PEFT_TEST_DATA);
  CHECK_OK(peft_lowrank_options_set_base(o, base));
  CHECK_CODE(peft_adapter_convert_to_lora(ia3, path(out, sizeof out, scratch, "ia3_gpt2"), o, NULL), PEFT_ERR_NOT_FOUND);
  peft_lowrank_options_free(o);
  peft_adapter_free(ia3);
}

static void test_extract_errors(void) {
  char base[512], out[512];
  snprintf(base, sizeof base, "%s/models/llama", PEFT_TEST_DATA);
  peft_lowrank_options* o = NULL;
  CHECK_OK(peft_lowrank_options_new(&o));
  CHECK_CODE(peft_adapter_extract(base, base, path(out, sizeof out, scratch, "x"), o, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_lowrank_options_set_rank(o, 2));
  /* a model against itself: nothing changed */
  CHECK_CODE_NAMING(peft_adapter_extract(base, base, out, o, NULL), PEFT_ERR_INVALID_ARGUMENT, "change");
  CHECK_CODE(peft_adapter_extract(base, path(out, sizeof out, scratch, "absent"), scratch, o, NULL),
             PEFT_ERR_NOT_FOUND);
  const char* names[] = {"no_such_module"};
  CHECK_OK(peft_lowrank_options_set_modules(o, names, 1));
  CHECK_CODE(peft_adapter_extract(base, base, path(out, sizeof out, scratch, "y"), o, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_extract(NULL, base, out, o, NULL), PEFT_ERR_INVALID_ARGUMENT);
  peft_lowrank_options_free(o);
}

int main(void) {
  char probe[512];
  snprintf(probe, sizeof probe, "%s/adapters/llama_lora/adapter_config.json", PEFT_TEST_DATA);
  if (!exists(probe)) {
    printf("SKIP: fixture %s is absent (run tests/fixtures/generate.py)\n", probe);
    return 0;
  }
  snprintf(scratch, sizeof scratch, "/tmp/peft_test_lowrank_XXXXXX");
  if (mkdtemp(scratch) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_options();
  test_convert();
  test_convert_against_base();
  test_extract_errors();
  remove_tree(scratch);
  return check_summary();
}
