/* Thread heaps. A new thread's heap pointer is the empty sentinel, whose
 * lists are all empty, so its first malloc takes the slow path, which
 * creates the real heap: the fast path never tests for initialisation.
 * Heap structs (the first one static, the others from a pool) are never
 * unmapped, so a stale pointer to a dead heap (a hint written by another
 * thread) stays harmless. */
#define _GNU_SOURCE /* pthread_cond_clockwait */
#include "internal.h"

#include <sched.h>

/* The first thread's heap, the first of the library's bss after crtstuff's
 * flag that the exit sets (no file linked before this one has bss): its
 * lists share that page, so a forked child that frees and exits copies one
 * page fewer (test introspect.a_forked_child_writes_one_page_...), and a
 * program of one thread maps no pool. The sentinel is read-only data. */
static hak_heap_t heap_first;
const hak_heap_t hak_heap_empty = {.small_class = {
#include "small_class_table.inc"
}};
__thread hak_heap_t *hak_tls_heap = HAK_HEAP_EMPTY;
HAK_FORK_HELD pthread_mutex_t hak_heaps_lock = PTHREAD_MUTEX_INITIALIZER;

static HAK_FORK_HELD hak_heap_t *heaps_live;
/* FIFO: a new thread takes the heap parked longest, whose blocks have had
 * the most time to be freed; it fills their holes instead of carving new
 * memory beside blocks still in use (larson 4t 10-1000: 15.1 MiB peak,
 * 16.8 taking the one parked last). A thread whose first call frees a
 * parked heap's block takes that heap instead (free.c: free_heapless). */
static HAK_FORK_HELD hak_heap_t *heaps_parked, **heaps_parked_end = &heaps_parked;
static HAK_FORK_HELD hak_heap_t *heaps_pool = &heap_first;
static HAK_FORK_HELD uint32_t pool_carved; /* heaps carved from the newest chunk */

#define HAK_HEAP_CHUNK ((size_t)256 * 1024)

/* Heaps by number, for hints that name a heap in fewer bits than a pointer
 * (span.c: a span block's last page): the pool's chunks, newest first,
 * each headed by the number of its first heap, number its heaps in order;
 * a heap struct keeps its number when pooled. The first heap has none (0).
 * No table: one mapped would be locked whole under mlockall, one in the
 * bss would move the data a forked child writes. */
typedef struct heap_chunk_s heap_chunk_t;
struct heap_chunk_s {
  heap_chunk_t *next;
  uint32_t first_number;
};
#define LINES_OF(n) (((n) + 63) & ~(size_t)63) /* n rounded up to whole cache lines */
#define HEAP_SIZE LINES_OF(sizeof(hak_heap_t))
#define CHUNK_HEAPS_AT LINES_OF(sizeof(heap_chunk_t))
#define CHUNK_HEAPS ((HAK_HEAP_CHUNK - CHUNK_HEAPS_AT) / HEAP_SIZE)
static HAK_FORK_HELD heap_chunk_t *pool_chunks;

/* The heap struct of that number in chunk c. */
static hak_heap_t *chunk_heap(heap_chunk_t *c, uint32_t number) {
  return (hak_heap_t *)((uint8_t *)c + CHUNK_HEAPS_AT + (number - c->first_number) * HEAP_SIZE);
}

hak_heap_t *hak_heap_numbered(uint32_t number) {
  if (number == 0) return NULL;
  hak_heap_t *h = NULL;
  pthread_mutex_lock(&hak_heaps_lock);
  heap_chunk_t *c = pool_chunks;
  while (c != NULL && number < c->first_number) c = c->next;
  if (c != NULL && number - c->first_number < CHUNK_HEAPS) h = chunk_heap(c, number);
  pthread_mutex_unlock(&hak_heaps_lock);
  return h;
}

