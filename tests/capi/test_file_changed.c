/* Files that change under open handles, from C99: a safetensors file truncated (to a page boundary,
 * so a mapped access to the lost pages would raise SIGBUS) or overwritten in place after it was
 * opened gives PEFT_ERR_IO from every call that reads it (checkpoint reads and views, writing from a
 * checkpoint, adapter tensor reads, adapter export, registry acquire), and a merge whose base or
 * adapter is truncated by its progress callback fails with PEFT_ERR_IO and leaves nothing behind;
 * a file replaced by rename keeps serving the bytes that were opened. Each case runs in a child
 * process, so a crash (the SIGBUS this guards against) is reported as a failed check naming the case
 * rather than ending the program. Prints "N passed, M failed" and exits nonzero on any failure. */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "peft_c.h"
#include "check.h"
#include "files.h"
#include "peft_test_paths.h"

#define LLAMA_LORA PEFT_TEST_DATA "/adapters/llama_lora"
#define LLAMA_LORA_SECOND PEFT_TEST_DATA "/adapters/llama_lora_second"
#define LLAMA_BASE PEFT_TEST_DATA "/models/llama"

/* Two F32 tensors of kElements each: "a" fills the first pages of the data, "b" the rest. */
enum { kElements = 4096, kPage = 4096 };

static char scratch[256];

/* A path in the scratch folder; one of 16 rotating buffers, so a few may be held at once. */
static const char* in_scratch(const char* rel) {
  static char buf[16][512];
  static int next = 0;
  next = (next + 1) % 16;
  snprintf(buf[next], sizeof buf[next], "%s/%s", scratch, rel);
  return buf[next];
}

/* Sets the file's modification time one day back, as for any file written before it is opened.
 * A change made afterwards then moves the time, whatever the file system's timestamp granularity. */
static int age(const char* path) {
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = time(NULL) - 86400;
  times[0].tv_nsec = times[1].tv_nsec = 0;
  return utimensat(AT_FDCWD, path, times, 0) == 0;
}

static off_t file_size(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

/* Writes the two-tensor file: a[i] = i + offset, b[i] = -(i + offset). The header is padded so the
 * data starts at byte kPage: "a" is then pages 1..4 of the file and "b" pages 5..8. */
static int write_two_tensors(const char* path, float offset) {
  static unsigned char bytes[kPage + 2 * kElements * 4];
  char header[kPage];
  uint64_t length = kPage - 8;
  int i, n;
  memset(bytes, 0, sizeof bytes);
  n = snprintf(header, sizeof header,
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[0,%d]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%d,%d]}}",
               kElements, kElements * 4, kElements, kElements * 4, kElements * 8);
  memset(header + n, ' ', (size_t)length - (size_t)n);
  for (i = 0; i < 8; ++i) bytes[i] = (unsigned char)(length >> (8 * i));
  memcpy(bytes + 8, header, (size_t)length);
  for (i = 0; i < kElements; ++i) {
    float a = (float)i + offset, b = -((float)i + offset);
    memcpy(bytes + kPage + 4 * i, &a, 4);
    memcpy(bytes + kPage + 4 * (kElements + i), &b, 4);
  }
  return write_bytes(path, bytes, sizeof bytes) && age(path);
}

static peft_checkpoint* open_file(const char* path, int use_pread) {
  peft_open_options* opts = NULL;
  peft_checkpoint* ckpt = NULL;
  CHECK_OK(peft_open_options_new(&opts));
  CHECK_OK(peft_open_options_set_use_pread(opts, use_pread));
  CHECK_OK(peft_checkpoint_open(path, opts, &ckpt));
  peft_open_options_free(opts);
  return ckpt;
}

static int tensor_is(const peft_checkpoint* ckpt, size_t index, float first) {
  static float values[kElements];
  int i;
  peft_error* err = peft_checkpoint_tensor_read(ckpt, index, PEFT_DTYPE_F32, values, sizeof values);
  if (err != NULL) {
    peft_error_free(err);
    return 0;
  }
  for (i = 0; i < kElements; ++i)
    if (values[i] != (index == 0 ? 1.0f : -1.0f) * ((float)i + first)) return 0;
  return 1;
}

