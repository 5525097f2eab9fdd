/* File helpers shared by the C99 API tests in tests/capi. Include after check.h; the program
 * defines _POSIX_C_SOURCE before its first system header (see check.h). The functions are
 * `static inline`, so a program that does not call one of them gets no warning for it. */
#ifndef PEFT_C_TESTS_CAPI_FILES_H
#define PEFT_C_TESTS_CAPI_FILES_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The whole file in a malloc'd buffer, NUL-terminated (NULL if unreadable); *size receives its length. */
static inline char* slurp(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  char* data;
  long n;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  data = (char*)malloc((size_t)n + 1);
  if (data != NULL && fread(data, 1, (size_t)n, f) != (size_t)n) {
    free(data);
    data = NULL;
  }
  if (data != NULL) data[n] = '\0';
  *size = (size_t)n;
  fclose(f);
  return data;
}

/* Writes `size` bytes to `path` (created or truncated); 1 on success. */
static inline int write_bytes(const char* path, const void* bytes, size_t size) {
  FILE* f = fopen(path, "wb");
  int ok;
  if (f == NULL) return 0;
  ok = fwrite(bytes, 1, size, f) == size;
  return fclose(f) == 0 && ok;
}

/* Copies a file; 1 on success. */
static inline int copy_file(const char* from, const char* to) {
  size_t size = 0;
  char* data = slurp(from, &size);
  int ok = data != NULL && write_bytes(to, data, size);
  free(data);
  return ok;
}

static inline int exists(const char* path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Removes a file, or a folder and everything in it. */
static inline void remove_tree(const char* path) {
  DIR* dir = opendir(path);
  if (dir != NULL) {
    struct dirent* e;
    while ((e = readdir(dir)) != NULL) {
      char child[1024];
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child) continue;
      remove_tree(child);
    }
    closedir(dir);
    rmdir(path);
  } else {
    unlink(path);
  }
}

#endif
