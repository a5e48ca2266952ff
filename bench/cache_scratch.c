/* cache_scratch — Hoard's passive-false-sharing test.
 *
 * usage: cache_scratch [threads [iterations [objsize [repetitions]]]]
 *   threads      worker threads (default 2)
 *   iterations   malloc/write/free cycles per thread (default 1000)
 *   objsize      object size in bytes (default 8)
 *   repetitions  times each byte is written per cycle (default 20000)
 *
 * The main thread allocates one small object per thread (adjacent objects,
 * likely on one cache line) and hands one to each thread, which frees it.
 * Each thread then repeatedly mallocs an object, writes it many times and
 * frees it.  An allocator that recycles a freed remote object for the next
 * local malloc makes threads write into the same cache line (passive false
 * sharing) and runs much slower.  ops = threads * iterations * 2 (+ threads),
 * but the time is dominated by the writes: what matters is the ratio.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: cache_scratch [threads [iterations [objsize [repetitions]]]]\n"
    "  defaults: 2 threads, 1000 iterations, 8 B objects, 20000 repetitions\n";

typedef struct {
  pthread_t tid;
  char *obj;
  long iterations, repetitions;
  size_t objsize;
} targ_t;

static pthread_barrier_t start_barrier;

BENCH_NOINLINE static void *bench_work(void *arg) {
  targ_t *a = arg;
  pthread_barrier_wait(&start_barrier);
  bench_span_begin();
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

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long threads = bench_arg(argc, argv, 1, 2);
  long iterations = bench_arg(argc, argv, 2, 1000);
  long objsize = bench_arg(argc, argv, 3, 8);
  long reps = bench_arg(argc, argv, 4, 20000);
  if (threads < 1 || threads > 1024 || iterations < 1 || objsize < 1 || reps < 1) {
    fputs(usage, stderr);
    return 2;
  }
  targ_t *ta = bench_xalloc((size_t)threads * sizeof *ta);
  pthread_barrier_init(&start_barrier, NULL, (unsigned)threads + 1);
  for (long t = 0; t < threads; t++) {
    ta[t] = (targ_t){.iterations = iterations, .repetitions = reps, .objsize = (size_t)objsize};
    ta[t].obj = malloc((size_t)objsize);
    if (!ta[t].obj) bench_die("malloc failed");
    memset(ta[t].obj, 1, (size_t)objsize);
  }
  for (long t = 0; t < threads; t++)
    if (pthread_create(&ta[t].tid, NULL, bench_work, &ta[t])) bench_die("pthread_create failed");
  pthread_barrier_wait(&start_barrier);
  for (long t = 0; t < threads; t++) pthread_join(ta[t].tid, NULL);
  double t = bench_span();
  long ops = threads * (iterations * 2 + 1);
  printf("cache_scratch threads=%ld iterations=%ld objsize=%ld repetitions=%ld build=%s ops=%ld ops/s=%.0f time_s=%.3f\n",
         threads, iterations, objsize, reps, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}
