/* Open a LoRA adapter, validate it against its base model, merge it into the base, and export it.
 * usage: example BASE_DIR ADAPTER_DIR OUT_DIR   (writes OUT_DIR/merged and OUT_DIR/adapter) */
#include <stdio.h>
#include <string.h>

#include "peft_c.h"

static int fail(peft_error* err) {
  fprintf(stderr, "example: %s: %s\n", peft_error_code_name(peft_error_code(err)), peft_error_message(err));
  peft_error_free(err);
  return 1;
}

int main(int argc, char** argv) {
  char merged[4096], exported[4096];
  peft_adapter* adapter = NULL;
  peft_merge_options* options = NULL;
  peft_merge_result* result = NULL;
  peft_error* err;
  if (argc != 4) {
    fprintf(stderr, "usage: example BASE_DIR ADAPTER_DIR OUT_DIR\n");
    return 2;
  }
  snprintf(merged, sizeof merged, "%s/merged", argv[3]);
  snprintf(exported, sizeof exported, "%s/adapter", argv[3]);

  if ((err = peft_adapter_open(argv[2], NULL, &adapter))) return fail(err);
  printf("adapter: r=%lld, lora_alpha=%g\n", (long long)peft_adapter_r(adapter), peft_adapter_lora_alpha(adapter));
  if ((err = peft_adapter_validate(adapter, argv[1]))) return fail(err);
  printf("validated against %s\n", argv[1]);

  if ((err = peft_merge_options_new(&options))) return fail(err);
  if ((err = peft_merge_options_add_adapter(options, adapter, 1.0))) return fail(err);
  if ((err = peft_merge_checkpoint(argv[1], merged, options, &result))) return fail(err);
  printf("merged into %s: %llu bytes in %zu file(s)\n", merged,
         (unsigned long long)peft_merge_result_bytes(result), peft_merge_result_file_count(result));

  if ((err = peft_adapter_export(adapter, exported, NULL))) return fail(err);
  printf("exported to %s\n", exported);

  peft_merge_result_free(result);
  peft_merge_options_free(options);
  peft_adapter_free(adapter);
  return 0;
}
