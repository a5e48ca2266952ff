/* large — big blocks: malloc, calloc, realloc and free of 64 KiB..32 MiB.
 *
 * usage: large [steps [ws [min [max [seed]]]]]
 *   steps  operations (default 3000)
 *   ws     live slots (default 8)
 *   min    smallest block in bytes (default 65536)
 *   max    largest block in bytes (default 33554432)
 *   seed   seed (default 1234567)
 *
 * Sizes are log-uniform in [min, max].  Each step picks a slot: if empty,
 * malloc (half the time) or calloc a new block; if full, realloc it to a new
 * random size (one time in three) or free it.  Every 4 KiB page of a new or
 * grown block is written once (calloc'd pages are first checked to read 0),
 * as a real program would.  Models big buffers, images, column arrays:
 * mmap/munmap policy, page-fault reuse, calloc zeroing and in-place realloc.
 * ops = steps.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: large [steps [ws [min [max [seed]]]]]\n"
    "  defaults: 3000 steps, 8 slots, 65536..33554432 B (log-uniform), seed 1234567\n";

typedef struct {
  char *p;
  size_t n;
} slot_t;

BENCH_NOINLINE static void bench_work(slot_t *sl, long ws, long steps, double lmin, double lmax,
                                      uint32_t s) {
  for (long i = 0; i < steps; i++) {
    uint32_t r = xorshift32(&s);
    slot_t *x = &sl[r % (uint32_t)ws];
    if (!x->p) {
      size_t n = bench_pick_log(&s, lmin, lmax);
      if (r & 0x100) {
        x->p = malloc(n);
        if (!x->p) bench_die("malloc failed");
      } else {
        x->p = calloc(1, n);
        if (!x->p) bench_die("calloc failed");
        for (size_t k = 0; k < n; k += 4096)
          if (x->p[k]) bench_die("calloc memory not zero");
        if (x->p[n - 1]) bench_die("calloc memory not zero");
      }
      x->n = n;
      bench_touch_pages(x->p, 0, n, (char)r);
    } else if (r % 3 == 0) {
      size_t n = bench_pick_log(&s, lmin, lmax);
      char first = x->p[0];
      char *np = realloc(x->p, n);
      if (!np) bench_die("realloc failed");
      if (np[0] != first) bench_die("realloc lost the contents");
      if (n > x->n) bench_touch_pages(np, x->n, n, (char)r);
      x->p = np;
      x->n = n;
    } else {
      free(x->p);
      x->p = NULL;
      x->n = 0;
    }
  }
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long steps = bench_arg(argc, argv, 1, 3000);
  long ws = bench_arg(argc, argv, 2, 8);
  long min = bench_arg(argc, argv, 3, 65536), max = bench_arg(argc, argv, 4, 33554432);
  uint32_t seed = bench_seed((uint64_t)bench_arg(argc, argv, 5, 1234567));
  if (steps < 1 || ws < 1 || min < 1 || max < min) {
    fputs(usage, stderr);
    return 2;
  }
  slot_t *sl = bench_xalloc((size_t)ws * sizeof *sl);
  double t0 = bench_now();
  bench_work(sl, ws, steps, log((double)min), log((double)max), seed);
  double t = bench_now() - t0;
  for (long i = 0; i < ws; i++) free(sl[i].p);
  printf("large steps=%ld ws=%ld min=%ld max=%ld seed=%u build=%s peak_rss_kib=%ld ops=%ld ops/s=%.0f time_s=%.3f\n",
         steps, ws, min, max, seed, BENCH_ALLOC_KIND, bench_status_kib("VmHWM"), steps, steps / t, t);
  return 0;
}