/* Every call that reads tensor bytes of `ckpt`, expected to fail with PEFT_ERR_IO naming `needle`. */
static void check_reads_fail(const peft_checkpoint* ckpt, const char* needle) {
  static float values[kElements];
  static uint16_t halves[kElements];
  const void* data = NULL;
  uint64_t nbytes = 0;
  size_t index;
  for (index = 0; index < 2; ++index) {
    CHECK_CODE_NAMING(peft_checkpoint_tensor_read(ckpt, index, PEFT_DTYPE_F32, values, sizeof values),
                      PEFT_ERR_IO, needle);
    CHECK_CODE_NAMING(peft_checkpoint_tensor_read(ckpt, index, PEFT_DTYPE_BF16, halves, sizeof halves),
                      PEFT_ERR_IO, needle);
    CHECK_CODE_NAMING(peft_checkpoint_tensor_view(ckpt, index, &data, &nbytes), PEFT_ERR_IO, needle);
    CHECK(data == NULL && nbytes == 0); /* a failed call leaves its out-parameters alone */
  }
  {
    /* Writing from the checkpoint reads it too; the writer's output is discarded. */
    peft_writer* writer = NULL;
    const uint64_t shape[1] = {kElements};
    CHECK_OK(peft_writer_new(in_scratch("copy.safetensors"), &writer));
    CHECK_OK(peft_writer_add_tensor(writer, "b", PEFT_DTYPE_F32, shape, 1));
    CHECK_CODE_NAMING(peft_writer_write_from_checkpoint(writer, NULL, ckpt, 1), PEFT_ERR_IO, needle);
    peft_writer_free(writer);
    CHECK(!exists(in_scratch("copy.safetensors")));
  }
}

/* Truncated to the end of "a"'s data between calls: both tensors fail, including "a", whose bytes
 * are still in the file (the file is not the one that was opened any more). */
static void case_truncated(int use_pread) {
  char path[512];
  peft_checkpoint* ckpt;
  snprintf(path, sizeof path, "%s", in_scratch("two.safetensors"));
  CHECK(write_two_tensors(path, 0.0f));
  ckpt = open_file(path, use_pread);
  if (ckpt == NULL) return;
  CHECK(tensor_is(ckpt, 0, 0.0f) && tensor_is(ckpt, 1, 0.0f));
  CHECK(truncate(path, kPage + kElements * 4) == 0);
  check_reads_fail(ckpt, "two.safetensors");
  check_reads_fail(ckpt, "truncated");
  /* Growing it back to the old size does not make it the same file: the time moved. */
  CHECK(truncate(path, kPage + kElements * 8) == 0);
  check_reads_fail(ckpt, "changed");
  peft_checkpoint_free(ckpt);
}

/* Overwritten in place with other bytes of the same size: reported, not served. */
static void case_overwritten(int use_pread) {
  char path[512];
  peft_checkpoint* ckpt;
  snprintf(path, sizeof path, "%s", in_scratch("two.safetensors"));
  CHECK(write_two_tensors(path, 0.0f));
  ckpt = open_file(path, use_pread);
  if (ckpt == NULL) return;
  CHECK(tensor_is(ckpt, 0, 0.0f));
  CHECK(write_two_tensors(path, 100.0f)); /* same size; age() puts the time back a day... */
  {
    /* ...so move it to now, as any real write does. */
    CHECK(utimensat(AT_FDCWD, path, NULL, 0) == 0);
  }
  check_reads_fail(ckpt, "changed since it was opened");
  peft_checkpoint_free(ckpt);
}

/* Replaced by rename (the safe way to update a file): the open checkpoint keeps reading the file it
 * opened, whole and unchanged; a new open sees the new file. */
