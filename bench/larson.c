/* larson — Larson & Krishnan "server" simulation, with a fixed amount of work.
 *
 * usage: larson [threads [min [max [blocks [iters [rounds [seed]]]]]]]
 *   threads  concurrent lineages (default 2)
 *   min max  block size range in bytes (default 8 128)
 *   blocks   blocks owned by each thread (default 1000)
 *   iters    replacements per round: free a random block, malloc a new one
 *            of random size in its place (default 20000)
 *   rounds   rounds per lineage (default 20)
 *   seed     seed (default 4141)
 *
 * The main thread allocates every lineage's initial blocks.  Each lineage is
 * a chain of threads: a thread runs one round on its block array, then
 * creates a NEW thread that takes over the array for the next round and
 * exits.  So frees cross threads (blocks allocated by the previous owner)
 * and threads keep dying and being born, as in a server handing connections
 * to short-lived workers.  Unlike the original (which runs for N seconds),
 * the work is fixed so runs are comparable and callgrind-countable.
 * ops = threads * rounds * iters * 2 (each replacement is a free + a malloc).
 */
#include "bench_common.h"
#include <pthread.h>

static const char usage[] =
    "usage: larson [threads [min [max [blocks [iters [rounds [seed]]]]]]]\n"
    "  defaults: 2 threads, 8..128 B, 1000 blocks per thread, 20000 replacements per round,\n"
    "  20 rounds, seed 4141.  ops = threads*rounds*iters*2\n";

typedef struct {
  void **blk;
  long nblk, iters, rounds_left;
  size_t min, span;
  uint32_t seed;
} lineage_t;

static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static long done_count;

BENCH_NOINLINE static void *bench_work(void *arg) {
  lineage_t *l = arg;
  uint32_t s = l->seed;
  void **blk = l->blk;
  for (long i = 0; i < l->iters; i++) {
    uint32_t r = xorshift32(&s);
    long victim = (long)(r % (uint32_t)l->nblk);
    free(blk[victim]);
    size_t sz = l->min + (xorshift32(&s) % l->span);
    char *p = malloc(sz);
    if (!p) bench_die("malloc failed");
    p[0] = (char)r;
    blk[victim] = p;
  }
  l->seed = s;
  if (--l->rounds_left > 0) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, bench_work, l)) bench_die("pthread_create failed");
    pthread_attr_destroy(&at);
  } else {
    pthread_mutex_lock(&done_mu);
    done_count++;
    pthread_cond_signal(&done_cv);
    pthread_mutex_unlock(&done_mu);
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long threads = bench_arg(argc, argv, 1, 2);
  long min = bench_arg(argc, argv, 2, 8), max = bench_arg(argc, argv, 3, 128);
  long blocks = bench_arg(argc, argv, 4, 1000);
  long iters = bench_arg(argc, argv, 5, 20000);
  long rounds = bench_arg(argc, argv, 6, 20);
  uint64_t seed = (uint64_t)bench_arg(argc, argv, 7, 4141);
  if (threads < 1 || threads > 1024 || min < 1 || max < min || blocks < 1 || iters < 0 || rounds < 1) {
    fputs(usage, stderr);
    return 2;
  }
  lineage_t *L = bench_xalloc((size_t)threads * sizeof *L);
  uint32_t s = bench_seed(seed);
  for (long t = 0; t < threads; t++) {
    L[t] = (lineage_t){.nblk = blocks, .iters = iters, .rounds_left = rounds, .min = (size_t)min,
                       .span = (size_t)(max - min + 1), .seed = bench_seed(seed ^ ((uint64_t)(t + 1) * 2654435761u))};
    L[t].blk = bench_xalloc((size_t)blocks * sizeof(void *));
    for (long b = 0; b < blocks; b++) {
      char *p = malloc((size_t)min + xorshift32(&s) % (size_t)(max - min + 1));
      if (!p) bench_die("malloc failed");
      p[0] = 1;
      L[t].blk[b] = p;
    }
  }
  double t0 = bench_now();
  for (long t = 0; t < threads; t++) {
    pthread_t tid;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&tid, &at, bench_work, &L[t])) bench_die("pthread_create failed");
    pthread_attr_destroy(&at);
  }
  pthread_mutex_lock(&done_mu);
  while (done_count < threads) pthread_cond_wait(&done_cv, &done_mu);
  pthread_mutex_unlock(&done_mu);
  double t = bench_now() - t0;
  for (long t2 = 0; t2 < threads; t2++) {
    for (long b = 0; b < blocks; b++) free(L[t2].blk[b]);
    bench_xfree(L[t2].blk, (size_t)blocks * sizeof(void *));
  }
  long ops = threads * rounds * iters * 2;
  printf("larson threads=%ld min=%ld max=%ld blocks=%ld iters=%ld rounds=%ld seed=%llu build=%s ops=%ld ops/s=%.0f time_s=%.3f\n",
         threads, min, max, blocks, iters, rounds, (unsigned long long)seed, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}
