/* Multi-thread stress: blocks are filled with a pattern derived from their
 * address and size, passed between threads, and verified before every free.
 * A corruption or a partial overlap shows up as a pattern mismatch. A block
 * handed out twice at once would carry the same pattern for both owners, so
 * each free first clears its header, and a new block whose header is a live
 * one's (the header its address gives) was handed out while live. */
#include "harness.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BLOCK (1u << 20)

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
static uint64_t rnd(uint64_t *s) {
  *s += 0x9e3779b97f4a7c15ull;
  return mix(*s);
}
/* 80% <= 1 KiB, 15% <= 64 KiB, 5% <= 1 MiB; never below 8 bytes. */
static size_t rand_size(uint64_t *s) {
  uint64_t r = rnd(s);
  unsigned k = (unsigned)(r % 100);
  r >>= 8;
  if (k < 80) return 8 + r % (1024 - 7);
  if (k < 95) return 1025 + r % (64 * 1024 - 1024);
  return 64 * 1024 + 1 + r % (MAX_BLOCK - 64 * 1024);
}

/* Block layout: word 0 = size | tag(address) << 21; then bytes from a hash
 * of (address, size, offset/8). `key` is the address the pattern was written
 * for (after a realloc the old key is used to check the kept prefix). */
static uint64_t tag_of(uintptr_t key) { return mix(key) >> 21; }
static uint64_t word_at(uintptr_t key, size_t size, size_t w) {
  return mix(key * 31 + size * 0x10001 + w);
}
static void stamp(void *p, size_t size) {
  uintptr_t key = (uintptr_t)p;
  uint64_t hdr = (uint64_t)size | tag_of(key) << 21;
  memcpy(p, &hdr, 8);
  unsigned char *b = p;
  size_t w = 1;
  for (; (w + 1) * 8 <= size; w++) {
    uint64_t v = word_at(key, size, w);
    memcpy(b + w * 8, &v, 8);
  }
  uint64_t v = word_at(key, size, w);
  memcpy(b + w * 8, &v, size - w * 8);
}
/* Checks bytes [0, upto) of a block written by stamp(key, size) and now
 * at p. Returns the first bad byte offset or (size_t)-1 if all good. */
static size_t check_pattern(const void *p, uintptr_t key, size_t size, size_t upto) {
  const unsigned char *b = p;
  uint64_t hdr = (uint64_t)size | tag_of(key) << 21;
  for (size_t i = 0; i < 8 && i < upto; i++)
    if (b[i] != ((const unsigned char *)&hdr)[i]) return i;
  for (size_t w = 1; w * 8 < upto; w++) {
    uint64_t v = word_at(key, size, w);
    size_t n = upto - w * 8 < 8 ? upto - w * 8 : 8;
    if (memcmp(b + w * 8, &v, n) != 0) {
      for (size_t i = 0; i < n; i++)
        if (b[w * 8 + i] != ((const unsigned char *)&v)[i]) return w * 8 + i;
    }
  }
  return (size_t)-1;
}
static size_t size_of_block(const void *p) {
  uint64_t hdr;
  memcpy(&hdr, p, 8);
  return (size_t)(hdr & ((1u << 21) - 1));
}

static atomic_long g_errors;
static atomic_flag g_reported = ATOMIC_FLAG_INIT;

static void report(const char *what, const void *p, size_t size, size_t off) {
  atomic_fetch_add(&g_errors, 1);
  if (!atomic_flag_test_and_set(&g_reported)) {
    const unsigned char *b = p;
    fprintf(stderr,
            "    %s: block %p size %zu: first bad byte at offset %zu (0x%02x); header word "
            "0x%016llx\n",
            what, p, size, off, off < size ? b[off] : 0,
            (unsigned long long)*(const uint64_t *)p);
  }
}

