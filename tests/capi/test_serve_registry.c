/* The registry part of the serving section of the C API, from C99: registering from a folder and
 * from memory, acquiring and releasing leases, the budget (eviction, OVER_BUDGET, set_budget),
 * replacement and removal, stats with the caller's size, layer names with a translator, and the
 * error contract (NULL arguments, stable codes, untouched out-parameters on failure). Prints
 * "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peft_c.h"
#include "check.h"
#include "files.h"
#include "peft_test_paths.h"

#define LLAMA_LORA PEFT_TEST_DATA "/adapters/llama_lora"
#define LLAMA_RSLORA PEFT_TEST_DATA "/adapters/llama_rslora"
#define LLAMA_DORA PEFT_TEST_DATA "/adapters/llama_dora"

static peft_lease* const kUntouchedLease = (peft_lease*)(uintptr_t)0x5eed;
static peft_registry* const kUntouchedRegistry = (peft_registry*)(uintptr_t)0x5eed;

static peft_registry_stats stats_of(const peft_registry* registry) {
  peft_registry_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  CHECK_OK(peft_registry_get_stats(registry, &s));
  return s;
}

/* The names in both forms: the list (peft_registry_name_list) and the older newline-joined text. */
static int names_are(const peft_registry* registry, const char* expected) {
  char* names = NULL;
  peft_string_list* list = NULL;
  char joined[256] = "";
  int same;
  CHECK_OK(peft_registry_names(registry, &names));
  CHECK_OK(peft_registry_name_list(registry, &list));
  for (size_t i = 0; i < peft_string_list_count(list); ++i) {
    strncat(joined, peft_string_list_get(list, i), sizeof joined - strlen(joined) - 1);
    strncat(joined, "\n", sizeof joined - strlen(joined) - 1);
  }
  CHECK(peft_string_list_get(list, peft_string_list_count(list)) == NULL);
  same = names != NULL && strcmp(names, expected) == 0 && strcmp(joined, expected) == 0;
  peft_string_free(names);
  peft_string_list_free(list);
  return same;
}

