/* mid_large_mt — the random_mixed loop in N threads, mid/large sizes.
 *
 * usage: mid_large_mt [threads [cycles [ws [seed [min max | big]]]]]
 *   threads  worker threads (default 2)
 *   cycles   steps PER THREAD (default 1000000); each step one malloc or free
 *   ws       slots per thread (default 400)
 *   seed     base seed (default 1234567); thread t uses seed ^ (t+1)*2654435761
 *   min max  size range (default 257 768): size = min + r % (max-min+1)
 *   big      instead of min max: size = (1 << (13 + r%3)) + (r & 0x7FF),
 *            i.e. 8..34 KiB
 * Each thread owns its slots (no cross-thread frees); models a server whose
 * workers churn medium buffers independently.  ops = threads * cycles.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: mid_large_mt [threads [cycles [ws [seed [min max | big]]]]]\n"
    "  defaults: 2 threads, 1000000 cycles per thread, ws 400, seed 1234567, 257..768 B\n"
    "  'big' selects size = (1 << (13 + r%3)) + (r & 0x7FF) (8-34 KiB)\n";

typedef struct {
  long cycles;
  uint32_t ws, seed;
  size_t min, max;
  int big;
} targ_t;

BENCH_NOINLINE static void *bench_work(void *arg) {
  targ_t *a = arg;
  void **slot = bench_xalloc(a->ws * sizeof *slot);
  uint32_t s = a->seed;
  size_t span = a->max - a->min + 1;
  bench_start();
  for (long i = 0; i < a->cycles; i++) {
    uint32_t r = xorshift32(&s);
    uint32_t idx = r % a->ws;
    if (slot[idx]) {
      free(slot[idx]);
      slot[idx] = NULL;
    } else {
      size_t sz = a->big ? ((size_t)1 << (13 + r % 3)) + (r & 0x7FF) : a->min + r % span;
      char *p = malloc(sz);
      if (!p) bench_die("malloc failed");
      p[0] = (char)r;
      slot[idx] = p;
    }
  }
  for (uint32_t i = 0; i < a->ws; i++) free(slot[i]);
  bench_xfree(slot, a->ws * sizeof *slot);
  bench_span_end();
  return NULL;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long threads = bench_arg(argc, argv, 1, 2);
  long cycles = bench_arg(argc, argv, 2, 1000000);
  long ws = bench_arg(argc, argv, 3, 400);
  uint64_t seed = (uint64_t)bench_arg(argc, argv, 4, 1234567);
  int big = argc > 5 && !strcmp(argv[5], "big");
  long min = big ? 8192 : bench_arg(argc, argv, 5, 257);
  long max = big ? 34815 : bench_arg(argc, argv, 6, 768);
  if (threads < 1 || threads > 1024 || cycles < 1 || ws < 1 || min < 1 || max < min) {
    fputs(usage, stderr);
    return 2;
  }
  targ_t *ta = bench_xalloc((size_t)threads * sizeof *ta);
  for (long t = 0; t < threads; t++)
    ta[t] = (targ_t){.cycles = cycles, .ws = (uint32_t)ws, .min = (size_t)min, .max = (size_t)max,
                     .big = big, .seed = bench_seed(seed ^ ((uint64_t)(t + 1) * 2654435761u))};
  bench_run_threads(threads, bench_work, ta, sizeof *ta);
  double t = bench_span();
  long ops = threads * cycles;
  printf("mid_large_mt threads=%ld cycles=%ld ws=%ld seed=%llu size=%s%ld-%ld build=%s ops=%ld ops/s=%.0f time_s=%.3f\n",
         threads, cycles, ws, (unsigned long long)seed, big ? "big:" : "", min, max, BENCH_ALLOC_KIND, ops,
         ops / t, t);
  return 0;
}
