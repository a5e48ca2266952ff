/* frag — fragmentation and memory return to the OS.
 *
 * usage: frag [total_mib [seed]]      (or: frag --scale S [seed], S = total_mib/1024)
 *   total_mib  memory allocated in phase 1, in MiB (default 1024)
 *   seed       seed (default 1234567)
 *
 * Phase 1 allocates total_mib MiB of mixed sizes (80% 16..512 B, 18%
 * 512 B..8 KiB, 2% 8..64 KiB) and writes every block fully.  Phase 2 frees
 * every other block (half the memory is now holes).  Phase 3 allocates half
 * of total_mib again in blocks 2..4x larger than phase 1's, which mostly cannot
 * reuse the holes.  Phase 4 frees everything.  Reports the peak RSS (VmHWM)
 * and the RSS after the final free (VmRSS): a good allocator keeps the peak
 * near 1.5x total_mib and returns most memory by the end.
 * ops = mallocs + frees.  All RSS figures are KiB.
 *
 * The start-up RSS is read after running once the libc code used later
 * (printing floats, clocks, sleeping), so that it is not counted as memory
 * the allocator kept.
 *
 * With a trailing `--watch MS`, after the final free it stays idle (no
 * allocation) for MS milliseconds and prints a second line with VmRSS and
 * RssAnon (`ms:rss/anon`) every 100 ms: how soon the allocator gives the
 * memory back on its own. The anonymous part is the allocator's: file pages
 * come and go as the kernel reads and reclaims them.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: frag [total_mib [seed]] [--watch MS]   or   frag --scale S [seed] [--watch MS]\n"
    "  default total 1024 MiB (--scale 1.0); e.g. frag 16 runs in well under a second\n";

static size_t size_of(uint32_t r, int big) {
  uint32_t k = r % 100;
  size_t n;
  if (k < 80) n = 16 + (r >> 8) % 497;
  else if (k < 98) n = 512 + (r >> 8) % (8192 - 512 + 1);
  else n = 8192 + (r >> 8) % (65536 - 8192 + 1);
  if (big) n *= 2 + (r >> 28) % 3;
  return n;
}

typedef struct {
  char **p;
  long n, cap;
} vec_t;

static void vpush(vec_t *v, char *p) {
  if (v->n == v->cap) {
    long nc = v->cap ? v->cap * 2 : 1 << 16;
    char **np = bench_xalloc((size_t)nc * sizeof *np);
    if (v->p) {
      memcpy(np, v->p, (size_t)v->n * sizeof *np);
      bench_xfree(v->p, (size_t)v->cap * sizeof *np);
    }
    v->p = np;
    v->cap = nc;
  }
  v->p[v->n++] = p;
}

static long rss_after_phase1, rss_after_holes, rss_after_phase3;

BENCH_NOINLINE static long bench_work(size_t total, uint32_t s) {
  vec_t a = {0}, b = {0};
  long ops = 0;
  for (size_t got = 0; got < total;) {
    uint32_t r = xorshift32(&s);
    size_t n = size_of(r, 0);
    char *p = malloc(n);
    if (!p) bench_die("malloc failed");
    memset(p, (int)(r & 0xFF), n);
    vpush(&a, p);
    got += n;
    ops++;
  }
  rss_after_phase1 = bench_status_kib("VmRSS");
  for (long i = 0; i < a.n; i += 2) {
    free(a.p[i]);
    a.p[i] = NULL;
    ops++;
  }
  rss_after_holes = bench_status_kib("VmRSS");
  for (size_t got = 0; got < total / 2;) {
    uint32_t r = xorshift32(&s);
    size_t n = size_of(r, 1);
    char *p = malloc(n);
    if (!p) bench_die("malloc failed");
    memset(p, (int)(r & 0xFF), n);
    vpush(&b, p);
    got += n;
    ops++;
  }
  rss_after_phase3 = bench_status_kib("VmRSS");
  for (long i = 0; i < a.n; i++)
    if (a.p[i]) {
      free(a.p[i]);
      ops++;
    }
  for (long i = 0; i < b.n; i++) {
    free(b.p[i]);
    ops++;
  }
  if (a.p) bench_xfree(a.p, (size_t)a.cap * sizeof(char *));
  if (b.p) bench_xfree(b.p, (size_t)b.cap * sizeof(char *));
  return ops;
}

/* Runs the libc code used after the start-up RSS is read (formatting
 * floats, clocks, sleeping) once before it, so that the start-up RSS
 * already holds those code pages (about 128 KiB with fault-around): they
 * are the program's memory, not the allocator's. */
static void warm_up_libc(void) {
  char line[64];
  struct timespec ts = {0, 0};
  nanosleep(&ts, NULL);
  if (snprintf(line, sizeof line, "%.3f %ld", bench_now(), (long)ts.tv_nsec) < 0) bench_die("snprintf");
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long watch_ms = 0;
  if (argc > 2 && !strcmp(argv[argc - 2], "--watch")) {
    watch_ms = strtol(argv[argc - 1], NULL, 0);
    argc -= 2;
  }
  double mib = 1024;
  int ai = 1;
  if (argc > 1 && !strcmp(argv[1], "--scale")) {
    if (argc < 3) {
      fputs(usage, stderr);
      return 2;
    }
    mib = 1024 * strtod(argv[2], NULL);
    ai = 3;
  } else if (argc > 1) {
    mib = strtod(argv[1], NULL);
    ai = 2;
  }
  uint32_t seed = bench_seed((uint64_t)(argc > ai ? strtol(argv[ai], NULL, 0) : 1234567));
  if (!(mib >= 1)) {
    fputs(usage, stderr);
    return 2;
  }
  size_t total = (size_t)(mib * 1048576.0);
  warm_up_libc();
  long base = bench_status_kib("VmRSS"), base_anon = bench_status_kib("RssAnon");
  double t0 = bench_now();
  long ops = bench_work(total, seed);
  double t = bench_now() - t0;
  long final = bench_status_kib("VmRSS");
  printf("frag total_mib=%.0f seed=%u build=%s start_rss_kib=%ld start_anon_kib=%ld phase1_rss_kib=%ld "
         "holes_rss_kib=%ld phase3_rss_kib=%ld peak_rss_kib=%ld final_rss_kib=%ld ops=%ld ops/s=%.0f "
         "time_s=%.3f\n",
         mib, seed, BENCH_ALLOC_KIND, base, base_anon, rss_after_phase1, rss_after_holes,
         rss_after_phase3, bench_status_kib("VmHWM"), final, ops, ops / t, t);
  if (watch_ms > 0) {
    printf("frag rss_after_free_kib");
    for (long ms = 0; ms <= watch_ms; ms += 100) {
      printf(" %ld:%ld/%ld", ms, bench_status_kib("VmRSS"), bench_status_kib("RssAnon"));
      fflush(stdout);
      struct timespec ts = {0, 100 * 1000000L};
      nanosleep(&ts, NULL);
    }
    printf("\n");
  }
  return 0;
}
