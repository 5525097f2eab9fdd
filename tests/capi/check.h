/* The check harness shared by the C99 API tests in tests/capi (one program per .c file).
 *
 * Each test program includes this header once, after its own system includes (and after any
 * feature-test macro such as _POSIX_C_SOURCE, which must come before every system header):
 *
 *   #include "check.h"
 *   ...
 *   int main(void) { ...; return check_summary(); }
 *
 * Every check counts into `passed` or `failed`; a failing check prints "file:line: ..." with the
 * expression (and, for the error checks, the call, the codes and the error's message) to stderr.
 *   CHECK(cond)                            cond is true.
 *   CHECK_OK(call)                         call returned NULL (no peft_error); else prints its
 *                                          code name and message and frees it.
 *   CHECK_CODE_NAMING(call, code, needle)  call returned an error with that code and a non-empty
 *                                          message containing `needle` (NULL: any non-empty
 *                                          message); the error is freed either way.
 *   CHECK_CODE(call, code)                 CHECK_CODE_NAMING(call, code, NULL).
 * check_summary() prints the one summary line on stdout, exactly "N passed, M failed", and returns
 * the exit status: 0 when nothing failed, 1 otherwise. A test may also count a check by hand with
 * ++passed / ++failed (printing its own message).
 *
 * The counters and the summary are `static`: each program is a single translation unit. */
#ifndef PEFT_C_TESTS_CAPI_CHECK_H
#define PEFT_C_TESTS_CAPI_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "peft_c.h"

static int passed = 0;
static int failed = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (cond) {                                                                \
      ++passed;                                                                \
    } else {                                                                   \
      ++failed;                                                                \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

/* Checks that a call succeeded; prints its code and message otherwise. */
#define CHECK_OK(call)                                                                      \
  do {                                                                                      \
    peft_error* ok_err_ = (call);                                                           \
    if (ok_err_ == NULL) {                                                                  \
      ++passed;                                                                             \
    } else {                                                                                \
      ++failed;                                                                             \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,              \
              peft_error_code_name(peft_error_code(ok_err_)), peft_error_message(ok_err_)); \
      peft_error_free(ok_err_);                                                             \
    }                                                                                       \
  } while (0)

/* Checks the code, and that the message names `needle` (NULL: any non-empty message).
 * peft_error_message(NULL) is "", so a call that did not fail reports "got OK: ". */
#define CHECK_CODE_NAMING(call, code, needle)                                             \
  do {                                                                                    \
    peft_error* code_err_ = (call);                                                       \
    int32_t got_ = peft_error_code(code_err_);                                            \
    const char* msg_ = peft_error_message(code_err_);                                     \
    const char* needle_ = (needle);                                                       \
    if (code_err_ != NULL && got_ == (code) && msg_[0] != '\0' &&                         \
        (needle_ == NULL || strstr(msg_, needle_) != NULL)) {                             \
      ++passed;                                                                           \
    } else {                                                                              \
      ++failed;                                                                           \
      fprintf(stderr, "%s:%d: %s: expected %s, got %s: %s\n", __FILE__, __LINE__, #call, \
              peft_error_code_name(code), peft_error_code_name(got_), msg_);              \
    }                                                                                     \
    peft_error_free(code_err_);                                                           \
  } while (0)

/* Checks that a call failed with the given code and a non-empty message. */
#define CHECK_CODE(call, code) CHECK_CODE_NAMING(call, code, NULL)

/* Prints "N passed, M failed" on stdout; returns main's exit status (nonzero on any failure). */
static inline int check_summary(void) {
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

#endif /* PEFT_C_TESTS_CAPI_CHECK_H */
