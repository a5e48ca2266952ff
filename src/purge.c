/* The background purger: returns free memory to the OS once it has been
 * idle for HAKMEM_PURGE_DELAY_MS, even when the program has stopped calling
 * malloc. The thread is started lazily, the first time something waits to
 * be purged, and sleeps without a timeout when nothing is pending (while
 * some thread of the program holds a heap). */
#define _GNU_SOURCE
#include "internal.h"

#include <signal.h>
#include <time.h>

_Atomic int hak_purge_started; /* the thread exists (or is being created) */
_Atomic int hak_purge_running; /* the thread exists: it purges and unmaps */
static _Atomic int wanted;   /* something was scheduled since the last pass */
static _Atomic int idle;     /* the thread waits for `wanted` */
static pthread_mutex_t wait_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wait_cond; /* on CLOCK_MONOTONIC, set up by start */
/* Held during a pass, so fork never copies a half-done purge. */
static HAK_FORK_HELD pthread_mutex_t pass_lock = PTHREAD_MUTEX_INITIALIZER;

/* Mappings to unmap, handed over by threads that should not pay for the
 * munmap (tearing down the page tables of a big mapping takes as long as
 * faulting it in). The record lives in the mapping's first bytes. */
typedef struct hak_unmap_s {
  struct hak_unmap_s *next;
  size_t size;
} hak_unmap_t;
static _Atomic(hak_unmap_t *) unmaps;

static void drain(void) {
  hak_unmap_t *u = atomic_exchange(&unmaps, NULL);
  while (u) {
    hak_unmap_t *next = u->next;
    hak_os_unmap(u, u->size);
    u = next;
  }
}

/* Also waits for a pass under way, which may hold mappings taken off the
 * list and not unmapped yet. */
void hak_purge_drain(void) {
  pthread_mutex_lock(&pass_lock);
  drain();
  pthread_mutex_unlock(&pass_lock);
}

bool hak_purge_unmap_later(void *p, size_t size) {
  if (!atomic_load_explicit(&hak_purge_running, memory_order_acquire)) return false;
  hak_unmap_t *u = p;
  u->size = size;
  u->next = atomic_load_explicit(&unmaps, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&unmaps, &u->next, u, memory_order_release,
                                                memory_order_relaxed)) {
  }
  pthread_mutex_lock(&wait_lock);
  pthread_cond_signal(&wait_cond);
  pthread_mutex_unlock(&wait_lock);
  return true;
}

/* Waits ms, or less if an unmap is handed over. */
static void wait_ms(uint64_t ms) {
  struct timespec ts = hak_clock_deadline(ms * 1000000u);
  pthread_mutex_lock(&wait_lock);
  while (atomic_load(&unmaps) == NULL &&
         pthread_cond_timedwait(&wait_cond, &wait_lock, &ts) == 0) {
  }
  pthread_mutex_unlock(&wait_lock);
}

static _Atomic size_t seen_mapped; /* os_mapped_total when last looked at */
static _Atomic uint64_t grew_ms;     /* when it was seen to change */

bool hak_purge_growing(uint64_t now, bool took) {
  size_t mapped = atomic_load_explicit(&hak_gstats.os_mapped_total, memory_order_relaxed);
  if (atomic_exchange_explicit(&seen_mapped, mapped, memory_order_relaxed) != mapped || took)
    atomic_store_explicit(&grew_ms, now, memory_order_relaxed);
  /* another caller may have seen the change a moment later */
  return now < atomic_load_explicit(&grew_ms, memory_order_relaxed) +
                   (uint64_t)hak_opt.purge_delay_ms;
}

/* Under pass_lock: purges what is due; true while something waits. */
static bool pass_locked(void) {
  hak_segmap_trim(false);
  drain();
  bool pending = hak_heaps_purge_due(hak_clock_ms());
  pending |= hak_segment_purge_abandoned(false);
  pending |= hak_span_purge(false);
  pending |= hak_segment_cache_collect(false);
  pending |= hak_large_cache_collect(false);
  return pending;
}

static bool purge_pass(void) {
  pthread_mutex_lock(&pass_lock);
  bool pending = pass_locked();
  pthread_mutex_unlock(&pass_lock);
  return pending;
}

/* Time between passes: a quarter of the delay, within 10 ms and 1 s. */
static uint64_t pass_step_ms(void) {
  uint64_t step = (uint64_t)hak_opt.purge_delay_ms / 4;
  return step < 10 ? 10 : step > 1000 ? 1000 : step;
}

