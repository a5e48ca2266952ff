/* glibc_simple — tight malloc/free of one size, one thread
 * (in the spirit of glibc's benchtests/bench-malloc-simple).
 *
 * usage: glibc_simple [size [iterations [batch]]]
 *   size        block size in bytes (default 64)
 *   iterations  rounds (default 5000000)
 *   batch       blocks malloc'd then freed (in allocation order) per round
 *               (default 1: a plain malloc/free pair)
 * Measures the allocator's fast path with a hot cache.
 * ops = iterations * batch * 2.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: glibc_simple [size [iterations [batch]]]\n"
    "  defaults: 64 B, 5000000 iterations, batch 1\n";

BENCH_NOINLINE static void bench_work(void **v, size_t size, long iterations, long batch) {
  for (long i = 0; i < iterations; i++) {
    for (long j = 0; j < batch; j++) {
      char *p = malloc(size);
      if (!p) bench_die("malloc failed");
      p[0] = (char)j;
      v[j] = p;
    }
    for (long j = 0; j < batch; j++) free(v[j]);
  }
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long size = bench_arg(argc, argv, 1, 64);
  long iterations = bench_arg(argc, argv, 2, 5000000);
  long batch = bench_arg(argc, argv, 3, 1);
  if (size < 1 || iterations < 1 || batch < 1) {
    fputs(usage, stderr);
    return 2;
  }
  void **v = bench_xalloc((size_t)batch * sizeof *v);
  double t0 = bench_now();
  bench_work(v, (size_t)size, iterations, batch);
  double t = bench_now() - t0;
  long ops = iterations * batch * 2;
  printf("glibc_simple size=%ld iterations=%ld batch=%ld build=%s ops=%ld ops/s=%.0f time_s=%.3f\n", size,
         iterations, batch, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}