/* A new pooled heap struct (under hak_heaps_lock); NULL if out of memory. */
static hak_heap_t *pool_carve(void) {
  heap_chunk_t *c = pool_chunks;
  if (c == NULL || pool_carved == CHUNK_HEAPS) {
    if ((c = hak_os_map(HAK_HEAP_CHUNK)) == NULL) return NULL;
    c->first_number = pool_chunks ? pool_chunks->first_number + (uint32_t)CHUNK_HEAPS : 1;
    c->next = pool_chunks;
    pool_chunks = c;
    pool_carved = 0;
  }
  uint32_t number = c->first_number + pool_carved++;
  hak_heap_t *h = chunk_heap(c, number);
  h->number = number;
  return h;
}

/* A parked heap whose blocks have all been freed waits, its slabs ready,
 * for the next new thread (which takes it before any other), instead of
 * retiring at once: a new thread then carves no blocks and faults in no
 * pages (larson 4t 10-1000: 1.23x as fast; a tree of threads,
 * bench/forkjoin depth 8, 1.7x). Past HAK_KEEP_EMPTY_HEAPS, one retires
 * each time a thread takes pages not committed yet for a slab, a span
 * refill or a large block (hak_heaps_trim_empty), so that the pages of a
 * burst of exiting threads are given back as the program grows elsewhere:
 * 64 threads that held 1 MiB each, then 20 MiB of small, 64 KiB or 2 MiB
 * blocks allocated by the main thread, peaked at 102-110 MiB when every
 * empty heap waited for the purge delay, 90-91 since. Blocks on committed
 * pages retire none: a tree of threads whose tasks took a large block a
 * round retired a heap at each, and the next threads faulted in new slabs
 * (forkjoin 8 5 20 4141 1: 1.25x as fast, at 120.5 MiB against 129.7). */
static HAK_FORK_HELD _Atomic size_t empty_parked;

static void empty_parked_add(hak_heap_t *heap) {
  heap->parked_empty = true;
  atomic_fetch_add(&empty_parked, 1);
}

/* Takes the heap at *pp off the parked list (under hak_heaps_lock). */
static hak_heap_t *parked_unlink(hak_heap_t **pp) {
  hak_heap_t *h = *pp;
  *pp = h->parked_next;
  if (*pp == NULL) heaps_parked_end = pp;
  h->parked_next = NULL;
  if (h->parked_empty) {
    h->parked_empty = false;
    atomic_fetch_sub(&empty_parked, 1);
  }
  return h;
}

/* The link to h in the parked list; NULL if a new thread or the purger
 * has taken it. */
static hak_heap_t **parked_link(const hak_heap_t *h) {
  for (hak_heap_t **pp = &heaps_parked; *pp; pp = &(*pp)->parked_next)
    if (*pp == h) return pp;
  return NULL;
}

/* The link to the empty heap parked longest; NULL if none waits. */
static hak_heap_t **parked_empty_link(void) {
  for (hak_heap_t **pp = &heaps_parked; *pp; pp = &(*pp)->parked_next)
    if ((*pp)->parked_empty) return pp;
  return NULL;
}

/* The heap's ACTIVE slabs take token as their owner (0 while parked). */
static void queue_owners(hak_heap_t *h, uintptr_t token) {
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++)
    for (hak_slab_t *s = h->queue[c].first; s; s = s->next)
      atomic_store_explicit(&s->owner, token, memory_order_relaxed);
}

/* A parked heap's ACTIVE slabs take the new thread's token. */
static void heap_unpark(hak_heap_t *h) {
  pthread_mutex_lock(&h->lock);
  __atomic_store_n(&h->parked, false, __ATOMIC_RELAXED);
  queue_owners(h, h->token);
  pthread_mutex_unlock(&h->lock);
}

/* A heap for the thread of token: want if given (NULL if it is no longer
 * parked), else an empty parked heap, else the one parked longest, else a
 * new one;
 * *stale is set to a live heap left with the same token by a dead thread
 * whose pointer this one reuses. */
