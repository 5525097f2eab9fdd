/* The hub section of the C API, from C99: peft_hub_resolve() and peft_hub_cache_dir() (arguments,
 * ownership, failed calls leaving the out-parameter alone), and model ids accepted by every function
 * that takes a base model or adapter folder, on a cache laid out as huggingface_hub lays it out
 * (snapshots/<commit>/<file> -> ../../blobs/<hash>, refs/main). Also an incomplete download (a link
 * to a missing blob) as NOT_FOUND. Prints "N passed, M failed" and exits nonzero on any failure. */
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

#define COMMIT "0123456789abcdef0123456789abcdef01234567"

static char scratch[256];

static const char* at(const char* rel) {
  static char buf[4][1024];
  static int next = 0;
  char* out = buf[next++ % 4];
  snprintf(out, sizeof buf[0], "%s/%s", scratch, rel);
  return out;
}

/* Lays file `name` of fixture folder `source` into repository folder `repo` (under the scratch
 * folder) as blob `blob`, linked from snapshots/COMMIT. 1 on success. */
static int lay(const char* repo, const char* source, const char* name, const char* blob) {
  char from[1024], to[1024], link[1024], target[256];
  snprintf(from, sizeof from, "%s/%s/%s", PEFT_TEST_DATA, source, name);
  snprintf(to, sizeof to, "%s/hub/%s/blobs/%s", scratch, repo, blob);
  snprintf(link, sizeof link, "%s/hub/%s/snapshots/" COMMIT "/%s", scratch, repo, name);
  snprintf(target, sizeof target, "../../blobs/%s", blob);
  return copy_file(from, to) && symlink(target, link) == 0;
}

static int make_repo(const char* repo) {
  char path[1024];
  const char* parts[] = {"", "/blobs", "/refs", "/snapshots", ("/snapshots/" COMMIT)};
  size_t i;
  for (i = 0; i < sizeof parts / sizeof parts[0]; ++i) {
    snprintf(path, sizeof path, "%s/hub/%s%s", scratch, repo, parts[i]);
    if (mkdir(path, 0755) != 0) return 0;
  }
  snprintf(path, sizeof path, "%s/hub/%s/refs/main", scratch, repo);
  return write_bytes(path, COMMIT, strlen(COMMIT));
}

static int same_file(const char* a, const char* b) {
  size_t na = 0, nb = 0;
  char* da = slurp(a, &na);
  char* db = slurp(b, &nb);
  int same = da != NULL && db != NULL && na == nb && memcmp(da, db, na) == 0;
  free(da);
  free(db);
  return same;
}

static void test_arguments(void) {
  char* out = (char*)&out; /* a sentinel a failed call must leave alone */
  CHECK_CODE_NAMING(peft_hub_resolve(NULL, &out), PEFT_ERR_INVALID_ARGUMENT, "id_or_path");
  CHECK_CODE_NAMING(peft_hub_resolve("org/tiny", NULL), PEFT_ERR_INVALID_ARGUMENT, "out_dir");
  CHECK_CODE_NAMING(peft_hub_cache_dir(NULL), PEFT_ERR_INVALID_ARGUMENT, "out_dir");
  CHECK_CODE_NAMING(peft_hub_resolve("../up", &out), PEFT_ERR_INVALID_ARGUMENT, "neither an existing path nor a model id");
  CHECK_CODE_NAMING(peft_hub_resolve("a/b/c", &out), PEFT_ERR_INVALID_ARGUMENT, "\"org/name\"");
  CHECK_CODE_NAMING(peft_hub_resolve("org/absent", &out), PEFT_ERR_NOT_FOUND, "downloads nothing");
  CHECK_CODE_NAMING(peft_hub_resolve("org/tiny@v9", &out), PEFT_ERR_NOT_FOUND, "refs/ names \"main\"");
  CHECK(out == (char*)&out);
}

static void test_resolution(void) {
  char* out = NULL;
  CHECK_OK(peft_hub_cache_dir(&out));
  CHECK(out != NULL && strcmp(out, at("hub")) == 0);
  peft_string_free(out);
  out = NULL;
  CHECK_OK(peft_hub_resolve("org/tiny", &out));
  CHECK(out != NULL && strcmp(out, at("hub/models--org--tiny/snapshots/" COMMIT)) == 0);
  peft_string_free(out);
  out = NULL;
  CHECK_OK(peft_hub_resolve("org/tiny@01234567", &out));
  CHECK(out != NULL && strcmp(out, at("hub/models--org--tiny/snapshots/" COMMIT)) == 0);
  peft_string_free(out);
  out = NULL;
  CHECK_OK(peft_hub_resolve(PEFT_TEST_DATA, &out)); /* an existing path, as it is */
  CHECK(out != NULL && strcmp(out, PEFT_TEST_DATA) == 0);
  peft_string_free(out);
}

