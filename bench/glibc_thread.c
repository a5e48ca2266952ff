/* glibc_thread — tight malloc/free of one size in N threads
 * (in the spirit of glibc's benchtests/bench-malloc-thread).
 *
 * usage: glibc_thread [threads [size [iterations [batch]]]]
 *   threads     worker threads (default 2)
 *   size        block size in bytes (default 64)
 *   iterations  rounds per thread (default 5000000)
 *   batch       blocks malloc'd then freed per round (default 1)
 * Every thread allocates and frees its own blocks: measures the fast path
 * and how well per-thread caching scales.  ops = threads*iterations*batch*2.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: glibc_thread [threads [size [iterations [batch]]]]\n"
    "  defaults: 2 threads, 64 B, 5000000 iterations per thread, batch 1\n";

typedef struct {
  size_t size;
  long iterations, batch;
} targ_t;

BENCH_NOINLINE static void *bench_work(void *arg) {
  targ_t *a = arg;
  void **v = bench_xalloc((size_t)a->batch * sizeof *v);
  bench_start();
  for (long i = 0; i < a->iterations; i++) {
    for (long j = 0; j < a->batch; j++) {
      char *p = malloc(a->size);
      if (!p) bench_die("malloc failed");
      p[0] = (char)j;
      v[j] = p;
    }
    for (long j = 0; j < a->batch; j++) free(v[j]);
  }
  bench_xfree(v, (size_t)a->batch * sizeof *v);
  bench_span_end();
  return NULL;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long threads = bench_arg(argc, argv, 1, 2);
  long size = bench_arg(argc, argv, 2, 64);
  long iterations = bench_arg(argc, argv, 3, 5000000);
  long batch = bench_arg(argc, argv, 4, 1);
  if (threads < 1 || threads > 1024 || size < 1 || iterations < 1 || batch < 1) {
    fputs(usage, stderr);
    return 2;
  }
  targ_t *ta = bench_xalloc((size_t)threads * sizeof *ta);
  for (long t = 0; t < threads; t++)
    ta[t] = (targ_t){.size = (size_t)size, .iterations = iterations, .batch = batch};
  bench_run_threads(threads, bench_work, ta, sizeof *ta);
  double t = bench_span();
  long ops = threads * iterations * batch * 2;
  printf("glibc_thread threads=%ld size=%ld iterations=%ld batch=%ld build=%s ops=%ld ops/s=%.0f time_s=%.3f\n",
         threads, size, iterations, batch, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}