static hak_heap_t *heap_struct_alloc(uintptr_t token, hak_heap_t *want, hak_heap_t **stale) {
  pthread_mutex_lock(&hak_heaps_lock);
  *stale = NULL;
  hak_heap_t **pp = &heaps_parked;
  if (want) {
    if (!(pp = parked_link(want))) {
      pthread_mutex_unlock(&hak_heaps_lock);
      return NULL;
    }
  } else {
    hak_heap_t **empty = parked_empty_link();
    if (empty) pp = empty;
  }
  for (hak_heap_t *l = heaps_live; l; l = l->next)
    if (l->token == token) *stale = l;
  hak_heap_t *h = *pp ? parked_unlink(pp) : NULL;
  if (h) {
    h->token = token;
    pthread_mutex_unlock(&hak_heaps_lock);
    heap_unpark(h);
    return h;
  }
  h = heaps_pool;
  if (h) {
    heaps_pool = h->next;
  } else {
    h = pool_carve();
  }
  if (h) {
    uint32_t number = h->number;
    memset(h, 0, sizeof *h);
    h->number = number;
    memcpy(h->small_class, hak_heap_empty.small_class, sizeof h->small_class);
    hak_span_heap_init(h);
    h->token = token;
    h->next = heaps_live;
    if (heaps_live) heaps_live->prev = h;
    heaps_live = h;
  }
  pthread_mutex_unlock(&hak_heaps_lock);
  return h;
}

static void heap_struct_free(hak_heap_t *h) {
  pthread_mutex_lock(&hak_heaps_lock);
  if (h->prev) h->prev->next = h->next;
  else heaps_live = h->next;
  if (h->next) h->next->prev = h->prev;
  h->next = heaps_pool;
  heaps_pool = h;
  pthread_mutex_unlock(&hak_heaps_lock);
}

/* The thread's heap: want (a parked heap) if given, NULL if it is no
 * longer parked; else a parked heap or a new one. */
static hak_heap_t *heap_install(hak_heap_t *want) {
  hak_heap_t *stale;
  hak_heap_t *h = heap_struct_alloc(hak_thread_token(), want, &stale);
  if (h != NULL) hak_tls_heap = h; /* first: retiring may allocate */
  /* Its slabs would pass our free's owner test: a thread that allocated
   * again after its exit handler ran (or exited before the key existed)
   * leaves its heap; retire it before the program frees with our token. */
  if (stale) hak_heap_done(stale);
  if (h == NULL) return NULL;
  h->refills_at_install = h->refills;
  /* may allocate (glibc's second-level key array): the heap is ready */
  if (atomic_load_explicit(&hak_key_ready, memory_order_acquire))
    pthread_setspecific(hak_thread_key, h);
  return h;
}

hak_heap_t *hak_heap_get(void) {
  hak_heap_t *h = hak_tls_heap;
  if (h != HAK_HEAP_EMPTY) return h;
  hak_process_init();
  return heap_install(NULL);
}

/* Set when the thread's exit handler has run: a free from a destructor
 * that runs after it takes no heap (a parked one, or one for its outboxes
 * or span caches), which would stay with a dead thread, and its blocks
 * with it, if that was the last round of destructors. */
static __thread bool thread_exited;

void hak_heap_thread_exit(hak_heap_t *heap) {
  thread_exited = true;
  if (heap == hak_tls_heap) hak_heap_done(heap);
}

hak_heap_t *hak_heap_for_free(void) { return thread_exited ? NULL : hak_heap_get(); }