static void test_ids_as_folders(void) {
  peft_checkpoint* ckpt = NULL;
  peft_adapter_options* opts = NULL;
  peft_adapter* adapter = NULL;
  peft_translator* translator = NULL;
  peft_merge_options* merge = NULL;
  peft_registry* registry = NULL;
  char base_path[1024], lora_path[1024];
  snprintf(base_path, sizeof base_path, "%s/models/llama", PEFT_TEST_DATA);
  snprintf(lora_path, sizeof lora_path, "%s/adapters/llama_lora", PEFT_TEST_DATA);

  CHECK_OK(peft_checkpoint_open("org/tiny", NULL, &ckpt));
  CHECK(peft_checkpoint_tensor_count(ckpt) > 0);
  peft_checkpoint_free(ckpt);

  CHECK_OK(peft_adapter_options_new(&opts));
  CHECK_OK(peft_adapter_options_set_base_dir(opts, "org/tiny"));
  CHECK_OK(peft_adapter_open("org/tiny-lora", opts, &adapter));
  CHECK(peft_adapter_module_count(adapter) > 0);
  CHECK_OK(peft_adapter_validate(adapter, "org/tiny"));
  CHECK_CODE_NAMING(peft_adapter_validate(adapter, "org/absent"), PEFT_ERR_NOT_FOUND, "models--org--absent");
  peft_adapter_free(adapter);
  adapter = NULL;
  CHECK_CODE_NAMING(peft_adapter_open("org/absent", NULL, &adapter), PEFT_ERR_NOT_FOUND, "models--org--absent");
  CHECK(adapter == NULL);
  /* A missing plain folder keeps its error. */
  CHECK_CODE_NAMING(peft_adapter_open(at("none"), NULL, &adapter), PEFT_ERR_NOT_FOUND, "does not exist");

  CHECK_OK(peft_translator_detect("org/tiny", NULL, &translator));
  CHECK(translator != NULL && strcmp(peft_translator_family(translator), "llama") == 0);
  peft_translator_free(translator);

  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 0, NULL, &registry));
  CHECK_OK(peft_registry_register(registry, "tiny", "org/tiny-lora", opts));
  peft_registry_free(registry);
  peft_adapter_options_free(opts);

  CHECK_OK(peft_merge_options_new(&merge));
  CHECK_OK(peft_merge_options_add_adapter_dir(merge, "org/tiny-lora", 1.0));
  CHECK_OK(peft_merge_checkpoint("org/tiny", at("by_id"), merge, NULL));
  peft_merge_options_free(merge);
  CHECK_OK(peft_merge_options_new(&merge));
  CHECK_OK(peft_merge_options_add_adapter_dir(merge, lora_path, 1.0));
  CHECK_OK(peft_merge_checkpoint(base_path, at("by_path"), merge, NULL));
  peft_merge_options_free(merge);
  CHECK(same_file(at("by_id/model.safetensors"), at("by_path/model.safetensors")));
  CHECK(same_file(at("by_id/config.json"), at("by_path/config.json")));
}

static void test_incomplete_download(void) {
  peft_adapter* adapter = NULL;
  CHECK(unlink(at("hub/models--org--tiny-lora/blobs/bbbb")) == 0);
  CHECK(write_bytes(at("hub/models--org--tiny-lora/blobs/bbbb.incomplete"), "x", 1));
  CHECK_CODE_NAMING(peft_adapter_open("org/tiny-lora", NULL, &adapter), PEFT_ERR_NOT_FOUND, "is incomplete");
  CHECK_CODE_NAMING(peft_adapter_open("org/tiny-lora", NULL, &adapter), PEFT_ERR_NOT_FOUND, "bbbb.incomplete is a partial download");
  CHECK(adapter == NULL);
}

int main(void) {
  char model[1024];
  snprintf(model, sizeof model, "%s/models/llama/model.safetensors", PEFT_TEST_DATA);
  if (!exists(model)) {
    printf("SKIP: fixture %s is absent\n", model);
    return 0;
  }
  snprintf(scratch, sizeof scratch, "/tmp/peft_capi_hub_XXXXXX");
  if (mkdtemp(scratch) == NULL) return 1;
  CHECK(mkdir(at("hub"), 0755) == 0);
  CHECK(make_repo("models--org--tiny") && make_repo("models--org--tiny-lora"));
  CHECK(lay("models--org--tiny", "models/llama", "config.json", "cccc"));
  CHECK(lay("models--org--tiny", "models/llama", "model.safetensors", "dddd"));
  CHECK(lay("models--org--tiny-lora", "adapters/llama_lora", "adapter_config.json", "aaaa"));
  CHECK(lay("models--org--tiny-lora", "adapters/llama_lora", "adapter_model.safetensors", "bbbb"));
  setenv("HF_HUB_CACHE", at("hub"), 1);

  test_arguments();
  test_resolution();
  test_ids_as_folders();
  test_incomplete_download();

  remove_tree(scratch);
  return check_summary();
}
