/* random_mixed — single-thread random malloc/free over a slot array.
 *
 * usage: random_mixed [cycles [ws [seed [min max]]]]
 *   cycles  steps to run (default 20000000); each step is one malloc or free
 *   ws      working-set slots (default 400)
 *   seed    xorshift32 seed (default 1234567)
 *   min max optional size range; default size is 16 + (r & 0x3FF) (16..1039 B)
 *
 * Each step: r = xorshift32(&seed); idx = r % ws; if slot[idx] is set, free
 * it and clear it, else slot[idx] = malloc(size) and write its first byte.
 * The remaining blocks are freed at the end (not timed, not counted).
 * Models: a program churning many small objects with a fixed live set.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: random_mixed [cycles [ws [seed [min max]]]]\n"
    "  cycles default 20000000, ws default 400, seed default 1234567\n"
    "  size = 16 + (r & 0x3FF), or min + r % (max-min+1) when min max given\n";

BENCH_NOINLINE static void bench_work(void **slot, long cycles, uint32_t ws, uint32_t seed,
                                      size_t min, size_t max) {
  uint32_t s = seed;
  size_t span = max - min + 1;
  for (long i = 0; i < cycles; i++) {
    uint32_t r = xorshift32(&s);
    uint32_t idx = r % ws;
    if (slot[idx]) {
      free(slot[idx]);
      slot[idx] = NULL;
    } else {
      size_t sz = min ? min + r % span : 16 + (r & 0x3FF);
      char *p = malloc(sz);
      if (!p) bench_die("malloc failed");
      p[0] = (char)r;
      slot[idx] = p;
    }
  }
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long cycles = bench_arg(argc, argv, 1, 20000000);
  long ws = bench_arg(argc, argv, 2, 400);
  uint32_t seed = bench_seed((uint64_t)bench_arg(argc, argv, 3, 1234567));
  long min = bench_arg(argc, argv, 4, 0), max = bench_arg(argc, argv, 5, 0);
  if (cycles < 1 || ws < 1 || (argc > 4 && (min < 1 || max < min))) {
    fputs(usage, stderr);
    return 2;
  }
  void **slot = bench_xalloc((size_t)ws * sizeof *slot);
  double t0 = bench_now();
  bench_work(slot, cycles, (uint32_t)ws, seed, (size_t)min, (size_t)max);
  double t = bench_now() - t0;
  for (long i = 0; i < ws; i++) free(slot[i]);
  bench_xfree(slot, (size_t)ws * sizeof *slot);
  if (argc > 4)
    printf("random_mixed cycles=%ld ws=%ld seed=%u min=%ld max=%ld build=%s ops=%ld ops/s=%.0f time_s=%.3f\n",
           cycles, ws, seed, min, max, BENCH_ALLOC_KIND, cycles, cycles / t, t);
  else
    printf("random_mixed cycles=%ld ws=%ld seed=%u build=%s ops=%ld ops/s=%.0f time_s=%.3f\n", cycles,
           ws, seed, BENCH_ALLOC_KIND, cycles, cycles / t, t);
  return 0;
}