static void case_renamed_over(int use_pread) {
  const char* path = in_scratch("two.safetensors");
  const char* next = in_scratch("next.safetensors");
  peft_checkpoint* ckpt;
  peft_checkpoint* fresh;
  const void* data = NULL;
  uint64_t nbytes = 0;
  CHECK(write_two_tensors(path, 0.0f));
  ckpt = open_file(path, use_pread);
  if (ckpt == NULL) return;
  CHECK(write_two_tensors(next, 100.0f));
  CHECK(rename(next, path) == 0);
  CHECK(tensor_is(ckpt, 0, 0.0f) && tensor_is(ckpt, 1, 0.0f));
  CHECK_OK(peft_checkpoint_tensor_view(ckpt, 1, &data, &nbytes));
  CHECK(nbytes == kElements * 4 && data != NULL && ((const float*)data)[7] == -7.0f);
  fresh = open_file(path, use_pread);
  CHECK(fresh != NULL && tensor_is(fresh, 0, 100.0f));
  peft_checkpoint_free(fresh);
  peft_checkpoint_free(ckpt);
}

/* In pread mode a view is a private copy taken at the first view: it stays readable after the file
 * is truncated, while tensors not viewed yet fail. */
static void case_pread_views_are_copies(void) {
  const char* path = in_scratch("two.safetensors");
  peft_checkpoint* ckpt;
  const void* data = NULL;
  uint64_t nbytes = 0;
  CHECK(write_two_tensors(path, 0.0f));
  ckpt = open_file(path, 1);
  if (ckpt == NULL) return;
  CHECK_OK(peft_checkpoint_tensor_view(ckpt, 1, &data, &nbytes));
  CHECK(truncate(path, kPage) == 0);
  CHECK(data != NULL && nbytes == kElements * 4 && ((const float*)data)[kElements - 1] == -(float)(kElements - 1));
  CHECK(tensor_is(ckpt, 1, 0.0f)); /* served from the copy */
  CHECK_CODE_NAMING(peft_checkpoint_tensor_view(ckpt, 0, &data, &nbytes), PEFT_ERR_IO, "two.safetensors");
  peft_checkpoint_free(ckpt);
}

/* An adapter folder copied into the scratch folder, its weights aged; returns its path. */
static const char* adapter_copy(const char* from, const char* name) {
  static char dir[512];
  char src[600], dst[600];
  snprintf(dir, sizeof dir, "%s/%s", scratch, name);
  remove_tree(dir);
  if (mkdir(dir, 0755) != 0) return NULL;
  snprintf(src, sizeof src, "%s/adapter_config.json", from);
  snprintf(dst, sizeof dst, "%s/adapter_config.json", dir);
  if (!copy_file(src, dst)) return NULL;
  snprintf(src, sizeof src, "%s/adapter_model.safetensors", from);
  snprintf(dst, sizeof dst, "%s/adapter_model.safetensors", dir);
  if (!copy_file(src, dst) || !age(dst)) return NULL;
  return dir;
}

/* The weights file of an adapter folder; one of 4 rotating buffers. */
static const char* weights_of(const char* dir) {
  static char path[4][600];
  static int next = 0;
  next = (next + 1) % 4;
  snprintf(path[next], sizeof path[next], "%s/adapter_model.safetensors", dir);
  return path[next];
}

static void case_adapter_truncated(void) {
  const char* dir = adapter_copy(LLAMA_LORA, "adapter");
  peft_adapter* adapter = NULL;
  float values[4096];
  uint64_t elements;
  CHECK(dir != NULL);
  if (dir == NULL) return;
  CHECK_OK(peft_adapter_open(dir, NULL, &adapter));
  if (adapter == NULL) return;
  elements = peft_adapter_module_tensor_shape(adapter, 0, 0)[0] * peft_adapter_module_tensor_shape(adapter, 0, 0)[1];
  CHECK(elements <= 4096);
  CHECK_OK(peft_adapter_module_tensor_read(adapter, 0, 0, PEFT_DTYPE_F32, values, elements * 4));
  CHECK(truncate(weights_of(dir), file_size(weights_of(dir)) / 2) == 0);
  CHECK_CODE_NAMING(peft_adapter_module_tensor_read(adapter, 0, 0, PEFT_DTYPE_F32, values, elements * 4),
                    PEFT_ERR_IO, "adapter_model.safetensors");
  CHECK_CODE_NAMING(peft_adapter_export(adapter, in_scratch("exported"), NULL), PEFT_ERR_IO,
                    "adapter_model.safetensors");
  CHECK(!exists(in_scratch("exported/adapter_model.safetensors")));
  peft_adapter_free(adapter);
}

