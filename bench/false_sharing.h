/* The driver shared by Hoard's false-sharing tests, cache_thrash and
 * cache_scratch (see their headers). Each thread repeatedly mallocs an
 * object, writes it many times and frees it. With `scratch`, the main thread
 * first allocates one object per thread (adjacent, likely on one cache line)
 * and each thread frees its one before starting. */
#ifndef HAK_BENCH_FALSE_SHARING_H
#define HAK_BENCH_FALSE_SHARING_H

#include "bench_common.h"

#include <stdbool.h>

typedef struct {
  char *obj; /* freed by the thread first (scratch), or NULL */
  long iterations, repetitions;
  size_t objsize;
} fs_targ_t;

BENCH_NOINLINE static void *bench_work(void *arg) {
  fs_targ_t *a = arg;
  bench_start();
  free(a->obj);
  for (long i = 0; i < a->iterations; i++) {
    volatile char *p = malloc(a->objsize);
    if (!p) bench_die("malloc failed");
    for (long j = 0; j < a->repetitions; j++)
      for (size_t k = 0; k < a->objsize; k++) p[k] = (char)(p[k] + 1);
    free((void *)p);
  }
  bench_span_end();
  return NULL;
}

static int false_sharing_main(int argc, char **argv, const char *name, const char *usage,
                              bool scratch) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long threads = bench_arg(argc, argv, 1, 2);
  long iterations = bench_arg(argc, argv, 2, 1000);
  long objsize = bench_arg(argc, argv, 3, 8);
  long reps = bench_arg(argc, argv, 4, 20000);
  if (threads < 1 || threads > 1024 || iterations < 1 || objsize < 1 || reps < 1) {
    fputs(usage, stderr);
    return 2;
  }
  fs_targ_t *ta = bench_xalloc((size_t)threads * sizeof *ta);
  for (long t = 0; t < threads; t++) {
    ta[t] = (fs_targ_t){.iterations = iterations, .repetitions = reps, .objsize = (size_t)objsize};
    if (scratch) {
      ta[t].obj = malloc((size_t)objsize);
      if (!ta[t].obj) bench_die("malloc failed");
      memset(ta[t].obj, 1, (size_t)objsize);
    }
  }
  bench_run_threads(threads, bench_work, ta, sizeof *ta);
  double t = bench_span();
  long ops = threads * (iterations * 2 + (scratch ? 1 : 0));
  printf("%s threads=%ld iterations=%ld objsize=%ld repetitions=%ld build=%s ops=%ld ops/s=%.0f "
         "time_s=%.3f\n",
         name, threads, iterations, objsize, reps, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}

#endif