/* A new thread whose first call frees a block of a live heap waits a
 * little for that heap to park, rather than build one or take another:
 * the block's thread is likely the worker that created this one and is
 * about to exit (larson, a server's chain of workers). The new thread would
 * otherwise carve new slabs while that heap's, half free, wait for the
 * next thread (larson 4t 10-1000, 40 runs: peaks of 7.8-12.2 MiB, median
 * 10.2, against 7.8-16.5, median 11.1). It waits even while other heaps
 * are parked: those are other lineages', and a thread that took one
 * carved beside their blocks (on 2 cores, successors that took another
 * heap: 7 of 400 instead of about 150; larson 4t 1-8 KiB 1.18x as fast at
 * 59.0 MiB against 86.0, 4t 8-128 and 10-1000 1.16x and 1.21x at 2.8 and
 * 9.3 MiB against 3.7 and 13.9; the waits took 1.5 ms on average). A
 * span block's heap is the one that took it from the page heap (span.c:
 * block_mark), which a seventh of larson 1-8 KiB's workers free first:
 * they took the heap parked longest (56.0 MiB against 60.9, 21 runs). Not
 * for the first thread's heap, which hands blocks to workers and seldom
 * exits, and not without the purger, as then heaps retire instead of
 * parking. The thread sleeps, or first yields where the bound is long
 * (heir_yield), so that the exiting one may run on its core. Waits that
 * time out (a parent that joins its children, as in bench/forkjoin) use up
 * a credit that parks replenish; without credit, one new thread in
 * HEIR_PROBE waits (forkjoin 6 20 20: 1.00x as fast; waiting 200 us,
 * 0.96x).
 * How long to wait is learnt: twice the time the heaps waited for took to
 * park, counted from the wait's start also for a creator that parks after
 * its successor gave up, from HEIR_WAIT_MIN_NS to HEIR_WAIT_MAX_NS. Where
 * threads outnumber cores an exiting one may wait a scheduler's slice for
 * one: on a 2-core Intel host larson 4t 10-1000's creators parked up to
 * 5 ms after their successors' first free, and with a fixed 50 us the
 * runs built 9-16 heaps (hosts whose creators parked within it, 5-8);
 * learnt, 21 interleaved runs peaked at 13.8-16.4 MiB against 15.0-19.2,
 * at 1.03x the speed. A creator that joins its successor parks later
 * than any bound, and teaches nothing. */
#define HEIR_WAIT_MIN_NS 50000
#define HEIR_WAIT_MAX_NS 5000000
#define HEIR_CREDIT_MAX 8
#define HEIR_PROBE 64
static pthread_cond_t heir_cond = PTHREAD_COND_INITIALIZER;
static HAK_FORK_HELD unsigned heir_waiters; /* under hak_heaps_lock */
static _Atomic int heir_credit = HEIR_CREDIT_MAX;
static _Atomic unsigned heir_skips;
static _Atomic uint64_t heir_wait_ns = HEIR_WAIT_MIN_NS;

/* A heap waited for parked `took` ns after the wait began: the bound
 * rises at once to twice that, and falls by an eighth of the way. */
static void heir_wait_learn(uint64_t took) {
  if (took > HEIR_WAIT_MAX_NS) return; /* not a thread about to exit */
  uint64_t want = 2 * took, now = atomic_load_explicit(&heir_wait_ns, memory_order_relaxed);
  if (want < HEIR_WAIT_MIN_NS) want = HEIR_WAIT_MIN_NS;
  if (want > HEIR_WAIT_MAX_NS) want = HEIR_WAIT_MAX_NS;
  atomic_store_explicit(&heir_wait_ns, want > now ? want : now - (now - want) / 8, memory_order_relaxed);
}

/* Yields the CPU until owner parks, within bound ns of start; false once
 * the yields have spun HEIR_SPIN_NS while no other thread took the CPU, or
 * at the bound. Where threads outnumber cores the exiting creator often
 * waits behind another thread's slice: a yield runs that thread where a
 * sleep left cores idle (larson 4t 8-128: 185% of the 2 cores busy and 700
 * voluntary switches a run, against 195% and 40; 11 interleaved runs 1.060x
 * as fast, 4t 10-1000 1.041x, 4t 1-8 KiB 1.055x, 1t and 2t 1.00-1.015x),
 * and a core that would idle spins a little instead, which a creator
 * parking on the other core ends sooner than a wake-up would. Only for a
 * bound of HEIR_YIELD_MIN_NS or more, learnt where creators park that late:
 * a yield may give the CPU away for a whole slice, past a shorter bound. */
#define HEIR_SPIN_NS 100000
#define HEIR_YIELD_MIN_NS 500000
#define HEIR_YIELD_RAN_NS 20000 /* a yield this long ran another thread */
static bool heir_yield(hak_heap_t *owner, uint64_t start, uint64_t bound) {
  uint64_t now = start, spun = 0;
  while (!__atomic_load_n(&owner->parked, __ATOMIC_RELAXED)) {
    if (now - start >= bound || spun >= HEIR_SPIN_NS) return false;
    sched_yield();
    uint64_t t = hak_clock_ns();
    if (t - now < HEIR_YIELD_RAN_NS) spun += t - now;
    now = t;
  }
  return true;
}