/* Verifies a block that was stamped in place (header decodes its size). */
static int verify_block(const void *p, const char *what) {
  size_t size = size_of_block(p);
  uint64_t hdr;
  memcpy(&hdr, p, 8);
  if (size < 8 || size > MAX_BLOCK || (hdr >> 21) != tag_of((uintptr_t)p)) {
    report(what, p, 8, 0);
    return 0;
  }
  size_t bad = check_pattern(p, (uintptr_t)p, size, size);
  if (bad != (size_t)-1) {
    report(what, p, size, bad);
    return 0;
  }
  return 1;
}

/* The header a live block stamped at p carries (stamp). */
static int has_live_header(const void *p) {
  uint64_t hdr;
  memcpy(&hdr, p, 8);
  size_t size = (size_t)(hdr & ((1u << 21) - 1));
  return (hdr >> 21) == tag_of((uintptr_t)p) && size >= 8 && size <= MAX_BLOCK;
}

/* Frees a block after checking it; its header cleared first (see above). */
static void free_verified(void *p, const char *what) {
  if (!verify_block(p, what)) return;
  memset(p, 0, 8);
  free(p);
}

static int check_new_block(void *p, size_t size, const char *what) {
  if (!p) {
    atomic_fetch_add(&g_errors, 1);
    fprintf(stderr, "    %s(%zu) returned NULL (errno %d)\n", what, size, errno);
    return 0;
  }
  if (has_live_header(p)) { /* (a realloc clears its block's header first) */
    atomic_fetch_add(&g_errors, 1);
    fprintf(stderr, "    %s(%zu) = %p: a live block's (its header is one)\n", what, size, p);
    return 0;
  }
  if (((uintptr_t)p & 15) != 0 || malloc_usable_size(p) < size) {
    atomic_fetch_add(&g_errors, 1);
    fprintf(stderr, "    %s(%zu) = %p: misaligned or usable %zu too small\n", what, size, p,
            malloc_usable_size(p));
    return 0;
  }
  return 1;
}

/* ---------- shared-slot stress ---------- */

#define NSLOTS 2048
static _Atomic(void *) g_slots[NSLOTS];
static atomic_int g_stop;
static atomic_long g_ops;

static void *new_block(uint64_t *rs) {
  size_t size = rand_size(rs);
  unsigned kind = (unsigned)(rnd(rs) % 10);
  void *p;
  if (kind == 0) {
    p = calloc(1, size);
    if (!check_new_block(p, size, "calloc")) return NULL;
    const unsigned char *b = p;
    for (size_t i = 0; i < size; i++)
      if (b[i]) {
        report("calloc not zeroed", p, size, i);
        break;
      }
  } else {
    p = malloc(size);
    if (!check_new_block(p, size, "malloc")) return NULL;
  }
  stamp(p, size);
  return p;
}

static void *slot_worker(void *arg) {
  uint64_t rs = (uint64_t)(uintptr_t)arg * 0x12345 + 1;
  long ops = 0;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    unsigned i = (unsigned)(rnd(&rs) % NSLOTS);
    unsigned action = (unsigned)(rnd(&rs) % 8);
    void *old;
    if (action == 0) { /* take a block, realloc it, put it back */
      old = atomic_exchange(&g_slots[i], NULL);
      if (old) {
        if (!verify_block(old, "before realloc")) continue;
        size_t osize = size_of_block(old);
        size_t nsize = rand_size(&rs);
        uint64_t hdr; /* cleared as by a free: realloc may free the block */
        memcpy(&hdr, old, 8);
        memset(old, 0, 8);
        void *q = realloc(old, nsize);
        if (!check_new_block(q, nsize, "realloc")) continue;
        memcpy(q, &hdr, 8);
        size_t keep = osize < nsize ? osize : nsize;
        size_t bad = check_pattern(q, (uintptr_t)old, osize, keep);
        if (bad != (size_t)-1) report("realloc lost data", q, keep, bad);
        stamp(q, nsize);
        old = atomic_exchange(&g_slots[i], q);
        if (old) free_verified(old, "before free");
      }
    } else if (action == 1) { /* just free whatever is there */
      old = atomic_exchange(&g_slots[i], NULL);
      if (old) free_verified(old, "before free");
    } else {
      void *p = new_block(&rs);
      if (!p) continue;
      old = atomic_exchange(&g_slots[i], p);
      if (old) free_verified(old, "before free");
    }
    ops++;
  }
  atomic_fetch_add(&g_ops, ops);
  return NULL;
}

