/* realloc_chain — growing strings and arrays with realloc.
 *
 * usage: realloc_chain [chains [steps [maxsize [seed]]]]
 *   chains   live chains (default 64); even ones are "strings", odd ones
 *            are "arrays"
 *   steps    total growth steps (default 2000000)
 *   maxsize  a chain that reaches this many bytes is freed and restarted
 *            (default 65536)
 *   seed     seed (default 1234567)
 *
 * Each step picks a random chain and grows it: a string appends 1..32 bytes
 * and reallocs to exactly the new length + 1 (naive strcat-style code); an
 * array appends 1..4 8-byte elements and, when full, reallocs to double the
 * capacity (vector-style, starting at 16 B).  Appended bytes are written.
 * Models parsers, string builders and growing vectors: in-place growth and
 * copy costs.  ops = mallocs + reallocs + frees actually called.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: realloc_chain [chains [steps [maxsize [seed]]]]\n"
    "  defaults: 64 chains, 2000000 steps, maxsize 65536, seed 1234567\n";

typedef struct {
  char *p;
  size_t len, cap;
} chain_t;

BENCH_NOINLINE static long bench_work(chain_t *c, long chains, long steps, size_t maxsize, uint32_t s) {
  long ops = 0;
  for (long i = 0; i < steps; i++) {
    uint32_t r = xorshift32(&s);
    chain_t *ch = &c[r % (uint32_t)chains];
    int is_array = (int)((ch - c) & 1);
    if (ch->len >= maxsize) {
      free(ch->p);
      ops++;
      ch->p = NULL;
      ch->len = ch->cap = 0;
    }
    size_t add = is_array ? 8 * (1 + ((r >> 8) & 3)) : 1 + ((r >> 8) & 31);
    size_t need = ch->len + add + (is_array ? 0 : 1);
    if (need > ch->cap) {
      size_t ncap = is_array ? (ch->cap ? ch->cap * 2 : 16) : need;
      while (ncap < need) ncap *= 2;
      char *np = ch->p ? realloc(ch->p, ncap) : malloc(ncap);
      if (!np) bench_die("realloc failed");
      ops++;
      ch->p = np;
      ch->cap = ncap;
    }
    memset(ch->p + ch->len, (int)(r & 0x7F) | 1, add);
    ch->len += add;
    if (!is_array) ch->p[ch->len] = 0;
  }
  return ops;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long chains = bench_arg(argc, argv, 1, 64);
  long steps = bench_arg(argc, argv, 2, 2000000);
  long maxsize = bench_arg(argc, argv, 3, 65536);
  uint32_t seed = bench_seed((uint64_t)bench_arg(argc, argv, 4, 1234567));
  if (chains < 1 || steps < 1 || maxsize < 64) {
    fputs(usage, stderr);
    return 2;
  }
  chain_t *c = bench_xalloc((size_t)chains * sizeof *c);
  double t0 = bench_now();
  long ops = bench_work(c, chains, steps, (size_t)maxsize, seed);
  double t = bench_now() - t0;
  for (long i = 0; i < chains; i++) free(c[i].p);
  printf("realloc_chain chains=%ld steps=%ld maxsize=%ld seed=%u build=%s ops=%ld ops/s=%.0f time_s=%.3f\n",
         chains, steps, maxsize, seed, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}