/* Whether owner is parked, after the wait if there is one. */
static bool heir_parked(hak_heap_t *owner) {
  if (__atomic_load_n(&owner->parked, __ATOMIC_RELAXED)) return true;
  if (owner == &heap_first || !hak_heaps_park()) return false;
  if (atomic_load_explicit(&heir_credit, memory_order_relaxed) <= 0 &&
      atomic_fetch_add_explicit(&heir_skips, 1, memory_order_relaxed) % HEIR_PROBE != 0)
    return __atomic_load_n(&owner->parked, __ATOMIC_RELAXED);
  uint64_t start = hak_clock_ns(), bound = atomic_load_explicit(&heir_wait_ns, memory_order_relaxed);
  bool yielded = bound >= HEIR_YIELD_MIN_NS && heir_yield(owner, start, bound);
  /* the wait is a cancellation point, which free must not be */
  int cancel_state;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
  pthread_mutex_lock(&hak_heaps_lock);
  int waited = yielded ? 1 : 0; /* 1: the owner parked meanwhile; -1: it did not */
  if (parked_link(owner) == NULL) {
    uint64_t now = hak_clock_ns();
    struct timespec end = hak_clock_deadline(now - start < bound ? bound - (now - start) : 0);
    heir_waiters++;
    waited = -1;
    while (waited < 0 && pthread_cond_clockwait(&heir_cond, &hak_heaps_lock, CLOCK_MONOTONIC, &end) == 0)
      if (parked_link(owner) != NULL) waited = 1;
    heir_waiters--;
  }
  bool parked = parked_link(owner) != NULL;
  if (waited < 0 && !parked) atomic_store_explicit(&owner->heir_gave_up_ns, start, memory_order_relaxed);
  pthread_mutex_unlock(&hak_heaps_lock);
  pthread_setcancelstate(cancel_state, NULL);
  if (waited > 0) heir_wait_learn(hak_clock_ns() - start);
  int credit = atomic_load_explicit(&heir_credit, memory_order_relaxed);
  if (waited > 0 && credit < HEIR_CREDIT_MAX) atomic_fetch_add(&heir_credit, 1);
  if (waited < 0 && credit > 0) atomic_fetch_sub(&heir_credit, 1);
  return parked;
}

hak_heap_t *hak_heap_for_heir(hak_heap_t *owner) {
  if (thread_exited) return NULL;
  hak_heap_t *h;
  if (owner != NULL && heir_parked(owner) && (h = heap_install(owner)) != NULL) return h;
  return hak_heap_get();
}

/* A new thread whose first free came while its predecessor was still
 * exiting took another heap (the one parked longest, whose blocks belong
 * to another lineage of workers) and frees its predecessor's blocks into
 * a parked heap. While it is young it takes that heap instead, once, and
 * its own is parked: each lineage then keeps to one heap, where the
 * blocks of two lineages had each heap carve beside the other's. larson
 * of 1-8 KiB blocks, 4 and 2 threads with 20,000 replacements a round:
 * 51.0 and 21.5 MiB against 58.3 and 24.3, 1.15x and 1.06x as fast (11
 * interleaved runs). Only for blocks of at least SWITCH_MIN_BLOCK: the
 * switch parks a heap and leaves the thread longer lists for its exit to
 * return, block by block, and other threads then free into the heap it
 * parked under its lock: 4,000 blocks of 16-256 B ran 0.80x as fast, in
 * no less memory. */
#define YOUNG_REFILLS 64
#define SWITCH_MIN_BLOCK 1024
static __thread bool switched;

bool hak_heap_switch_to_parked(hak_heap_t *heap, hak_heap_t *parked, size_t block_size) {
  if (block_size < SWITCH_MIN_BLOCK || switched || thread_exited ||
      heap->refills - heap->refills_at_install >= YOUNG_REFILLS)
    return false;
  switched = true;
  hak_heap_done(heap);
  heap_install(parked);
  return true;
}

/* Its thread is done with it: the outboxes go over, the span caches and
 * kept large blocks go back, and the lists go back to their slabs. Returns
 * holding its lock. */
