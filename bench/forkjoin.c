/* forkjoin — a tree of threads, each a task that its parent created.
 *
 * usage: forkjoin [depth [trees [rounds [seed [big]]]]]
 *   depth   levels below the root task: 2^(depth+1) - 1 tasks a tree (default 8)
 *   trees   trees run one after the other (default 20)
 *   rounds  rounds of work a task: 64 blocks of 32-931 B allocated,
 *           written and freed (default 200)
 *   seed    seed (default 4141)
 *   big     1: a round's first block is one of 1,200,000-2,199,999 B, written
 *           whole, as a task's buffer; 2: every eighth block is one of
 *           8,192-32,767 B (default 0: none)
 *
 * A task frees the block its parent handed it, does its rounds, then (above
 * the leaves) allocates a block for each of two children, creates them as
 * threads and joins them: a fan-out of threads per task, as std::async
 * makes, with hundreds alive at once and each alive for its own work only.
 * Frees cross threads (the handed block) and heaps come and go by the
 * thousand. ops = trees * tasks * (rounds * 128 + 2); the report counts
 * tasks too (tasks/s).
 */
#include "bench_common.h"
#include <pthread.h>

static const char usage[] =
    "usage: forkjoin [depth [trees [rounds [seed [big]]]]]\n"
    "  defaults: depth 8 (511 tasks a tree), 20 trees, 200 rounds, seed 4141, big 0.\n"
    "  Each task is a thread: frees its parent's block, allocates and frees 64 blocks of\n"
    "  32-931 B a round, then creates two children (each handed a block) and joins them.\n"
    "  big 1: a round's first block is of 1.2-2.2 MB, written whole;\n"
    "  big 2: every eighth block is of 8-32 KiB.\n";

typedef struct {
  long depth, rounds, big;
  uint32_t seed;
  char *handed;
} task_t;

static volatile long sink;

BENCH_NOINLINE static void *bench_task(void *arg) {
  task_t *t = arg;
  free(t->handed);
  uint32_t s = t->seed;
  long sum = 0;
  char *b[64];
  for (long r = 0; r < t->rounds; r++) {
    for (int i = 0; i < 64; i++) {
      int buffer = i == 0 && t->big == 1;
      size_t sz = buffer                    ? 1200000 + xorshift32(&s) % 1000000
                  : i % 8 == 0 && t->big == 2 ? 8192 + xorshift32(&s) % 24576
                                              : 32 + xorshift32(&s) % 900;
      if (!(b[i] = malloc(sz))) bench_die("malloc failed");
      if (buffer) memset(b[i], 1, sz);
      b[i][0] = (char)i;
      b[i][sz - 1] = 1;
    }
    for (int i = 0; i < 64; i++) {
      sum += b[i][0];
      free(b[i]);
    }
  }
  if (t->depth > 0) {
    pthread_t child[2];
    task_t ct[2];
    for (int k = 0; k < 2; k++) {
      ct[k] = (task_t){
          .depth = t->depth - 1, .rounds = t->rounds, .big = t->big, .seed = xorshift32(&s)};
      if (!(ct[k].handed = malloc(200))) bench_die("malloc failed");
      memset(ct[k].handed, 1, 200);
      if (pthread_create(&child[k], NULL, bench_task, &ct[k])) bench_die("pthread_create failed");
    }
    for (int k = 0; k < 2; k++) pthread_join(child[k], NULL);
  }
  sink += sum;
  return NULL;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long depth = bench_arg(argc, argv, 1, 8), trees = bench_arg(argc, argv, 2, 20);
  long rounds = bench_arg(argc, argv, 3, 200);
  uint64_t seed = (uint64_t)bench_arg(argc, argv, 4, 4141);
  long big = bench_arg(argc, argv, 5, 0);
  if (depth < 0 || depth > 14 || trees < 1 || rounds < 0 || big < 0 || big > 2) {
    fputs(usage, stderr);
    return 2;
  }
  uint32_t s = bench_seed(seed);
  double t0 = bench_now();
  for (long i = 0; i < trees; i++) {
    task_t root = {.depth = depth,
                   .rounds = rounds,
                   .big = big,
                   .seed = xorshift32(&s),
                   .handed = malloc(200)};
    if (!root.handed) bench_die("malloc failed");
    pthread_t tid;
    if (pthread_create(&tid, NULL, bench_task, &root)) bench_die("pthread_create failed");
    pthread_join(tid, NULL);
  }
  double t = bench_now() - t0;
  long tasks = trees * ((2L << depth) - 1);
  long ops = tasks * (rounds * 128 + 2);
  printf("forkjoin depth=%ld trees=%ld rounds=%ld seed=%llu big=%ld build=%s tasks=%ld tasks/s=%.0f ops=%ld ops/s=%.0f time_s=%.3f\n",
         depth, trees, rounds, (unsigned long long)seed, big, BENCH_ALLOC_KIND, tasks, tasks / t, ops, ops / t, t);
  return 0;
}