static void test_lifecycle(void) {
  peft_registry* registry = NULL;
  peft_lease* first = NULL;
  peft_lease* again = NULL;
  peft_lease* other = NULL;
  peft_registry_stats s;
  uint64_t size;

  CHECK_OK(peft_registry_new(PEFT_DTYPE_BF16, 1u << 20, NULL, &registry));
  if (registry == NULL) return;
  CHECK(names_are(registry, ""));
  CHECK_OK(peft_registry_register(registry, "support", LLAMA_LORA, NULL));
  CHECK_OK(peft_registry_register(registry, "rs", LLAMA_RSLORA, NULL));
  CHECK(names_are(registry, "support\nrs\n"));
  s = stats_of(registry);
  CHECK(s.budget_bytes == 1u << 20);
  CHECK(s.registered == 2);
  CHECK(s.loads == 0); /* registering reads headers only */
  CHECK(s.loaded_bytes == 0);

  CHECK_OK(peft_registry_acquire(registry, "support", &first));
  CHECK_OK(peft_registry_acquire(registry, "support", &again));
  if (first == NULL || again == NULL) return;
  CHECK(strcmp(peft_lease_name(first), "support") == 0);
  CHECK(peft_lease_version(first) == 1);
  CHECK(peft_lease_version(again) == 1);
  /* llama_lora: 28 F32 tensors, 11624 - 8 - 3424 bytes of data, half of that in BF16. */
  size = peft_lease_bytes(first);
  CHECK(size == (11624 - 8 - 3424) / 2);
  CHECK(peft_lease_has_module(first, "model.layers.0.self_attn.q_proj") == 1);
  CHECK(peft_lease_has_module(first, "base_model.model.model.layers.1.mlp.down_proj.weight") == 1);
  CHECK(peft_lease_has_module(first, "model.layers.0.self_attn.q_proj.lora_A") == 0);
  CHECK(peft_lease_has_module(first, "model.embed_tokens") == 0);
  s = stats_of(registry);
  CHECK(s.loads == 1);
  CHECK(s.hits == 1);
  CHECK(s.loaded == 1);
  CHECK(s.pinned == 1);
  CHECK(s.loaded_bytes == size);
  CHECK(s.peak_loaded_bytes == size);

  /* Room for one: the pinned adapter stays, the other cannot load beside it. */
  CHECK_OK(peft_registry_set_budget(registry, size));
  CHECK_CODE(peft_registry_acquire(registry, "rs", &other), PEFT_ERR_OVER_BUDGET);
  CHECK_CODE(peft_registry_set_budget(registry, size - 1), PEFT_ERR_OVER_BUDGET);
  s = stats_of(registry);
  CHECK(s.budget_bytes == size);
  CHECK(s.loaded == 1);
  peft_lease_release(first); /* the older name of peft_lease_free() */
  peft_lease_free(again);
  s = stats_of(registry);
  CHECK(s.pinned == 0);
  CHECK(s.loaded == 1);
  CHECK_OK(peft_registry_acquire(registry, "rs", &other)); /* evicts "support" */
  s = stats_of(registry);
  CHECK(s.evictions == 1);
  CHECK(s.loaded == 1);
  CHECK(peft_lease_version(other) == 2);
  CHECK(peft_lease_has_module(other, "model.layers.0.mlp.up_proj") == 0); /* rslora adapts attention only */

  /* Replacing while leased: the lease keeps the old version, new acquisitions get the new one. */
  CHECK_OK(peft_registry_set_budget(registry, 4 * size));
  CHECK_OK(peft_registry_register(registry, "rs", LLAMA_LORA, NULL));
  CHECK(names_are(registry, "support\nrs\n"));
  CHECK(peft_lease_version(other) == 2);
  CHECK(peft_lease_has_module(other, "model.layers.0.mlp.up_proj") == 0);
  CHECK_OK(peft_registry_acquire(registry, "rs", &again));
  CHECK(peft_lease_version(again) == 3);
  CHECK(peft_lease_has_module(again, "model.layers.0.mlp.up_proj") == 1);
  CHECK(stats_of(registry).loaded == 2);
  peft_lease_free(other);
  CHECK(stats_of(registry).loaded == 1); /* the replaced version went with its last lease */

  /* Unregistering while leased; trim evicts what nothing pins. */
  CHECK_OK(peft_registry_unregister(registry, "rs"));
  CHECK(names_are(registry, "support\n"));
  CHECK_CODE(peft_registry_acquire(registry, "rs", &other), PEFT_ERR_NOT_FOUND);
  CHECK(peft_lease_has_module(again, "model.layers.0.mlp.up_proj") == 1);
  CHECK_OK(peft_registry_acquire(registry, "support", &first));
  peft_lease_free(first);
  CHECK_OK(peft_registry_trim(registry));
  s = stats_of(registry);
  CHECK(s.loaded == 1);
  CHECK(s.pinned == 1);
  /* The registry goes first; the lease keeps its adapter until released. */
  peft_registry_free(registry);
  CHECK(peft_lease_has_module(again, "model.layers.1.mlp.gate_proj") == 1);
  CHECK(strcmp(peft_lease_name(again), "rs") == 0);
  peft_lease_free(again);
}

