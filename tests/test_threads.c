/* Thread lifecycle: thread churn with blocks outliving their thread, threads
 * exiting with live blocks, TSD destructors that allocate, fork() while
 * other threads allocate, and cancellation. */
#define _GNU_SOURCE
#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/single_threaded.h>
#include <sys/wait.h>

/* A block remembers its size in word 0 and carries bytes derived from its
 * address, so a block handed out twice or overwritten is detected. */
static unsigned char byte_for(const void *p, size_t i) {
  uintptr_t a = (uintptr_t)p;
  return (unsigned char)((a >> 4) * 7 + (a >> 12) + i * 13 + 5);
}
static void *make_block(size_t size) {
  if (size < sizeof(size_t)) size = sizeof(size_t);
  unsigned char *p = malloc(size);
  if (!p) return NULL;
  memcpy(p, &size, sizeof size);
  for (size_t i = sizeof size; i < size; i++) p[i] = byte_for(p, i);
  return p;
}
static atomic_long g_bad;
/* Verifies and frees; counts corruption in g_bad. */
static void check_free(void *v) {
  unsigned char *p = v;
  size_t size;
  memcpy(&size, p, sizeof size);
  if (size < sizeof size || size > (64u << 20)) {
    if (atomic_fetch_add(&g_bad, 1) == 0)
      fprintf(stderr, "    block %p: size word corrupted (%zu)\n", v, size);
    return;
  }
  for (size_t i = sizeof size; i < size; i++)
    if (p[i] != byte_for(p, i)) {
      if (atomic_fetch_add(&g_bad, 1) == 0)
        fprintf(stderr, "    block %p (%zu B): byte %zu is 0x%02x, expected 0x%02x\n", v, size,
                i, p[i], byte_for(p, i));
      return;
    }
  free(p);
}

/* ---------- 20k short threads ---------- */

#define HANDOFF 3
static _Atomic(void **) g_handoff; /* array of HANDOFF blocks left by some earlier thread */
static atomic_long g_alloc_fail;

static void *churn_thread(void *arg) {
  unsigned id = (unsigned)(uintptr_t)arg;
  static const size_t sizes[] = {16, 24, 100, 256, 1000, 3000, 9000, 40000, 200000};
  void *own[6];
  for (int i = 0; i < 6; i++) {
    own[i] = make_block(sizes[(id + (unsigned)i * 5) % 9]);
    if (!own[i]) atomic_fetch_add(&g_alloc_fail, 1);
  }
  for (int i = 0; i < 3; i++)
    if (own[i]) check_free(own[i]);
  void **bundle = malloc(HANDOFF * sizeof *bundle);
  if (!bundle) {
    atomic_fetch_add(&g_alloc_fail, 1);
    return NULL;
  }
  for (int i = 0; i < HANDOFF; i++) bundle[i] = own[3 + i];
  void **prev = atomic_exchange(&g_handoff, bundle);
  if (prev) {
    for (int i = 0; i < HANDOFF; i++)
      if (prev[i]) check_free(prev[i]);
    free(prev);
  }
  return NULL;
}