/* A registered adapter whose weights are truncated, or overwritten by another adapter's file (cp
 * over it), before its first acquire: PEFT_ERR_IO, as documented, and the registry goes on serving
 * its other adapters. */
static void case_registry(void) {
  peft_registry* registry = NULL;
  peft_lease* lease = NULL;
  const char* dir;
  CHECK_OK(peft_registry_new(PEFT_DTYPE_F32, 1u << 20, NULL, &registry));
  if (registry == NULL) return;
  dir = adapter_copy(LLAMA_LORA, "reg_truncated");
  CHECK(dir != NULL);
  CHECK_OK(peft_registry_register(registry, "truncated", dir, NULL));
  CHECK(truncate(weights_of(dir), 4096) == 0);
  dir = adapter_copy(LLAMA_LORA, "reg_overwritten");
  CHECK(dir != NULL);
  CHECK_OK(peft_registry_register(registry, "overwritten", dir, NULL));
  CHECK(copy_file(weights_of(LLAMA_LORA_SECOND), weights_of(dir)));
  CHECK_OK(peft_registry_register(registry, "intact", LLAMA_LORA, NULL));

  CHECK_CODE_NAMING(peft_registry_acquire(registry, "truncated", &lease), PEFT_ERR_IO, "reg_truncated");
  CHECK(lease == NULL);
  CHECK_CODE_NAMING(peft_registry_acquire(registry, "overwritten", &lease), PEFT_ERR_IO, "changed");
  CHECK(lease == NULL);
  CHECK_OK(peft_registry_acquire(registry, "intact", &lease));
  CHECK(lease != NULL);
  peft_lease_free(lease);
  /* Registering the changed folder again reads it afresh and serves it. */
  CHECK_OK(peft_registry_register(registry, "overwritten", in_scratch("reg_overwritten"), NULL));
  lease = NULL;
  CHECK_OK(peft_registry_acquire(registry, "overwritten", &lease));
  CHECK(lease != NULL);
  peft_lease_free(lease);
  peft_registry_free(registry);
}

/* A merge whose input is truncated while it runs: the progress callback truncates the file after
 * the first tensor is written, the merge fails with PEFT_ERR_IO, and the output folder it created is
 * gone. With more than one thread, the next tensor is being built while the callback runs. */
struct truncate_on_progress {
  const char* path;
  off_t size;
  int done;
};

static int32_t truncate_after_first(void* user, uint64_t done, uint64_t total) {
  struct truncate_on_progress* t = (struct truncate_on_progress*)user;
  (void)total;
  if (done > 0 && !t->done) t->done = truncate(t->path, t->size) == 0 ? 1 : -1;
  return 0;
}

static void merge_with_truncation(const char* base, const char* adapter, const char* victim, uint32_t threads,
                                  const char* needle) {
  peft_merge_options* opts = NULL;
  peft_merge_result* result = NULL;
  struct truncate_on_progress t;
  t.path = victim;
  t.size = kPage;
  t.done = 0;
  CHECK_OK(peft_merge_options_new(&opts));
  CHECK_OK(peft_merge_options_add_adapter_dir(opts, adapter, 1.0));
  CHECK_OK(peft_merge_options_set_threads(opts, threads));
  CHECK_OK(peft_merge_options_set_progress(opts, truncate_after_first, &t));
  CHECK_CODE_NAMING(peft_merge_checkpoint(base, in_scratch("merged"), opts, &result), PEFT_ERR_IO, needle);
  CHECK(t.done == 1);
  CHECK(result == NULL);
  CHECK(!exists(in_scratch("merged")));
  peft_merge_options_free(opts);
}

static const char* base_copy(void) {
  static char dir[512];
  char dst[600];
  snprintf(dir, sizeof dir, "%s/base", scratch);
  remove_tree(dir);
  if (mkdir(dir, 0755) != 0) return NULL;
  snprintf(dst, sizeof dst, "%s/config.json", dir);
  if (!copy_file(LLAMA_BASE "/config.json", dst)) return NULL;
  snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
  if (!copy_file(LLAMA_BASE "/model.safetensors", dst) || !age(dst)) return NULL;
  return dir;
}