static void test_memory_and_translator(void) {
  peft_registry* registry = NULL;
  peft_translator* translator = NULL;
  peft_lease* folder = NULL;
  peft_lease* memory = NULL;
  size_t config_size = 0, weights_size = 0;
  char* config = slurp(LLAMA_LORA "/adapter_config.json", &config_size);
  char* weights = slurp(LLAMA_LORA "/adapter_model.safetensors", &weights_size);
  CHECK(config != NULL && weights != NULL);
  if (config == NULL || weights == NULL) goto done;

  CHECK_OK(peft_translator_new_builtin("llama", &translator));
  CHECK_OK(peft_registry_new(PEFT_DTYPE_F16, 1u << 20, translator, &registry));
  peft_translator_free(translator); /* the registry shares the table */
  if (registry == NULL) goto done;
  CHECK_OK(peft_registry_register(registry, "folder", LLAMA_LORA, NULL));
  CHECK_OK(peft_registry_register_memory(registry, "memory", config, weights, weights_size, NULL));
  memset(weights, 0, weights_size); /* copied: the caller's buffer is free again */
  CHECK_OK(peft_registry_acquire(registry, "folder", &folder));
  CHECK_OK(peft_registry_acquire(registry, "memory", &memory));
  if (folder == NULL || memory == NULL) goto done;
  CHECK(peft_lease_bytes(memory) == peft_lease_bytes(folder));
  CHECK(peft_lease_bytes(memory) == (11624 - 8 - 3424) / 2);
  /* With the translator, layers are named as the host names them. */
  CHECK(peft_lease_has_module(memory, "transformer/layer_0/attention/query") == 1);
  CHECK(peft_lease_has_module(memory, "transformer/embed_tokens") == 0);
  CHECK(peft_lease_has_module(memory, "not/a/llama/name") == 0);

  /* Bad bytes and bad configs are refused, and the name keeps its adapter. */
  CHECK_CODE(peft_registry_register_memory(registry, "memory", config, weights, 4, NULL), PEFT_ERR_HEADER_TOO_SMALL);
  CHECK_CODE(peft_registry_register_memory(registry, "memory", config, weights, weights_size, NULL),
             PEFT_ERR_INVALID_HEADER); /* zeroed: an empty header */
  CHECK_CODE(peft_registry_register_memory(registry, "memory", "{\"peft_type\": \"LORA\", \"r\": []}",
                                           weights, weights_size, NULL),
             PEFT_ERR_INVALID_CONFIG);
  CHECK(peft_lease_version(memory) == 2);
  CHECK(names_are(registry, "folder\nmemory\n"));

done:
  peft_lease_free(folder);
  peft_lease_free(memory);
  peft_registry_free(registry);
  free(config);
  free(weights);
}

static void test_stats_size(void) {
  peft_registry* registry = NULL;
  peft_registry_stats s;
  uint64_t short_stats[4];
  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 12345, NULL, &registry));
  if (registry == NULL) return;

  /* A caller that knows only the first two counters gets those, and nothing past them is written. */
  memset(short_stats, 0xab, sizeof short_stats);
  short_stats[0] = 3 * sizeof(uint64_t);
  CHECK_OK(peft_registry_get_stats(registry, (peft_registry_stats*)(void*)short_stats));
  CHECK(short_stats[0] == 3 * sizeof(uint64_t));
  CHECK(short_stats[1] == 12345);
  CHECK(short_stats[2] == 0);
  CHECK(short_stats[3] == UINT64_C(0xabababababababab));
  /* A size that is not a whole number of fields writes only the whole ones. */
  memset(short_stats, 0xab, sizeof short_stats);
  short_stats[0] = 3 * sizeof(uint64_t) - 1;
  CHECK_OK(peft_registry_get_stats(registry, (peft_registry_stats*)(void*)short_stats));
  CHECK(short_stats[1] == 12345);
  CHECK(short_stats[2] == UINT64_C(0xabababababababab));

  memset(&s, 0, sizeof s);
  s.size = 15;
  CHECK_CODE(peft_registry_get_stats(registry, &s), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(s.budget_bytes == 0);
  s.size = sizeof s + 64; /* a newer caller's larger struct: the fields this library has are filled */
  CHECK_OK(peft_registry_get_stats(registry, &s));
  CHECK(s.budget_bytes == 12345);
  peft_registry_free(registry);
}