TEST_T(twenty_thousand_short_threads_rss_bounded, 120) {
  enum { TOTAL = 20000, BATCH = 8 };
  long rss_start = th_vm_rss_kib(), rss_warm = 0, rss_peak = 0;
  for (int done = 0; done < TOTAL; done += BATCH) {
    pthread_t th[BATCH];
    for (int i = 0; i < BATCH; i++) {
      int rc = pthread_create(&th[i], NULL, churn_thread, (void *)(uintptr_t)(done + i));
      REQUIRE(rc == 0);
    }
    for (int i = 0; i < BATCH; i++) pthread_join(th[i], NULL);
    if (done == 800) rss_warm = th_vm_rss_kib();
    if (done % 1000 == 0) {
      long r = th_vm_rss_kib();
      if (r > rss_peak) rss_peak = r;
    }
  }
  void **last = atomic_exchange(&g_handoff, NULL);
  if (last) {
    for (int i = 0; i < HANDOFF; i++)
      if (last[i]) check_free(last[i]);
    free(last);
  }
  long rss_end = th_vm_rss_kib();
  if (rss_end > rss_peak) rss_peak = rss_end;
  printf("    VmRSS: start %ld KiB, after 800 threads %ld KiB, end %ld KiB, peak %ld KiB "
         "(growth %ld KiB)\n",
         rss_start, rss_warm, rss_end, rss_peak, rss_peak - rss_start);
  CHECK_MSG(atomic_load(&g_bad) == 0, "%ld corrupted blocks", atomic_load(&g_bad));
  CHECK_MSG(atomic_load(&g_alloc_fail) == 0, "%ld failed allocations",
            atomic_load(&g_alloc_fail));
  CHECK_MSG(rss_peak - rss_start < 64 * 1024,
            "VmRSS grew by %ld KiB over 20000 threads (dead thread heaps not reused?)",
            rss_peak - rss_start);
  CHECK_MSG(rss_end - rss_warm < 32 * 1024, "VmRSS kept growing after warm-up: +%ld KiB",
            rss_end - rss_warm);
}

/* ---------- threads exit leaving blocks for main ---------- */

#define LEAVE_N 2000
static void *leaving_thread(void *arg) {
  void **blocks = malloc(LEAVE_N * sizeof *blocks);
  if (!blocks) return NULL;
  unsigned seed = (unsigned)(uintptr_t)arg;
  for (int i = 0; i < LEAVE_N; i++) {
    seed = seed * 1103515245u + 12345u;
    size_t size = (i % 200 == 0) ? 100000 + (seed >> 8) % 400000 : 8 + (seed >> 8) % 2000;
    blocks[i] = make_block(size);
    if (!blocks[i]) {
      atomic_fetch_add(&g_alloc_fail, 1);
      blocks[i] = NULL;
    }
  }
  return blocks; /* exits without freeing anything */
}

TEST_T(threads_exit_without_freeing_main_frees_later, 60) {
  enum { T = 16, ROUNDS = 12 };
  long rss0 = th_vm_rss_kib(), rss_round1 = 0;
  for (int round = 0; round < ROUNDS; round++) {
    pthread_t th[T];
    void **res[T];
    for (int t = 0; t < T; t++)
      REQUIRE(pthread_create(&th[t], NULL, leaving_thread, (void *)(uintptr_t)(round * T + t + 1)) ==
              0);
    for (int t = 0; t < T; t++) {
      pthread_join(th[t], (void **)&res[t]);
      REQUIRE(res[t] != NULL);
    }
    /* All owners are gone now. Allocate a bit in main first (may reuse the
     * dead threads' memory), then free everything they left. */
    void *mine[500];
    for (int i = 0; i < 500; i++) mine[i] = make_block(8 + (size_t)i * 3);
    for (int t = 0; t < T; t++) {
      for (int i = 0; i < LEAVE_N; i++)
        if (res[t][i]) check_free(res[t][i]);
      free(res[t]);
    }
    for (int i = 0; i < 500; i++)
      if (mine[i]) check_free(mine[i]);
    if (round == 0) rss_round1 = th_vm_rss_kib();
  }
  long rss_end = th_vm_rss_kib();
  printf("    VmRSS: start %ld KiB, after round 1 %ld KiB, after %d rounds %ld KiB\n", rss0,
         rss_round1, ROUNDS, rss_end);
  CHECK_MSG(atomic_load(&g_bad) == 0, "%ld corrupted blocks", atomic_load(&g_bad));
  CHECK(atomic_load(&g_alloc_fail) == 0);
  /* One round leaves about 16 * (2000 * 1 KiB + 10 * 300 KiB) = 80 MiB; later
   * rounds must reuse it rather than add another round's worth each time. */
  CHECK_MSG(rss_end - rss_round1 < 96 * 1024, "VmRSS grew %ld KiB over %d more rounds",
            rss_end - rss_round1, ROUNDS - 1);
}

