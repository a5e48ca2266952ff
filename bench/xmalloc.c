/* xmalloc — producer/consumer: every free is remote.
 *
 * usage: xmalloc [producers [consumers [objects [batch [min [max [queue]]]]]]]
 *   producers  allocating threads (default 2)
 *   consumers  freeing threads (default 2)
 *   objects    objects allocated per producer (default 1000000)
 *   batch      objects per batch handed over (default 100)
 *   min max    object size range (default 16 128)
 *   queue      bound of the batch queue (default 64 batches)
 *
 * Producers malloc objects (writing the first byte), fill a batch (the batch
 * record itself is malloc'd too) and push it on a bounded, mutex-protected
 * queue; consumers pop batches and free every object and the batch.  Models
 * pipelines / message passing where memory is freed by a different thread
 * than allocated it.  Also reports peak RSS (VmHWM) since remote frees that
 * are not recycled promptly show up as memory growth.
 * ops = producers * objects * 2 (the batch records' mallocs and frees not counted).
 */
#include "bench_common.h"

static const char usage[] =
    "usage: xmalloc [producers [consumers [objects [batch [min [max [queue]]]]]]]\n"
    "  defaults: 2 producers, 2 consumers, 1000000 objects per producer, batch 100,\n"
    "  16..128 B, queue bound 64 batches\n";

typedef struct batch {
  long n;
  void *obj[];
} batch_t;

static batch_t **q;
static long qcap, qhead, qtail, qlen, producers_left;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_full = PTHREAD_COND_INITIALIZER, not_empty = PTHREAD_COND_INITIALIZER;
static long g_objects, g_batch;
static size_t g_min, g_span;
static pthread_barrier_t start_barrier;

static void push(batch_t *b) {
  pthread_mutex_lock(&mu);
  while (qlen == qcap) pthread_cond_wait(&not_full, &mu);
  q[qtail] = b;
  qtail = (qtail + 1) % qcap;
  qlen++;
  pthread_cond_signal(&not_empty);
  pthread_mutex_unlock(&mu);
}

static batch_t *pop(void) {
  pthread_mutex_lock(&mu);
  while (qlen == 0 && producers_left > 0) pthread_cond_wait(&not_empty, &mu);
  batch_t *b = NULL;
  if (qlen > 0) {
    b = q[qhead];
    qhead = (qhead + 1) % qcap;
    qlen--;
    pthread_cond_signal(&not_full);
  }
  pthread_mutex_unlock(&mu);
  return b;
}

BENCH_NOINLINE static void *bench_work_producer(void *arg) {
  uint32_t s = bench_seed((uint64_t)(uintptr_t)arg * 2654435761u);
  pthread_barrier_wait(&start_barrier);
  bench_span_begin();
  for (long done = 0; done < g_objects;) {
    long n = g_objects - done < g_batch ? g_objects - done : g_batch;
    batch_t *b = malloc(sizeof(batch_t) + (size_t)n * sizeof(void *));
    if (!b) bench_die("malloc failed");
    for (long i = 0; i < n; i++) {
      uint32_t r = xorshift32(&s);
      char *p = malloc(g_min + r % g_span);
      if (!p) bench_die("malloc failed");
      p[0] = (char)r;
      b->obj[i] = p;
    }
    b->n = n;
    push(b);
    done += n;
  }
  pthread_mutex_lock(&mu);
  producers_left--;
  pthread_cond_broadcast(&not_empty);
  pthread_mutex_unlock(&mu);
  bench_span_end();
  return NULL;
}

BENCH_NOINLINE static void *bench_work_consumer(void *arg) {
  long *freed = arg;
  pthread_barrier_wait(&start_barrier);
  bench_span_begin();
  batch_t *b;
  while ((b = pop()) != NULL) {
    for (long i = 0; i < b->n; i++) free(b->obj[i]);
    *freed += b->n;
    free(b);
  }
  bench_span_end();
  return NULL;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  long P = bench_arg(argc, argv, 1, 2), C = bench_arg(argc, argv, 2, 2);
  g_objects = bench_arg(argc, argv, 3, 1000000);
  g_batch = bench_arg(argc, argv, 4, 100);
  long min = bench_arg(argc, argv, 5, 16), max = bench_arg(argc, argv, 6, 128);
  qcap = bench_arg(argc, argv, 7, 64);
  if (P < 1 || C < 1 || P > 512 || C > 512 || g_objects < 1 || g_batch < 1 || min < 1 || max < min ||
      qcap < 1) {
    fputs(usage, stderr);
    return 2;
  }
  g_min = (size_t)min;
  g_span = (size_t)(max - min + 1);
  q = bench_xalloc((size_t)qcap * sizeof *q);
  producers_left = P;
  pthread_t *tid = bench_xalloc((size_t)(P + C) * sizeof *tid);
  long *freed = bench_xalloc((size_t)C * 64 * sizeof(long));
  pthread_barrier_init(&start_barrier, NULL, (unsigned)(P + C + 1));
  for (long i = 0; i < P; i++)
    if (pthread_create(&tid[i], NULL, bench_work_producer, (void *)(uintptr_t)(i + 1)))
      bench_die("pthread_create failed");
  for (long i = 0; i < C; i++)
    if (pthread_create(&tid[P + i], NULL, bench_work_consumer, &freed[i * 64]))
      bench_die("pthread_create failed");
  pthread_barrier_wait(&start_barrier);
  for (long i = 0; i < P + C; i++) pthread_join(tid[i], NULL);
  double t = bench_span();
  long total = 0;
  for (long i = 0; i < C; i++) total += freed[i * 64];
  if (total != P * g_objects) bench_die("lost objects");
  long ops = P * g_objects * 2;
  printf("xmalloc producers=%ld consumers=%ld objects=%ld batch=%ld min=%ld max=%ld queue=%ld build=%s peak_rss_kib=%ld ops=%ld ops/s=%.0f time_s=%.3f\n",
         P, C, g_objects, g_batch, min, max, qcap, BENCH_ALLOC_KIND, bench_status_kib("VmHWM"), ops, ops / t, t);
  return 0;
}