static _Atomic uint64_t next_inline_ms; /* when the program's calls may pass again */

/* Without the thread (HAKMEM_PURGE_THREAD=0, or a program of one thread
 * that has mapped little), the program's calls make the passes, as often
 * as the thread would. Its refills once purged their own heap's slabs
 * only: freed span pages and large blocks stayed committed for good (a
 * 64 MiB block freed, then 0.5 s of small mallocs: 67 MiB of RSS left). */
static void purge_inline(void) {
  uint64_t now = hak_clock_ms(), next = atomic_load_explicit(&next_inline_ms, memory_order_relaxed);
  if (now < next ||
      !atomic_compare_exchange_strong(&next_inline_ms, &next, now + pass_step_ms()) ||
      pthread_mutex_trylock(&pass_lock) != 0)
    return;
  atomic_store(&wanted, 0); /* what is scheduled during the pass sets it again */
  bool pending = pass_locked();
  pthread_mutex_unlock(&pass_lock);
  if (pending) atomic_store(&wanted, 1);
}

static void *purge_main(void *arg) {
  sigset_t all, program;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &program); /* signals are the program's */
  atomic_store_explicit(&hak_purge_running, 1, memory_order_release);
  uint64_t next_thread_look = 0;
  for (;;) {
    wait_ms(pass_step_ms());
    atomic_store(&wanted, 0);
    bool pending = purge_pass();
    /* The program's threads may all be gone (a main that called
     * pthread_exit, a child forked from a thread): glibc ends the process
     * (exit(0)) when its last thread returns, so the purger must not be
     * what keeps it alive. The kernel's count, not the heaps: a thread's
     * last mallocs, after its exit handler, may leave it a new heap. It
     * looks before every wait without a pass, and once a second between
     * passes (a few system calls, none of which opens a descriptor that
     * a program listing its own would see: CPython's test_subprocess
     * counted one as leaked). */
    uint64_t now = hak_clock_ms();
    if (!pending || now >= next_thread_look) {
      next_thread_look = now + 1000;
      if (hak_os_last_thread()) break;
    }
    if (pending) continue;
    /* No other thread holds a heap: the last may be one that never
     * allocated, whose exit the purger would not hear of. */
    if (!hak_heaps_other_thread()) {
      wait_ms(1000);
      continue;
    }
    /* Nothing pending: sleep until something is scheduled. */
    pthread_mutex_lock(&wait_lock);
    atomic_store(&idle, 1);
    while (!atomic_load(&wanted) && atomic_load(&unmaps) == NULL)
      pthread_cond_wait(&wait_cond, &wait_lock);
    atomic_store(&idle, 0);
    pthread_mutex_unlock(&wait_lock);
  }
  /* Still started, so that nothing starts another: the process exits,
   * its exit handlers run here, with the signals of the thread that
   * started the purger. */
  atomic_store_explicit(&hak_purge_running, 0, memory_order_release);
  hak_purge_drain();
  pthread_sigmask(SIG_SETMASK, &program, NULL);
  return NULL;
}

void hak_purge_wake(void) {
  if (atomic_load_explicit(&wanted, memory_order_relaxed)) return;
  atomic_store(&wanted, 1);
  if (atomic_load(&idle)) {
    pthread_mutex_lock(&wait_lock);
    pthread_cond_signal(&wait_cond);
    pthread_mutex_unlock(&wait_lock);
  }
}

static void init_wait_cond(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&wait_cond, &ca);
  pthread_condattr_destroy(&ca);
}

/* Once any thread exists, glibc locks stdio and libstdc++ counts
 * shared_ptr references with atomics, for the rest of the process: getc
 * took 6.0 ns instead of 3.3, a shared_ptr copy 10.2 instead of 6.2. A
 * program of one thread gets ours only once it has mapped
 * HAK_PURGER_MIN_MAPPED, enough memory to be worth that; until then its
 * allocations purge what is due, as with HAKMEM_PURGE_THREAD=0, and its
 * forks copy no thread (a bash subshell took 1.05x as long with it). */
static bool purger_worth_a_thread(void) {
  if (!hak_single_threaded()) return true;
  return atomic_load_explicit(&hak_gstats.mapped, memory_order_relaxed) >= HAK_PURGER_MIN_MAPPED;
}

