/* Minimal test harness: each TEST is a function run in its own forked child
 * (so a crash or an abort counts as one failure, not the end of the suite).
 * A suite binary prints one line per test and a final machine-readable line
 *   RESULT <suite> <passed> <failed> <skipped>
 * that tests/run.sh sums into the closing "N passed, N failed" line. */
#ifndef HAK_TEST_HARNESS_H
#define HAK_TEST_HARNESS_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

typedef void (*th_fn_t)(void);
typedef struct { const char *name; th_fn_t fn; unsigned timeout_s; } th_test_t;

#define TH_MAX_TESTS 256
static th_test_t th_tests[TH_MAX_TESTS];
static int th_ntests;
static int th_failed_here; /* in the child: number of failed checks */

static inline void th_register(const char *name, th_fn_t fn, unsigned timeout_s) {
  if (th_ntests < TH_MAX_TESTS) th_tests[th_ntests++] = (th_test_t){name, fn, timeout_s};
}

/* TEST(name) { ... }            default timeout 60 s
 * TEST_T(name, seconds) { ... } explicit timeout */
#define TEST_T(name, secs)                                                   \
  static void name(void);                                                    \
  __attribute__((constructor)) static void th_reg_##name(void) {             \
    th_register(#name, name, secs);                                          \
  }                                                                          \
  static void name(void)
#define TEST(name) TEST_T(name, 60)

/* CHECK(cond) records a failure with file:line and continues. */
#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "    check failed: %s (%s:%d)\n", #cond, __FILE__,     \
              __LINE__);                                                     \
      th_failed_here++;                                                      \
    }                                                                        \
  } while (0)
/* CHECK_MSG(cond, fmt, ...) is CHECK with a formatted explanation. */
#define CHECK_MSG(cond, ...)                                                 \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "    check failed: %s (%s:%d): ", #cond, __FILE__,     \
              __LINE__);                                                     \
      fprintf(stderr, __VA_ARGS__);                                          \
      fputc('\n', stderr);                                                   \
      th_failed_here++;                                                      \
    }                                                                        \
  } while (0)
/* REQUIRE(cond) stops the test at the first failure. */
#define REQUIRE(cond)                                                        \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "    required: %s (%s:%d)\n", #cond, __FILE__,         \
              __LINE__);                                                     \
      _exit(1);                                                              \
    }                                                                        \
  } while (0)

/* SKIP(fmt, ...) ends the test unchecked, saying why (something this
 * machine lacks): reported as a skip, never as a pass. */
#define TH_SKIP_STATUS 77
#define SKIP(...)                                                            \
  do {                                                                       \
    printf("    skipped: ");                                                 \
    printf(__VA_ARGS__);                                                     \
    printf("\n");                                                            \
    fflush(NULL);                                                            \
    _exit(TH_SKIP_STATUS);                                                   \
  } while (0)

/* The number of a /proc/self/status field ("VmRSS" in KiB, "Threads"), or
 * -1. */
static inline long th_proc_status(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t n = strlen(field);
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%ld", &v) == 1)
      break;
  fclose(f);
  return v;
}

/* The process's resident set (VmRSS) in KiB, or -1. */
static inline long th_vm_rss_kib(void) { return th_proc_status("VmRSS"); }

/* The process's minor page faults so far. */
static inline long th_minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* fn(arg) in a new thread, waited for: with a 64 KiB stack, which a
 * program that locked its future memory (mlockall) has faulted in whole,
 * where glibc's default is 8 MiB. Fails the test if it cannot start. */
static inline void th_run_on_small_stack(void *(*fn)(void *), void *arg) {
  pthread_attr_t attr;
  pthread_t t;
  REQUIRE(pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, 64 << 10) == 0);
  REQUIRE(pthread_create(&t, &attr, fn, arg) == 0 && pthread_join(t, NULL) == 0);
  pthread_attr_destroy(&attr);
}

static double th_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Run all tests (or those named in argv) and print RESULT. */
static int th_main(const char *suite, int argc, char **argv) {
  int passed = 0, failed = 0, skipped = 0;
  setvbuf(stdout, NULL, _IONBF, 0);
  for (int i = 0; i < th_ntests; i++) {
    const th_test_t *t = &th_tests[i];
    if (argc > 1) {
      int wanted = 0;
      for (int a = 1; a < argc; a++) wanted |= strcmp(argv[a], t->name) == 0;
      if (!wanted) continue;
    }
    double t0 = th_now();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(t->timeout_s);
      th_failed_here = 0;
      t->fn();
      fflush(NULL);
      _exit(th_failed_here ? 1 : 0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
      failed++;
      printf("  FAIL  %s.%s: %s: %s\n", suite, t->name, pid < 0 ? "fork" : "waitpid",
             strerror(errno));
      continue;
    }
    double dt = th_now() - t0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      passed++;
      printf("  ok    %s.%s (%.2fs)\n", suite, t->name, dt);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == TH_SKIP_STATUS) {
      skipped++;
      printf("  skip  %s.%s (%.2fs)\n", suite, t->name, dt);
    } else {
      failed++;
      if (WIFSIGNALED(status))
        printf("  FAIL  %s.%s: killed by signal %d%s (%.2fs)\n", suite, t->name,
               WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (timeout)" : "", dt);
      else
        printf("  FAIL  %s.%s: exit %d (%.2fs)\n", suite, t->name, WEXITSTATUS(status), dt);
    }
  }
  printf("RESULT %s %d %d %d\n", suite, passed, failed, skipped);
  return failed ? 1 : 0;
}

#define TEST_MAIN(suite) \
  int main(int argc, char **argv) { return th_main(suite, argc, argv); }

#endif