static void heap_let_go(hak_heap_t *heap) {
  hak_free_flush_outboxes(heap);
  hak_span_heap_done(heap);
  hak_large_kept_release(heap, true);
  pthread_mutex_lock(&heap->lock);
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++) hak_heap_return_list(heap, c);
}

/* Its thread is done with it for good: its segments go to the abandoned
 * list, its struct to the pool. */
static void heap_retire(hak_heap_t *heap) {
  heap_let_go(heap);
  __atomic_store_n(&heap->parked, false, __ATOMIC_RELAXED);
  hak_span_heap_retire(heap);
  hak_segment_abandon_all(heap);
  pthread_mutex_unlock(&heap->lock);
  if (hak_tls_heap == heap) hak_tls_heap = HAK_HEAP_EMPTY;
  heap_struct_free(heap);
}

/* Takes the parked heaps off their list: all of them, or those parked for
 * the purge delay; the caller retires them, holding no lock. */
static hak_heap_t *parked_take(bool all, uint64_t now) {
  hak_heap_t *out = NULL, **pp = &heaps_parked;
  while (*pp) {
    if (all || now - (*pp)->parked_since_ms >= (uint64_t)hak_opt.purge_delay_ms) {
      hak_heap_t *h = parked_unlink(pp);
      h->parked_next = out;
      out = h;
    } else {
      pp = &(*pp)->parked_next;
    }
  }
  return out;
}

static void parked_retire(hak_heap_t *list) {
  while (list) {
    hak_heap_t *next = list->parked_next;
    heap_retire(list);
    list = next;
  }
}

/* Slabs of the heap with blocks in use, their remote frees collected:
 * a FULL slab that other threads emptied while its thread lived would
 * otherwise count until the purge delay retired the heap. */
static uint32_t slabs_live(hak_heap_t *heap) {
  uint32_t n = 0;
  hak_heap_revive_full_locked(heap);
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++) {
    for (hak_slab_t *s = heap->queue[c].first; s; s = s->next) {
      hak_slab_collect_remote(s);
      n += s->used != 0;
    }
    for (hak_slab_t *s = heap->full[c].first; s; s = s->next) n += s->used != 0;
  }
  return n;
}

/* A thread that exits with blocks in use leaves its heap whole, slabs and
 * segments, for the next new thread: threads that come and go, handing
 * their blocks on (a server's workers), then reuse one set of slabs instead
 * of each starting its own while the last one's are still committed. The
 * heap owns nothing while parked: its slabs' owner is 0, and frees into
 * them take the heap's lock. It retires (its segments are abandoned, the
 * empty ones cached) after the purge delay (the purger's job: without the
 * purger it retires at once), or, once its last block is freed, when a
 * thread needs memory (hak_heaps_trim_empty). */
static void heap_park(hak_heap_t *heap) {
  heap_let_go(heap);
  heap->parked_live = slabs_live(heap);
  if (heap->parked_live == 0) empty_parked_add(heap);
  queue_owners(heap, 0);
  __atomic_store_n(&heap->parked, true, __ATOMIC_RELAXED); /* free reads it unlocked */
  pthread_mutex_unlock(&heap->lock);
  if (hak_tls_heap == heap) hak_tls_heap = HAK_HEAP_EMPTY;
  pthread_mutex_lock(&hak_heaps_lock);
  heap->token = 0;
  heap->parked_since_ms = hak_clock_ms();
  uint64_t gave_up = atomic_exchange_explicit(&heap->heir_gave_up_ns, 0, memory_order_relaxed);
  if (gave_up != 0) heir_wait_learn(hak_clock_ns() - gave_up);
  heap->parked_next = NULL;
  *heaps_parked_end = heap;
  heaps_parked_end = &heap->parked_next;
  if (heir_waiters != 0) pthread_cond_broadcast(&heir_cond);
  pthread_mutex_unlock(&hak_heaps_lock);
  hak_purge_wake();
}

void hak_heap_done(hak_heap_t *heap) {
  if (heap == HAK_HEAP_EMPTY) return;
  if (hak_heaps_park()) heap_park(heap);
  else heap_retire(heap);
}