/* ---------- TSD destructors that allocate after the thread's heap is torn down ---------- */

static pthread_key_t g_key;
static atomic_long g_dtor_runs;

static void dtor(void *v) {
  /* Runs during thread exit, possibly after the allocator's own per-thread
   * cleanup: free the value, allocate, use and free new blocks. */
  check_free(v);
  void *a = make_block(64), *b = make_block(5000), *c = make_block(300000);
  if (!a || !b || !c) atomic_fetch_add(&g_alloc_fail, 1);
  if (a) check_free(a);
  if (b) check_free(b);
  long n = atomic_fetch_add(&g_dtor_runs, 1);
  /* Every other thread re-arms the key once (second destructor pass) with a
   * block that will be freed in that pass; c is left for the next pass. */
  if (c) {
    if (n % 2 == 0)
      pthread_setspecific(g_key, c);
    else
      check_free(c);
  }
}

static void *tsd_thread(void *arg) {
  void *v = make_block(128 + (size_t)(uintptr_t)arg % 1000);
  if (!v) {
    atomic_fetch_add(&g_alloc_fail, 1);
    return NULL;
  }
  pthread_setspecific(g_key, v);
  for (int i = 0; i < 50; i++) check_free(make_block(32 + (size_t)i * 40));
  return NULL;
}

TEST(tsd_destructors_may_malloc_and_free_at_thread_exit) {
  REQUIRE(pthread_key_create(&g_key, dtor) == 0);
  for (int round = 0; round < 50; round++) {
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
      REQUIRE(pthread_create(&th[i], NULL, tsd_thread, (void *)(uintptr_t)(round * 4 + i)) == 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  }
  long runs = atomic_load(&g_dtor_runs);
  printf("    %ld destructor runs for 200 threads\n", runs);
  CHECK(runs >= 200);
  CHECK_MSG(atomic_load(&g_bad) == 0, "%ld corrupted blocks", atomic_load(&g_bad));
  CHECK(atomic_load(&g_alloc_fail) == 0);
}

/* ---------- fork while other threads allocate ---------- */

static atomic_int g_stop;
static atomic_long g_bg_ops;

static void *bg_allocator(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void *ring[64] = {0};
  long ops = 0;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    seed = seed * 1103515245u + 12345u;
    unsigned k = (seed >> 16) % 64;
    if (ring[k]) check_free(ring[k]);
    unsigned r = (seed >> 8) % 100;
    size_t size = r < 85 ? 8 + seed % 1000 : r < 98 ? 1000 + seed % 60000 : (1u << 20) + seed % 4096;
    ring[k] = make_block(size);
    ops++;
  }
  for (int k = 0; k < 64; k++)
    if (ring[k]) check_free(ring[k]);
  atomic_fetch_add(&g_bg_ops, ops);
  return NULL;
}

static void *child_thread(void *arg) {
  for (int i = 0; i < 500; i++) {
    void *p = make_block(16 + (size_t)i * 7);
    if (!p) return (void *)1;
    check_free(p);
  }
  return NULL;
}

/* Runs in the forked child. Returns the exit code. */
static int child_work(int n) {
  void *keep[256] = {0};
  for (int i = 0; i < 3000; i++) {
    size_t size = (i % 500 == 0)  ? (1u << 20)
                  : (i % 50 == 0) ? 20000 + (size_t)i
                                  : 8 + (size_t)(i * 37) % 2000;
    void *p = make_block(size);
    if (!p) return 2;
    if (i % 3 == 0) {
      check_free(p);
    } else {
      if (keep[i % 256]) check_free(keep[i % 256]);
      keep[i % 256] = p;
    }
  }
  for (int i = 0; i < 256; i++)
    if (keep[i]) check_free(keep[i]);
  void *big = calloc(1, 1u << 20);
  if (!big) return 3;
  big = realloc(big, 3u << 20);
  if (!big) return 4;
  free(big);
  if (n % 5 == 0) { /* threads work in the child too */
    pthread_t t;
    void *r = (void *)1;
    if (pthread_create(&t, NULL, child_thread, NULL) != 0) return 5;
    pthread_join(t, &r);
    if (r) return 6;
  }
  return atomic_load(&g_bad) ? 7 : 0;
}

