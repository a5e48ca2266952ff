/* thread_footprint — what each thread costs that holds a few blocks.
 *
 * usage: thread_footprint [threads [small [big]]]
 *   threads  threads alive at once, 64 KiB stacks (default 1000)
 *   small    blocks each thread holds of 16, 116, 216, ... B, one size class
 *            each (default 8)
 *   big      bytes of one more block each thread holds, 0 for none (default 20000)
 * Every byte of every block is written. Prints the process's resident memory
 * (Rss of /proc/self/smaps_rollup, which walks the page tables: a thread's
 * counters of /proc/self/status lag) before the threads start and while all
 * of them hold their blocks, and the difference a thread. Not a speed test:
 * it models a server with a thread per connection, each with a few buffers.
 */
#include "bench_common.h"

static const char usage[] =
    "usage: thread_footprint [threads [small [big]]]\n"
    "  defaults: 1000 threads, 8 small blocks (16, 116, 216, ... B), one block of 20000 B\n";

static long small_blocks, big_size;
static pthread_barrier_t holding, measured;

static void *bench_work(void *arg) {
  char *b[64];
  for (long i = 0; i < small_blocks; i++) {
    size_t size = 16 + (size_t)i * 100;
    if (!(b[i] = malloc(size))) bench_die("malloc failed");
    memset(b[i], 1, size);
  }
  char *big = NULL;
  if (big_size > 0) {
    if (!(big = malloc((size_t)big_size))) bench_die("malloc failed");
    memset(big, 2, (size_t)big_size);
  }
  pthread_barrier_wait(&holding);
  pthread_barrier_wait(&measured);
  for (long i = 0; i < small_blocks; i++) free(b[i]);
  free(big);
  return NULL;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long threads = bench_arg(argc, argv, 1, 1000);
  small_blocks = bench_arg(argc, argv, 2, 8);
  big_size = bench_arg(argc, argv, 3, 20000);
  if (threads < 1 || threads > 10000 || small_blocks < 0 || small_blocks > 64 || big_size < 0) {
    fputs(usage, stderr);
    return 2;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 << 10);
  pthread_barrier_init(&holding, NULL, (unsigned)threads + 1);
  pthread_barrier_init(&measured, NULL, (unsigned)threads + 1);
  pthread_t *t = bench_xalloc((size_t)threads * sizeof *t);
  long start = bench_proc_kib("/proc/self/smaps_rollup", "Rss");
  for (long i = 0; i < threads; i++)
    if (pthread_create(&t[i], &attr, bench_work, NULL) != 0) bench_die("pthread_create failed");
  pthread_barrier_wait(&holding);
  long held = bench_proc_kib("/proc/self/smaps_rollup", "Rss");
  pthread_barrier_wait(&measured);
  for (long i = 0; i < threads; i++) pthread_join(t[i], NULL);
  bench_xfree(t, (size_t)threads * sizeof *t);
  printf("thread_footprint threads=%ld small=%ld big=%ld build=%s rss_start_kib=%ld rss_held_kib=%ld "
         "kib_per_thread=%.1f\n",
         threads, small_blocks, big_size, BENCH_ALLOC_KIND, start, held,
         (double)(held - start) / (double)threads);
  return 0;
}
