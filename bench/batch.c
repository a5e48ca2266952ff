/* batch — a batch of mid-size buffers, allocated, filled and freed, again
 * and again.
 *
 * usage: batch [rounds [buffers [min [max [seed]]]]]
 *   rounds   rounds (default 2000)
 *   buffers  buffers per round (default 256)
 *   min max  buffer size range in bytes, log-uniform (default 16384 262144)
 *   seed     seed (default 1234567)
 *
 * Each round mallocs every buffer of the batch at a new random size, writes
 * one byte in each of its 4 KiB pages (a buffer being filled), then frees
 * them all.  Models a server or a pipeline stage that handles a request or
 * a frame with a set of buffers it drops at the end: the memory a round
 * frees should serve the next one without going back to the OS in between
 * (page faults), and without a walk or lock per buffer.
 * ops = rounds * buffers * 2.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: batch [rounds [buffers [min [max [seed]]]]]\n"
    "  defaults: 2000 rounds, 256 buffers, 16384..262144 B (log-uniform), seed 1234567\n";

BENCH_NOINLINE static void bench_work(char **buf, long rounds, long n, double lmin, double lmax,
                                      uint32_t s) {
  for (long r = 0; r < rounds; r++) {
    for (long i = 0; i < n; i++) {
      size_t size = bench_pick_log(&s, lmin, lmax);
      char *p = malloc(size);
      if (!p) bench_die("malloc failed");
      bench_touch_pages(p, 0, size, (char)r);
      buf[i] = p;
    }
    for (long i = 0; i < n; i++) free(buf[i]);
  }
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long rounds = bench_arg(argc, argv, 1, 2000);
  long n = bench_arg(argc, argv, 2, 256);
  long min = bench_arg(argc, argv, 3, 16384), max = bench_arg(argc, argv, 4, 262144);
  uint32_t seed = bench_seed((uint64_t)bench_arg(argc, argv, 5, 1234567));
  if (rounds < 1 || n < 1 || min < 1 || max < min) {
    fputs(usage, stderr);
    return 2;
  }
  char **buf = bench_xalloc((size_t)n * sizeof *buf);
  double t0 = bench_now();
  bench_work(buf, rounds, n, log((double)min), log((double)max), seed);
  double t = bench_now() - t0;
  long ops = rounds * n * 2;
  printf("batch rounds=%ld buffers=%ld min=%ld max=%ld seed=%u build=%s ops=%ld ops/s=%.0f time_s=%.3f\n",
         rounds, n, min, max, seed, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}