TEST_T(eight_threads_exchange_verified_blocks_for_4s, 60) {
  enum { T = 8 };
  pthread_t th[T];
  long rss0 = th_vm_rss_kib();
  for (long t = 0; t < T; t++) REQUIRE(pthread_create(&th[t], NULL, slot_worker, (void *)t) == 0);
  double t0 = th_now();
  long peak = 0;
  while (th_now() - t0 < 4.0) {
    usleep(100 * 1000);
    long r = th_vm_rss_kib() - rss0;
    if (r > peak) peak = r;
  }
  atomic_store(&g_stop, 1);
  for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
  int left = 0;
  for (int i = 0; i < NSLOTS; i++) {
    void *p = atomic_exchange(&g_slots[i], NULL);
    if (p) {
      left++;
      free_verified(p, "final");
    }
  }
  printf("    %ld ops, %d blocks left at end, VmRSS growth peak %ld MiB\n", atomic_load(&g_ops),
         left, peak >> 10);
  CHECK_MSG(atomic_load(&g_errors) == 0, "%ld corrupted/failed blocks", atomic_load(&g_errors));
  CHECK(atomic_load(&g_ops) > 2000); /* progress, even on a loaded machine */
  /* The live set is at most 2048 blocks, about 64 MiB on average; hakmem,
   * its hardened build and glibc peak at 130-150 MiB. */
  CHECK_MSG(peak < 384 * 1024, "VmRSS grew by %ld MiB", peak >> 10);
}

/* ---------- producer / consumer (every free is remote) ---------- */

#define RING 4096
static _Atomic(void *) g_ring[RING];
static atomic_ulong g_head, g_tail; /* head: next to write; tail: next to read */
#define PC_BLOCKS 800000

static void *producer(void *arg) {
  uint64_t rs = 777;
  for (long n = 0; n < PC_BLOCKS; n++) {
    size_t size = (rnd(&rs) % 64 == 0) ? rand_size(&rs) : 8 + rnd(&rs) % 1017;
    void *p = malloc(size);
    if (!check_new_block(p, size, "malloc")) return NULL;
    stamp(p, size);
    unsigned long h = atomic_load_explicit(&g_head, memory_order_relaxed);
    while (h - atomic_load_explicit(&g_tail, memory_order_acquire) >= RING) sched_yield();
    atomic_store_explicit(&g_ring[h % RING], p, memory_order_relaxed);
    atomic_store_explicit(&g_head, h + 1, memory_order_release);
  }
  return NULL;
}

static void *consumer(void *arg) {
  long *freed = arg;
  for (;;) {
    unsigned long t = atomic_load_explicit(&g_tail, memory_order_relaxed);
    while (atomic_load_explicit(&g_head, memory_order_acquire) == t) {
      if (atomic_load(&g_stop)) return NULL;
      sched_yield();
    }
    void *p = atomic_load_explicit(&g_ring[t % RING], memory_order_relaxed);
    atomic_store_explicit(&g_tail, t + 1, memory_order_release);
    free_verified(p, "consumer");
    (*freed)++;
  }
}

TEST_T(producer_consumer_all_frees_remote, 60) {
  long rss0 = th_vm_rss_kib();
  long freed = 0;
  pthread_t pt, ct;
  atomic_store(&g_stop, 0);
  REQUIRE(pthread_create(&ct, NULL, consumer, &freed) == 0);
  REQUIRE(pthread_create(&pt, NULL, producer, NULL) == 0);
  pthread_join(pt, NULL);
  atomic_store(&g_stop, 1);
  pthread_join(ct, NULL);
  long growth = th_vm_rss_kib() - rss0;
  printf("    %ld blocks passed producer -> consumer; VmRSS growth %ld MiB\n", freed,
         growth >> 10);
  CHECK_MSG(atomic_load(&g_errors) == 0, "%ld corrupted/failed blocks", atomic_load(&g_errors));
  CHECK_MSG(freed == PC_BLOCKS, "consumer freed %ld of %d", freed, PC_BLOCKS);
  /* ~0.8 GB flowed through a ring of 4096 blocks: remote frees must be reused. */
  CHECK_MSG(growth < 256 * 1024, "VmRSS grew by %ld MiB: remote frees not reclaimed?",
            growth >> 10);
}

