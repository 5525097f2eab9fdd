/* The export section of the C API, from C99: export options, peft_adapter_export and
 * peft_adapter_combine, their results read back through the API, and every documented error.
 * Prints "N passed, M failed" and exits nonzero on any failure. */
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

static const char* in_scratch(const char* name, char* buf, size_t size) {
  snprintf(buf, size, "%s/%s", scratch, name);
  return buf;
}

static const char* fixture(const char* name, char* buf, size_t size) {
  snprintf(buf, size, "%s/adapters/%s", PEFT_TEST_DATA, name);
  return buf;
}

static int same_file(const char* a, const char* b) {
  size_t na = 0, nb = 1;
  char* da = slurp(a, &na);
  char* db = slurp(b, &nb);
  int same = da != NULL && db != NULL && na == nb && memcmp(da, db, na) == 0;
  free(da);
  free(db);
  return same;
}

static peft_adapter* open_fixture(const char* name) {
  char dir[512];
  peft_adapter* a = NULL;
  CHECK_OK(peft_adapter_open(fixture(name, dir, sizeof dir), NULL, &a));
  return a;
}

static void test_options(void) {
  peft_export_options* opts = NULL;
  CHECK_CODE(peft_export_options_new(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_export_options_new(&opts));
  CHECK(opts != NULL);

  CHECK_OK(peft_export_options_set_dtype(opts, PEFT_DTYPE_F32));
  CHECK_OK(peft_export_options_set_dtype(opts, PEFT_DTYPE_F16));
  CHECK_OK(peft_export_options_set_dtype(opts, PEFT_DTYPE_BF16));
  CHECK_OK(peft_export_options_set_dtype(opts, -1));
  CHECK_CODE(peft_export_options_set_dtype(opts, PEFT_DTYPE_I32), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_dtype(opts, PEFT_DTYPE_F64), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_dtype(opts, 1000), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_dtype(NULL, PEFT_DTYPE_F32), PEFT_ERR_INVALID_ARGUMENT);

  CHECK_OK(peft_export_options_set_peft_version(opts, "0.13"));
  CHECK_OK(peft_export_options_set_peft_version(opts, "0.17.1"));
  CHECK_OK(peft_export_options_set_peft_version(opts, NULL));
  CHECK_OK(peft_export_options_set_peft_version(opts, ""));
  CHECK_CODE_NAMING(peft_export_options_set_peft_version(opts, "zero.13"), PEFT_ERR_INVALID_ARGUMENT, "zero.13");
  CHECK_CODE_NAMING(peft_export_options_set_peft_version(opts, "0.12"), PEFT_ERR_UNSUPPORTED, "0.13");
  CHECK_CODE(peft_export_options_set_peft_version(NULL, "0.13"), PEFT_ERR_INVALID_ARGUMENT);

  peft_export_options_free(opts);
  peft_export_options_free(NULL);
}

static void test_export(void) {
  char src[512], out[512], a[1024], b[1024];
  peft_adapter* lora = open_fixture("llama_lora");
  peft_adapter* bias = open_fixture("qwen2_lora_bias");
  peft_adapter* back = NULL;
  peft_export_options* opts = NULL;
  size_t m, t;
  int all_bf16 = 1;
  if (lora == NULL || bias == NULL) return;

  /* Defaults: PEFT's own files, byte for byte. */
  CHECK_OK(peft_adapter_export(lora, in_scratch("plain", out, sizeof out), NULL));
  fixture("llama_lora", src, sizeof src);
  snprintf(a, sizeof a, "%s/adapter_model.safetensors", out);
  snprintf(b, sizeof b, "%s/adapter_model.safetensors", src);
  CHECK(same_file(a, b));
  snprintf(a, sizeof a, "%s/adapter_config.json", out);
  snprintf(b, sizeof b, "%s/adapter_config.json", src);
  CHECK(same_file(a, b));

  /* A dtype and a target version. */
  CHECK_OK(peft_export_options_new(&opts));
  CHECK_OK(peft_export_options_set_dtype(opts, PEFT_DTYPE_BF16));
  CHECK_OK(peft_export_options_set_peft_version(opts, "0.13"));
  CHECK_OK(peft_adapter_export(lora, in_scratch("nested/bf16_013", out, sizeof out), opts));
  CHECK_OK(peft_adapter_open(out, NULL, &back));
  if (back != NULL) {
    CHECK(peft_adapter_module_count(back) == peft_adapter_module_count(lora));
    for (m = 0; m < peft_adapter_module_count(back); ++m)
      for (t = 0; t < peft_adapter_module_tensor_count(back, m); ++t)
        all_bf16 = all_bf16 && peft_adapter_module_tensor_dtype(back, m, t) == PEFT_DTYPE_BF16;
    CHECK(all_bf16);
    CHECK(peft_adapter_config_field(back, "peft_version") == NULL);
    CHECK(peft_adapter_config_field(back, "exclude_modules") == NULL);
    CHECK(strcmp(peft_adapter_config_field(back, "inference_mode"), "true") == 0);
    CHECK(strcmp(peft_adapter_config_field(back, "r"), "4") == 0);
    peft_adapter_free(back);
  }

  /* lora_bias does not exist in PEFT 0.13: refused, nothing written. */
  CHECK_CODE_NAMING(peft_adapter_export(bias, in_scratch("bias_013", out, sizeof out), opts), PEFT_ERR_UNSUPPORTED,
                    "lora_bias");
  CHECK(!exists(out));
  CHECK_OK(peft_export_options_set_peft_version(opts, "0.14"));
  CHECK_OK(peft_adapter_export(bias, in_scratch("bias_014", out, sizeof out), opts));

  /* Argument errors. */
  CHECK_CODE(peft_adapter_export(NULL, out, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_export(lora, NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_export(lora, "", NULL), PEFT_ERR_INVALID_ARGUMENT);
  snprintf(a, sizeof a, "%s/adapter_config.json", in_scratch("plain", out, sizeof out));
  CHECK_CODE(peft_adapter_export(lora, a, NULL), PEFT_ERR_INVALID_ARGUMENT); /* a file, not a folder */
  CHECK(same_file(a, b));

  peft_export_options_free(opts);
  peft_adapter_free(lora);
  peft_adapter_free(bias);
}

static void test_combine(void) {
  char out[512];
  const double weights[2] = {0.5, 1.5};
  const double bad_weights[2] = {1.0, NAN};
  peft_adapter* first = open_fixture("llama_lora");
  peft_adapter* second = open_fixture("llama_lora_second");
  peft_adapter* pattern = open_fixture("llama_rank_alpha_pattern");
  peft_adapter* dora = open_fixture("llama_dora");
  peft_adapter* back = NULL;
  peft_export_options* opts = NULL;
  const peft_adapter* pair[2];
  const peft_adapter* with_null[2];
  const peft_adapter* unequal[2];
  const peft_adapter* with_dora[2];
  size_t m;
  int ranks_ok = 1;
  if (first == NULL || second == NULL || pattern == NULL || dora == NULL) return;
  pair[0] = first;
  pair[1] = second;
  with_null[0] = first;
  with_null[1] = NULL;
  unequal[0] = pattern;
  unequal[1] = first;
  with_dora[0] = first;
  with_dora[1] = dora;

  CHECK_OK(peft_adapter_combine(pair, weights, 2, PEFT_COMBINE_CAT, in_scratch("cat", out, sizeof out), NULL));
  CHECK_OK(peft_adapter_open(out, NULL, &back));
  if (back != NULL) {
    CHECK(peft_adapter_r(back) == 8);
    CHECK(peft_adapter_lora_alpha(back) == 8.0);
    for (m = 0; m < peft_adapter_module_count(back); ++m)
      ranks_ok = ranks_ok && peft_adapter_module_rank(back, m) == 8 && peft_adapter_module_scaling(back, m) == 1.0;
    CHECK(ranks_ok);
    CHECK(strcmp(peft_adapter_config_field(back, "rank_pattern"), "{}") == 0);
    peft_adapter_free(back);
    back = NULL;
  }

  CHECK_OK(peft_export_options_new(&opts));
  CHECK_OK(peft_export_options_set_dtype(opts, PEFT_DTYPE_F16));
  CHECK_OK(peft_adapter_combine(pair, weights, 2, PEFT_COMBINE_LINEAR, in_scratch("linear", out, sizeof out), opts));
  CHECK_OK(peft_adapter_open(out, NULL, &back));
  if (back != NULL) {
    CHECK(peft_adapter_r(back) == 4);
    CHECK(peft_adapter_module_tensor_dtype(back, 0, 0) == PEFT_DTYPE_F16);
    peft_adapter_free(back);
  }

  /* The pruning types: density required, in [0, 1]; the settings' own errors. */
  CHECK_OK(peft_export_options_set_dtype(opts, PEFT_DTYPE_KEEP));
  CHECK_CODE_NAMING(peft_adapter_combine(pair, weights, 2, PEFT_COMBINE_TIES, in_scratch("ties", out, sizeof out), opts),
                    PEFT_ERR_INVALID_ARGUMENT, "density");
  CHECK(!exists(out));
  CHECK_CODE(peft_export_options_set_combine_density(opts, 1.5), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_density(opts, -0.1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_density(opts, NAN), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_density(NULL, 0.5), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_majority_sign(opts, 2), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_majority_sign(NULL, PEFT_MAJORITY_SIGN_TOTAL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_seed(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_export_options_set_combine_density(opts, 0.5));
  CHECK_OK(peft_export_options_set_combine_majority_sign(opts, PEFT_MAJORITY_SIGN_FREQUENCY));
  CHECK_OK(peft_export_options_set_combine_seed(opts, UINT64_MAX));
  CHECK_OK(peft_adapter_combine(pair, weights, 2, PEFT_COMBINE_TIES, in_scratch("ties", out, sizeof out), opts));
  CHECK_OK(peft_adapter_combine(pair, weights, 2, PEFT_COMBINE_DARE_TIES, in_scratch("dare", out, sizeof out), opts));
  CHECK_OK(peft_adapter_open(out, NULL, &back));
  if (back != NULL) {
    CHECK(peft_adapter_r(back) == 4);
    peft_adapter_free(back);
    back = NULL;
  }
  CHECK_CODE_NAMING(peft_adapter_combine(unequal, weights, 2, PEFT_COMBINE_MAGNITUDE_PRUNE,
                                         in_scratch("pruned", out, sizeof out), opts),
                    PEFT_ERR_INVALID_ARGUMENT, "rank");
  CHECK(!exists(out));

  /* The SVD types: unequal ranks allowed; the rank is the largest, or svd_rank; the settings' errors. */
  CHECK_CODE(peft_export_options_set_combine_svd_rank(NULL, 2), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_svd_rank(opts, -1), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_svd_clamp(NULL, 0.5), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_svd_clamp(opts, 1.5), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_export_options_set_combine_svd_clamp(opts, -0.5), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_OK(peft_adapter_combine(unequal, weights, 2, PEFT_COMBINE_SVD, in_scratch("svd", out, sizeof out), NULL));
  CHECK_OK(peft_adapter_open(out, NULL, &back));
  if (back != NULL) {
    /* llama_rank_alpha_pattern: r 4 with a rank_pattern value 8; llama_lora: r 4. */
    CHECK(peft_adapter_r(back) == 8);
    CHECK(peft_adapter_lora_alpha(back) == 8.0);
    peft_adapter_free(back);
    back = NULL;
  }
  CHECK_OK(peft_export_options_set_combine_svd_rank(opts, 2));
  CHECK_OK(peft_export_options_set_combine_svd_clamp(opts, 0.9));
  CHECK_OK(peft_adapter_combine(unequal, weights, 2, PEFT_COMBINE_TIES_SVD, in_scratch("ties_svd", out, sizeof out), opts));
  CHECK_OK(peft_adapter_open(out, NULL, &back));
  if (back != NULL) {
    CHECK(peft_adapter_r(back) == 2);
    peft_adapter_free(back);
    back = NULL;
  }
  CHECK_OK(peft_export_options_set_combine_svd_clamp(opts, NAN));
  CHECK_OK(peft_export_options_set_combine_svd_rank(opts, 0));

  /* Errors: nothing is written. */
  in_scratch("failed", out, sizeof out);
  CHECK_CODE(peft_adapter_combine(NULL, weights, 2, PEFT_COMBINE_CAT, out, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_combine(pair, NULL, 2, PEFT_COMBINE_CAT, out, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_combine(pair, weights, 2, PEFT_COMBINE_CAT, NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_combine(pair, weights, 0, PEFT_COMBINE_CAT, out, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE_NAMING(peft_adapter_combine(pair, weights, 2, 11, out, NULL), PEFT_ERR_INVALID_ARGUMENT, "11");
  CHECK_CODE_NAMING(peft_adapter_combine(with_null, weights, 2, PEFT_COMBINE_CAT, out, NULL),
                    PEFT_ERR_INVALID_ARGUMENT, "adapters[1]");
  CHECK_CODE(peft_adapter_combine(pair, bad_weights, 2, PEFT_COMBINE_CAT, out, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE_NAMING(peft_adapter_combine(unequal, weights, 2, PEFT_COMBINE_LINEAR, out, NULL),
                    PEFT_ERR_INVALID_ARGUMENT, "rank");
  CHECK_CODE_NAMING(peft_adapter_combine(with_dora, weights, 2, PEFT_COMBINE_CAT, out, NULL), PEFT_ERR_UNSUPPORTED,
                    "DoRA");
  CHECK(!exists(out));

  /* The delta-space combination: exact by default (the ranks add up, errors 0), truncated with a rank. */
  {
    peft_lowrank_report* report = NULL;
    peft_lowrank_options* lowrank = NULL;
    size_t i;
    int zero = 1, summed = 0;
    CHECK_OK(peft_adapter_combine_deltas(unequal, weights, 2, PEFT_COMBINE_LINEAR, in_scratch("deltas", out, sizeof out),
                                         NULL, NULL, &report));
    CHECK(report != NULL && peft_lowrank_report_module_count(report) > 0);
    for (i = 0; report != NULL && i < peft_lowrank_report_module_count(report); ++i) {
      zero = zero && peft_lowrank_report_module_error(report, i) == 0.0;
      /* q_proj: llama_rank_alpha_pattern's rank_pattern 8 plus llama_lora's 4 */
      if (strcmp(peft_lowrank_report_module_name(report, i), "model.layers.0.self_attn.q_proj") == 0)
        summed = peft_lowrank_report_module_rank(report, i) == 12;
    }
    CHECK(zero);
    CHECK(summed);
    peft_lowrank_report_free(report);
    report = NULL;
    CHECK_OK(peft_lowrank_options_new(&lowrank));
    CHECK_OK(peft_lowrank_options_set_rank(lowrank, 2));
    CHECK_OK(peft_export_options_set_combine_density(opts, 0.5));
    CHECK_OK(peft_adapter_combine_deltas(pair, weights, 2, PEFT_COMBINE_TIES, in_scratch("deltas_ties", out, sizeof out),
                                         opts, lowrank, NULL));
    CHECK_OK(peft_adapter_open(out, NULL, &back));
    if (back != NULL) {
      CHECK(peft_adapter_r(back) == 2);
      peft_adapter_free(back);
      back = NULL;
    }
    /* Errors: another method, exact with pruning, DoRA, NULL arguments; nothing written. */
    in_scratch("deltas_failed", out, sizeof out);
    CHECK_CODE(peft_adapter_combine_deltas(pair, weights, 2, PEFT_COMBINE_SVD, out, opts, lowrank, NULL),
               PEFT_ERR_INVALID_ARGUMENT);
    CHECK_CODE_NAMING(peft_adapter_combine_deltas(pair, weights, 2, PEFT_COMBINE_TIES, out, opts, NULL, NULL),
                      PEFT_ERR_INVALID_ARGUMENT, "rank or an energy");
    CHECK_CODE_NAMING(peft_adapter_combine_deltas(with_dora, weights, 2, PEFT_COMBINE_LINEAR, out, NULL, NULL, NULL),
                      PEFT_ERR_UNSUPPORTED, "DoRA");
    CHECK_CODE(peft_adapter_combine_deltas(NULL, weights, 2, PEFT_COMBINE_LINEAR, out, NULL, NULL, NULL),
               PEFT_ERR_INVALID_ARGUMENT);
    CHECK_CODE(peft_adapter_combine_deltas(pair, weights, 0, PEFT_COMBINE_LINEAR, out, NULL, NULL, NULL),
               PEFT_ERR_INVALID_ARGUMENT);
    CHECK_CODE(peft_adapter_combine_deltas(with_null, weights, 2, PEFT_COMBINE_LINEAR, out, NULL, NULL, NULL),
               PEFT_ERR_INVALID_ARGUMENT);
    CHECK(!exists(out));
    peft_lowrank_options_free(lowrank);
  }

  peft_export_options_free(opts);
  peft_adapter_free(first);
  peft_adapter_free(second);
  peft_adapter_free(pattern);
  peft_adapter_free(dora);
}

/* peft_adapter_export_gguf_split: its argument errors, and that a failure leaves neither output. */
static void test_export_gguf_split(void) {
  char base[512], out[512], base_out[512], file[1024];
  peft_adapter* dora = open_fixture("llama_dora");
  FILE* f;
  if (dora == NULL) return;
  snprintf(base, sizeof base, "%s/models/llama", PEFT_TEST_DATA);
  in_scratch("split.gguf", out, sizeof out);
  in_scratch("split_base", base_out, sizeof base_out);

  CHECK_CODE(peft_adapter_export_gguf_split(NULL, out, base, 0, base_out), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_export_gguf_split(dora, NULL, base, 0, base_out), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_adapter_export_gguf_split(dora, out, base, 0, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE_NAMING(peft_adapter_export_gguf_split(dora, out, base, 0, ""), PEFT_ERR_INVALID_ARGUMENT, "empty");
  CHECK_CODE_NAMING(peft_adapter_export_gguf_split(dora, out, base, -1, base_out), PEFT_ERR_INVALID_ARGUMENT, "-1");
  CHECK_CODE_NAMING(peft_adapter_export_gguf_split(dora, out, base, 2, base_out), PEFT_ERR_INVALID_ARGUMENT, "2");
  CHECK_CODE_NAMING(peft_adapter_export_gguf_split(dora, out, base, 0, base), PEFT_ERR_INVALID_ARGUMENT, "is the base");
  CHECK_CODE_NAMING(peft_adapter_export_gguf_split(dora, out, base, 0, out), PEFT_ERR_INVALID_ARGUMENT, "same path");
  CHECK(!exists(out) && !exists(base_out));

  /* The merge fails (the merged base of a Hugging Face base is a folder, and a file is in the way)
   * after the adapter part was written under a temporary name: neither output is left, the file in
   * the way is unchanged, and the scratch folder holds no temporary. */
  in_scratch("in_the_way", file, sizeof file);
  f = fopen(file, "wb");
  CHECK(f != NULL);
  if (f != NULL) {
    fputs("keep", f);
    fclose(f);
  }
  CHECK_CODE(peft_adapter_export_gguf_split(dora, out, base, 0, file), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(!exists(out));
  {
    size_t n = 0;
    char* kept = slurp(file, &n);
    CHECK(kept != NULL && n == 4 && memcmp(kept, "keep", 4) == 0);
    free(kept);
  }
  {
    DIR* d = opendir(scratch);
    struct dirent* e;
    int temporaries = 0;
    while (d != NULL && (e = readdir(d)) != NULL)
      if (strstr(e->d_name, "peft-tmp") != NULL) ++temporaries;
    if (d != NULL) closedir(d);
    CHECK(temporaries == 0);
  }
  remove(file);

  /* Success: everything merged (DoRA), an adapter without pairs, a model folder. */
  CHECK_OK(peft_adapter_export_gguf_split(dora, out, base, 0, base_out));
  CHECK(exists(out));
  snprintf(file, sizeof file, "%s/model.safetensors", base_out);
  CHECK(exists(file));
  peft_adapter_free(dora);
}

int main(void) {
  char probe[512];
  snprintf(probe, sizeof probe, "%s/adapters/llama_lora/adapter_config.json", PEFT_TEST_DATA);
  if (!exists(probe)) {
    printf("SKIP: fixture %s is absent (run tests/fixtures/generate.py)\n", probe);
    return 0;
  }
  snprintf(scratch, sizeof scratch, "/tmp/peft_test_export_XXXXXX");
  if (mkdtemp(scratch) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_options();
  test_export();
  test_combine();
  test_export_gguf_split();
  remove_tree(scratch);
  return check_summary();
}