/* No thread could be made (a limit of threads, or of locked memory that
 * refuses any stack): the program's calls make the passes from then on. */
static _Atomic bool thread_refused;

bool hak_purge_in_calls_only(void) {
  return hak_opt.purge_delay_ms != 0 &&
         !atomic_load_explicit(&hak_purge_started, memory_order_relaxed) &&
         (!hak_opt.purge_thread || atomic_load_explicit(&thread_refused, memory_order_relaxed) ||
          !purger_worth_a_thread());
}

/* The thread's stack, mapped here rather than by glibc: a program that
 * locked its future memory (mlockall) has all it maps faulted in and
 * locked, the whole default 8 MiB. The top page is made accessible first;
 * if the kernel faulted it in, the rest is locked only as it is used
 * (MLOCK_ONFAULT). The default size, since the program's exit handlers may
 * run on it when its threads are gone; the lowest page is the guard. A
 * fork's child reuses it: the thread did not come along. */
static void *stack_base;
static size_t stack_size;

static bool stack_map(void) {
  if (stack_base != NULL) return true;
  pthread_attr_t def;
  size_t size = 0;
  if (pthread_getattr_default_np(&def) == 0) {
    pthread_attr_getstacksize(&def, &size);
    pthread_attr_destroy(&def);
  }
  if (size < (size_t)PTHREAD_STACK_MIN) size = PTHREAD_STACK_MIN;
  size = hak_page_up(size) + HAK_PAGE_SIZE;
  uint8_t *guard = hak_os_reserve(size, HAK_PAGE_SIZE);
  if (guard == NULL) return false;
  uint8_t *top = guard + size - HAK_PAGE_SIZE;
  bool done = hak_os_commit(top, HAK_PAGE_SIZE);
  if (done && hak_os_found_locked(top))
    hak_os_lock_on_fault(guard + HAK_PAGE_SIZE, size - 2 * HAK_PAGE_SIZE);
  if (!done || !hak_os_commit(guard + HAK_PAGE_SIZE, size - 2 * HAK_PAGE_SIZE)) {
    hak_os_unreserve(guard, size);
    return false;
  }
  stack_base = guard + HAK_PAGE_SIZE;
  stack_size = size - HAK_PAGE_SIZE;
  return true;
}

/* The purger's thread, detached, on stack_map's stack or glibc's. */
static bool thread_create(bool own_stack) {
  pthread_attr_t attr;
  pthread_t t;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  bool done = (!own_stack || pthread_attr_setstack(&attr, stack_base, stack_size) == 0) &&
              pthread_create(&t, &attr, purge_main, NULL) == 0;
  pthread_attr_destroy(&attr);
  return done;
}

void hak_purge_start_slow(void) {
  if (!atomic_load_explicit(&wanted, memory_order_relaxed)) return;
  if (hak_opt.purge_delay_ms == 0) {
    /* All is purged as it is freed, but for the batches that a thread
     * which only frees hands to the others (span.c's transfer): the passes
     * give them back once they stop moving. */
    if (hak_purge_all_at_once()) return;
    if (!hak_opt.purge_thread || atomic_load_explicit(&thread_refused, memory_order_relaxed)) {
      purge_inline();
      return;
    }
  } else if (hak_purge_in_calls_only()) {
    purge_inline();
    return;
  }
  int expected = 0;
  if (!atomic_compare_exchange_strong(&hak_purge_started, &expected, 1)) return;
  init_wait_cond();
  /* on glibc's stack, as before, if not on its own */
  if ((!stack_map() || !thread_create(true)) && !thread_create(false)) {
    atomic_store_explicit(&thread_refused, true, memory_order_relaxed);
    atomic_store(&hak_purge_started, 0);
  }
}

void hak_purge_fork_prepare(void) { pthread_mutex_lock(&pass_lock); }
void hak_purge_fork_parent(void) { pthread_mutex_unlock(&pass_lock); }
void hak_purge_fork_child(void) {
  pthread_mutex_init(&pass_lock, NULL);
  /* Without a thread, nothing else was used (and writing it would fault
   * in a page of the child's). */
  if (!atomic_load(&hak_purge_started)) return;
  /* the thread did not come along: the child starts its own when needed */
  pthread_mutex_init(&wait_lock, NULL);
  atomic_store(&hak_purge_started, 0);
  atomic_store(&hak_purge_running, 0);
  atomic_store(&idle, 0);
  drain();
}