static void test_errors(void) {
  peft_registry* registry = kUntouchedRegistry;
  peft_lease* lease = kUntouchedLease;
  peft_registry_stats s;
  char* names = NULL;
  peft_string_list* list = NULL;
  const char* dir = LLAMA_LORA;

  CHECK_CODE(peft_registry_new(PEFT_DTYPE_F32, 1, NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_new(PEFT_DTYPE_F64, 1, NULL, &registry), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_new(PEFT_DTYPE_I32, 1, NULL, &registry), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_new(-1, 1, NULL, &registry), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_new(1000, 1, NULL, &registry), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(registry == kUntouchedRegistry);
  registry = NULL;
  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 20, NULL, &registry));
  if (registry == NULL) return;

  CHECK_CODE(peft_registry_register(NULL, "x", dir, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register(registry, NULL, dir, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register(registry, "", dir, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register(registry, "x", NULL, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register(registry, "x", PEFT_TEST_DATA "/adapters/no_such_adapter", NULL),
             PEFT_ERR_NOT_FOUND);
  CHECK_CODE(peft_registry_register_memory(NULL, "x", "{}", "", 0, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register_memory(registry, NULL, "{}", "", 0, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register_memory(registry, "", "{}", "", 0, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register_memory(registry, "x", NULL, "", 0, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_register_memory(registry, "x", "{}", NULL, 10, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(names_are(registry, ""));

  CHECK_CODE(peft_registry_unregister(NULL, "x"), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_unregister(registry, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_unregister(registry, "x"), PEFT_ERR_NOT_FOUND);
  CHECK_CODE(peft_registry_names(NULL, &names), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_names(registry, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_name_list(NULL, &list), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_name_list(registry, NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK(list == NULL);
  CHECK(names == NULL);
  CHECK_CODE(peft_registry_acquire(NULL, "x", &lease), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_acquire(registry, NULL, &lease), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_acquire(registry, "x", NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_acquire(registry, "x", &lease), PEFT_ERR_NOT_FOUND);
  CHECK(lease == kUntouchedLease);
  CHECK_CODE(peft_registry_trim(NULL), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_set_budget(NULL, 1), PEFT_ERR_INVALID_ARGUMENT);
  s.size = sizeof s;
  CHECK_CODE(peft_registry_get_stats(NULL, &s), PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_get_stats(registry, NULL), PEFT_ERR_INVALID_ARGUMENT);

  /* The tolerant calls take NULL. */
  peft_lease_free(NULL);
  peft_lease_release(NULL);
  peft_string_list_free(NULL);
  CHECK(peft_string_list_count(NULL) == 0);
  CHECK(peft_string_list_get(NULL, 0) == NULL);
  peft_registry_free(NULL);
  CHECK(peft_lease_name(NULL) == NULL);
  CHECK(peft_lease_version(NULL) == 0);
  CHECK(peft_lease_bytes(NULL) == 0);
  CHECK(peft_lease_has_module(NULL, "model.layers.0.self_attn.q_proj") == 0);
  CHECK_OK(peft_registry_register(registry, "x", dir, NULL));
  lease = NULL;
  CHECK_OK(peft_registry_acquire(registry, "x", &lease));
  CHECK(peft_lease_has_module(lease, NULL) == 0);
  peft_lease_free(lease);
  peft_registry_free(registry);
}

/* DoRA in unmerged apply: a DoRA layer without its base weight is NOT_FOUND (y untouched), the
 * argument checks of peft_registry_set_base_weight(), a weight that does not fit the layer
 * (SHAPE_MISMATCH at apply), then a fitting one: y changes, and changes again after the weight
 * changed and the registry was told. The fixture's q_proj is Linear 16 -> 16. */
static void test_dora_base_weights(void) {
  const char* q = "model.layers.0.self_attn.q_proj";
  const uint64_t shape[2] = {16, 16}, wrong[2] = {16, 8}, three[3] = {16, 16, 1};
  float weight[16 * 16], bias[16], x[2 * 16], y[2 * 16], first[2 * 16];
  peft_registry* registry = NULL;
  peft_lease* lease = NULL;
  const peft_lease* leases[1];
  for (int i = 0; i < 16 * 16; ++i) weight[i] = (float)((i * 37) % 19 - 9) / 16.0f;
  for (int i = 0; i < 16; ++i) bias[i] = (float)i / 8.0f;
  for (int i = 0; i < 2 * 16; ++i) x[i] = (float)((i * 11) % 7 - 3) / 4.0f;
  memset(y, 0, sizeof y);

  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 20, NULL, &registry));
  CHECK_OK(peft_registry_register(registry, "dora", LLAMA_DORA, NULL));
  CHECK_OK(peft_registry_acquire(registry, "dora", &lease));
  leases[0] = lease;
  CHECK_CODE_NAMING(peft_lora_apply(q, leases, 1, NULL, x, PEFT_DTYPE_F32, 2, 16, y, PEFT_DTYPE_F32, 16),
                    PEFT_ERR_NOT_FOUND, "peft_registry_set_base_weight");
  for (int i = 0; i < 2 * 16; ++i) CHECK(y[i] == 0.0f);

  CHECK_CODE(peft_registry_set_base_weight(NULL, q, weight, PEFT_DTYPE_F32, shape, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_set_base_weight(registry, NULL, weight, PEFT_DTYPE_F32, shape, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_set_base_weight(registry, q, NULL, PEFT_DTYPE_F32, shape, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_set_base_weight(registry, q, weight, PEFT_DTYPE_F32, NULL, 2, NULL, 0, 0),
             PEFT_ERR_INVALID_ARGUMENT);
  CHECK_CODE(peft_registry_set_base_weight(registry, q, weight, PEFT_DTYPE_I32, shape, 2, NULL, 0, 0),
             PEFT_ERR_UNSUPPORTED);
  CHECK_CODE(peft_registry_set_base_weight(registry, q, weight, 12345, shape, 2, NULL, 0, 0), PEFT_ERR_UNSUPPORTED);
  CHECK_CODE(peft_registry_set_base_weight(registry, q, weight, PEFT_DTYPE_F32, three, 3, NULL, 0, 0),
             PEFT_ERR_SHAPE_MISMATCH);
  CHECK_CODE(peft_registry_set_base_weight(registry, q, weight, PEFT_DTYPE_F32, shape, 2, bias, PEFT_DTYPE_F32, 0),
             PEFT_ERR_SHAPE_MISMATCH);
  CHECK_CODE(peft_registry_base_weights_changed(NULL), PEFT_ERR_INVALID_ARGUMENT);

  CHECK_OK(peft_registry_set_base_weight(registry, q, weight, PEFT_DTYPE_F32, wrong, 2, NULL, 0, 0));
  CHECK_CODE_NAMING(peft_lora_apply(q, leases, 1, NULL, x, PEFT_DTYPE_F32, 2, 16, y, PEFT_DTYPE_F32, 16),
                    PEFT_ERR_SHAPE_MISMATCH, "[16, 8]");
  CHECK_OK(peft_registry_set_base_weight(registry, q, weight, PEFT_DTYPE_F32, shape, 2, bias, PEFT_DTYPE_F32, 8));
  CHECK_CODE_NAMING(peft_lora_apply(q, leases, 1, NULL, x, PEFT_DTYPE_F32, 2, 16, y, PEFT_DTYPE_F32, 16),
                    PEFT_ERR_SHAPE_MISMATCH, "bias");
  for (int i = 0; i < 2 * 16; ++i) CHECK(y[i] == 0.0f);

  CHECK_OK(peft_registry_set_base_weight(registry, "model.layers.0.self_attn.q_proj.weight", weight, PEFT_DTYPE_F32,
                                         shape, 2, bias, PEFT_DTYPE_F32, 16));
  CHECK_OK(peft_lora_apply(q, leases, 1, NULL, x, PEFT_DTYPE_F32, 2, 16, y, PEFT_DTYPE_F32, 16));
  memcpy(first, y, sizeof y);
  int changed = 0;
  for (int i = 0; i < 2 * 16; ++i) changed += y[i] != 0.0f;
  CHECK(changed > 0);

  /* Kept until told: the same y again, then another after the change is announced. */
  for (int i = 0; i < 16 * 16; ++i) weight[i] *= 2.0f;
  memset(y, 0, sizeof y);
  CHECK_OK(peft_lora_apply(q, leases, 1, NULL, x, PEFT_DTYPE_F32, 2, 16, y, PEFT_DTYPE_F32, 16));
  CHECK(memcmp(y, first, sizeof y) == 0);
  CHECK_OK(peft_registry_base_weights_changed(registry));
  memset(y, 0, sizeof y);
  CHECK_OK(peft_lora_apply(q, leases, 1, NULL, x, PEFT_DTYPE_F32, 2, 16, y, PEFT_DTYPE_F32, 16));
  CHECK(memcmp(y, first, sizeof y) != 0);

  peft_lease_free(lease);
  peft_registry_free(registry);
}

int main(void) {
  test_lifecycle();
  test_memory_and_translator();
  test_stats_size();
  test_errors();
  test_dora_base_weights();
  return check_summary();
}