/* Frees b as the heap's owner would, under its lock: a slab that empties
 * goes back to its segment, but for its class's first (a new owner would
 * take a slab for the class at once), and a heap that empties waits for a
 * new thread like one parked empty. */
bool hak_heap_free_parked(hak_heap_t *heap, hak_segment_t *seg, hak_slab_t *slab, hak_block_t *b) {
  pthread_mutex_lock(&heap->lock);
  bool parked = heap->parked && atomic_load_explicit(&seg->heap, memory_order_relaxed) == heap;
  bool emptied = false;
  if (parked) {
    if (HAK_UNLIKELY(slab->local_free == b)) hak_double_free(b);
    hak_slab_collect_remote(slab);
    hak_slab_take_back(heap, slab, b);
    atomic_store_explicit(&slab->owner, 0, memory_order_relaxed); /* not heap->token */
    if (slab->used == 0) {
      emptied = --heap->parked_live == 0;
      if (heap->queue[slab->cls].first != slab) {
        hak_queue_remove(&heap->queue[slab->cls], slab);
        hak_segment_free_slab(heap, slab, false);
      }
    }
  }
  pthread_mutex_unlock(&heap->lock);
  if (emptied) {
    pthread_mutex_lock(&hak_heaps_lock);
    if (parked_link(heap)) empty_parked_add(heap);
    pthread_mutex_unlock(&hak_heaps_lock);
  }
  return parked;
}

void hak_heap_collect(hak_heap_t *heap, bool force) {
  if (heap == HAK_HEAP_EMPTY) return;
  hak_free_flush_outboxes(heap);
  hak_span_flush(heap);
  pthread_mutex_lock(&heap->lock);
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++) hak_heap_return_list(heap, c);
  if (force) hak_segment_reclaim_abandoned(heap);
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++) {
    hak_slab_t *s = heap->queue[c].first;
    while (s) {
      hak_slab_t *next = s->next;
      hak_slab_collect_remote(s);
      if (s->used == 0) {
        hak_queue_remove(&heap->queue[c], s);
        hak_segment_free_slab(heap, s, false);
      }
      s = next;
    }
  }
  hak_segment_purge(heap, force);
  pthread_mutex_unlock(&heap->lock);
}

void hak_heaps_lock_all(void) {
  pthread_mutex_lock(&hak_heaps_lock);
  for (hak_heap_t *h = heaps_live; h; h = h->next) pthread_mutex_lock(&h->lock);
}

void hak_heaps_unlock_all(bool reinit) {
  for (hak_heap_t *h = heaps_live; h; h = h->next) {
    if (reinit) pthread_mutex_init(&h->lock, NULL);
    else pthread_mutex_unlock(&h->lock);
  }
  if (reinit) pthread_mutex_init(&hak_heaps_lock, NULL);
  else pthread_mutex_unlock(&hak_heaps_lock);
}

void hak_heaps_usage(hak_usage_t *u) {
  memset(u, 0, sizeof *u);
  pthread_mutex_lock(&hak_heaps_lock);
  for (hak_heap_t *h = heaps_live; h; h = h->next) {
    pthread_mutex_lock(&h->lock);
    for (hak_segment_t *seg = h->segments; seg; seg = seg->next) hak_segment_usage(seg, u);
    pthread_mutex_unlock(&h->lock);
  }
  pthread_mutex_unlock(&hak_heaps_lock);
  hak_span_usage(u);
  /* This thread's own lists are free blocks, not used ones. */
  hak_heap_t *me = hak_tls_heap;
  for (size_t c = 0; c < HAK_NUMBERS; c++) {
    size_t n = 0;
    for (hak_block_t *b = me->free[c]; b; b = hak_next(b)) n++;
    hak_usage_unused(u, hak_class_of_number(c), n);
  }
  hak_segment_usage_abandoned(u);
}

void hak_heaps_large_kept(size_t *blocks, size_t *map_bytes) {
  pthread_mutex_lock(&hak_heaps_lock);
  for (hak_heap_t *h = heaps_live; h; h = h->next) hak_large_kept_count(h, blocks, map_bytes);
  pthread_mutex_unlock(&hak_heaps_lock);
}