/* Waits up to 10 s for the child; false (the child killed) if it ran on. */
static bool wait_child(pid_t pid, int *status) {
  double t0 = th_now();
  pid_t w;
  while ((w = waitpid(pid, status, WNOHANG)) == 0 && th_now() - t0 < 10.0) usleep(1000);
  if (w != 0) return true;
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

TEST_T(fork_while_threads_allocate, 120) {
  enum { T = 4, FORKS = 50 };
  pthread_t th[T];
  for (int t = 0; t < T; t++)
    REQUIRE(pthread_create(&th[t], NULL, bg_allocator, (void *)(uintptr_t)(t * 7919 + 1)) == 0);
  int hung = 0, failed = 0;
  for (int n = 0; n < FORKS; n++) {
    usleep(2000 + (n % 7) * 1000); /* let the threads get mid-operation */
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(30);
      int rc = child_work(n);
      exit(rc);
    }
    int status = 0;
    if (!wait_child(pid, &status)) {
      if (hung++ == 0) fprintf(stderr, "    fork #%d: child hung for 10 s (deadlock in malloc after fork?)\n", n);
      continue;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (failed++ < 3) {
        if (WIFSIGNALED(status))
          fprintf(stderr, "    fork #%d: child killed by signal %d\n", n, WTERMSIG(status));
        else
          fprintf(stderr, "    fork #%d: child exit %d\n", n, WEXITSTATUS(status));
      }
    }
  }
  atomic_store(&g_stop, 1);
  for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
  printf("    %d forks, background ops %ld, hung %d, failed %d\n", FORKS, atomic_load(&g_bg_ops),
         hung, failed);
  CHECK_MSG(hung == 0, "%d children hung", hung);
  CHECK_MSG(failed == 0, "%d children failed", failed);
  CHECK_MSG(atomic_load(&g_bad) == 0, "%ld corrupted blocks in the parent", atomic_load(&g_bad));
  CHECK(atomic_load(&g_bg_ops) > 1000);
}

/* ---------- fork of a program that has never had a second thread ---------- */

/* Its fork handlers do nothing then (no lock is taken or set up again):
 * the child frees the parent's blocks of every tier and allocates more,
 * forks once more itself, and the parent goes on after each. */
static int one_thread_fork_child(void **parent_blocks, int n, int depth) {
  for (int i = 0; i < n; i++) check_free(parent_blocks[i]);
  void *mine[12];
  for (int i = 0; i < 12; i++) mine[i] = make_block(i % 3 == 0 ? 48 : i % 3 == 1 ? 20000 : 1 << 20);
  if (depth == 0) {
    pid_t pid = fork();
    if (pid == 0) _exit(one_thread_fork_child(mine, 12, 1));
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return 3;
  }
  for (int i = 0; i < 12; i++) check_free(mine[i]);
  return atomic_load(&g_bad) == 0 ? 0 : 2;
}

TEST(fork_of_a_program_of_one_thread) {
  REQUIRE(__libc_single_threaded);
  enum { N = 30 };
  void *blocks[N];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) blocks[i] = make_block(i % 3 == 0 ? 100 : i % 3 == 1 ? 9000 : 300000);
    pid_t pid = fork();
    if (pid == 0) _exit(one_thread_fork_child(blocks, N, 0));
    int status = 0;
    REQUIRE(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d: child status %d", round, status);
    for (int i = 0; i < N; i++) check_free(blocks[i]);
  }
  CHECK(atomic_load(&g_bad) == 0);
  CHECK(__libc_single_threaded);
}

/* ---------- fork after threads exit leaving blocks (parked heaps) ---------- */

