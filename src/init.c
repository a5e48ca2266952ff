/* Process and thread life cycle: one-time initialisation (options, the
 * thread-exit key, fork handlers), thread exit, fork, and exit. */
#include "internal.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <sys/random.h>
#include <time.h>

pthread_key_t hak_thread_key;
_Atomic int hak_key_ready;

enum { INIT_NONE, INIT_RUNNING, INIT_DONE };
static _Atomic int init_state;
static __thread bool init_here; /* this thread runs the initialisation */

static void thread_done(void *value) {
  hak_heap_t *heap = value;
  if (heap != NULL) hak_heap_thread_exit(heap);
}

/* glibc's (2.32): true until the program first creates a thread. Weak: a
 * libc without it counts as threaded. */
extern char __libc_single_threaded __attribute__((weak));

bool hak_single_threaded(void) {
  return &__libc_single_threaded != NULL && __libc_single_threaded;
}

/* fork: hold every global lock across fork so the child sees consistent
 * state, then give the child the heaps of threads that no longer exist.
 * A program that has never had a second thread needs none of it, as
 * glibc's malloc skips its own locks then: no other thread can hold a lock
 * or a heap, and each lock taken and released was a page written in the
 * parent and in the child after the fork (without them: 6 copy-on-write
 * faults a fork fewer, a fork loop 1.036x as fast). */
static HAK_FORK_HELD bool fork_locked;

static void fork_prepare(void) {
  hak_segmap_trim(true); /* or the child is charged the map as well */
  /* written only when it changes: the page, shared with the last child,
   * took the parent a fault at every fork (a fork loop 1.008x) */
  bool threaded = !hak_single_threaded();
  if (fork_locked != threaded) fork_locked = threaded;
  if (!fork_locked) return;
  hak_purge_fork_prepare();
  hak_heaps_lock_all();
  hak_span_fork_prepare();
  pthread_mutex_lock(&hak_segment_lock);
  pthread_mutex_lock(&hak_large_lock);
  pthread_mutex_lock(&hak_segmap_lock);
}
static void fork_parent(void) {
  if (!fork_locked) return;
  pthread_mutex_unlock(&hak_segmap_lock);
  pthread_mutex_unlock(&hak_large_lock);
  pthread_mutex_unlock(&hak_segment_lock);
  hak_span_fork_parent();
  hak_heaps_unlock_all(false);
  hak_purge_fork_parent();
}
static void fork_child(void) {
  hak_os_fork_child();
  if (!fork_locked) return;
  pthread_mutex_init(&hak_segmap_lock, NULL);
  pthread_mutex_init(&hak_large_lock, NULL);
  pthread_mutex_init(&hak_segment_lock, NULL);
  hak_span_fork_child();
  hak_heaps_unlock_all(true);
  hak_purge_fork_child();
  hak_heaps_abandon_others(hak_tls_heap);
}

void hak_process_init(void) {
  if (HAK_LIKELY(atomic_load_explicit(&init_state, memory_order_acquire) == INIT_DONE)) return;
  int expected = INIT_NONE;
  if (!atomic_compare_exchange_strong(&init_state, &expected, INIT_RUNNING)) {
    if (init_here) return; /* re-entered from our own initialisation */
    while (atomic_load_explicit(&init_state, memory_order_acquire) != INIT_DONE) sched_yield();
    return;
  }
  init_here = true;
#if HAK_SECURE
  if (getrandom(&hak_secret, sizeof hak_secret, GRND_NONBLOCK) != sizeof hak_secret)
    hak_secret = (uintptr_t)hak_clock_ns() * 0x9e3779b97f4a7c15ull ^ (uintptr_t)&hak_secret;
#endif
  hak_options_load();
  atomic_store_explicit(&init_state, INIT_DONE, memory_order_release);
  /* These may allocate; allocation works from here on. */
  if (pthread_key_create(&hak_thread_key, thread_done) == 0)
    atomic_store_explicit(&hak_key_ready, 1, memory_order_release);
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  init_here = false;
  if (hak_opt.verbose) hak_options_print(2);
}

__attribute__((constructor)) static void process_start(void) {
  hak_process_init();
  /* The main thread's heap may predate the key. */
  if (hak_tls_heap != HAK_HEAP_EMPTY && atomic_load(&hak_key_ready))
    pthread_setspecific(hak_thread_key, hak_tls_heap);
}

/* HAKMEM_STATS_FILE with %p replaced by the pid; -1, with a message, if it
 * is too long or cannot be written. */
static int open_stats_file(void) {
  char path[PATH_MAX];
  size_t n = 0;
  for (const char *s = hak_opt.stats_file; *s; s++) {
    char pid[16];
    const char *part = s;
    size_t len = 1;
    if (s[0] == '%' && s[1] == 'p') {
      len = (size_t)snprintf(pid, sizeof pid, "%d", (int)getpid());
      part = pid;
      s++;
    }
    if (n + len >= sizeof path) {
      hak_print(2, "hakmem: HAKMEM_STATS_FILE too long (at most %zu bytes once %%p is expanded)\n",
                sizeof path - 1);
      return -1;
    }
    memcpy(path + n, part, len);
    n += len;
  }
  path[n] = 0;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) hak_print(2, "hakmem: cannot write HAKMEM_STATS_FILE %s\n", path);
  return fd;
}

__attribute__((destructor)) static void process_end(void) {
  if (!hak_opt.stats) return;
  if (hak_opt.stats_file[0] == 0) {
    hak_stats_report(2);
    return;
  }
  int fd = open_stats_file();
  if (fd >= 0) {
    hak_stats_write_records(fd);
    close(fd);
  }
}

#if HAK_SECURE
uintptr_t hak_secret;

uint64_t hak_random(void) {
  static __thread uint64_t state;
  if (state == 0) state = (hak_secret ^ (uintptr_t)&state ^ hak_clock_ns()) | 1;
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}
#endif

const char *hak_version(void) {
#if HAK_SECURE
  return "hakmem " HAK_VERSION " (secure)";
#elif HAK_DEBUG
  return "hakmem " HAK_VERSION " (debug)";
#elif HAK_STATS
  return "hakmem " HAK_VERSION " (stats)";
#else
  return "hakmem " HAK_VERSION " (release)";
#endif
}
