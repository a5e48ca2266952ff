/* Shared helpers for the hakmem benchmark programs (the bench .c files, and
 * the C++ ones).
 *
 * Every program calls plain malloc/free (built with -fno-builtin so the
 * compiler cannot elide or merge the calls), so the allocator under test is
 * chosen at run time with LD_PRELOAD (no preload = glibc).
 *
 * Every program prints exactly ONE result line on stdout:
 *   <name> key=value ... ops=<calls> ops/s=<calls per second> time_s=<s>
 * "ops" counts allocator calls (malloc, calloc, realloc and free each count
 * one), so ops/s is comparable across workloads of the same kind.
 *
 * The measured part of each program lives in a function named bench_work*
 * (noinline) so `valgrind --tool=callgrind --toggle-collect=bench_work*`
 * counts exactly the workload (make bench-instr).
 *
 * Built with -DNOOP_ALLOC, malloc/calloc/realloc/free are replaced by trivial
 * out-of-line stubs (every malloc returns the same static buffer, free does
 * nothing).  Instructions of that build = cost of the workload's own loop,
 * which bench-instr subtracts.  Only meaningful for workloads that never keep
 * data in the blocks they allocate (random_mixed, larson).
 */
#ifndef HAK_BENCH_COMMON_H
#define HAK_BENCH_COMMON_H

#ifndef _GNU_SOURCE /* g++ defines it */
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <pthread.h>
#include <sys/mman.h>

#define BENCH_NOINLINE __attribute__((noinline))
#define BENCH_UNUSED __attribute__((unused))

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Marsaglia xorshift32; the state must never be 0. */
static inline uint32_t xorshift32(uint32_t *s) {
  uint32_t x = *s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  *s = x;
  return x;
}

/* A size log-uniform in [exp(lmin), exp(lmax)]. */
static inline size_t bench_pick_log(uint32_t *s, double lmin, double lmax) {
  double u = (double)xorshift32(s) / 4294967296.0;
  return (size_t)exp(lmin + u * (lmax - lmin));
}

/* Writes v once in every 4 KiB page of p[from, to), and in its last byte,
 * as a program filling a buffer would. */
static inline void bench_touch_pages(char *p, size_t from, size_t to, char v) {
  for (size_t i = from; i < to; i += 4096) p[i] = v;
  if (to > from) p[to - 1] = v;
}

static inline uint32_t bench_seed(uint64_t s) {
  uint32_t x = (uint32_t)(s ^ (s >> 32));
  return x ? x : 0x9E3779B9u;
}

/* Value of a "Key:   N kB" line of a /proc file, in KiB (-1 if absent). */
static inline long bench_proc_kib(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, n) == 0 && line[n] == ':') {
      v = strtol(line + n + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return v;
}
/* A "VmRSS:"-style line of /proc/self/status. */
static inline long bench_status_kib(const char *key) { return bench_proc_kib("/proc/self/status", key); }

static inline long bench_arg(int argc, char **argv, int i, long def) {
  return argc > i ? strtol(argv[i], NULL, 0) : def;
}

static inline int bench_want_help(int argc, char **argv, const char *usage) {
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    fputs(usage, stdout);
    return 1;
  }
  return 0;
}

static inline void bench_die(const char *msg) {
  fprintf(stderr, "bench: %s\n", msg);
  exit(2);
}

/* Keeps the compiler from proving a store dead. */
static inline void bench_escape(void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }

/* Harness memory (slot arrays, thread records): mmap'd, zeroed, never from
 * the allocator under test, so it neither perturbs nor is counted. */
static inline void *bench_xalloc(size_t n) {
  void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) bench_die("mmap failed");
  return p;
}
static inline void bench_xfree(void *p, size_t n) { munmap(p, n ? n : 1); }

/* Multi-thread timing: each worker calls bench_span_begin() after the start
 * barrier and bench_span_end() when done; bench_span() = last end - first
 * begin (the main thread may wake from the barrier late on a busy machine). */
static pthread_mutex_t bench_span_mu = PTHREAD_MUTEX_INITIALIZER;
static double bench_span_t0 = 1e300, bench_span_t1 = 0;
static inline BENCH_UNUSED void bench_span_begin(void) {
  double t = bench_now();
  pthread_mutex_lock(&bench_span_mu);
  if (t < bench_span_t0) bench_span_t0 = t;
  pthread_mutex_unlock(&bench_span_mu);
}
static inline BENCH_UNUSED void bench_span_end(void) {
  double t = bench_now();
  pthread_mutex_lock(&bench_span_mu);
  if (t > bench_span_t1) bench_span_t1 = t;
  pthread_mutex_unlock(&bench_span_mu);
}
static inline BENCH_UNUSED double bench_span(void) { return bench_span_t1 - bench_span_t0; }

/* Runs fn on n threads, thread i getting args + i * stride, and waits for
 * them. Each worker calls bench_start() first: the threads start together
 * once all exist. */
static BENCH_UNUSED pthread_barrier_t bench_start_barrier;
static inline BENCH_UNUSED void bench_start(void) {
  pthread_barrier_wait(&bench_start_barrier);
  bench_span_begin();
}
static inline BENCH_UNUSED void bench_run_threads(long n, void *(*fn)(void *), void *args,
                                                  size_t stride) {
  pthread_t *tid = (pthread_t *)bench_xalloc((size_t)n * sizeof *tid);
  pthread_barrier_init(&bench_start_barrier, NULL, (unsigned)n + 1);
  for (long t = 0; t < n; t++)
    if (pthread_create(&tid[t], NULL, fn, (char *)args + (size_t)t * stride))
      bench_die("pthread_create failed");
  pthread_barrier_wait(&bench_start_barrier);
  for (long t = 0; t < n; t++) pthread_join(tid[t], NULL);
  pthread_barrier_destroy(&bench_start_barrier);
  bench_xfree(tid, (size_t)n * sizeof *tid);
}

#ifdef NOOP_ALLOC
/* Trivial allocator: measures the workload loop only (see top). */
static char bench_noop_buf[1 << 16] __attribute__((aligned(64)));
BENCH_NOINLINE BENCH_UNUSED static void *bench_noop_malloc(size_t n) {
  __asm__ volatile("" : : "r"(n) : "memory");
  return bench_noop_buf;
}
BENCH_NOINLINE BENCH_UNUSED static void bench_noop_free(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }
BENCH_NOINLINE BENCH_UNUSED static void *bench_noop_calloc(size_t a, size_t b) {
  __asm__ volatile("" : : "r"(a), "r"(b) : "memory");
  return bench_noop_buf;
}
BENCH_NOINLINE BENCH_UNUSED static void *bench_noop_realloc(void *p, size_t n) {
  __asm__ volatile("" : : "r"(p), "r"(n) : "memory");
  return bench_noop_buf;
}
#define malloc(n) bench_noop_malloc(n)
#define free(p) bench_noop_free(p)
#define calloc(a, b) bench_noop_calloc(a, b)
#define realloc(p, n) bench_noop_realloc(p, n)
#define BENCH_ALLOC_KIND "noop"
#else
#define BENCH_ALLOC_KIND "malloc"
#endif

#endif