/* ---------- one allocator thread, all threads free ---------- */

#define OWN_N 120000
static void *g_owned[OWN_N];
static pthread_barrier_t g_bar;

static void *freeing_worker(void *arg) {
  long t = (long)(intptr_t)arg;
  for (int round = 0; round < 5; round++) {
    pthread_barrier_wait(&g_bar); /* main has filled g_owned */
    for (long i = t; i < OWN_N; i += 8)
      free_verified(g_owned[i], "freed by other thread");
    pthread_barrier_wait(&g_bar); /* all freed */
  }
  return NULL;
}

TEST_T(all_threads_free_blocks_of_one_thread, 60) {
  pthread_t th[8];
  uint64_t rs = 4242;
  pthread_barrier_init(&g_bar, NULL, 9);
  for (long t = 0; t < 8; t++)
    REQUIRE(pthread_create(&th[t], NULL, freeing_worker, (void *)(intptr_t)t) == 0);
  long rss0 = th_vm_rss_kib(), rss_after_first = 0;
  for (int round = 0; round < 5; round++) {
    for (long i = 0; i < OWN_N; i++) {
      size_t size = (i % 100 == 0) ? rand_size(&rs) : 8 + rnd(&rs) % 2041;
      g_owned[i] = malloc(size);
      REQUIRE(check_new_block(g_owned[i], size, "malloc"));
      stamp(g_owned[i], size);
    }
    pthread_barrier_wait(&g_bar);
    pthread_barrier_wait(&g_bar);
    if (round == 0) rss_after_first = th_vm_rss_kib();
  }
  for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
  long rss_end = th_vm_rss_kib();
  printf("    VmRSS: start %ld MiB, after round 1 %ld MiB, after round 5 %ld MiB\n",
         rss0 >> 10, rss_after_first >> 10, rss_end >> 10);
  CHECK_MSG(atomic_load(&g_errors) == 0, "%ld corrupted/failed blocks", atomic_load(&g_errors));
  /* Each round reallocates the same volume: rounds 2..5 must reuse what the
   * other threads freed, so RSS must not keep growing by a round's volume. */
  CHECK_MSG(rss_end - rss_after_first < 128 * 1024,
            "VmRSS grew %ld MiB over 4 more rounds of the same volume",
            (rss_end - rss_after_first) >> 10);
  /* The owner can still allocate and its new blocks are sound. */
  for (int i = 0; i < 10000; i++) {
    void *p = malloc(8 + (size_t)i % 500);
    REQUIRE(check_new_block(p, 8 + (size_t)i % 500, "malloc"));
    stamp(p, 8 + (size_t)i % 500);
    free_verified(p, "after");
  }
  CHECK(atomic_load(&g_errors) == 0);
}

/* ---------- many threads hammering one size class ---------- */

static void *same_class_worker(void *arg) {
  enum { K = 256 };
  void *mine[K];
  for (int it = 0; it < 400; it++) {
    for (int i = 0; i < K; i++) {
      mine[i] = malloc(48);
      if (!check_new_block(mine[i], 48, "malloc")) return NULL;
      stamp(mine[i], 48);
    }
    for (int i = 0; i < K; i++)
      free_verified(mine[i], "same-class");
  }
  return NULL;
}

TEST_T(threads_share_one_size_class_without_overlap, 60) {
  pthread_t th[8];
  for (int t = 0; t < 8; t++) REQUIRE(pthread_create(&th[t], NULL, same_class_worker, NULL) == 0);
  for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
  CHECK_MSG(atomic_load(&g_errors) == 0, "%ld corrupted/failed blocks", atomic_load(&g_errors));
}

TEST_MAIN("stress")
