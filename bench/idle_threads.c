/* idle_threads — what threads keep after they free everything and go idle.
 *
 * usage: idle_threads [threads [size [mib [rounds [idle_ms]]]]]
 *   threads  worker threads (default 8)
 *   size     block size in bytes (default 65536)
 *   mib      MiB each thread fills (every block written) and frees, per round (default 20)
 *   rounds   rounds of fill and free (default 20)
 *   idle_ms  how long the threads then stay alive without any call (default 1000)
 * Prints VmRSS at start, when the last thread has freed its last block,
 * after the idle time, and once the threads have exited (KiB). Not a speed test: it models a thread pool whose
 * workers had a burst of work and now wait, and asks whether the memory they
 * freed leaves the process while they wait.
 */
#include "bench_common.h"

#include <unistd.h>

static const char usage[] =
    "usage: idle_threads [threads [size [mib [rounds [idle_ms]]]]]\n"
    "  defaults: 8 threads, 65536 B blocks, 20 MiB per round, 20 rounds, 1000 ms idle\n";

typedef struct {
  size_t size, blocks;
  long rounds;
} targ_t;

static pthread_barrier_t freed_all, measured;

static void *bench_work(void *arg) {
  targ_t *a = arg;
  void **b = bench_xalloc(a->blocks * sizeof *b);
  for (long r = 0; r < a->rounds; r++) {
    for (size_t i = 0; i < a->blocks; i++) {
      b[i] = malloc(a->size);
      if (!b[i]) bench_die("malloc failed");
      memset(b[i], 1, a->size);
    }
    for (size_t i = 0; i < a->blocks; i++) free(b[i]);
  }
  bench_xfree(b, a->blocks * sizeof *b);
  pthread_barrier_wait(&freed_all);
  pthread_barrier_wait(&measured); /* alive and idle until the main thread has measured */
  return NULL;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long threads = bench_arg(argc, argv, 1, 8), size = bench_arg(argc, argv, 2, 65536);
  long mib = bench_arg(argc, argv, 3, 20), rounds = bench_arg(argc, argv, 4, 20);
  long idle_ms = bench_arg(argc, argv, 5, 1000);
  if (threads < 1 || threads > 1024 || size < 1 || mib < 1 || rounds < 1 || idle_ms < 0) {
    fputs(usage, stderr);
    return 2;
  }
  long start = bench_status_kib("VmRSS");
  targ_t arg = {.size = (size_t)size, .blocks = ((size_t)mib << 20) / (size_t)size + 1, .rounds = rounds};
  pthread_t *t = bench_xalloc((size_t)threads * sizeof *t);
  pthread_barrier_init(&freed_all, NULL, (unsigned)threads + 1);
  pthread_barrier_init(&measured, NULL, (unsigned)threads + 1);
  for (long i = 0; i < threads; i++)
    if (pthread_create(&t[i], NULL, bench_work, &arg) != 0) bench_die("pthread_create failed");
  pthread_barrier_wait(&freed_all);
  long freed = bench_status_kib("VmRSS");
  usleep((useconds_t)idle_ms * 1000);
  long idle = bench_status_kib("VmRSS");
  pthread_barrier_wait(&measured);
  for (long i = 0; i < threads; i++) pthread_join(t[i], NULL);
  long exited = bench_status_kib("VmRSS");
  bench_xfree(t, (size_t)threads * sizeof *t);
  printf("idle_threads threads=%ld size=%ld mib=%ld rounds=%ld idle_ms=%ld build=%s "
         "rss_start_kib=%ld rss_freed_kib=%ld rss_idle_kib=%ld rss_exited_kib=%ld\n",
         threads, size, mib, rounds, idle_ms, BENCH_ALLOC_KIND, start, freed, idle, exited);
  return 0;
}