size_t hak_heaps_kept_sweep(void) {
  size_t n = 0;
  pthread_mutex_lock(&hak_heaps_lock);
  for (hak_heap_t *h = heaps_live; h; h = h->next, n++) hak_large_kept_release(h, false);
  pthread_mutex_unlock(&hak_heaps_lock);
  return n;
}

void hak_heaps_trim_empty(void) {
  if (atomic_load_explicit(&empty_parked, memory_order_relaxed) <= HAK_KEEP_EMPTY_HEAPS) return;
  hak_heap_t *h = NULL, **pp;
  pthread_mutex_lock(&hak_heaps_lock);
  if (atomic_load_explicit(&empty_parked, memory_order_relaxed) > HAK_KEEP_EMPTY_HEAPS &&
      (pp = parked_empty_link()) != NULL)
    h = parked_unlink(pp);
  pthread_mutex_unlock(&hak_heaps_lock);
  if (h) heap_retire(h);
}

void hak_heaps_retire_parked(void) {
  pthread_mutex_lock(&hak_heaps_lock);
  hak_heap_t *parked = parked_take(true, 0);
  pthread_mutex_unlock(&hak_heaps_lock);
  parked_retire(parked);
}

bool hak_release_all(void) {
  size_t before = atomic_load(&hak_gstats.os_returned);
  hak_heaps_retire_parked();
  hak_heap_collect(hak_tls_heap, true);
  pthread_mutex_lock(&hak_heaps_lock);
  for (hak_heap_t *h = heaps_live; h; h = h->next) {
    pthread_mutex_lock(&h->lock);
    hak_segment_purge(h, true);
    pthread_mutex_unlock(&h->lock);
    hak_span_drain_collect(h, true);
    hak_large_kept_release(h, true);
  }
  pthread_mutex_unlock(&hak_heaps_lock);
  hak_segment_purge_abandoned(true);
  hak_span_purge(true);
  hak_segment_cache_collect(true);
  hak_large_cache_collect(true);
  hak_purge_drain();
  return atomic_load(&hak_gstats.os_returned) != before;
}

/* Remote blocks a purge pass may count in idle heaps' FULL slabs. */
#define HAK_IDLE_WALK_BUDGET 16384

bool hak_heaps_purge_due(uint64_t now) {
  size_t walk_budget = HAK_IDLE_WALK_BUDGET;
  bool pending = false;
  pthread_mutex_lock(&hak_heaps_lock);
  for (hak_heap_t *h = heaps_live; h; h = h->next) {
    pending |= hak_span_drain_collect(h, false); /* atomics: needs no lock */
    pending |= hak_large_kept_release(h, false);
    if (pthread_mutex_trylock(&h->lock) != 0) { /* busy: look again later */
      pending = true;
      continue;
    }
    if (!h->parked) pending |= hak_slab_release_idle_full(h, &walk_budget);
    if (h->next_purge_ms != 0 && now >= h->next_purge_ms) hak_segment_purge(h, false);
    pending |= h->next_purge_ms != 0;
    pthread_mutex_unlock(&h->lock);
  }
  hak_heap_t *expired = parked_take(false, now);
  pending |= heaps_parked != NULL;
  pthread_mutex_unlock(&hak_heaps_lock);
  parked_retire(expired);
  return pending;
}

bool hak_heaps_other_thread(void) {
  bool any = false;
  pthread_mutex_lock(&hak_heaps_lock);
  for (hak_heap_t *h = heaps_live; h && !any; h = h->next) any = h->token != 0 && h != hak_tls_heap;
  pthread_mutex_unlock(&hak_heaps_lock);
  return any;
}

void hak_heaps_abandon_others(hak_heap_t *keep) {
  heaps_parked = NULL;
  heir_waiters = 0;
  pthread_cond_init(&heir_cond, NULL);
  atomic_store(&empty_parked, 0);
  heaps_parked_end = &heaps_parked;
  hak_heap_t *h = heaps_live;
  while (h) {
    hak_heap_t *next = h->next;
    if (h != keep) heap_retire(h);
    h = next;
  }
}