TEST_T(fork_after_threads_exit_leaving_blocks, 60) {
  enum { T = 4, ROUNDS = 3 };
  for (int round = 0; round < ROUNDS; round++) {
    pthread_t th[T];
    void **res[T];
    for (int t = 0; t < T; t++)
      REQUIRE(pthread_create(&th[t], NULL, leaving_thread, (void *)(uintptr_t)(round * T + t + 7)) == 0);
    for (int t = 0; t < T; t++) {
      pthread_join(th[t], (void **)&res[t]);
      REQUIRE(res[t] != NULL);
    }
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      /* the dead threads' heaps belong to the child now: free into them,
       * and let new threads take their place */
      for (int t = 0; t < T; t++)
        for (int i = 0; i < LEAVE_N; i += 2)
          if (res[t][i]) check_free(res[t][i]);
      pthread_t c;
      void *r = (void *)1;
      if (pthread_create(&c, NULL, child_thread, NULL) != 0) _exit(5);
      pthread_join(c, &r);
      for (int t = 0; t < T; t++)
        for (int i = 1; i < LEAVE_N; i += 2)
          if (res[t][i]) check_free(res[t][i]);
      _exit(r != NULL ? 6 : atomic_load(&g_bad) ? 7 : 0);
    }
    for (int t = 0; t < T; t++) {
      for (int i = 0; i < LEAVE_N; i++)
        if (res[t][i]) check_free(res[t][i]);
      free(res[t]);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d: child status %#x", round,
              status);
  }
  CHECK(atomic_load(&g_bad) == 0);
}

/* ---------- cancellation ---------- */

/* A thread whose cancel is pending, the cancel sent while it could not act. */
static atomic_int g_cancel_sent;
static void wait_for_pending_cancel(void) {
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
  while (!atomic_load(&g_cancel_sent)) sched_yield();
  pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
}
static atomic_int g_first_large_got;
static void *first_large_block(void *arg) {
  wait_for_pending_cancel();
  void *p = malloc(1 << 20);
  atomic_store(&g_first_large_got, p != NULL);
  free(p);
  pthread_testcancel();
  return NULL;
}

/* The process's first large block (this test's child has made none before)
 * reads /proc under the large tier's lock, and open and read are
 * cancellation points: the thread must leave malloc with its block and be
 * cancelled at its next cancellation point, not unwind out of malloc with
 * the lock held (every later large malloc then waits for ever). */
TEST_T(a_cancel_pending_does_not_unwind_a_thread_out_of_malloc, 20) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, first_large_block, NULL) == 0);
  REQUIRE(pthread_cancel(t) == 0);
  atomic_store(&g_cancel_sent, 1);
  void *result = NULL;
  REQUIRE(pthread_join(t, &result) == 0);
  CHECK_MSG(result == PTHREAD_CANCELED, "the thread was not cancelled");
  CHECK_MSG(atomic_load(&g_first_large_got), "the thread left malloc without its block");
  void *p = malloc(1 << 20); /* waits for ever if the lock was left held */
  CHECK(p != NULL);
  free(p);
}

/* ---------- the process ends with its last thread ---------- */

static int g_exit_pipe = -1;
/* Whether this thread's stack is at least a default thread's. */
static bool default_stack(void) {
  pthread_attr_t self, def;
  size_t have = 0, want = 0;
  if (pthread_getattr_np(pthread_self(), &self) != 0) return false;
  pthread_attr_getstacksize(&self, &have);
  pthread_attr_destroy(&self);
  if (pthread_getattr_default_np(&def) != 0) return false;
  pthread_attr_getstacksize(&def, &want);
  pthread_attr_destroy(&def);
  return have >= want;
}
/* The exit handlers run on the last thread, with the stack of any and
 * the signals of the program's threads (none blocked here). */
