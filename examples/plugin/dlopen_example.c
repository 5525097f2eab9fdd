/* A host that loads peft_c with dlopen and reaches every function through peft_get_api() alone:
 * the one symbol a plugin needs. It does the same job as examples/c/example.c.
 * usage: dlopen_example LIBRARY BASE_DIR ADAPTER_DIR OUT_DIR */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>

#include "peft_c.h"

static const peft_api* api;

static int fail(peft_error* err) {
  fprintf(stderr, "dlopen_example: %s: %s\n", api->error_code_name(api->error_code(err)), api->error_message(err));
  api->error_free(err);
  return 1;
}

int main(int argc, char** argv) {
  char merged[4096], exported[4096];
  void* library;
  peft_get_api_fn get_api;
  peft_adapter* adapter = NULL;
  peft_merge_options* options = NULL;
  peft_error* err;
  if (argc != 5) {
    fprintf(stderr, "usage: dlopen_example LIBRARY BASE_DIR ADAPTER_DIR OUT_DIR\n");
    return 2;
  }
  library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "dlopen_example: %s\n", dlerror());
    return 1;
  }
  /* POSIX guarantees that dlsym's result converts to a function pointer; this spelling of the
   * conversion is the one it recommends. */
  *(void**)(&get_api) = dlsym(library, "peft_get_api");
  if (get_api == NULL || (api = get_api(PEFT_ABI_VERSION)) == NULL) {
    fprintf(stderr, "dlopen_example: the library has no table for ABI %d\n", PEFT_ABI_VERSION);
    return 1;
  }
  if (api->abi != PEFT_ABI_VERSION || api->size < sizeof(peft_api)) {
    fprintf(stderr, "dlopen_example: the library's table is older than this header\n");
    return 1;
  }
  printf("loaded peft_c %s (ABI %u) through peft_get_api\n", api->version(), api->abi_version());
  if (get_api(PEFT_ABI_VERSION + 1) != NULL) {
    fprintf(stderr, "dlopen_example: an unknown ABI version must give NULL\n");
    return 1;
  }
  snprintf(merged, sizeof merged, "%s/merged", argv[4]);
  snprintf(exported, sizeof exported, "%s/adapter", argv[4]);

  if ((err = api->adapter_open(argv[3], NULL, &adapter))) return fail(err);
  if ((err = api->adapter_validate(adapter, argv[2]))) return fail(err);
  if ((err = api->merge_options_new(&options))) return fail(err);
  if ((err = api->merge_options_add_adapter(options, adapter, 1.0))) return fail(err);
  if ((err = api->merge_checkpoint(argv[2], merged, options, NULL))) return fail(err);
  if ((err = api->adapter_export(adapter, exported, NULL))) return fail(err);
  printf("validated, merged into %s, exported to %s\n", merged, exported);

  api->merge_options_free(options);
  api->adapter_free(adapter);
  dlclose(library);
  return 0;
}