static void case_merge_base_truncated(uint32_t threads) {
  const char* base = base_copy();
  char victim[600];
  CHECK(base != NULL);
  if (base == NULL) return;
  CHECK(file_size(LLAMA_BASE "/model.safetensors") > 2 * kPage);
  snprintf(victim, sizeof victim, "%s/model.safetensors", base);
  merge_with_truncation(base, LLAMA_LORA, victim, threads, "model.safetensors");
}

static void case_merge_adapter_truncated(uint32_t threads) {
  const char* adapter = adapter_copy(LLAMA_LORA, "merge_adapter");
  char victim[600];
  CHECK(adapter != NULL);
  if (adapter == NULL) return;
  CHECK(file_size(weights_of(adapter)) > 2 * kPage);
  snprintf(victim, sizeof victim, "%s", weights_of(adapter));
  merge_with_truncation(LLAMA_BASE, adapter, victim, threads, "adapter_model.safetensors");
}

/* Runs one case in a child process, whose check counts come back through a pipe; a child killed by
 * a signal is a failure naming the case and the signal. */
static void run_case(const char* name, void (*body)(int), int arg) {
  int counts[2] = {0, 0};
  int fds[2];
  pid_t pid;
  int status = 0;
  fflush(NULL);
  if (pipe(fds) != 0 || (pid = fork()) < 0) {
    perror("pipe/fork");
    ++failed;
    return;
  }
  if (pid == 0) {
    close(fds[0]);
    passed = failed = 0;
    body(arg);
    fflush(NULL);
    counts[0] = passed;
    counts[1] = failed;
    exit(write(fds[1], counts, sizeof counts) == (ssize_t)sizeof counts ? 0 : 1); /* exit: leak checks run */
  }
  close(fds[1]);
  if (read(fds[0], counts, sizeof counts) != (ssize_t)sizeof counts) counts[0] = counts[1] = 0;
  close(fds[0]);
  if (waitpid(pid, &status, 0) != pid) {
    perror("waitpid");
    ++failed;
    return;
  }
  passed += counts[0];
  failed += counts[1];
  if (WIFSIGNALED(status)) {
    ++failed;
    fprintf(stderr, "case %s(%d): killed by signal %d%s\n", name, arg, WTERMSIG(status),
            WTERMSIG(status) == SIGBUS ? " (SIGBUS)" : "");
  } else if (WEXITSTATUS(status) != 0 || counts[0] + counts[1] == 0) {
    ++failed;
    fprintf(stderr, "case %s(%d): exited with status %d after %d checks\n", name, arg, WEXITSTATUS(status),
            counts[0] + counts[1]);
  }
}

static void truncated(int use_pread) { case_truncated(use_pread); }
static void overwritten(int use_pread) { case_overwritten(use_pread); }
static void renamed_over(int use_pread) { case_renamed_over(use_pread); }
static void pread_views(int unused) { (void)unused; case_pread_views_are_copies(); }
static void adapter_truncated(int unused) { (void)unused; case_adapter_truncated(); }
static void registry(int unused) { (void)unused; case_registry(); }
static void merge_base(int threads) { case_merge_base_truncated((uint32_t)threads); }
static void merge_adapter(int threads) { case_merge_adapter_truncated((uint32_t)threads); }

int main(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(scratch, sizeof scratch, "%s/peft_file_changed_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(scratch) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  run_case("truncated", truncated, 0);
  run_case("truncated", truncated, 1);
  run_case("overwritten", overwritten, 0);
  run_case("overwritten", overwritten, 1);
  run_case("renamed_over", renamed_over, 0);
  run_case("renamed_over", renamed_over, 1);
  run_case("pread_views", pread_views, 0);
  run_case("adapter_truncated", adapter_truncated, 0);
  run_case("registry", registry, 0);
  run_case("merge_base", merge_base, 1);
  run_case("merge_base", merge_base, 2);
  run_case("merge_adapter", merge_adapter, 1);
  run_case("merge_adapter", merge_adapter, 2);
  remove_tree(scratch);
  return check_summary();
}