static void say_exit(void) {
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, NULL, &mask);
  const char *msg = !default_stack()                ? "atexit on a small stack\n"
                    : sigismember(&mask, SIGTERM) ? "atexit, SIGTERM blocked\n"
                                                  : "atexit\n";
  (void)!write(g_exit_pipe, msg, strlen(msg));
}

/* Blocks freed and allocated in bursts, enough for the purger to start. */
static void *last_worker(void *arg) {
  for (int i = 0; i < 20000; i++) free(malloc(100 + (size_t)(i * 37) % 60000));
  void *big = malloc(8 << 20);
  free(big);
  return NULL;
}

/* A thread that never allocates: its exit reaches no heap's handler. */
static void *quiet_worker(void *arg) {
  usleep(300000);
  return NULL;
}

/* A forked child (its forking thread is its main thread) starts a worker
 * and calls pthread_exit: POSIX ends the process with status 0, atexit
 * handlers run, once the worker is done. hakmem's purger thread must not
 * keep it alive (nor, blocking every signal, make it deaf to SIGTERM).
 * no_descriptors: the child may open none, so the purger must tell that
 * its main thread is gone without one (a program that lists its own
 * descriptors would see it). */
static void expect_end_after_main_pthread_exit(void *(*worker)(void *), bool no_descriptors) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    g_exit_pipe = fds[1];
    atexit(say_exit);
    for (int i = 0; i < 5000; i++) free(malloc(200));
    free(malloc(8 << 20));
    /* pthread_exit loads libgcc_s to unwind: loaded before, it opens nothing */
    if (no_descriptors && (dlopen("libgcc_s.so.1", RTLD_NOW) == NULL ||
                           setrlimit(RLIMIT_NOFILE, &(struct rlimit){0, 0}) != 0))
      _exit(6);
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) _exit(5);
    pthread_exit(NULL);
  }
  close(fds[1]);
  int status = 0;
  bool ended = wait_child(pid, &status);
  char buf[32] = {0};
  (void)!read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  CHECK_MSG(ended, "the process still ran 10 s after its last thread exited");
  CHECK_MSG(!ended || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "status %#x", status);
  CHECK_MSG(strcmp(buf, "atexit\n") == 0,
            "the atexit handler did not run, or not as on a thread of the program's (read \"%s\")",
            buf);
}

TEST_T(process_ends_when_its_last_thread_exits_after_main_pthread_exit, 60) {
  expect_end_after_main_pthread_exit(last_worker, false);
}

TEST_T(process_ends_when_its_last_thread_never_allocated, 60) {
  expect_end_after_main_pthread_exit(quiet_worker, false);
}

TEST_T(process_ends_after_main_pthread_exit_with_no_descriptor_to_open, 60) {
  expect_end_after_main_pthread_exit(last_worker, true);
}

/* A malloc in the last round of a thread's key destructors, after
 * hakmem's exit handler ran for it, makes a heap that no handler retires.
 * The next thread, on the same stack (glibc keeps it), has the same thread
 * pointer: its first call, the free of that heap's block, passed the
 * owner's test, and emptying the slab died of SIGSEGV (it locked the
 * read-only empty heap). With a trim first, the slab is detached. */
static pthread_key_t g_late_key;
static void *volatile g_late_block, *volatile g_late_tp[2];
static bool g_late_trim;
static void allocate_in_the_last_round(void *round) {
  if ((long)round < PTHREAD_DESTRUCTOR_ITERATIONS) {
    pthread_setspecific(g_late_key, (void *)((long)round + 1));
    return;
  }
  static void *b[3000];
  for (int i = 0; i < 3000; i++) b[i] = malloc(48);
  g_late_block = b[0];
  for (int i = 1; i < 3000; i++) free(b[i]);
  if (g_late_trim) malloc_trim(0);
}
static void *arm_late_malloc(void *arg) {
  (void)arg;
  g_late_tp[0] = __builtin_thread_pointer();
  free(malloc(100));
  pthread_setspecific(g_late_key, (void *)1L);
  return NULL;
}
static void *free_first(void *arg) {
  (void)arg;
  g_late_tp[1] = __builtin_thread_pointer();
  free(g_late_block);
  free(malloc(48));
  return NULL;
}
static void free_a_block_of_the_last_round(bool trim) {
  g_late_trim = trim;
  REQUIRE(pthread_key_create(&g_late_key, allocate_in_the_last_round) == 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, arm_late_malloc, NULL) == 0 && pthread_join(t, NULL) == 0);
  REQUIRE(g_late_block != NULL);
  REQUIRE(pthread_create(&t, NULL, free_first, NULL) == 0 && pthread_join(t, NULL) == 0);
  CHECK_MSG(g_late_tp[0] == g_late_tp[1], "the second thread did not reuse the first's stack");
  void *p = malloc(48);
  CHECK(p != NULL);
  free(p);
}
TEST_T(a_new_threads_first_free_of_a_block_from_a_dead_threads_last_destructor, 20) {
  free_a_block_of_the_last_round(false);
}
TEST_T(a_new_threads_first_free_of_a_trimmed_block_from_a_dead_threads_last_destructor, 20) { free_a_block_of_the_last_round(true); }

/* Another thread's mappings are its own: the large blocks' pages, moved
 * from chunk to chunk of the arena with mremap, left holes the kernel gave
 * to the next mmap, which the refill replaced (the program's 1 MiB turned
 * inaccessible, or shared a block's pages). The gaps above the arena are
 * filled first, so that a hole in it is where the next mmap goes. Where
 * moves leave no hole, no mapping of the program lands in the arena at all
 * (in_arena stays 0); before 56c44a8 one did within 0.02 s, and crashed. */
#define FOREIGN_MAP ((size_t)1 << 20)
static atomic_bool g_mover_stop;
static void *move_large_blocks(void *arg) {
  (void)arg;
  char *slot[16] = {0};
  unsigned s = 1;
  while (!atomic_load(&g_mover_stop)) {
    s = s * 1103515245u + 12345u;
    size_t k = (s >> 16) % 16, size = ((size_t)1 << 20) + (s >> 8) % ((size_t)7 << 20);
    free(slot[k]);
    if ((slot[k] = malloc(size)) != NULL) memset(slot[k], 1, size);
  }
  for (size_t k = 0; k < 16; k++) free(slot[k]);
  return NULL;
}

TEST_T(a_mapping_of_the_program_is_never_replaced_by_a_large_blocks_move, 30) {
  char *probe = malloc(3 << 20);
  REQUIRE(probe != NULL);
  uintptr_t arena = (uintptr_t)probe;
  free(probe);
  static void *above[4096];
  size_t n_above = 0;
  while (n_above < 4096) {
    void *p = mmap(NULL, FOREIGN_MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    if ((uintptr_t)p < arena) {
      munmap(p, FOREIGN_MAP);
      break;
    }
    above[n_above++] = p;
  }
  atomic_store(&g_mover_stop, false);
  pthread_t mover;
  REQUIRE(pthread_create(&mover, NULL, move_large_blocks, NULL) == 0);
  long in_arena = 0, replaced = 0;
  for (double end = th_now() + 3; th_now() < end && replaced == 0;) {
    unsigned char *p = mmap(NULL, FOREIGN_MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    if ((uintptr_t)p >= arena) { /* in a hole of the arena: a crash here is the fault too */
      in_arena++;
      memset(p, 0xab, FOREIGN_MAP);
      usleep(1000);
      for (size_t i = 0; i < FOREIGN_MAP; i += 4096) replaced += p[i] != 0xab;
    }
    munmap(p, FOREIGN_MAP);
  }
  atomic_store(&g_mover_stop, true);
  pthread_join(mover, NULL);
  for (size_t i = 0; i < n_above; i++) munmap(above[i], FOREIGN_MAP);
  CHECK_MSG(replaced == 0, "%ld pages of the program's mapping changed under it (%ld in the arena)",
            replaced, in_arena);
}

TEST_MAIN("threads")
