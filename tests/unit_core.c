/* White-box tests of hakmem's internals, linked against the debug build
 * (assertions and exact per-class counters on). */
#define _GNU_SOURCE /* RTLD_NEXT */
#include "harness.h"
#include "internal.h"
#include "blocks.h"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* A large block of one chunk: past the span sizes, and its header and it
 * within one chunk. */
#define ONE_CHUNK (HAK_BIG_MAX + HAK_LARGE_GRAIN / 4)

/* ---- size classes ---- */

TEST(every_heap_has_the_class_table_of_small_sizes) {
  free(malloc(1)); /* the thread has a heap */
  REQUIRE(hak_tls_heap != HAK_HEAP_EMPTY);
  CHECK(memcmp(hak_tls_heap->small_class, hak_heap_empty.small_class, sizeof hak_heap_empty.small_class) == 0);
  /* it ends on a class boundary, past the small classes */
  CHECK(hak_class_size[hak_size_class(HAK_TABLE_MAX)] == HAK_TABLE_MAX);
  CHECK(hak_tls_heap->small_class[HAK_TABLE_MAX] == hak_size_class(HAK_TABLE_MAX));
  CHECK(hak_tls_heap->small_class[HAK_TABLE_MAX] == HAK_SMALL_CLASSES);
}

/* Whether `need` bytes fit after every colour of a block of span class cls. */
static bool fits_every_colour(size_t cls, size_t need) { return need + HAK_SPAN_COLOUR_MAX <= hak_class_size[cls]; }

TEST(class_is_smallest_fitting) {
  for (size_t size = 0; size <= HAK_BIG_MAX; size++) {
    size_t cls = hak_size_class(size);
    REQUIRE(cls < HAK_CLASSES);
    CHECK_MSG(hak_class_size[cls] >= size, "size %zu -> class %zu (%u)", size, cls,
              hak_class_size[cls]);
    if (cls > 0)
      CHECK_MSG(hak_class_size[cls - 1] < (size ? size : 1), "size %zu not smallest", size);
    if (size <= HAK_TABLE_MAX)
      CHECK_MSG(hak_heap_empty.small_class[size] == cls, "size %zu: the heaps' table says %u", size,
                hak_heap_empty.small_class[size]);
    size_t number = hak_class_is_span(cls) && !fits_every_colour(cls, size) ? hak_span_at_page(cls) : cls;
    CHECK_MSG(hak_fast_class[(size + 15) >> 4] == number, "size %zu: malloc's number %u, not %zu", size,
              hak_fast_class[(size + 15) >> 4], number);
    if (th_failed_here > 5) return;
  }
}

TEST(class_sizes_increase_and_are_16_aligned) {
  for (size_t c = 0; c < HAK_CLASSES; c++) {
    CHECK(hak_class_size[c] % 16 == 0);
    if (c) CHECK(hak_class_size[c] > hak_class_size[c - 1]);
  }
  CHECK(hak_class_size[HAK_SMALL_CLASSES - 1] == HAK_SMALL_MAX);
  CHECK(hak_class_size[HAK_CLASSES - 1] == HAK_BIG_MAX);
}

TEST(slab_class_waste_at_most_12_5_percent) {
  for (size_t size = 129; size <= HAK_SLAB_MAX; size++) {
    size_t bs = hak_class_size[hak_size_class(size)];
    CHECK_MSG((bs - size) * 8 <= bs, "size %zu wastes %zu of %zu", size, bs - size, bs);
  }
}

/* Slab classes end at HAK_SLAB_MAX; every span class is whole pages. */
TEST(span_classes_follow_the_slab_classes_in_whole_pages) {
  CHECK(hak_class_size[HAK_SLAB_CLASSES - 1] == HAK_SLAB_MAX);
  CHECK(!hak_class_is_span(hak_size_class(HAK_SLAB_MAX)));
  CHECK(hak_class_is_span(hak_size_class(HAK_SLAB_MAX + 1)));
  CHECK(hak_class_is_span(hak_size_class(HAK_BIG_MAX)));
  for (size_t c = HAK_SLAB_CLASSES; c < HAK_CLASSES; c++) {
    CHECK_MSG(hak_class_size[c] % HAK_PAGE_SIZE == 0, "class %zu: %u B", c, hak_class_size[c]);
    if (c > HAK_SLAB_CLASSES + 1) /* <= 25% waste from 16 KiB on */
      CHECK(hak_class_size[c] - hak_class_size[c - 1] <= hak_class_size[c] / 4);
  }
}

/* ---- address arithmetic ---- */

TEST(segment_of_finds_header_by_mask) {
  size_t sizes[] = {1, 16, 100, 1000, 1024, 1025, 5000, HAK_SLAB_MAX};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint8_t *p = malloc(sizes[i]);
    REQUIRE(p != NULL);
    hak_segment_t *seg = hak_segment_of(p);
    REQUIRE(seg != NULL);
    CHECK(((uintptr_t)seg & HAK_SEG_MASK) == 0);
    CHECK(p > (uint8_t *)seg && p < (uint8_t *)seg + HAK_SEG_SIZE);
    CHECK(seg->kind == HAK_KIND_SLABS);
    hak_slab_t *slab = hak_slab_of(seg, p);
    CHECK(slab->units == 1);
    CHECK(slab->block_size == hak_class_size[hak_size_class(sizes[i])]);
    uint8_t *start = hak_slab_start(seg, slab);
    CHECK(p >= start && p + slab->block_size <= start + hak_slab_bytes(slab));
    CHECK((size_t)(p - start) % slab->block_size == 0);
    CHECK(hak_segment_of_slab(slab) == seg);
    free(p);
  }
}

/* The block test of free's fast path against its definition, at every
 * offset around a slab of each class (first slab, after the header, and
 * one further on, 1 and 4 units long): a block start, and of a block
 * carved (none, a third, all). */
TEST(block_test_accepts_exactly_the_carved_block_starts) {
  size_t len = 2 * HAK_SEG_SIZE;
  uint8_t *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  hak_segment_t *seg = (hak_segment_t *)(((uintptr_t)map + HAK_SEG_MASK) & ~HAK_SEG_MASK);
  size_t wrong = 0;
  for (size_t cls = 0; cls < HAK_SLAB_CLASSES; cls++) {
    unsigned placements[][2] = {{0, 1}, {8, 1}, {20, 4}, {0, 4}};
    for (size_t i = 0; i < sizeof placements / sizeof placements[0]; i++) {
      hak_slab_t *slab = &seg->slabs[placements[i][0]];
      slab->index = (uint8_t)placements[i][0];
      slab->units = (uint8_t)placements[i][1];
      hak_slab_init(slab, cls);
      size_t start = (size_t)(hak_slab_start(seg, slab) - (uint8_t *)seg);
      size_t bs = slab->block_size, cap = slab->capacity;
      CHECK(cap == hak_slab_bytes(slab) / bs);
      size_t carved[] = {0, (cap + 2) / 3, cap};
      for (size_t c = 0; c < 3; c++) {
        hak_slab_set_reserved(slab, (uint32_t)carved[c]);
        size_t end = start + cap * bs + 2 * bs;
        for (size_t off = 0; off < end && off < HAK_SEG_SIZE; off++) {
          bool want = off >= start && (off - start) % bs == 0 && (off - start) / bs < carved[c];
          if (hak_slab_is_block(slab, (uint8_t *)seg + off) != want && wrong++ < 5)
            fprintf(stderr, "    class %zu (%zu B), slab at unit %u, %zu carved: offset %zu %s\n",
                    cls, bs, placements[i][0], carved[c], off, want ? "rejected" : "accepted");
        }
      }
    }
  }
  CHECK(wrong == 0);
  munmap(map, len);
}

/* free's slot of a pointer against the mapping of its chunk, at and
 * around chunk boundaries from NULL to the top of the address space. */
TEST(segmap_slot_of_a_pointer_is_its_chunks) {
  uintptr_t chunks[] = {0, 1, 2, 0x7f0000000000 >> HAK_SEG_SHIFT, (UINTPTR_MAX >> HAK_SEG_SHIFT) - 1,
                        UINTPTR_MAX >> HAK_SEG_SHIFT};
  intptr_t offsets[] = {-1, 0, 1, 16, HAK_SEG_SIZE / 2};
  size_t wrong = 0;
  for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++)
    for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) {
      uintptr_t p = (chunks[c] << HAK_SEG_SHIFT) + (uintptr_t)offsets[o];
      if (hak_segmap_slot((const void *)p) != hak_segmap_slot_of_chunk((p - 1) >> HAK_SEG_SHIFT) &&
          wrong++ < 5)
        fprintf(stderr, "    pointer %#lx: slot %zu\n", (unsigned long)p, hak_segmap_slot((const void *)p));
    }
  CHECK(wrong == 0);
  CHECK(hak_segmap_slot(NULL) == hak_segmap_slot_of_chunk(UINTPTR_MAX >> HAK_SEG_SHIFT));
}

TEST(segment_of_rejects_foreign_pointers) {
  int local;
  static int global;
  CHECK(hak_segment_of(NULL) == NULL);
  CHECK(hak_segment_of(&local) == NULL);
  CHECK(hak_segment_of(&global) == NULL);
  void *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(hak_segment_of(m) == NULL);
  munmap(m, 1 << 20);
}

TEST(large_blocks_have_their_own_segment) {
  size_t sizes[] = {HAK_BIG_MAX + 1, 2 << 20, 5 << 20, 33 << 20};
  for (size_t i = 0; i < 4; i++) {
    uint8_t *p = malloc(sizes[i]);
    REQUIRE(p != NULL);
    hak_segment_t *seg = hak_segment_of(p);
    REQUIRE(seg != NULL);
    CHECK(seg->kind == HAK_KIND_LARGE);
    CHECK(p == (uint8_t *)seg + HAK_LARGE_OFFSET);
    /* the block starts on its header's page (no guard page between them):
     * a block used at its start only costs one page */
    if (!HAK_GUARD_PAGES) CHECK(((uintptr_t)p & ~(uintptr_t)4095) == (uintptr_t)seg);
    CHECK(seg->large_size >= sizes[i]);
    CHECK(hak_segmap_of(p) == HAK_SEGMAP_LARGE); /* the arena's: no unit is read */
    free(p);
  }
}

TEST(huge_alignment_header_sits_in_chunk_before) {
  size_t align = (size_t)16 << 20;
  void *p = aligned_alloc(align, 100);
  REQUIRE(p != NULL);
  CHECK(((uintptr_t)p & (align - 1)) == 0);
  hak_segment_t *seg = hak_segment_of(p);
  REQUIRE(seg != NULL);
  CHECK((uint8_t *)seg == (uint8_t *)p - HAK_SEG_SIZE);
  CHECK(seg->kind == HAK_KIND_LARGE);
  /* a mapping of its own is slabs to the segment map: free's fast path
   * reads p's unit, which must lead to slabs[0], whose owner is nobody */
  CHECK(hak_segmap_of(p) == HAK_SEGMAP_SLABS);
  CHECK(hak_slab_of(seg, p) == &seg->slabs[0]);
  free(p);
}

TEST(aligned_slab_blocks_are_aligned) {
  for (size_t align = 32; align <= HAK_SLAB_ALIGN_MAX; align *= 2) {
    for (size_t size = 1; size < 3 * align; size += align / 2 + 7) {
      void *ps[40];
      for (int i = 0; i < 40; i++) {
        ps[i] = aligned_alloc(align, size);
        REQUIRE(ps[i] != NULL);
        CHECK_MSG(((uintptr_t)ps[i] & (align - 1)) == 0, "align %zu size %zu", align, size);
        CHECK(hak_segment_of(ps[i])->kind != HAK_KIND_LARGE);
      }
      for (int i = 0; i < 40; i++) free(ps[i]);
    }
  }
}

/* An aligned block takes the smallest class that fits and is a multiple of
 * the alignment, up to the largest span class. */
TEST(aligned_blocks_take_the_smallest_aligned_class) {
  for (size_t align = 32; align <= HAK_SLAB_ALIGN_MAX; align *= 2) {
    for (size_t size = 0; size + HAK_CANARY <= HAK_BIG_MAX; size += size < 2048 ? 7 : 251) {
      size_t cls = 0;
      while (hak_class_size[cls] < size + HAK_CANARY || hak_class_size[cls] % align != 0) cls++;
      void *p = aligned_alloc(align, size);
      REQUIRE(p != NULL);
      CHECK_MSG(((uintptr_t)p & (align - 1)) == 0, "align %zu size %zu", align, size);
      CHECK_MSG(malloc_usable_size(p) == hak_class_size[cls] - HAK_CANARY,
                "align %zu size %zu: %zu usable, class %u", align, size, malloc_usable_size(p),
                hak_class_size[cls]);
      free(p);
    }
  }
}

/* ---- free lists ---- */

static hak_slab_t *slab_of_ptr(void *p) { return hak_slab_of(hak_segment_of(p), p); }
/* Mallocs blocks of size into out[n], out[n + 1], ... (at most max in all)
 * until the heap's list of cls is empty: the next malloc refills. Returns
 * the new count. */
static int use_up_list(size_t cls, size_t size, void **out, int n, int max) {
  while (hak_tls_heap->free[cls] != NULL) {
    REQUIRE(n < max);
    out[n++] = malloc(size);
  }
  return n;
}

/* Runs fn(arg) on a thread of its own, to its exit. */
static void run_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, fn, arg) == 0);
  pthread_join(t, NULL);
}

static void *no_work(void *arg) { return arg; }

/* Starting the background purger allocates (pthread_create): tests that
 * watch slab states start it first, so it cannot reuse their slabs. A
 * program of one thread that has mapped little gets no purger: a thread
 * started and joined makes this one a program with threads. */
static void start_purger(void) {
  run_thread(no_work, NULL);
  hak_purge_wake();
  hak_purge_start();
  /* running once the thread has begun: only then do exiting threads park */
  for (int i = 0; i < 5000 && !atomic_load(&hak_purge_running); i++) usleep(1000);
  REQUIRE(atomic_load(&hak_purge_running));
}

/* Resident pages of the bytes / 4096 pages from start's page on (a large
 * block starts on its header's page, past the header). */
static int resident_pages(void *start, size_t bytes) {
  unsigned char vec[256];
  size_t pages = bytes / 4096;
  void *page = (void *)((uintptr_t)start & ~(uintptr_t)4095);
  if (pages > sizeof vec || mincore(page, bytes, vec) != 0) return -1;
  int n = 0;
  for (size_t i = 0; i < pages; i++) n += vec[i] & 1;
  return n;
}

/* Allocates n blocks of size, writes v all over each; returns the page
 * faults that took. */
static size_t fill_blocks(void **ps, int n, size_t size, int v) {
  long before = th_minor_faults();
  for (int i = 0; i < n; i++) {
    REQUIRE((ps[i] = malloc(size)) != NULL);
    memset(ps[i], v, size);
  }
  return (size_t)(th_minor_faults() - before);
}

/* Whether the FREE unit at slab s went back to the OS. */
static bool unit_purged(const hak_slab_t *s) {
  return hak_segment_of_slab((hak_slab_t *)s)->purged_units >> s->index & 1;
}

/* Three slabs' worth of written 1000-byte blocks, all freed: the first
 * slab, which went back to its segment. */
static hak_slab_t *fill_three_slabs_and_free(void) {
  enum { N = 3 * 64 };
  void *ps[N];
  for (int i = 0; i < N; i++) {
    ps[i] = malloc(1000);
    memset(ps[i], 1, 1000);
  }
  hak_slab_t *first = slab_of_ptr(ps[0]);
  for (int i = 0; i < N; i++) free(ps[i]);
  return first;
}

/* ---- large blocks: the arena ---- */

/* Freed large blocks stay committed for the delay, here 100 s, as in a
 * program whose purger thread runs: where purges run in the program's
 * calls only, its frees keep no more than a bound learnt from its reuse
 * (large.c, calls_keep), 0 in a new process. */
static void keep_freed_large_blocks(void) {
  hak_opt.purge_delay_ms = 100000;
  atomic_store(&hak_purge_started, 1);
}

TEST(freed_large_block_pages_serve_a_smaller_one) {
  keep_freed_large_blocks();
  size_t big = (size_t)20 << 20, small = (size_t)5 << 20;
  uint8_t *a = malloc(big);
  REQUIRE(a != NULL);
  memset(a, 1, big);
  free(a);
  uint8_t *b = malloc(small);
  CHECK(b == a); /* the smallest free run that fits, split */
  int resident = resident_pages((void *)((uintptr_t)b & ~(uintptr_t)4095), 16 * 4096);
  CHECK_MSG(resident == 16, "%d of 16 pages resident: reuse would fault", resident);
  uint8_t *c = malloc(small); /* the rest of the run, after b's chunks */
  CHECK(c > b && c < a + big);
  free(b);
  free(c);
}

TEST(large_blocks_start_every_grain) {
  uint8_t *a = malloc(ONE_CHUNK), *b = malloc(ONE_CHUNK);
  REQUIRE(a && b);
  CHECK(b == a + HAK_LARGE_GRAIN); /* a smaller block does not hold a whole segment */
  CHECK(hak_segment_of(b) == (hak_segment_t *)(b - HAK_LARGE_OFFSET));
  uint8_t *c = malloc(2 * HAK_LARGE_GRAIN); /* with its header, three chunks */
  REQUIRE(c != NULL);
  CHECK(hak_segment_of(c + HAK_LARGE_GRAIN) == NULL); /* its second chunk has no header */
  free(a);
  free(b);
  free(c);
}

/* The walks skip blocks a word of chunk bits at a time: a free chunk past
 * a hundred and more live ones is still found, and reused. */
TEST(a_freed_large_block_past_many_live_ones_is_reused) {
  hak_opt.purge_delay_ms = 100000;
  enum { N = 200 };
  static uint8_t *b[N];
  for (int i = 0; i < N; i++) {
    b[i] = malloc(ONE_CHUNK);
    REQUIRE(b[i] != NULL);
    b[i][0] = 1;
  }
  for (int i = 1; i < N; i++) REQUIRE(b[i] == b[i - 1] + HAK_LARGE_GRAIN);
  uint8_t *freed = b[130];
  free(freed);
  b[130] = malloc(HAK_BIG_MAX + 1); /* its committed pages win over fresh chunks */
  CHECK(b[130] == freed);
  for (int i = 0; i < N; i++) free(b[i]);
}

/* A block of one chunk goes where the most of it is committed already and,
 * among the chunks that cover it all, where the least is left over. */
TEST(a_one_chunk_block_takes_the_free_chunk_that_covers_it_best) {
  keep_freed_large_blocks();
  hak_opt.purge_thread = 0; /* no block is kept (large.c): the arena places them all */
  enum { N = 5 };
  const size_t kib = 1024, sizes[N] = {1560 * kib, 1600 * kib, 1640 * kib, 1100 * kib, 1140 * kib};
  uint8_t *b[N], *c[N + 1];
  for (int i = 0; i < N; i++) REQUIRE((b[i] = malloc(sizes[i])) != NULL);
  for (int i = 0; i < N; i++) free(b[i]);
  CHECK((c[0] = malloc(1570 * kib)) == b[1]); /* 1640 covers it too, with more left over */
  CHECK((c[1] = malloc(1540 * kib)) == b[0]);
  /* none covers the rest: the most committed first */
  CHECK((c[2] = malloc(1900 * kib)) == b[2]);
  CHECK((c[3] = malloc(1900 * kib)) == b[4]);
  CHECK((c[4] = malloc(1900 * kib)) == b[3]);
  c[5] = malloc(1900 * kib);
  for (int i = 0; i < N; i++) CHECK(c[5] != b[i]);
  for (int i = 0; i <= N; i++) free(c[i]);
}

/* A thread's freed blocks of one chunk wait for its next large blocks of
 * about their size; a size none of them fits gives them all back. */
TEST(a_freed_large_block_is_kept_for_the_next_of_about_its_size) {
  keep_freed_large_blocks();
  hak_heap_t *heap = hak_heap_get();
  REQUIRE(heap != NULL);
  hak_large_kept_release(heap, true);
  uint8_t *a = malloc(1100000), *b = malloc(2000000);
  REQUIRE(a && b);
  free(a);
  free(b);
  CHECK(hak_slab_state(&hak_large_header(a)->slabs[0]) == HAK_SLAB_FREE); /* a double free shows */
  size_t kept = 0;
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) {
    hak_segment_t *seg = atomic_load(&heap->large_kept[k]);
    kept += seg == hak_large_header(a) || seg == hak_large_header(b);
  }
  CHECK(kept == 2);
  uint8_t *c = malloc(1500000), *d = malloc(1090000);
  CHECK(c == b); /* fits in b, and asks for more than half of it */
  CHECK(d == a);
  free(c);
  free(d);
  uint8_t *e = malloc(3 << 20); /* more than either holds */
  REQUIRE(e != NULL);
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) CHECK(atomic_load(&heap->large_kept[k]) == NULL);
  free(e);
}

/* A thread whose only blocks are large gets a heap at its first one, and
 * keeps them as any other thread does. */
static void *large_blocks_only(void *arg) {
  bool *kept = arg;
  if (hak_tls_heap != HAK_HEAP_EMPTY) return NULL;
  uint8_t *a = malloc(1500000);
  if (a == NULL) return NULL;
  free(a);
  hak_heap_t *heap = hak_tls_heap;
  for (size_t k = 0; heap != HAK_HEAP_EMPTY && k < HAK_LARGE_KEPT; k++)
    *kept |= atomic_load(&heap->large_kept[k]) == hak_large_header(a);
  return NULL;
}

TEST(a_thread_of_large_blocks_only_keeps_them) {
  keep_freed_large_blocks();
  bool kept = false;
  run_thread(large_blocks_only, &kept);
  CHECK(kept);
}

/* A thread that keeps a block and then waits loses it to the sweeps of
 * another thread's large mallocs that its blocks do not fit: one sweep
 * marks it idle, the next (a millisecond on) gives its block back. */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int step;
  hak_heap_t *heap;
  uint8_t *block;
} waiter_t;

static void *keep_one_and_wait(void *arg) {
  waiter_t *w = arg;
  w->block = malloc(1500000);
  free(w->block);
  pthread_mutex_lock(&w->lock);
  w->heap = hak_tls_heap;
  w->step = 1;
  pthread_cond_broadcast(&w->cond);
  while (w->step != 2) pthread_cond_wait(&w->cond, &w->lock);
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

static bool heap_keeps(hak_heap_t *heap, const void *block) {
  bool kept = false;
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++)
    kept |= atomic_load(&heap->large_kept[k]) == hak_large_header(block);
  return kept;
}

TEST(a_waiting_thread_gives_its_kept_blocks_to_the_sweeps_of_others) {
  keep_freed_large_blocks();
  waiter_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, NULL, NULL};
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, keep_one_and_wait, &w) == 0);
  pthread_mutex_lock(&w.lock);
  while (w.step != 1) pthread_cond_wait(&w.cond, &w.lock);
  pthread_mutex_unlock(&w.lock);
  bool kept_at_first = heap_keeps(w.heap, w.block), kept_after = true;
  for (int i = 0; i < 2; i++) { /* blocks of 3 MiB are never kept: each misses */
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
    void *big = malloc(3 << 20);
    free(big);
  }
  kept_after = heap_keeps(w.heap, w.block);
  pthread_mutex_lock(&w.lock);
  w.step = 2;
  pthread_cond_broadcast(&w.cond);
  pthread_mutex_unlock(&w.lock);
  pthread_join(t, NULL);
  CHECK(kept_at_first);
  CHECK(!kept_after);
}

/* A kept block counts in the reports as freed and held, not as in use. */
TEST(reports_count_kept_large_blocks_as_free) {
  keep_freed_large_blocks();
  hak_heap_t *heap = hak_heap_get();
  REQUIRE(heap != NULL);
  hak_large_kept_release(heap, true);
  hak_stats_t before, during, after;
  struct mallinfo2 mb = mallinfo2();
  hak_stats_get(&before);
  uint8_t *a = malloc(1500000);
  REQUIRE(a != NULL);
  hak_stats_get(&during);
  struct mallinfo2 md = mallinfo2();
  free(a);
  hak_stats_get(&after);
  struct mallinfo2 ma = mallinfo2();
  bool kept = false;
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) kept |= atomic_load(&heap->large_kept[k]) == hak_large_header(a);
  REQUIRE(kept);
  CHECK(during.large_live == before.large_live + 1);
  CHECK(after.large_live == before.large_live);
  CHECK(after.large_cached >= before.large_cached + 1500000);
  CHECK(md.hblks == mb.hblks + 1 && md.hblkhd >= mb.hblkhd + 1500000);
  CHECK(ma.hblks == mb.hblks && ma.hblkhd == mb.hblkhd);
  CHECK(ma.fordblks >= mb.fordblks + 1500000);
}

/* calloc takes a kept block as malloc does, and clears it. */
TEST(calloc_takes_a_kept_large_block_and_clears_it) {
  hak_opt.purge_delay_ms = 100000;
  hak_heap_t *heap = hak_heap_get();
  REQUIRE(heap != NULL);
  hak_large_kept_release(heap, true);
  size_t n = 1 << 20;
  uint8_t *a = malloc(n);
  REQUIRE(a != NULL);
  memset(a, 0xab, n);
  free(a);
  uint8_t *b = calloc(1, n);
  CHECK(b == a);
  REQUIRE(b != NULL);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i++) nonzero += b[i] != 0;
  CHECK_MSG(nonzero == 0, "%zu bytes not cleared", nonzero);
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) CHECK(atomic_load(&heap->large_kept[k]) == NULL);
  free(b);
}

TEST(adjacent_free_large_blocks_merge) {
  hak_opt.purge_delay_ms = 100000;
  size_t sz = 2 * HAK_LARGE_GRAIN + HAK_LARGE_GRAIN / 2;
  uint8_t *a = malloc(sz), *b = malloc(sz), *guard = malloc(sz);
  REQUIRE(a && b && guard);
  REQUIRE(b == a + 3 * HAK_LARGE_GRAIN); /* with its header: three chunks each */
  free(a);
  free(b);
  uint8_t *c = malloc(5 * HAK_LARGE_GRAIN); /* needs six chunks: both runs */
  CHECK(c == a);
  free(c);
  free(guard);
}

TEST(large_realloc_grows_in_place_into_free_chunks) {
  hak_opt.purge_delay_ms = 100000;
  uint8_t *a = malloc((size_t)3 << 20), *b = malloc((size_t)3 << 20);
  REQUIRE(a && b);
  memset(a, 7, (size_t)3 << 20);
  free(b);
  uint8_t *r = realloc(a, (size_t)6 << 20);
  CHECK(r == a);
  CHECK(r[0] == 7 && r[((size_t)3 << 20) - 1] == 7);
  free(r);
}

/* A block of two chunks between two live blocks, written and freed: its
 * chunks are a free run too short for a block of four. */
#define TWO_CHUNKS (HAK_LARGE_GRAIN + HAK_LARGE_GRAIN / 2)
#define FOUR_CHUNKS (3 * HAK_LARGE_GRAIN + HAK_LARGE_GRAIN / 2)
static uint8_t *isolated_dirty_chunk(uint8_t **before, uint8_t **after, int fill) {
  size_t sz = TWO_CHUNKS;
  *before = malloc(sz);
  uint8_t *a = malloc(sz);
  *after = malloc(sz);
  if (!*before || !a || !*after) return NULL;
  memset(a, fill, sz);
  free(a);
  return a;
}

TEST(a_new_large_block_takes_committed_pages_of_a_free_chunk) {
  keep_freed_large_blocks();
  uint8_t *before, *after, *a = isolated_dirty_chunk(&before, &after, 5);
  REQUIRE(a != NULL);
  REQUIRE(resident_pages(a, 64 * 4096) == 64);
  uint8_t *b = malloc(FOUR_CHUNKS); /* cannot fit in a's run */
  REQUIRE(b != NULL);
  CHECK(b != a);
  int moved = resident_pages(b, 256 * 4096), left = resident_pages(a, 64 * 4096);
  CHECK_MSG(moved == 256, "%d of 256 pages resident: the block would fault", moved);
  CHECK_MSG(left == 0, "%d pages still resident in the donor chunk", left);
  free(b);
  free(before);
  free(after);
}

/* Blocks of two chunks (never kept by the thread) churned over 8 slots,
 * each written whole or at its first byte only. */
static void churn_two_chunk_blocks(size_t steps, int write_all) {
  uint8_t *slot[8] = {0};
  size_t sz = HAK_LARGE_GRAIN + 64 * 1024;
  uint32_t r = 12345;
  for (size_t i = 0; i < steps; i++) {
    r = r * 1103515245u + 12345u;
    uint8_t **s = &slot[(r >> 16) % 8];
    if (*s) {
      free(*s);
      *s = NULL;
    } else if ((*s = malloc(sz)) != NULL) {
      if (write_all) memset(*s, 1, sz);
      else (*s)[0] = 1;
    }
  }
  for (int k = 0; k < 8; k++) free(slot[k]);
}

/* With every free chunk purged, the pages of a new block of four chunks
 * resident right after its malloc: 256 if it took a dirty chunk's pages,
 * the header's only if not; -1 if the setup failed. */
static int pages_a_new_block_takes(void) {
  hak_collect(true);
  uint8_t *before, *after, *a = isolated_dirty_chunk(&before, &after, 5);
  if (a == NULL || resident_pages(a, 64 * 4096) != 64) return -1;
  uint8_t *b = malloc(FOUR_CHUNKS);
  int taken = b ? resident_pages(b, 256 * 4096) : -1;
  free(b);
  free(before);
  free(after);
  return taken;
}

/* Pages move to a new block while the blocks freed before wrote most of
 * theirs, and not after blocks that wrote their first byte only: each
 * move would have cost an mremap for a page or two. */
TEST(pages_move_to_a_new_large_block_only_while_freed_blocks_wrote_theirs) {
  hak_opt.purge_delay_ms = 100000;
  churn_two_chunk_blocks(1200, 0);
  int taken = pages_a_new_block_takes();
  CHECK_MSG(taken >= 0 && taken <= 1, "%d pages resident after blocks that wrote one byte", taken);
  churn_two_chunk_blocks(2000, 1);
  taken = pages_a_new_block_takes();
  CHECK_MSG(taken == 256, "%d of 256 pages resident after blocks written whole", taken);
}

/* A block aligned to a chunk starts a chunk after its header, which needs
 * the header's page only: a free chunk's pages go under the block's bytes. */
TEST(a_chunk_aligned_block_takes_committed_pages_for_its_bytes_not_its_header) {
  keep_freed_large_blocks();
  uint8_t *before, *after, *a = isolated_dirty_chunk(&before, &after, 5);
  REQUIRE(a != NULL);
  void *p = NULL;
  REQUIRE(posix_memalign(&p, HAK_LARGE_GRAIN, HAK_LARGE_GRAIN + HAK_LARGE_GRAIN / 2) == 0);
  uint8_t *b = p, *header_chunk = b - HAK_LARGE_GRAIN; /* three chunks: not in a's run */
  CHECK(((uintptr_t)b & (HAK_LARGE_GRAIN - 1)) == 0);
  CHECK(b != a - HAK_LARGE_OFFSET + HAK_LARGE_GRAIN);
  const size_t half = HAK_LARGE_GRAIN / 2; /* 256 pages */
  int taken = resident_pages(b, half);
  int under_header = resident_pages(header_chunk, half) + resident_pages(header_chunk + half, half);
  CHECK_MSG(taken == 256, "%d of the block's first 256 pages resident", taken);
  CHECK_MSG(under_header <= 1, "%d pages resident in the header's chunk", under_header);
  free(b);
  free(before);
  free(after);
}

/* A block's chunk that takes a free chunk's pages gives its own to the
 * donor's place, where they stay committed, a free chunk's (a move over
 * them dropped them). */
TEST(a_chunk_that_takes_a_donors_pages_gives_its_own_in_exchange) {
  keep_freed_large_blocks();
  const size_t mib = (size_t)1 << 20, two = HAK_LARGE_GRAIN + HAK_LARGE_GRAIN / 2;
  uint8_t *g0 = malloc(mib), *b = malloc(two), *g1 = malloc(mib);
  uint8_t *d = malloc(HAK_LARGE_GRAIN - 64 * 1024), *g2 = malloc(mib);
  REQUIRE(g0 && b && g1 && d && g2);
  memset(b, 1, two);                            /* its second chunk: half committed */
  memset(d, 2, HAK_LARGE_GRAIN - 64 * 1024); /* nearly all */
  free(b);
  free(d);
  uint8_t *d_chunk = d - HAK_LARGE_OFFSET, *b_second = b - HAK_LARGE_OFFSET + HAK_LARGE_GRAIN;
  REQUIRE(resident_pages(d_chunk, 256 * 4096) == 256);
  uint8_t *big = malloc(2 * HAK_LARGE_GRAIN - 2 * 4096); /* two chunks: b's run */
  REQUIRE(big == b);
  int taken = resident_pages(b_second, 256 * 4096), kept = resident_pages(d_chunk, 128 * 4096);
  CHECK_MSG(taken == 256, "%d of the first 256 pages of the second chunk resident", taken);
  CHECK_MSG(kept == 128, "%d of 128 pages kept at the donor's place", kept);
  CHECK(d_chunk[HAK_LARGE_OFFSET] == 1); /* b's second chunk's bytes, moved there */
  free(big);
  free(g0);
  free(g1);
  free(g2);
}

TEST(calloc_clears_pages_taken_from_a_free_chunk) {
  keep_freed_large_blocks();
  uint8_t *before, *after, *a = isolated_dirty_chunk(&before, &after, 0xAB);
  REQUIRE(a != NULL);
  size_t sz = FOUR_CHUNKS;
  uint8_t *b = calloc(1, sz);
  REQUIRE(b != NULL);
  CHECK(resident_pages(b, 64 * 4096) == 64);
  CHECK_MSG(first_nonzero(b, sz) == sz, "byte %zu not zero", first_nonzero(b, sz));
  free(b);
  free(before);
  free(after);
}

TEST(large_realloc_growth_takes_committed_pages_of_a_free_chunk) {
  keep_freed_large_blocks();
  size_t sz = TWO_CHUNKS;
  uint8_t *before = malloc(sz), *a = malloc(sz), *after = malloc(sz), *x = malloc(sz);
  REQUIRE(before && a && after && x > after); /* x is last: it can grow in place */
  memset(a, 9, sz);
  free(a); /* a's run is too short for what x becomes */
  memset(x, 4, sz);
  uint8_t *y = realloc(x, FOUR_CHUNKS); /* grows into fresh chunks */
  REQUIRE(y != NULL);
  CHECK(y == x);
  CHECK(y[0] == 4 && y[sz - 1] == 4);
  uint8_t *third = y - HAK_LARGE_OFFSET + 2 * HAK_LARGE_GRAIN; /* the first chunk grown */
  int resident = resident_pages(third, 64 * 4096);
  CHECK_MSG(resident == 64, "%d of 64 grown pages resident", resident);
  CHECK(resident_pages(a, 64 * 4096) == 0);
  free(y);
  free(before);
  free(after);
}

/* Seals a page (mseal, Linux 6.10): the kernel will not move it; false
 * where the kernel has no mseal. */
static bool seal_page(void *page) {
  return syscall(462 /* mseal, x86-64 */, page, (size_t)4096, 0UL) == 0;
}

/* A block of four chunks, filled, with a live block right after it, so
 * that realloc has to move it to grow: its chunk by chunk. */
static uint8_t *block_that_must_move(uint8_t **after) {
  uint8_t *a = malloc(FOUR_CHUNKS);
  *after = malloc(ONE_CHUNK);
  REQUIRE(a && *after);
  REQUIRE(*after == a + 4 * HAK_LARGE_GRAIN);
  fill(a, FOUR_CHUNKS, 6);
  return a;
}

/* realloc moves a block that cannot grow in place chunk by chunk; when a
 * chunk after the first cannot move (its first page sealed, or where there
 * is no mseal protected apart, which splits the chunk's mapping: before
 * Linux 6.17 mremap moves a range of one mapping only, and either way
 * fails before it moves anything), the chunks moved go back and the
 * block is copied, whole. */
TEST(large_realloc_copies_a_block_whose_chunk_cannot_move) {
  hak_opt.purge_delay_ms = 100000;
  uint8_t *after, *a = block_that_must_move(&after);
  uint8_t *third = a - HAK_LARGE_OFFSET + 2 * HAK_LARGE_GRAIN;
  if (!seal_page(third)) REQUIRE(mprotect(third, 4096, PROT_READ) == 0);
  uint8_t *r = realloc(a, 6 * HAK_LARGE_GRAIN);
  REQUIRE(r != NULL);
  CHECK(r != a);
  size_t kept = verify(r, FOUR_CHUNKS, 6);
  CHECK_MSG(kept == FOUR_CHUNKS, "byte %zu of %zu not kept", kept, (size_t)FOUR_CHUNKS);
  memset(r, 1, 6 * HAK_LARGE_GRAIN);
  free(r);
  free(after);
}

/* Whether a failed mremap of two mappings, the second sealed, moved the
 * first (Linux 6.17 on moves them one by one): 1, 0, or -1 without mseal. */
static int kernel_moves_part_of_a_range(void) {
  uint8_t *m = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uint8_t *to = mmap(NULL, 2 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(m != MAP_FAILED && to != MAP_FAILED);
  m[0] = m[4096] = 1;
  if (!seal_page(m + 4096)) return -1;
  REQUIRE(mremap(m, 2 * 4096, 2 * 4096, MREMAP_MAYMOVE | MREMAP_FIXED, to) == MAP_FAILED);
  return resident_pages(m, 4096) < 0; /* its first page gone */
}

/* A chunk sealed after its first page: where the kernel moves that page
 * and then fails, realloc aborts naming the fault (the block has a hole
 * that nothing can fill again); where it fails first, realloc copies. */
TEST(large_realloc_of_a_chunk_the_kernel_moves_in_part_aborts_or_copies) {
  hak_opt.purge_delay_ms = 100000;
  int part = kernel_moves_part_of_a_range();
  if (part < 0) SKIP("no mseal on this kernel");
  uint8_t *after, *a = block_that_must_move(&after);
  REQUIRE(seal_page(a - HAK_LARGE_OFFSET + 2 * HAK_LARGE_GRAIN + 4096));
  int errp[2];
  REQUIRE(pipe(errp) == 0);
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(errp[1], 2);
    uint8_t *r = realloc(a, 6 * HAK_LARGE_GRAIN);
    _exit(r != NULL && r != a && verify(r, FOUR_CHUNKS, 6) == FOUR_CHUNKS ? 0 : 3);
  }
  close(errp[1]);
  char err[512] = "";
  ssize_t n = read(errp[0], err, sizeof err - 1);
  err[n > 0 ? n : 0] = 0;
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (part) {
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %#x", status);
    CHECK_MSG(strstr(err, "moved part of the range and failed") != NULL, "stderr: %s", err);
  } else {
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x, stderr: %s", status, err);
  }
}

/* Blocks of 1-6 chunks allocated, grown, shrunk and freed at random, 24
 * live at most: each keeps its bytes, and the arena reuses the free runs
 * (the span of addresses stays within twice the most live, where
 * runs lost to the search would take new chunks every time). */
TEST(large_blocks_of_several_chunks_reuse_free_runs) {
  hak_opt.purge_delay_ms = 100000;
  enum { SLOTS = 24, STEPS = 4000 };
  static uint8_t *slot[SLOTS];
  static size_t size[SLOTS];
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  uint32_t x = 2463534242u;
  for (int step = 0; step < STEPS; step++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    int k = (int)(x % SLOTS);
    size_t want = (size_t)(x >> 8) % (6 * HAK_LARGE_GRAIN - 8192 - HAK_BIG_MAX) + HAK_BIG_MAX + 1;
    if (slot[k] != NULL) {
      uint8_t tag = (uint8_t)k + 1;
      CHECK(slot[k][0] == tag && slot[k][size[k] - 1] == tag);
      if (x & 0x80) {
        free(slot[k]);
        slot[k] = NULL;
        continue;
      }
      uint8_t *r = realloc(slot[k], want);
      REQUIRE(r != NULL);
      CHECK(r[0] == tag && (want < size[k] || r[size[k] - 1] == tag));
      slot[k] = r;
    } else {
      REQUIRE((slot[k] = malloc(want)) != NULL);
    }
    size[k] = want;
    slot[k][0] = slot[k][want - 1] = (uint8_t)k + 1;
    if ((uintptr_t)slot[k] < lo) lo = (uintptr_t)slot[k];
    if ((uintptr_t)slot[k] + want > hi) hi = (uintptr_t)slot[k] + want;
  }
  size_t most = (size_t)SLOTS * 6 * HAK_LARGE_GRAIN;
  CHECK_MSG(hi - lo <= 2 * most, "blocks spread over %zu MiB; at most %zu MiB live",
            (size_t)(hi - lo) >> 20, most >> 20);
  for (int k = 0; k < SLOTS; k++) free(slot[k]);
}

/* A block that realloc grew grows again: its next chunk takes a free
 * chunk's pages whole, though the step needs a few of them, as the
 * growth within a chunk that holds its bytes could not take them any more. */
TEST(a_block_realloc_grows_again_takes_a_whole_chunk_of_committed_pages) {
  keep_freed_large_blocks();
  uint8_t *before = malloc(TWO_CHUNKS), *a = malloc(TWO_CHUNKS), *after = malloc(TWO_CHUNKS);
  uint8_t *x = malloc(HAK_LARGE_GRAIN - 3 * 4096); /* one chunk, last */
  REQUIRE(before && a && after && x > after);
  memset(a, 6, TWO_CHUNKS);
  free(a); /* the donor */
  x[0] = 1;
  uint8_t *y = realloc(x, HAK_LARGE_GRAIN - 2 * 4096); /* grown within its chunk */
  REQUIRE(y == x);
  y = realloc(x, HAK_LARGE_GRAIN + 8192); /* 12 KiB into the next chunk */
  REQUIRE(y == x);
  uint8_t *next = x - HAK_LARGE_OFFSET + HAK_LARGE_GRAIN;
  int taken = resident_pages(next, 256 * 4096);
  CHECK_MSG(taken == 256, "%d of the next chunk's first 256 pages resident", taken);
  CHECK(y[0] == 1);
  free(y);
  free(before);
  free(after);
}

/* Past HAKMEM_LARGE_CACHE_MB, the longest idle chunks go back to the OS,
 * and only as many as are too many: blocks freed within a millisecond of
 * each other are not purged all together. */
TEST(free_large_chunks_beyond_the_cache_bound_are_purged_no_more) {
  hak_opt.purge_delay_ms = 100000;
  hak_opt.large_cache_mb = 16;
  const size_t mib = (size_t)1 << 20, sz = 8 * mib - 4096; /* four chunks each */
  uint8_t *b[4];
  for (int i = 0; i < 4; i++) {
    REQUIRE((b[i] = malloc(sz)) != NULL);
    memset(b[i], 1, sz);
  }
  size_t before = atomic_load(&hak_gstats.large_cached);
  for (int i = 0; i < 4; i++) free(b[i]);
  size_t cached = atomic_load(&hak_gstats.large_cached) - before;
  CHECK_MSG(cached <= 16 * mib && cached >= 14 * mib, "%zu KiB cached, bound 16 MiB",
            cached >> 10);
  CHECK(resident_pages(b[3], 256 * 4096) == 256); /* the one freed last stays */
}

/* Free chunks of blocks that wrote their first page only count for what
 * they hold: the bound of committed bytes holds up to 4 times its bytes of
 * such chunks, not purged at each free. */
TEST(free_large_chunks_of_blocks_that_wrote_a_page_count_for_less_than_they_spanned) {
  hak_opt.purge_delay_ms = 100000;
  hak_opt.large_cache_mb = 16;
  const size_t mib = (size_t)1 << 20, sz = 8 * mib - 4096; /* four chunks each */
  for (int i = 0; i < 200; i++) { /* freed blocks are sampled: they wrote a page */
    uint8_t *p = malloc(sz);
    REQUIRE(p != NULL);
    p[0] = 1;
    free(p);
  }
  enum { N = 12 };
  uint8_t *b[N];
  for (int i = 0; i < N; i++) {
    REQUIRE((b[i] = malloc(sz)) != NULL);
    b[i][0] = 1;
  }
  size_t before = atomic_load(&hak_gstats.large_cached);
  for (int i = 0; i < N; i++) free(b[i]);
  size_t cached = atomic_load(&hak_gstats.large_cached) - before;
  CHECK_MSG(cached <= 64 * mib && cached >= 56 * mib, "%zu KiB cached, bound 4 x 16 MiB", cached >> 10);
  CHECK(resident_pages(b[N - 1], 4096) == 1); /* the one freed last stays */
}

/* A purge of free chunks counts their bytes returned once: committed went
 * below zero, by the chunks' size at each purge, and os_returned grew twice
 * as much as the purge returned. */
TEST(a_purge_of_large_chunks_counts_them_returned_once) {
  hak_opt.purge_delay_ms = 100000;
  size_t sz = (size_t)16 << 20;
  hak_stats_t before, after;
  hak_collect(true);
  hak_stats_get(&before);
  for (int round = 0; round < 3; round++) {
    uint8_t *volatile keep = malloc(sz);
    uint8_t *a = keep;
    REQUIRE(a != NULL);
    memset(a, 3, sz);
    free(a);
    hak_collect(true);
  }
  hak_stats_get(&after);
  CHECK_MSG((ptrdiff_t)after.committed >= 0, "committed %td", (ptrdiff_t)after.committed);
  CHECK_MSG(after.committed <= before.committed + ((size_t)1 << 20), "committed %zu KiB, %zu before",
            after.committed >> 10, before.committed >> 10);
  size_t returned = after.os_returned - before.os_returned;
  CHECK_MSG(returned >= 3 * sz && returned <= 3 * sz + ((size_t)12 << 20),
            "%zu KiB returned for 3 blocks of %zu KiB", returned >> 10, sz >> 10);
}

TEST(free_large_chunks_are_purged_after_delay) {
  hak_opt.purge_delay_ms = 50;
  start_purger();
  size_t sz = (size_t)8 << 20;
  uint8_t *a = malloc(sz);
  REQUIRE(a != NULL);
  memset(a, 3, sz);
  size_t cached = atomic_load(&hak_gstats.large_cached);
  free(a);
  CHECK(atomic_load(&hak_gstats.large_cached) >= cached + sz);
  struct timespec ts = {0, 400 * 1000000L};
  nanosleep(&ts, NULL);
  int resident = resident_pages(a, 64 * 4096);
  CHECK_MSG(resident == 0, "%d pages still resident", resident);
  CHECK(atomic_load(&hak_gstats.large_cached) == cached);
}

/* Out of memory, an allocation gives back what hakmem keeps and tries
 * again, unless it asks for more than hakmem holds: a probe for a huge
 * size fails with the caches left alone. */
TEST(huge_request_fails_without_emptying_the_caches) {
  keep_freed_large_blocks();
  size_t sz = (size_t)8 << 20;
  uint8_t *a = malloc(sz);
  REQUIRE(a != NULL);
  memset(a, 3, sz);
  free(a);
  size_t cached = atomic_load(&hak_gstats.large_cached);
  REQUIRE(cached >= sz);
  errno = 0;
  CHECK(malloc((size_t)1 << 47) == NULL && errno == ENOMEM); /* all user address space */
  CHECK(atomic_load(&hak_gstats.large_cached) == cached);
}

/* Whether the page at p is readable and writable, from /proc/self/maps. */
static bool page_accessible(const void *p) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL) return false;
  char line[512], perms[5] = "";
  unsigned long lo, hi;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && (uintptr_t)p >= lo && (uintptr_t)p < hi)
      break;
    else
      perms[0] = 0;
  fclose(f);
  return perms[0] == 'r' && perms[1] == 'w';
}

/* A fork makes read-only the segment map's bytes that no segment needs:
 * as bss, its 32 MiB were charged to the commit of the process and of each
 * child. A segment further down the address space makes its bytes
 * writable again, and one the limits refuse fails the open. */
TEST(segment_map_is_read_only_from_a_fork_but_where_segments_need_it) {
  uint8_t *p = malloc(64);
  REQUIRE(p != NULL && hak_segmap_has(p));
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(page_accessible(&hak_segmap[hak_segmap_slot(p)]) ? 0 : 1);
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(page_accessible(&hak_segmap[hak_segmap_slot(p)]));
  CHECK(!page_accessible(&hak_segmap[HAK_SEGMAP_SIZE - 1]));
  CHECK(hak_segment_of((void *)((uintptr_t)1 << 30)) == NULL); /* its byte reads 0 */
  uintptr_t far = (uintptr_t)1 << 40, farther = (uintptr_t)1 << 36;
  REQUIRE(!page_accessible(&hak_segmap[hak_segmap_slot_of_chunk(far >> HAK_SEG_SHIFT)]));
  pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) { /* a data limit already exceeded refuses the page */
    struct rlimit lim = {HAK_PAGE_SIZE, HAK_PAGE_SIZE};
    bool refused = setrlimit(RLIMIT_DATA, &lim) == 0 && !hak_segmap_open((void *)far, HAK_SEG_SIZE) &&
                   errno == ENOMEM;
    _exit(refused && !page_accessible(&hak_segmap[hak_segmap_slot_of_chunk(far >> HAK_SEG_SHIFT)]) ? 0 : 1);
  }
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(hak_segmap_open((void *)far, HAK_SEG_SIZE));
  CHECK(page_accessible(&hak_segmap[hak_segmap_slot_of_chunk(far >> HAK_SEG_SHIFT)]));
  CHECK(!page_accessible(&hak_segmap[hak_segmap_slot_of_chunk(farther >> HAK_SEG_SHIFT)]));
  CHECK(page_accessible(&hak_segmap[hak_segmap_slot(p)]));
  errno = 0;
  CHECK(!hak_segmap_open((void *)((HAK_SEGMAP_SIZE - 1) << HAK_SEG_SHIFT), HAK_SEG_SIZE) &&
        errno == ENOMEM); /* the chunk that stands for NULL */
  free(p);
}

/* A data limit that refuses the segment map's pages for the large arena
 * fails the malloc with ENOMEM, but leaves the arena to be tried again:
 * with the limit raised, the next large block is the arena's. */
TEST(an_arena_that_a_data_limit_refused_is_tried_again) {
  REQUIRE(hak_commit_strict == -1); /* not read yet */
  free(malloc(64));
  struct rlimit old, lim;
  REQUIRE(getrlimit(RLIMIT_DATA, &old) == 0);
  lim = (struct rlimit){HAK_PAGE_SIZE, old.rlim_max}; /* exceeded already: no page more */
  REQUIRE(setrlimit(RLIMIT_DATA, &lim) == 0);
  errno = 0;
  void *p = malloc(ONE_CHUNK);
  int refused = errno;
  REQUIRE(setrlimit(RLIMIT_DATA, &old) == 0);
  CHECK(p == NULL && refused == ENOMEM);
  uint8_t *q = malloc(ONE_CHUNK);
  REQUIRE(q != NULL);
  CHECK(hak_segmap_of(q) == HAK_SEGMAP_LARGE);
  memset(q, 1, ONE_CHUNK);
  free(q);
  free(p);
}

/* Under an address-space limit that refuses the arena's 64 GiB, the arena
 * is a quarter of what is left (between an eighth and a quarter), so that
 * large blocks still come from it and the program's own mappings and the
 * blocks it cannot hold still find room. */
TEST(under_an_address_space_limit_the_arena_takes_a_quarter_of_what_is_left) {
  REQUIRE(hak_commit_strict == -1); /* not read yet */
  size_t mib = 1 << 20;
  struct rlimit old, lim;
  REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
  lim = (struct rlimit){(size_t)th_proc_status("VmSize") * 1024 + 2048 * mib, old.rlim_max};
  REQUIRE(setrlimit(RLIMIT_AS, &lim) == 0);
  uint8_t *a = malloc(ONE_CHUNK);
  REQUIRE(a != NULL);
  CHECK(hak_segmap_of(a) == HAK_SEGMAP_LARGE);
  memset(a, 1, ONE_CHUNK);
  void *room = mmap(NULL, 1024 * mib, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  CHECK(room != MAP_FAILED);
  if (room != MAP_FAILED) munmap(room, 1024 * mib);
  uint8_t *big = malloc(600 * mib); /* more than the arena: a mapping of its own */
  CHECK(big != NULL && hak_segmap_of(big) == HAK_SEGMAP_SLABS);
  free(big);
  free(a);
  REQUIRE(setrlimit(RLIMIT_AS, &old) == 0);
}

/* The arena's reservation is inaccessible but for the chunks of blocks
 * (whole chunks, but under strict overcommit): mlockall would otherwise
 * fault in all 64 GiB of it. A purge empties the chunks; only under strict
 * overcommit does it make them inaccessible again (to give back their
 * charge). */
TEST(the_arena_is_inaccessible_but_for_the_chunks_of_blocks) {
  REQUIRE(hak_commit_strict == -1); /* not read yet */
  size_t size = HAK_BIG_MAX + 1;
  uint8_t *a = malloc(size);
  REQUIRE(a != NULL && hak_segmap_of(a) == HAK_SEGMAP_LARGE);
  memset(a, 1, size);
  uint8_t *chunk = (uint8_t *)hak_large_header(a);
  CHECK(page_accessible(chunk) && page_accessible(a + size - 1));
  CHECK(page_accessible(chunk + HAK_LARGE_GRAIN - HAK_PAGE_SIZE) == !hak_commit_strict);
  CHECK(!page_accessible(chunk + HAK_LARGE_GRAIN)); /* the next chunk, unused */
  free(a);
  hak_collect(true);
  CHECK(page_accessible(chunk) == !hak_commit_strict);
  CHECK(resident_pages(chunk, 256 * HAK_PAGE_SIZE) == 0);
}

/* Under strict overcommit every writable page a process maps is charged:
 * a new slab or span segment is reserved and made accessible unit by unit
 * as slabs and blocks take them, where every thread's segment took 4 MiB
 * of the commit limit. */
static void *fill_a_new_segment(void *arg) {
  enum { N = 40000 }; /* 2.5 MiB of 64-byte blocks: most of a segment */
  static uint8_t *ps[N];
  ps[0] = malloc(64);
  REQUIRE(ps[0] != NULL);
  hak_segment_t *seg = hak_segment_of(ps[0]);
  uint8_t *base = (uint8_t *)seg;
  page_accessible(base); /* its own blocks (fopen's) take their slabs first */
  size_t edge = seg->reserved_from;
  CHECK_MSG(edge >= HAK_UNIT_SIZE && edge <= HAK_SEG_SIZE / 4, "accessible up to %zu", edge);
  CHECK(page_accessible(base + edge - HAK_PAGE_SIZE) && !page_accessible(base + edge));
  CHECK(!page_accessible(base + HAK_SEG_SIZE - HAK_PAGE_SIZE));
  for (int i = 1; i < N; i++) {
    REQUIRE((ps[i] = malloc(64)) != NULL);
    memset(ps[i], 7, 64);
  }
  CHECK(hak_segment_of(ps[N - 1]) == seg && seg->reserved_from > edge);
  CHECK(page_accessible(ps[N - 1]) && !page_accessible(base + HAK_SEG_SIZE - HAK_PAGE_SIZE));
  for (int i = 0; i < N; i++) free(ps[i]);
  return arg;
}

TEST(under_strict_overcommit_segments_become_accessible_as_they_are_used) {
  hak_commit_strict = 1;
  run_thread(fill_a_new_segment, NULL);
  /* more than a segment of span blocks: the last ones are in a new one (a
   * runtime's blocks may have made the first before the test) */
  enum { N = 300, SIZE = 20000 };
  static uint8_t *spans[N];
  for (int i = 0; i < N; i++) {
    REQUIRE((spans[i] = malloc(SIZE)) != NULL && hak_segmap_of(spans[i]) == HAK_SEGMAP_SPANS);
    memset(spans[i], 1, SIZE);
  }
  hak_segment_t *seg = hak_segment_of(spans[N - 1]);
  CHECK(seg != hak_segment_of(spans[0]) && seg->reserved_from != 0);
  CHECK(page_accessible(spans[N - 1] + SIZE - 1) &&
        !page_accessible((uint8_t *)seg + HAK_SEG_SIZE - HAK_PAGE_SIZE));
  /* grown in place, into the reserved pages after it (no committed run
   * elsewhere, which it would take instead) */
  hak_span_flush(hak_tls_heap);
  hak_span_purge(true);
  enum { GROWN = 200000 };
  uint8_t *grown = realloc(spans[N - 1], GROWN);
  REQUIRE(grown != NULL);
  CHECK(grown == spans[N - 1] && grown[SIZE - 1] == 1);
  memset(grown, 2, GROWN);
  spans[N - 1] = grown;
  for (int i = 0; i < N; i++) free(spans[i]);
}

/* A program that locked its future memory (mlockall) has all it maps
 * faulted in and locked: the purger's stack (8 MiB by default) is locked
 * as the thread uses it. */
TEST(the_purgers_stack_is_locked_as_it_is_used) {
  /* a program with threads; the small stack glibc keeps for the next
   * thread would not do for the purger's */
  th_run_on_small_stack(no_work, NULL);
  REQUIRE(!atomic_load(&hak_purge_started) && mlockall(MCL_FUTURE) == 0);
  long before = th_vm_rss_kib();
  hak_purge_wake();
  hak_purge_start();
  for (int i = 0; i < 5000 && !atomic_load(&hak_purge_running); i++) usleep(1000);
  REQUIRE(atomic_load(&hak_purge_running));
  long grown = th_vm_rss_kib() - before;
  munlockall();
  printf("    %ld KiB more resident\n", grown);
  CHECK_MSG(grown < 1024, "%ld KiB more resident", grown);
}

/* The segment map past the segments' bytes, and the large arena's tables,
 * are mapped again read-only (hak_segmap_trim). A readable mapping in a
 * program that locked its future memory is faulted in whole: 32 MiB for
 * the map, before the range was made read-only from inaccessible. */
TEST(a_range_made_read_only_under_mlockall_is_not_faulted_in) {
  enum { SIZE = 8 << 20 };
  uint8_t *range = hak_os_map(SIZE);
  REQUIRE(range != NULL && mlockall(MCL_FUTURE) == 0);
  long before = th_vm_rss_kib();
  bool done = hak_os_read_only(range, SIZE);
  long grown = th_vm_rss_kib() - before;
  munlockall();
  REQUIRE(done);
  CHECK(range[0] == 0 && range[SIZE - 1] == 0);
  printf("    %ld KiB more resident\n", grown);
  CHECK_MSG(grown < 1024, "%ld KiB more resident", grown);
  hak_os_unmap(range, SIZE);
}

/* A page in memory is not a locked one: the page written (with zero, as
 * the probe discards it) and the page never written leave commits as they
 * were. */
TEST(a_page_in_memory_without_a_lock_leaves_commits_as_they_were) {
  REQUIRE(hak_commit_strict == -1); /* not read yet */
  uint8_t *page = hak_os_map(2 * HAK_PAGE_SIZE);
  REQUIRE(page != NULL);
  ((volatile uint8_t *)page)[0] = 0;
  CHECK(!hak_os_found_locked(page));
  CHECK(!hak_os_found_locked(page + HAK_PAGE_SIZE));
  CHECK(hak_commit_strict == -1);
  hak_os_unmap(page, 2 * HAK_PAGE_SIZE);
}

/* The pages of a range in memory, read from the page table. */
TEST(the_pages_in_memory_are_those_written) {
  enum { PAGES = 16 };
  uint8_t *range = hak_os_map(PAGES * HAK_PAGE_SIZE);
  REQUIRE(range != NULL);
  CHECK(hak_os_resident(range, PAGES * HAK_PAGE_SIZE) == 0);
  for (int i = 1; i < PAGES; i += 5) range[i * HAK_PAGE_SIZE + 100] = 1;
  CHECK(hak_os_resident(range, PAGES * HAK_PAGE_SIZE) == 3 * HAK_PAGE_SIZE);
  CHECK(hak_os_resident(range + 2 * HAK_PAGE_SIZE, 4 * HAK_PAGE_SIZE) == 0);
  hak_os_unmap(range, PAGES * HAK_PAGE_SIZE);
}

/* A page mlock faulted in, with the process's memory locked, is taken for
 * mlockall's: memory is made accessible as it is used from then on. */
TEST(a_locked_page_makes_commits_strict) {
  REQUIRE(hak_commit_strict == -1); /* not read yet */
  uint8_t *page = hak_os_map(HAK_PAGE_SIZE);
  REQUIRE(page != NULL && mlock(page, HAK_PAGE_SIZE) == 0);
  CHECK(hak_os_found_locked(page));
  CHECK(hak_commit_strict == 1);
  munlock(page, HAK_PAGE_SIZE);
  hak_os_unmap(page, HAK_PAGE_SIZE);
}

/* Under strict overcommit (vm.overcommit_memory 2) a read/write reservation
 * of the arena's 64 GiB would be refused: the arena is inaccessible but for
 * what blocks use, and a purge or a move makes chunks inaccessible again. */
TEST(under_strict_overcommit_blocks_make_accessible_what_they_use) {
  REQUIRE(hak_commit_strict == -1); /* not read yet */
  hak_commit_strict = 1;
  size_t kib = 1024, mib = 1024 * kib;
  uint8_t *a = malloc(1100 * kib);
  REQUIRE(a != NULL && hak_segmap_of(a) == HAK_SEGMAP_LARGE && hak_commit_strict == 1);
  memset(a, 1, 1100 * kib);
  uint8_t *chunk = (uint8_t *)hak_large_header(a);
  CHECK(page_accessible(chunk) && page_accessible(a + 1100 * kib - 1));
  CHECK(!page_accessible(chunk + HAK_LARGE_GRAIN - HAK_PAGE_SIZE));
  CHECK(!page_accessible(chunk + HAK_LARGE_GRAIN)); /* the next chunk, unused */
  /* grown in place, within its chunk and then over three */
  uint8_t *grown = realloc(a, 2000 * kib);
  REQUIRE(grown != NULL);
  CHECK(grown == a);
  memset(a = grown, 2, 2000 * kib);
  REQUIRE((grown = realloc(a, 5 * mib)) != NULL);
  CHECK(grown == a);
  memset((a = grown) + 2000 * kib, 3, 5 * mib - 2000 * kib);
  CHECK(a[0] == 2 && a[2000 * kib - 1] == 2 && a[5 * mib - 1] == 3);
  CHECK(page_accessible(a + 5 * mib - 1));
  CHECK(!page_accessible(chunk + 3 * HAK_LARGE_GRAIN)); /* a grown block's chunks are whole */
  /* a block after it holds it in place: the next growth moves its pages,
   * and the chunks they left are inaccessible again */
  uint8_t *b = malloc(1100 * kib);
  REQUIRE(b != NULL && b > a);
  uint8_t *c = realloc(a, 12 * mib);
  REQUIRE(c != NULL);
  CHECK(c != a && c[0] == 2 && c[5 * mib - 1] == 3);
  CHECK(!page_accessible(chunk) && !page_accessible(chunk + 2 * HAK_LARGE_GRAIN));
  memset(c, 4, 12 * mib);
  free(c);
  free(b);
  hak_collect(true);
  CHECK(!page_accessible(chunk) && !page_accessible(c));
  /* the chunks, purged, serve zeroed blocks again */
  uint8_t *d = calloc(1, 3 * mib);
  REQUIRE(d != NULL);
  size_t nonzero = 0;
  for (size_t i = 0; i < 3 * mib; i += 4096) nonzero += d[i] != 0;
  CHECK(nonzero == 0);
  memset(d, 5, 3 * mib);
  free(d);
}

/* A slab no list of the heap holds blocks of (detached) takes its owner's
 * frees on its own list and counts them. */
TEST(local_free_and_used_count) {
  enum { N = 50 };
  void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = malloc(48);
  hak_slab_t *slab = slab_of_ptr(ps[0]);
  for (int i = 0; i < N; i++) REQUIRE(slab_of_ptr(ps[i]) == slab);
  hak_heap_return_list(hak_tls_heap, slab->cls);
  REQUIRE(hak_slab_free_to(slab) == &slab->local_free);
  uint32_t used = slab->used;
  free(ps[N - 1]);
  CHECK(slab->used == used - 1);
  CHECK(slab->local_free == ps[N - 1]);
  free(ps[N - 2]);
  CHECK(slab->local_free == ps[N - 2]);
  CHECK(slab->local_free->next == ps[N - 1]);
  for (int i = 0; i < N - 2; i++) free(ps[i]);
  CHECK(slab->used == used - N);
}

/* Frees n blocks of size, all of one detached slab, in a shuffled order
 * into freed[], and mallocs n blocks of that size again into got[]. */
static void free_shuffled_and_take_back(size_t size, int n, void **freed, void **got) {
  enum { MORE = 300 };
  void *more[MORE];
  for (int i = 0; i < n; i++) freed[i] = malloc(size);
  hak_slab_t *slab = slab_of_ptr(freed[0]);
  hak_heap_t *heap = hak_tls_heap;
  size_t cls = slab->cls;
  for (int i = 0; i < n; i++) REQUIRE(slab_of_ptr(freed[i]) == slab);
  int m = use_up_list(cls, size, more, 0, MORE);
  hak_heap_return_list(heap, cls); /* detached: frees stay on the slab */
  REQUIRE(heap->queue[cls].first == slab);
  uint32_t x = 12345;
  for (int i = n - 1; i > 0; i--) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    int j = (int)(x % (uint32_t)(i + 1));
    void *t = freed[i];
    freed[i] = freed[j];
    freed[j] = t;
  }
  for (int i = 0; i < n; i++) free(freed[i]);
  for (int i = 0; i < n; i++) got[i] = malloc(size);
  for (int i = 0; i < n; i++) free(got[i]);
  for (int i = 0; i < m; i++) free(more[i]);
}

/* Blocks taken back from n freed in a shuffled order (see
 * free_shuffled_and_take_back): in address order, or the freed last
 * first. */
static int taken_ascending(int n, void **got) {
  int ascending = 0;
  for (int i = 1; i < n; i++) ascending += (uintptr_t)got[i] > (uintptr_t)got[i - 1];
  return ascending + 1;
}
static int taken_lifo(int n, void **freed, void **got) {
  int lifo = 0;
  for (int i = 0; i < n; i++) lifo += got[i] == freed[n - 1 - i];
  return lifo;
}

/* A small class's detached slab's list of HAK_SORT_MIN blocks or more
 * goes to the heap in address order, whatever the order of the frees: what
 * the program allocates next lies in a row. Shorter lists, and those of
 * larger blocks, come back in the reverse order of their frees, without a
 * walk. */
TEST(a_long_list_of_a_small_slab_comes_back_in_address_order) {
  enum { LONG = HAK_SORT_MIN + 16, SHORT = 40 };
  static void *freed[LONG], *got[LONG];
  free_shuffled_and_take_back(16, LONG, freed, got); /* 4096 in a unit */
  CHECK_MSG(taken_ascending(LONG, got) == LONG, "%d of %d in address order",
            taken_ascending(LONG, got), LONG);
  free_shuffled_and_take_back(500, SHORT, freed, got);
  CHECK_MSG(taken_lifo(SHORT, freed, got) == SHORT, "%d of %d freed last, taken first",
            taken_lifo(SHORT, freed, got), SHORT);
  free_shuffled_and_take_back(1200, SHORT, freed, got); /* 1280 B: 51 in a unit */
  CHECK_MSG(taken_lifo(SHORT, freed, got) == SHORT, "%d of %d freed last, taken first",
            taken_lifo(SHORT, freed, got), SHORT);
}

static size_t list_len(const hak_block_t *b) {
  size_t n = 0;
  for (; b; b = b->next) n++;
  return n;
}

static bool list_has(const hak_block_t *b, const void *p) {
  for (; b; b = b->next)
    if (b == p) return true;
  return false;
}

static size_t remote_count(hak_slab_t *slab) { return list_len(atomic_load(&slab->remote)); }
static bool on_remote_list(hak_slab_t *slab, const void *p) {
  return list_has(atomic_load(&slab->remote), p);
}

/* Once the heap takes a list of used blocks from a slab, the slab is
 * attached: its frees go to the heap's list, so malloc returns the block
 * freed last. Its used count is then no count; detaching (the list given
 * back) counts the blocks again. */
TEST(attached_slab_reuses_the_block_freed_last) {
  enum { N = 20, MORE = 400 }; /* fewer than HAK_SORT_MIN: the list keeps its order */
  void *ps[N], *more[MORE];
  for (int i = 0; i < N; i++) ps[i] = malloc(720);
  hak_slab_t *slab = slab_of_ptr(ps[0]);
  hak_heap_t *heap = hak_tls_heap;
  size_t cls = slab->cls;
  int m = use_up_list(cls, 720, more, 0, MORE);
  hak_heap_return_list(heap, cls); /* detached: frees stay on the slab */
  for (int i = 0; i < N; i++) REQUIRE(slab_of_ptr(ps[i]) == slab);
  for (int i = 0; i < N; i++) free(ps[i]);
  CHECK(hak_slab_free_to(slab) == &slab->local_free);
  CHECK(slab->local_free == ps[N - 1]);
  void *a = malloc(720); /* the refill takes the freed blocks */
  CHECK(a == ps[N - 1]);
  CHECK(hak_slab_free_to(slab) == &heap->free[cls]);
  void *b = malloc(720);
  free(a);
  CHECK(heap->free[cls] == a && slab->local_free == NULL);
  CHECK(malloc(720) == a);
  /* 2^31 frees without a refill bring the count to 0: it starts over */
  slab->used = 1;
  free(a);
  CHECK(slab->state == HAK_SLAB_ACTIVE && slab->used > slab->capacity);
  free(b);
  size_t listed = list_len(heap->free[cls]) + list_len(slab->local_free);
  uint32_t reserved = slab->reserved;
  void *head = heap->free[cls];
  hak_heap_return_list(heap, cls);
  CHECK(hak_slab_free_to(slab) == &slab->local_free);
  CHECK(slab->used == reserved - listed);
  CHECK(slab->local_free == head); /* one slab's list goes back whole, in its order */
  int ours = 0;
  for (int i = 0; i < m; i++) {
    ours += slab_of_ptr(more[i]) == slab;
    free(more[i]);
  }
  CHECK(slab->used == reserved - listed - ours);
}

/* A slab of two units or more: a free into its last unit goes where the
 * slab's frees go (every unit has its own copy of that list's address):
 * its own list, or the heap's while it is attached. */
TEST(a_free_into_any_unit_of_a_long_slab_goes_to_its_list) {
  enum { MAX = 20000 };
  static void *ps[MAX];
  int n = 0;
  void *p = NULL;
  hak_slab_t *slab = NULL;
  while (p == NULL) { /* a block in the last unit of a long slab */
    REQUIRE(n < MAX);
    void *q = ps[n++] = malloc(48);
    hak_slab_t *s = slab_of_ptr(q);
    uintptr_t unit = ((uintptr_t)q & HAK_SEG_MASK) >> HAK_UNIT_SHIFT;
    if (s->units >= 2 && unit == s->index + s->units - 1u) p = q, slab = s;
  }
  hak_segment_t *seg = hak_segment_of_slab(slab);
  hak_heap_t *heap = hak_tls_heap;
  size_t cls = slab->cls;
  for (unsigned u = slab->index; u < slab->index + slab->units; u++)
    CHECK(seg->unit[u].slab == slab && seg->unit[u].free_to == &heap->free[cls]);
  hak_heap_return_list(heap, cls); /* detached */
  for (unsigned u = slab->index; u < slab->index + slab->units; u++)
    CHECK(seg->unit[u].free_to == &slab->local_free);
  free(p);
  CHECK(slab->local_free == p);
  n = use_up_list(cls, 48, ps, n, MAX);
  CHECK(malloc(48) == p); /* the refill took the slab's list: attached */
  for (unsigned u = slab->index; u < slab->index + slab->units; u++)
    CHECK(seg->unit[u].free_to == &heap->free[cls]);
  free(p);
  CHECK(heap->free[cls] == p && slab->local_free == NULL);
  hak_heap_return_list(heap, cls);
  for (unsigned u = slab->index; u < slab->index + slab->units; u++)
    CHECK(seg->unit[u].free_to == &slab->local_free);
  for (int i = 0; i < n; i++)
    if (ps[i] != p) free(ps[i]);
}

/* Refills that take the freed blocks of other slabs keep the slabs they
 * took before attached (up to HAK_ATTACH_MAX), so the heap's list mixes
 * their blocks; returning it gives each block to its own slab, whose used
 * count is then the blocks still out. */
TEST(returning_the_list_of_several_attached_slabs_gives_each_block_to_its_slab) {
  enum { MAX = 20000, SLABS = 8, SIZE = 80 };
  static void *held[MAX], *churn[MAX];
  int n = 0, m = 0;
  hak_slab_t *slabs[SLABS];
  int nslabs = 0;
  while (nslabs < 4) { /* blocks on four slabs of the class, or more */
    REQUIRE(n < MAX);
    hak_slab_t *s = slab_of_ptr(held[n++] = malloc(SIZE));
    int k = 0;
    while (k < nslabs && slabs[k] != s) k++;
    if (k == nslabs) {
      REQUIRE(nslabs < SLABS);
      slabs[nslabs++] = s;
    }
  }
  hak_heap_t *heap = hak_tls_heap;
  size_t cls = slabs[0]->cls;
  int kept = 0;
  for (int i = 0; i < n; i++) /* every other block back: no slab empties */
    if (i % 2) free(held[i]);
    else held[kept++] = held[i];
  while (heap->attached_n[cls] < 2) { /* refills that take other slabs' blocks */
    REQUIRE(m < MAX);
    churn[m++] = malloc(SIZE);
  }
  for (int i = 0; i < m; i++) free(churn[i]);
  hak_heap_return_list(heap, cls);
  CHECK(heap->attached_n[cls] == 0 && heap->free[cls] == NULL);
  for (int k = 0; k < nslabs; k++) {
    hak_slab_t *s = slabs[k];
    uint32_t out = 0;
    for (int i = 0; i < kept; i++) out += slab_of_ptr(held[i]) == s;
    size_t on_list = 0;
    for (hak_block_t *b = s->local_free; b != NULL; b = hak_next(b)) {
      CHECK(slab_of_ptr(b) == s);
      on_list++;
    }
    CHECK_MSG(s->used == out, "slab %d: used %u, %u blocks out", k, s->used, out);
    CHECK(on_list == s->reserved - out);
    CHECK(hak_slab_free_to(s) == &s->local_free);
  }
  for (int i = 0; i < kept; i++) free(held[i]);
}

typedef struct {
  void **ps;
  int n;
} batch_t;

static void *free_batch(void *arg) {
  batch_t *b = arg;
  for (int i = 0; i < b->n; i++) free(b->ps[i]);
  return NULL;
}

/* Blocks other threads freed into a FULL slab are taken before a refill
 * carves new ones from the current slab: a producer whose consumers free
 * its blocks (xmalloc) otherwise touched a fresh page for most refills. */
static void *full_slab_revived_before_carving(void *arg) {
  (void)arg;
  enum { MAX = 20000, SIZE = 176 };
  static void *ps[MAX];
  int n = 0;
  hak_heap_t *heap = NULL;
  size_t cls = hak_size_class(SIZE);
  do { /* until a slab of the class has gone FULL */
    REQUIRE(n < MAX);
    ps[n++] = malloc(SIZE);
    heap = hak_tls_heap;
  } while (heap->full[cls].first == NULL);
  hak_slab_t *full = heap->full[cls].first, *cur = heap->queue[cls].first;
  REQUIRE(cur != NULL && cur->reserved < cur->capacity); /* room to carve */
  static void *mine[8];
  int k = 0;
  for (int i = 0; i < n && k < 8; i++)
    if (slab_of_ptr(ps[i]) == full) mine[k++] = ps[i], ps[i] = NULL;
  REQUIRE(k == 8);
  batch_t b = {mine, k};
  run_thread(free_batch, &b); /* remote frees into the FULL slab */
  CHECK(atomic_load(&heap->full_remote) != 0);
  n = use_up_list(cls, SIZE, ps, n, MAX);
  uint32_t carved = cur->reserved;
  void *p = malloc(SIZE);
  CHECK_MSG(slab_of_ptr(p) == full, "the refill took %p, not a block of the FULL slab", p);
  CHECK(cur->reserved == carved);
  CHECK(full->state == HAK_SLAB_ACTIVE);
  free(p);
  for (int i = 0; i < n; i++) free(ps[i]);
  return NULL;
}
TEST(a_refill_takes_remote_frees_of_full_slabs_before_carving) {
  run_thread(full_slab_revived_before_carving, NULL);
}

/* Before carving, a refill takes the blocks freed into the one of the
 * class's next 15 slabs that has the most, if a carve's worth: with
 * the frees of a random loop spread over a class's slabs, carving on
 * touched a fifth more blocks than were ever live, and a slab with a block
 * or two would make each refill another. */
static void *most_freed_taken_before_carving(void *arg) {
  enum { MAX = 4000, SIZE = 3000, SLABS = 5, MANY = 6 }; /* a carve is 4 */
  static void *ps[MAX];
  hak_slab_t *seen[SLABS];
  int n = 0, k = 0;
  size_t cls = hak_size_class(SIZE);
  while (k < SLABS) { /* until SLABS slabs of the class went FULL */
    REQUIRE(n < MAX);
    ps[n++] = malloc(SIZE);
    k = 0;
    for (hak_slab_t *s = hak_tls_heap->full[cls].first; s != NULL && k < SLABS; s = s->next)
      seen[k++] = s;
  }
  /* one block back into each (they come back on the queue in that order),
   * then MANY more into the last, by this thread or another */
  static void *many[MANY];
  for (int j = 0; j < SLABS; j++) {
    int want = j < SLABS - 1 ? 1 : 1 + MANY;
    for (int i = 0; i < n && want > 0; i++)
      if (ps[i] != NULL && slab_of_ptr(ps[i]) == seen[j]) {
        if (j == SLABS - 1 && want <= MANY) many[MANY - want] = ps[i];
        else free(ps[i]);
        ps[i] = NULL;
        want--;
      }
  }
  if (*(bool *)arg) {
    batch_t b = {many, MANY};
    run_thread(free_batch, &b); /* onto the slab's remote list */
  } else {
    for (int j = 0; j < MANY; j++) free(many[j]);
  }
  n = use_up_list(cls, SIZE, ps, n, MAX);
  hak_slab_t *cur = hak_tls_heap->queue[cls].first;
  REQUIRE(cur != NULL && cur->reserved < cur->capacity && !cur->local_free); /* room to carve */
  REQUIRE(cur->next != NULL && cur->next != seen[SLABS - 1]); /* a slab of one block first */
  uint32_t carved = cur->reserved;
  void *p = malloc(SIZE);
  CHECK_MSG(slab_of_ptr(p) == seen[SLABS - 1],
            "the refill took %p, not a block of the slab with the most", p);
  CHECK(cur->reserved == carved);
  free(p);
  for (int i = 0; i < n; i++) free(ps[i]);
  return NULL;
}
TEST(a_refill_takes_the_slab_with_the_most_freed_before_carving) {
  bool remote = false;
  run_thread(most_freed_taken_before_carving, &remote);
}

/* The same with the blocks freed by another thread: a producer whose
 * consumers free its blocks would otherwise carve while they wait. */
TEST(a_refill_counts_other_threads_frees_before_carving) {
  bool remote = true;
  run_thread(most_freed_taken_before_carving, &remote);
}

TEST(remote_frees_are_collected_by_owner) {
  enum { N = 64 };
  void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = malloc(200);
  hak_slab_t *slab = slab_of_ptr(ps[0]);
  batch_t b = {ps, N};
  run_thread(free_batch, &b);
  size_t on_remote = remote_count(slab);
  size_t same_slab = 0;
  for (int i = 0; i < N; i++) same_slab += slab_of_ptr(ps[i]) == slab;
  CHECK(on_remote == same_slab);
  CHECK(slab->local_free == NULL || on_remote < N);
  /* drain the thread's list so the next malloc refills from the slab */
  hak_stats_t before, after;
  hak_stats_get(&before);
  uint32_t used_before = slab->used;
  hak_heap_t *heap = hak_tls_heap;
  size_t cls = slab->cls;
  while (heap->free[cls]) (void)malloc(200);
  hak_block_t *remote_head = atomic_load(&slab->remote);
  void *got = malloc(200);
  hak_stats_get(&after);
  CHECK(after.remote_collects > before.remote_collects);
  CHECK(atomic_load(&slab->remote) == NULL);
  /* the refill took the remote list whole, in its order, as the heap's list,
   * attaching the slab: detaching it counts its blocks again */
  CHECK(got == remote_head);
  CHECK(list_len(heap->free[cls]) == on_remote - 1);
  CHECK(hak_slab_free_to(slab) == &heap->free[cls]);
  size_t listed = list_len(heap->free[cls]) + list_len(slab->local_free);
  hak_heap_return_list(heap, cls);
  CHECK(slab->used == slab->reserved - listed);
  CHECK(slab->used <= used_before);
}

typedef struct {
  batch_t batch, later;
  sem_t freed, go;
} held_frees_t;

/* Frees batch, waits, calls hak_collect, waits, frees later, waits, exits. */
static void *free_in_steps(void *arg) {
  held_frees_t *h = arg;
  free_batch(&h->batch);
  sem_post(&h->freed);
  sem_wait(&h->go);
  hak_collect(false);
  sem_post(&h->freed);
  sem_wait(&h->go);
  free_batch(&h->later);
  sem_post(&h->freed);
  sem_wait(&h->go);
  return NULL;
}

/* Frees blocks of `size` from another thread in steps: they go over to
 * their slab an outbox (hak_outbox_bytes) at a time, at hak_collect, and
 * at the thread's exit. */
static void remote_frees_go_over_an_outbox_at_a_time(size_t size) {
  enum { N = 64 };
  void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = malloc(size);
  hak_slab_t *slab = slab_of_ptr(ps[0]);
  int n = 0;
  while (n < N && slab_of_ptr(ps[n]) == slab) n++;
  size_t bs = slab->block_size, per_push = (hak_outbox_bytes(slab->cls) + bs - 1) / bs;
  int first = (int)(2 * per_push + 3), later = 4;
  REQUIRE(per_push > (size_t)later && n >= first + later);
  n = first + later;
  held_frees_t h = {.batch = {ps, first}, .later = {ps + first, later}};
  sem_init(&h.freed, 0, 0);
  sem_init(&h.go, 0, 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, free_in_steps, &h) == 0);
  sem_wait(&h.freed);
  /* each push took the blocks that filled an outbox; the last 3 wait */
  CHECK(remote_count(slab) == 2 * per_push);
  sem_post(&h.go);
  sem_wait(&h.freed);
  CHECK(remote_count(slab) == (size_t)first); /* hak_collect handed them over */
  sem_post(&h.go);
  sem_wait(&h.freed);
  CHECK(remote_count(slab) == (size_t)first); /* 4 blocks fill no outbox */
  sem_post(&h.go);
  pthread_join(t, NULL);
  CHECK(remote_count(slab) == (size_t)n); /* the thread's exit handed over the rest */
  for (int i = n; i < N; i++) free(ps[i]);
  sem_destroy(&h.freed);
  sem_destroy(&h.go);
}

TEST(remote_frees_of_small_blocks_go_over_a_page_at_a_time_at_collect_and_at_exit) {
  remote_frees_go_over_an_outbox_at_a_time(200);
  CHECK(hak_outbox_bytes(hak_size_class(200)) == HAK_PAGE_SIZE);
}

/* A page holds 2 blocks of 2 KiB: pushes of 2 left the consumer of a
 * pipeline waiting on each push's locked instruction. */
TEST(remote_frees_of_2_KiB_blocks_go_over_8_at_a_time) {
  remote_frees_go_over_an_outbox_at_a_time(2000);
  CHECK(hak_outbox_bytes(hak_size_class(2000)) / hak_class_size[hak_size_class(2000)] == 8);
}

TEST(empty_slabs_are_released) {
  /* Three slabs' worth of 1 KiB blocks: the non-current ones go FREE when
   * they empty. The class is then down to its current slab, which gets the
   * heap's list back and goes too when its last block is freed. */
  start_purger();
  enum { N = 3 * 64 };
  void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = malloc(1024);
  hak_slab_t *first = slab_of_ptr(ps[0]);
  hak_slab_t *last = slab_of_ptr(ps[N - 1]);
  REQUIRE(first != last);
  for (int i = 0; i < N; i++) free(ps[i]);
  CHECK_MSG(first->state == HAK_SLAB_FREE, "state %d used %u", first->state, first->used);
  CHECK_MSG(last->state == HAK_SLAB_FREE, "state %d used %u", last->state, last->used);
  CHECK(hak_tls_heap->free[hak_size_class(1024)] == NULL);
}

/* ---- units: slab memory shared by every class ---- */

/* A first slab of 1000-byte blocks, FULL, whose blocks are all freed while
 * the class allocates from a second one: it goes back to its segment, its
 * unit still committed (nothing else is: hak_release_all first). */
static hak_slab_t *release_full_slab(void) {
  enum { N = 80 }; /* 64 blocks per unit, 52 in unit 0 */
  char *ps[N];
  start_purger(); /* before: starting it allocates */
  hak_release_all();
  for (int i = 0; i < N; i++) {
    ps[i] = malloc(1000);
    memset(ps[i], 3, 1000);
  }
  hak_slab_t *first = slab_of_ptr(ps[0]);
  REQUIRE(first->units == 1 && first->state == HAK_SLAB_FULL);
  for (int i = 0; i < N; i++)
    if (slab_of_ptr(ps[i]) == first) free(ps[i]);
  REQUIRE(first->state == HAK_SLAB_FREE);
  return first;
}

/* Free units of seg whose memory is committed. */
static uint64_t committed_free_units(const hak_segment_t *seg) {
  return seg->free_units & ~seg->zero_units;
}

TEST(freed_slab_units_serve_another_class) {
  hak_opt.purge_delay_ms = 100000;
  hak_slab_t *first = release_full_slab();
  hak_segment_t *seg = hak_segment_of_slab(first);
  uint64_t committed = committed_free_units(seg);
  REQUIRE(committed >> first->index & 1);
  void *q = malloc(3000); /* a class with no slab yet */
  hak_slab_t *s = slab_of_ptr(q);
  CHECK(s->units == 1);
  CHECK(hak_segment_of_slab(s) == seg);
  CHECK_MSG(committed >> s->index & 1, "took unit %u, not a committed free one", s->index);
  free(q);
}

/* A new slab of the given size's class, which had none: taking it looks
 * at the classes that refilled before the last two new slabs. */
static void *new_class_block(size_t size) {
  size_t taken = atomic_load(&hak_gstats.slabs_allocated);
  void *p = malloc(size);
  REQUIRE(p != NULL);
  REQUIRE(atomic_load(&hak_gstats.slabs_allocated) == taken + 1);
  return p;
}

TEST(a_class_left_with_every_block_free_gives_its_slab_to_new_classes) {
  /* 16 blocks of 3,000 B written and freed, as a buffer grown by realloc
   * leaves a class: the third new class's slab finds the class idle, its
   * blocks all on the heap's list, and takes its unit, committed. One
   * block still out keeps a class's slab. */
  hak_opt.purge_delay_ms = 100000;
  start_purger(); /* before: starting it allocates */
  hak_release_all();
  enum { N = 16 };
  char *left[N], *kept[N];
  for (int i = 0; i < N; i++) {
    left[i] = malloc(3000);
    kept[i] = malloc(1800);
    memset(left[i], 1, 3000);
    memset(kept[i], 1, 1800);
  }
  hak_slab_t *gone = slab_of_ptr(left[0]), *stays = slab_of_ptr(kept[0]);
  for (int i = 0; i < N; i++) free(left[i]);
  for (int i = 1; i < N; i++) free(kept[i]);
  REQUIRE(gone->state == HAK_SLAB_ACTIVE);
  void *a = new_class_block(5000), *b = new_class_block(6000);
  CHECK(gone->state == HAK_SLAB_ACTIVE); /* idle for one new slab only */
  void *c = new_class_block(7000);
  CHECK_MSG(slab_of_ptr(c) == gone, "the new slab took unit %u, not the idle class's %u",
            slab_of_ptr(c)->index, gone->index);
  CHECK(hak_tls_heap->free[hak_size_class(3000)] == NULL);
  CHECK(hak_tls_heap->queue[hak_size_class(3000)].first == NULL);
  CHECK(hak_tls_heap->attached_n[hak_size_class(3000)] == 0);
  CHECK(stays->state == HAK_SLAB_ACTIVE);
  CHECK(hak_tls_heap->free[hak_size_class(1800)] != NULL);
  void *again = malloc(3000); /* the class takes a slab again */
  CHECK(again != NULL && slab_of_ptr(again) != slab_of_ptr(c));
  free(again);
  free(a);
  free(b);
  free(c);
  free(kept[0]);
}

TEST(a_class_left_idle_gives_back_every_slab_it_had) {
  /* Two slabs of 3,000 B blocks attached at once: the first filled, five
   * of its blocks freed, which a refill takes before carving more of the
   * second. All freed, the class is idle by the third new class's slab
   * and keeps none. */
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  hak_release_all();
  enum { N = 80 };
  size_t cls = hak_size_class(3000);
  char *p[N];
  int n = 0;
  p[n++] = malloc(3000);
  hak_slab_t *first = slab_of_ptr(p[0]);
  while (n < N && slab_of_ptr(p[n - 1]) == first) p[n++] = malloc(3000);
  REQUIRE(slab_of_ptr(p[n - 1]) != first);
  for (int i = 0; i < 5; i++) free(p[i]);
  int from = 5, again = 0;
  while (n < N && again == 0) {
    p[n] = malloc(3000);
    REQUIRE(p[n] != NULL);
    again += slab_of_ptr(p[n++]) == first;
  }
  REQUIRE(again == 1);
  REQUIRE(hak_tls_heap->attached_n[cls] == 2);
  hak_slab_t *second = slab_of_ptr(p[n - 2]);
  for (int i = from; i < n; i++) free(p[i]);
  void *a = new_class_block(5000), *b = new_class_block(6000), *c = new_class_block(7000);
  CHECK(hak_tls_heap->free[cls] == NULL);
  CHECK(hak_tls_heap->queue[cls].first == NULL && hak_tls_heap->full[cls].first == NULL);
  CHECK(hak_tls_heap->attached_n[cls] == 0);
  CHECK(first->state == HAK_SLAB_FREE || first->cls != cls);
  CHECK(second->state == HAK_SLAB_FREE || second->cls != cls);
  free(a);
  free(b);
  free(c);
}

/* A 4-unit slab (a busy class's) with one committed free unit and fresh
 * ones: it takes the committed unit, shortened to it, rather than touch
 * new memory. */
TEST(slab_shortens_to_committed_units) {
  hak_opt.purge_delay_ms = 100000;
  hak_slab_t *first = release_full_slab();
  hak_heap_t *heap = hak_tls_heap;
  bool adopted, new_pages;
  pthread_mutex_lock(&heap->lock);
  hak_slab_t *s = hak_segment_alloc_slab(heap, 4, 960, &adopted, &new_pages);
  pthread_mutex_unlock(&heap->lock);
  REQUIRE(s != NULL);
  CHECK(s == first);
  CHECK(!new_pages);
  CHECK(s->units == 1);
}

/* Whether the heap's segments with free units all come before the full
 * ones (the search for units stops at the first full one). */
static bool segments_ordered(const hak_heap_t *heap) {
  bool full_seen = false;
  for (hak_segment_t *seg = heap->segments; seg; seg = seg->next) {
    if (seg->free_units != 0 && full_seen) return false;
    full_seen |= seg->free_units == 0;
  }
  return true;
}

TEST(segments_with_free_units_come_first) {
  enum { N = 14000 }; /* 1000-byte blocks: more than three segments */
  static char *ps[N];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(1000)) != NULL);
  hak_heap_t *heap = hak_tls_heap;
  CHECK(segments_ordered(heap));
  int first = 0; /* a block of a full segment, allocated long ago */
  while (first < N / 2 && hak_segment_of(ps[first])->free_units != 0) first++;
  REQUIRE(first < N / 2);
  hak_segment_t *seg = hak_segment_of(ps[first]);
  hak_slab_t *slab = slab_of_ptr(ps[first]);
  for (int i = 0; i < N; i++)
    if (slab_of_ptr(ps[i]) == slab) free(ps[i]); /* not the current slab: released */
  CHECK(seg->free_units != 0);
  CHECK(segments_ordered(heap));
  void *q = malloc(3000); /* a new class's slab: in that segment's free unit */
  CHECK(hak_segment_of(q) == seg);
}

/* A new segment's header is written on its first page alone (the unit
 * table) until slabs take units: a thread with a few slabs does not make
 * the 8 KiB of the 64 descriptors resident. */
static void *first_small_blocks(void *arg) {
  void **out = arg;
  size_t segments = atomic_load(&hak_gstats.segments);
  for (int i = 0; i < 3; i++) out[i] = malloc((size_t)16 << (4 * i)); /* 16, 256, 4096 B */
  out[3] = (void *)(atomic_load(&hak_gstats.segments) - segments);
  return NULL;
}
TEST(a_new_segment_makes_the_first_page_of_its_header_resident_alone) {
  hak_opt.segment_cache = 0; /* new segments are fresh ones */
  hak_release_all();
  void *out[4];
  run_thread(first_small_blocks, out);
  REQUIRE(out[0] && out[1] && out[2] && out[3] == (void *)1); /* one new segment */
  hak_segment_t *seg = hak_segment_of(out[0]);
  int resident = resident_pages(seg, HAK_SEG_HEADER);
  CHECK_MSG(resident == 1, "%d of the header's %zu pages resident", resident, HAK_SEG_HEADER / 4096);
  for (int i = 0; i < 3; i++) {
    hak_slab_t *slab = slab_of_ptr(out[i]);
    CHECK(hak_segment_of(out[i]) == seg);
    CHECK_MSG(slab->index == (uintptr_t)(slab - seg->slabs), "slab of unit %td says %u",
              slab - seg->slabs, slab->index);
    CHECK(hak_slab_state(slab) != HAK_SLAB_FREE && slab->units >= 1);
    free(out[i]);
  }
}

/* A class that filled a slab is busy: its next slabs hold at least
 * HAK_BUSY_BLOCKS blocks and are twice as long as the slab it filled last,
 * so more of its frees go to the attached slab. Returns the units of the
 * slab of the n-th block of size. */
static unsigned busy_class_slab_units(size_t size, int n) {
  void **ps = calloc((size_t)n, sizeof *ps);
  REQUIRE(ps != NULL);
  hak_release_all(); /* no committed free unit left: slabs get their full length */
  for (int i = 0; i < n; i++) ps[i] = malloc(size);
  hak_slab_t *first = slab_of_ptr(ps[0]), *last = slab_of_ptr(ps[n - 1]);
  CHECK(first->units == 1);
  CHECK(first->state == HAK_SLAB_FULL);
  CHECK(last != first);
  CHECK_MSG(last->capacity >= HAK_BUSY_BLOCKS, "%zu B: capacity %u", size, last->capacity);
  unsigned units = last->units;
  for (int i = 0; i < n; i++) free(ps[i]);
  free(ps);
  return units;
}

TEST(a_class_that_filled_a_slab_takes_longer_slabs) {
  start_purger(); /* before: starting it allocates */
  unsigned u = busy_class_slab_units(700, 200); /* 768 B: 85 in one unit, 256 in 3 */
  CHECK_MSG(u == 3, "768 B: %u units", u);
  u = busy_class_slab_units(6000, 40); /* 6 KiB: 10 in one unit, 256 in 24 */
  CHECK_MSG(u == 24, "6 KiB: %u units", u);
  /* 288 B: 227 in one unit, 455 in two (filled), then 4 units */
  u = busy_class_slab_units(280, 227 + 455 + 10);
  CHECK_MSG(u == 4, "288 B: %u units", u);
}

/* The units of the first n slabs that blocks of size fill one after
 * another in units[]; as slab back_at starts (0: never), the first block
 * is freed, back to its FULL slab. */
static void growing_class_slab_units(size_t size, unsigned *units, int n, int back_at) {
  enum { MAX = 8192 };
  void **ps = calloc(MAX, sizeof *ps);
  hak_slab_t *seen[8];
  REQUIRE(ps != NULL && n <= 8);
  hak_release_all(); /* no committed free unit left: slabs get their full length */
  int blocks = 0, slabs = 0;
  while (slabs < n) {
    REQUIRE(blocks < MAX);
    void *p = ps[blocks++] = malloc(size);
    REQUIRE(p != NULL);
    hak_slab_t *s = slab_of_ptr(p);
    bool old = false;
    for (int i = 0; i < slabs; i++) old |= seen[i] == s;
    if (old) continue;
    seen[slabs] = s;
    units[slabs++] = s->units;
    if (slabs == back_at) {
      free(ps[0]);
      ps[0] = NULL;
    }
  }
  for (int i = 0; i < blocks; i++) free(ps[i]);
  free(ps);
}

/* A class that only grows doubles its slabs up to 8 units: blocks that
 * leave in the order they came (buffers that move on to the next class
 * together) then empty one slab after another for the next class. */
TEST(a_class_that_only_grows_doubles_its_slabs_to_8_units_at_most) {
  start_purger(); /* before: starting it allocates */
  unsigned u[5];
  growing_class_slab_units(1000, u, 5, 0); /* 1 KiB: 64 in a unit, 256 in 4 */
  CHECK_MSG(u[0] == 1 && u[1] == 4 && u[2] == 8 && u[3] == 8 && u[4] == 8,
            "1 KiB: %u, %u, %u, %u, %u units", u[0], u[1], u[2], u[3], u[4]);
}

/* Once a block has come back to one of its slabs, the class doubles on:
 * 1, 4, 8, then 4, 8, 16 and 32 units (the first slab, refilled with that
 * block, is the one filled last when the fourth comes, which doubles it). */
TEST(a_class_whose_block_came_back_doubles_its_slabs_past_8_units) {
  start_purger();
  unsigned u[7];
  growing_class_slab_units(1000, u, 7, 3);
  CHECK_MSG(u[5] > 8 && u[6] > u[5], "1 KiB: %u, %u, %u, %u, %u, %u, %u units", u[0], u[1], u[2],
            u[3], u[4], u[5], u[6]);
}

/* ---- spans ---- */

static uint32_t page_word(const void *p) {
  return hak_segment_of(p)->span.page[hak_span_page_index(p)];
}
/* malloc's number in the entry of p's page: the cache free puts its block in. */
static size_t page_number(const void *p) { return hak_span_entry_number(hak_span_entry(hak_segment_of(p), p)); }
/* The first page of span block p (which starts at that page's colour, or
 * at the page). */
static uint8_t *page_start(const void *p) { return (uint8_t *)hak_page_down((uintptr_t)p); }

/* The class an aligned span block takes: that of the size rounded up to
 * the alignment if that is at most twice the size, else the size's own. */
static size_t aligned_span_class(size_t align, size_t size) {
  size_t need = hak_aligned_need(size, align);
  size_t want = need <= 2 * (size + HAK_CANARY) ? need : size + HAK_CANARY;
  size_t cls = HAK_SLAB_CLASSES;
  while (hak_class_size[cls] < want) cls++;
  return cls;
}

/* Alignments of 8 KiB to 256 KiB, for sizes up to 256 KiB, are span
 * blocks at that alignment, of aligned_span_class; live together, they
 * do not overlap. */
TEST(aligned_span_blocks_are_aligned_and_take_their_class) {
  enum { N = 48 };
  for (size_t align = 2 * HAK_PAGE_SIZE; align <= HAK_BIG_MAX; align *= 2) {
    for (size_t size = 1; size + HAK_CANARY <= HAK_BIG_MAX; size = size * 3 + 1000) {
      uint8_t *p[N];
      size_t cls = aligned_span_class(align, size);
      for (int i = 0; i < N; i++) {
        REQUIRE((p[i] = aligned_alloc(align, size)) != NULL);
        CHECK_MSG(((uintptr_t)p[i] & (align - 1)) == 0, "align %zu size %zu", align, size);
        CHECK(hak_segment_of(p[i])->kind == HAK_KIND_SPANS);
        CHECK_MSG(malloc_usable_size(p[i]) == hak_class_size[cls] - HAK_CANARY,
                  "align %zu size %zu: %zu usable", align, size, malloc_usable_size(p[i]));
        memset(p[i], i, size);
      }
      for (int i = 0; i < N; i++) {
        CHECK(p[i][0] == (uint8_t)i && p[i][size - 1] == (uint8_t)i);
        free(p[i]);
      }
    }
  }
}

/* A freed aligned block comes back to the next request of its alignment
 * and class, from the thread's cache; with blocks at other places on top
 * of the cache, the request cuts a run of the page heap at its alignment,
 * and the pages before the block stay free. */
TEST(aligned_span_blocks_come_back_from_the_cache_or_are_cut_at_their_alignment) {
  hak_opt.purge_delay_ms = 100000;
  const size_t align = 65536, size = 20000;
  void *p = aligned_alloc(align, size);
  REQUIRE(p != NULL);
  free(p);
  CHECK(aligned_alloc(align, size) == p);
  void *u[64];
  int n = 0;
  do REQUIRE(n < 64 && (u[n++] = malloc(size)) != NULL);
  while (((uintptr_t)u[n - 1] & (align - 1)) == 0);
  free(u[--n]); /* the top of the cache, not aligned */
  uint8_t *q = aligned_alloc(align, size);
  REQUIRE(q != NULL);
  CHECK(((uintptr_t)q & (align - 1)) == 0 && (void *)q != p);
  if (hak_span_page_index(q) > HAK_SPAN_FIRST_PAGE) { /* the last page of a free run or a block */
    uint32_t before = page_word(q - HAK_PAGE_SIZE) & HAK_PAGE_TAG;
    CHECK_MSG(before == HAK_PAGE_FREE || before == HAK_PAGE_TAIL, "the page before holds %u", before);
  }
  free(q);
  free(p);
  while (n > 0) free(u[--n]);
}

/* Aligned and plain span blocks of random sizes, freed and reallocated at
 * random: runs cut at an alignment, with pages left before the blocks, and
 * merged again, keep every block's bytes. */
TEST(aligned_and_plain_span_blocks_at_random_keep_their_bytes) {
  enum { SLOTS = 200, STEPS = 6000 };
  static uint8_t *p[SLOTS];
  static size_t sz[SLOTS];
  uint64_t r = 88172645463325252ull;
  for (int step = 0; step < STEPS; step++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    int k = (int)(r % SLOTS);
    if (p[k]) {
      CHECK_MSG(p[k][0] == (uint8_t)k && p[k][sz[k] / 2] == (uint8_t)k && p[k][sz[k] - 1] == (uint8_t)k,
                "step %d: slot %d of %zu bytes overwritten", step, k, sz[k]);
      if ((r >> 40) % 4 == 0) {
        size_t n = 1 + (r >> 20) % (HAK_BIG_MAX - HAK_CANARY);
        REQUIRE((p[k] = realloc(p[k], n)) != NULL);
        if (n > sz[k]) memset(p[k] + sz[k], k, n - sz[k]);
        sz[k] = n;
        continue;
      }
      free(p[k]);
      p[k] = NULL;
      continue;
    }
    sz[k] = 1 + (r >> 20) % (HAK_BIG_MAX - HAK_CANARY);
    size_t align = (size_t)HAK_PAGE_SIZE << (1 + (r >> 10) % 7); /* 8 KiB .. 512 KiB */
    bool aligned = (r >> 50) % 2;
    REQUIRE((p[k] = aligned ? aligned_alloc(align, sz[k]) : malloc(sz[k])) != NULL);
    if (aligned) CHECK(((uintptr_t)p[k] & (align - 1)) == 0);
    memset(p[k], k, sz[k]);
  }
  for (int k = 0; k < SLOTS; k++) free(p[k]);
}

/* Blocks of the span classes: at their first page's colour, or at the
 * page for a size that does not fit after every colour; their class and
 * length in their first page's word. */
TEST(span_blocks_are_runs_of_pages_of_a_span_segment) {
  size_t sizes[] = {HAK_SLAB_MAX + 1, 8192, 8193, 20000, 40000, 100000, HAK_BIG_MAX};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint8_t *p = malloc(sizes[i]);
    REQUIRE(p != NULL);
    hak_segment_t *seg = hak_segment_of(p);
    REQUIRE(seg != NULL);
    CHECK(seg->kind == HAK_KIND_SPANS);
    size_t cls = hak_size_class(sizes[i]);
    bool fits = fits_every_colour(cls, sizes[i] + HAK_CANARY);
    CHECK(hak_page_offset(p) == (fits ? hak_span_colour(p) : 0));
    CHECK(hak_span_page_index(p) >= HAK_SPAN_FIRST_PAGE);
    uint32_t w = page_word(p);
    CHECK((w & HAK_PAGE_TAG) == HAK_PAGE_USED);
    CHECK(hak_span_word_class(w) == cls);
    CHECK((w >> 16) == hak_class_size[cls] / HAK_PAGE_SIZE);
    uint16_t e = hak_span_entry(seg, p); /* free's and realloc's test */
    CHECK(hak_span_entry_number(e) == (fits ? cls : hak_span_at_page(cls)) && hak_span_entry_is_block(e, p));
    CHECK(!hak_span_entry_is_block(e, p + 64) && !hak_span_entry_is_block(e, page_start(p) + (hak_page_offset(p) ? 0 : 64)));
    CHECK(page_number(p + HAK_PAGE_SIZE) == 0);
    CHECK(malloc_usable_size(p) == hak_class_size[cls] - hak_page_offset(p) - HAK_CANARY);
    CHECK(hak_slab_of(seg, p)->owner == 0); /* free's slab test fails: the span path */
    memset(p, 1, sizes[i]);
    free(p);
  }
}

/* malloc's number of a span size: the cache its blocks come from and go
 * back to (its class's, or that of the class's blocks at their page's start). */
static size_t span_number(size_t size) { return hak_size_number(size + HAK_CANARY); }

/* The heap's cache of a class holds the blocks freed to it, counted by
 * its head block's depth. */
static size_t cache_len(size_t cls) { return list_len(hak_tls_heap->free[cls]); }
static unsigned cache_counted(size_t cls) { return hak_span_count(hak_tls_heap, cls); }

TEST(span_frees_go_to_the_cache_of_the_freeing_thread) {
  size_t cls = hak_size_class(40000);
  void *a = malloc(40000);
  REQUIRE(a != NULL);
  size_t before = cache_len(cls);
  free(a);
  CHECK(hak_tls_heap->free[cls] == a);
  CHECK(cache_len(cls) == before + 1);
  CHECK(cache_counted(cls) == cache_len(cls));
  CHECK(malloc(40000) == a); /* the block freed last comes back first */
  free(a);
}

/* Past its bound, a cache gives the batch freed last back to the page
 * heap: the blocks' pages are a free run again. */
TEST(full_span_cache_gives_a_batch_back) {
  enum { N = 64 };
  size_t cls = hak_size_class(40000), c = cls - HAK_SLAB_CLASSES;
  void *ps[N];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(40000)) != NULL);
  hak_heap_t *heap = hak_tls_heap;
  unsigned max = heap->span_max[c];
  REQUIRE(max < N);
  for (int i = 0; i < N; i++) {
    free(ps[i]);
    CHECK(cache_counted(cls) <= max);
  }
  CHECK(cache_counted(cls) == cache_len(cls));
  size_t given_back = 0;
  for (int i = 0; i < N; i++) {
    bool used = (page_word(ps[i]) & HAK_PAGE_TAG) == HAK_PAGE_USED;
    given_back += !used;
    CHECK(page_number(ps[i]) == (used ? cls : 0)); /* free's fast path sees it too */
  }
  CHECK_MSG(given_back == N - cache_len(cls), "%zu of %d blocks given back, %zu cached",
            given_back, N, cache_len(cls));
}

/* A cache that overflowed and then ran dry may hold a batch more. */
TEST(span_cache_grows_when_it_overflowed_and_ran_dry) {
  enum { N = 64 };
  size_t cls = hak_size_class(40000), c = cls - HAK_SLAB_CLASSES;
  void *ps[N];
  free(malloc(40000)); /* the heap exists */
  hak_heap_t *heap = hak_tls_heap;
  unsigned max = heap->span_max[c];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(40000)) != NULL);
  CHECK(heap->span_max[c] == max); /* running dry alone does not grow it */
  for (int i = 0; i < N; i++) free(ps[i]); /* overflows */
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(40000)) != NULL); /* runs dry */
  CHECK_MSG(heap->span_max[c] > max, "bound %u, was %u", heap->span_max[c], max);
  for (int i = 0; i < N; i++) free(ps[i]);
}

/* A heap's fills of a span class take 1, 2, 4, ... blocks up to a batch
 * (8 of 8 KiB). A pool of a thousand threads, each with a buffer of 8 KiB,
 * wrote the first page of 8 blocks in each; bash's few blocks of a class
 * wrote a batch's pages for one or two. */
#define FIRST_FILLS 5
static void *first_fills(void *arg) {
  size_t cls = span_number(8000);
  unsigned *took = arg;
  void *ps[FIRST_FILLS * 8]; /* batches of 8 at most */
  size_t n = 0;
  for (int f = 0; f < FIRST_FILLS; f++) {
    REQUIRE(cache_len(cls) == 0);
    ps[n++] = malloc(8000); /* the fill, which hands out one of what it took */
    took[f] = (unsigned)cache_len(cls) + 1;
    while (cache_len(cls) > 0 && n < sizeof ps / sizeof ps[0]) ps[n++] = malloc(8000);
  }
  for (size_t i = 0; i < n; i++) free(ps[i]);
  return NULL;
}
TEST(a_heaps_fills_of_a_span_class_double_from_one_block_to_a_batch) {
  unsigned took[FIRST_FILLS];
  run_thread(first_fills, took);
  unsigned batch = (64 << 10) / hak_class_size[hak_size_class(8000)]; /* span.c's BATCH_BYTES */
  unsigned want[FIRST_FILLS] = {1, 2, 4, batch, batch};
  for (int f = 0; f < FIRST_FILLS; f++)
    CHECK_MSG(took[f] == want[f], "fill %d took %u blocks, want %u", f, took[f], want[f]);
}

/* Gives every span cache of this thread back to the page heap. */
static void flush_span_caches(void) { hak_span_flush(hak_tls_heap); }

/* Every span fill of this thread's heap takes a batch from here on, as a
 * heap's fills of a class do after its first few: for tests of where the
 * blocks of a batch lie and how caches fill. */
static void fill_span_batches(void) {
  free(malloc(16)); /* the thread has its heap */
  memset(hak_tls_heap->span_fill_next, UINT8_MAX, sizeof hak_tls_heap->span_fill_next);
}

/* A cache that overflowed and then ran dry grows even when its class's
 * other cache serves the malloc that found it empty, as its refill would. */
TEST(span_cache_served_by_the_other_grows_as_if_refilled) {
  size_t fits = 40000, cls = span_number(fits), c = cls - HAK_SLAB_CLASSES;
  size_t big = hak_class_size[cls] - HAK_CANARY;
  REQUIRE(span_number(big) == hak_span_at_page(cls));
  free(malloc(16)); /* the thread has its heap */
  flush_span_caches();
  hak_heap_t *heap = hak_tls_heap;
  unsigned max = heap->span_max[c];
  void *ps[8];
  REQUIRE(max < 8);
  for (int i = 0; i < 8; i++) REQUIRE((ps[i] = malloc(fits)) != NULL);
  for (int i = 0; i < 8; i++) free(ps[i]); /* overflows */
  REQUIRE(heap->span_max[c] == max);
  for (unsigned i = 0; i < max; i++) REQUIRE((ps[i] = malloc(fits)) != NULL); /* empties it */
  REQUIRE(heap->free[cls] == NULL);
  void *q = malloc(big);
  REQUIRE(q != NULL);
  free(q); /* the cache of blocks at their page's start holds it */
  void *r = malloc(fits);
  CHECK(r == q);
  CHECK_MSG(heap->span_max[c] > max, "bound %u, was %u", heap->span_max[c], max);
  free(r);
  for (unsigned i = 0; i < max; i++) free(ps[i]);
}

/* Blocks of one class from one fill start at colours that differ from
 * page to page, each the one its page's entry gives. */
TEST(span_blocks_start_at_their_pages_colours) {
  enum { N = 32 };
  fill_span_batches();
  uint8_t *p[N];
  unsigned seen = 0;
  for (int i = 0; i < N; i++) {
    REQUIRE((p[i] = malloc(10000)) != NULL);
    uint16_t e = hak_span_entry(hak_segment_of(p[i]), p[i]);
    CHECK(hak_page_offset(p[i]) == hak_span_colour(p[i]) && hak_span_entry_offset(e) == hak_page_offset(p[i]));
    seen |= 1u << (hak_page_offset(p[i]) >> 6);
  }
  CHECK_MSG(__builtin_popcount(seen) >= 8, "%d colours in %d blocks", __builtin_popcount(seen), N);
  for (int i = 0; i < N; i++) free(p[i]);
}

/* A size that does not fit after every colour of its class has malloc's
 * own number, the list of the class's blocks at their page's start: its
 * malloc takes a block there, its free puts it back there, and a size that
 * fits after the colours takes it when the class's own list is empty. */
TEST(a_size_past_the_largest_colour_starts_at_its_page) {
  size_t cls = hak_size_class(10000), big = hak_class_size[cls] - HAK_CANARY, at_page = hak_span_at_page(cls);
  REQUIRE(fits_every_colour(cls, 10000) && !fits_every_colour(cls, big + HAK_CANARY));
  CHECK(hak_size_number(big + HAK_CANARY) == at_page);
  flush_span_caches();
  uint8_t *p = malloc(big);
  REQUIRE(p != NULL);
  CHECK(hak_page_offset(p) == 0 && malloc_usable_size(p) == big);
  CHECK(page_number(p) == at_page && hak_span_entry_offset(hak_span_entry(hak_segment_of(p), p)) == 0);
  memset(p, 3, big);
  free(p);
  CHECK(hak_tls_heap->free[at_page] == (void *)p);
  CHECK(malloc(big) == p); /* malloc's fast path */
  free(p);
  REQUIRE(hak_tls_heap->free[cls] == NULL);
  uint8_t *q = malloc(10000);
  CHECK(q == p && page_number(q) == at_page);
  free(q);
  CHECK(hak_tls_heap->free[at_page] == (void *)p);
}

/* With the list at pages' starts empty, such a size takes the head of the
 * class's list, which starts at its colour, and moves it to its page's
 * start for good. */
TEST(a_size_past_the_colours_moves_a_coloured_block_to_its_page) {
  size_t cls = hak_size_class(10000), big = hak_class_size[cls] - HAK_CANARY, at_page = hak_span_at_page(cls);
  flush_span_caches();
  free(malloc(10000));
  uint8_t *head = (uint8_t *)hak_tls_heap->free[cls];
  REQUIRE(head != NULL && hak_tls_heap->free[at_page] == NULL);
  uint8_t *p = malloc(big);
  CHECK(p == page_start(head) && page_number(p) == at_page);
  CHECK(hak_span_entry_is_block(hak_span_entry(hak_segment_of(p), p), p));
  free(p);
  CHECK(hak_tls_heap->free[at_page] == (void *)p);
}

/* calloc of a size past the colours clears a block of the class's list of
 * fresh pages whole when it moves to its page's start: the fill wrote its
 * list words at its colour, and the list at pages' starts, whose last
 * refill's blocks were zero memory, did not hand it out. */
static void *calloc_past_colours(void *arg) {
  static const size_t sizes[] = {12288, 16384, 20480, 32768}; /* batches of 2 or more */
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i] - HAK_CANARY, cls = hak_size_class(n);
    uint8_t *first = calloc(1, n); /* the first refill of the list at pages' starts: one block */
    hak_tls_heap->span_fill_next[cls - HAK_SLAB_CLASSES] = UINT8_MAX;
    uint8_t *kept = malloc(n - HAK_SPAN_COLOUR_MAX); /* the class's list's refill: a batch */
    uint8_t *head = (uint8_t *)hak_tls_heap->free[cls];
    REQUIRE(first != NULL && kept != NULL && head != NULL);
    uint8_t *p = calloc(1, n);
    REQUIRE(p == page_start(head));
    size_t nonzero = 0;
    for (size_t k = 0; k < n; k++) nonzero += p[k] != 0;
    CHECK_MSG(nonzero == 0, "%zu bytes of calloc(1, %zu) not zero", nonzero, n);
    *(int *)arg += hak_page_offset(head) != 0; /* its words were elsewhere */
    free(p);
    free(kept);
    free(first);
  }
  return NULL;
}
TEST(calloc_of_a_size_past_the_colours_is_zero) {
  flush_span_caches();
  hak_release_all(); /* the fills take zero pages: calloc clears only what they wrote */
  int moved = 0;
  run_thread(calloc_past_colours, &moved);
  CHECK(moved > 0);
}

/* Polls cond every 10 ms for up to 3 s: a span run freed while the program
 * grows (as a test's own allocations make it) waits HAK_GROWTH_WAIT purge
 * delays, not one. */
#define WAIT_FOR(cond)                                                           \
  for (int waited_ = 0; !(cond) && waited_ < 300; waited_++) usleep(10000)

/* The point of spans: the pages a freed block gives back serve a block of
 * another size, without page faults. */
TEST(freed_span_pages_serve_a_block_of_another_size) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  hak_release_all(); /* no other committed free run */
  uint8_t *a = malloc(80000), *guard = malloc(80000);
  REQUIRE(a && guard);
  memset(a, 5, 80000);
  free(a);
  flush_span_caches();
  CHECK((page_word(a) & HAK_PAGE_TAG) == HAK_PAGE_FREE);
  uint8_t *b = malloc(30000); /* another class: the best committed run */
  CHECK(b == a);
  int resident = resident_pages(b, 8 * 4096);
  CHECK_MSG(resident == 8, "%d of 8 pages resident: reuse would fault", resident);
  free(b);
  free(guard);
}

/* A span block left in its cache (the only one of its class, as a hash
 * table's old buckets) goes back to the OS once slabs fault in new pages:
 * the small blocks that grow in its stead are not held beside it. */
TEST(slabs_taking_new_pages_purge_a_span_block_left_in_a_cache) {
  hak_opt.purge_delay_ms = 100000; /* no purge by time */
  flush_span_caches();
  hak_release_all(); /* the slabs' free units too: taking one faults */
  uint8_t *left = malloc(300000);
  REQUIRE(left);
  memset(left, 1, 300000);
  free(left);
  size_t cls = hak_size_class(300000 + HAK_CANARY);
  REQUIRE(cache_counted(cls) + cache_counted(hak_span_at_page(cls)) == 1);
  enum { SMALL = 20000 };
  static void *small[SMALL];
  for (int i = 0; i < SMALL; i++) REQUIRE((small[i] = malloc(48)) != NULL);
  int resident = resident_pages(page_start(left) + 4096, 64 * 4096);
  CHECK_MSG(resident == 0, "%d of 64 pages of the span block still resident", resident);
  for (int i = 0; i < SMALL; i++) free(small[i]);
}

/* Blocks *a and *b, of sizes sa and sb, in a row from a fresh run (the
 * page heap emptied first, each class's first fill one block), and a guard
 * of sa after them; a and b written and freed, a first if a_first, and the
 * caches flushed, so that both are the page heap's. */
static void spans_in_a_row_freed(size_t sa, size_t sb, bool a_first, uint8_t **a, uint8_t **b,
                                 uint8_t **guard) {
  flush_span_caches();
  hak_release_all();
  *a = malloc(sa), *b = malloc(sb), *guard = malloc(sa);
  REQUIRE(*a && *b && *guard);
  REQUIRE(page_start(*b) == page_start(*a) + hak_class_size[hak_size_class(sa + HAK_CANARY)] &&
          page_start(*guard) == page_start(*b) + hak_class_size[hak_size_class(sb + HAK_CANARY)]);
  memset(*a, 1, sa);
  memset(*b, 1, sb);
  free(a_first ? *a : *b);
  free(a_first ? *b : *a);
  flush_span_caches();
}

/* Blocks of up to 16 pages given back side by side stay runs of their
 * own, until a block needs them together. */
TEST(adjacent_free_spans_merge_when_a_block_needs_them) {
  hak_opt.purge_delay_ms = 100000;
  uint8_t *a, *b, *guard;
  spans_in_a_row_freed(40000, 40000, false, &a, &b, &guard);
  uint32_t w = page_word(a);
  REQUIRE((w & HAK_PAGE_TAG) == HAK_PAGE_FREE);
  CHECK((page_word(b) & HAK_PAGE_TAG) == HAK_PAGE_FREE && page_word(b) != w); /* apart */
  uint8_t *c = malloc(81920); /* no dirty run fits: the two make one (at its page: no room for a colour) */
  CHECK(c == page_start(a));
  CHECK(page_word(b) == 0); /* inside c */
  free(c);
  free(guard);
}

/* A longer block given back merges with its free neighbours at once. */
TEST(adjacent_long_free_spans_merge_at_once) {
  hak_opt.purge_delay_ms = 100000;
  uint8_t *a, *b, *guard;
  spans_in_a_row_freed(120000, 120000, false, &a, &b, &guard);
  uint32_t w = page_word(a);
  REQUIRE((w & HAK_PAGE_TAG) == HAK_PAGE_FREE);
  CHECK(page_word(b) == 0); /* inside the run now */
  CHECK(page_word(b + 131072 - 4096) == w); /* the run's last page */
  free(guard);
}

/* The page heap's run records suffice however its segments are cut. A
 * 20 KiB block shrunk by realloc to 8 KiB gives back a 3-page tail, which
 * an 8 KiB block cuts to one page; freed, the two blocks stay runs apart:
 * three runs per 5 pages, side by side, on a hundred segments (the pool
 * held one record per 2 pages, and ran out). */
TEST(span_run_records_suffice_for_short_runs_side_by_side) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  hak_release_all();
  enum { N = 100 * (HAK_SPAN_PAGES - HAK_SPAN_FIRST_PAGE) / 5 };
  char **w = malloc(N * sizeof *w), **x = malloc(N * sizeof *x);
  REQUIRE(w && x);
  for (int i = 0; i < N; i++) REQUIRE((w[i] = malloc(20000)) != NULL);
  for (int i = 0; i < N; i++) REQUIRE(realloc(w[i], 8000) == w[i]);
  for (int i = 0; i < N; i++) REQUIRE((x[i] = malloc(8000)) != NULL);
  for (int i = 0; i < N; i++) {
    free(w[i]);
    free(x[i]);
  }
  flush_span_caches();
  int three = 0;
  for (int i = 0; i < N; i++) {
    uint32_t a = page_word(w[i]), b = page_word(w[i] + 8192), c = page_word(w[i] + 16384);
    three += (a & b & c & HAK_PAGE_TAG) == HAK_PAGE_FREE && a != b && b != c;
  }
  CHECK_MSG(three > N * 9 / 10, "%d of %d blocks left three runs", three, N);
  char *p = malloc(200000); /* the records still serve the page heap */
  REQUIRE(p != NULL);
  memset(p, 1, 200000);
  free(p);
  free(w);
  free(x);
}

/* The next block of a freed block's length takes its run, though the run
 * has a free neighbour that a block of another length left: merged, the
 * block would take the pages at the front of both. */
TEST(a_freed_span_run_serves_the_next_block_of_its_length) {
  hak_opt.purge_delay_ms = 100000;
  uint8_t *a, *b, *guard;
  spans_in_a_row_freed(40000, 20000, true, &a, &b, &guard);
  uint8_t *d = malloc(20000);
  CHECK(d == b);
  free(d);
  free(guard);
}

/* Page words name free runs by a handle into the pool of run records:
 * with more free runs at once than the pool's first chunk holds (5,461),
 * the holes left by freeing every other block of 8 KiB (purged: neighbours
 * in use, they stay runs of their own) are found again by blocks of their
 * size, and the segments' runs are walked when they go. */
static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return (x > y) - (x < y);
}
TEST(thousands_of_free_runs_are_found_by_their_handles) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  hak_release_all(); /* no committed free run: the holes are the only ones */
  enum { N = 12000 };
  static void *ps[N], *holes[N / 2];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(8192)) != NULL);
  flush_span_caches();
  for (int i = 0; i < N / 2; i++) free(holes[i] = ps[2 * i]);
  flush_span_caches();
  hak_span_purge(true); /* and the 4 MiB that waited in the class's transfer */
  int runs = 0;
  for (int i = 0; i < N / 2; i++) {
    uint32_t w = page_word(holes[i]);
    runs += (w & HAK_PAGE_TAG) == HAK_PAGE_FREE && page_word((uint8_t *)holes[i] + 4096) == w;
  }
  /* but for what a thread that only frees stages, less than a batch */
  CHECK_MSG(runs > N / 2 - 8, "%d of %d holes are free runs of their own", runs, N / 2);
  qsort(holes, N / 2, sizeof holes[0], cmp_ptr);
  /* a few more than the holes: blocks the thread staged come first */
  enum { M = N / 2 + 64 };
  static void *again[M];
  int found = 0;
  for (int i = 0; i < M; i++) {
    REQUIRE((again[i] = malloc(8192)) != NULL);
    found += bsearch(&again[i], holes, N / 2, sizeof holes[0], cmp_ptr) != NULL;
  }
  CHECK_MSG(found == N / 2, "%d of %d holes taken again", found, N / 2);
  for (int i = 0; i < N / 2; i++) free(ps[2 * i + 1]);
  for (int i = 0; i < M; i++) free(again[i]);
  flush_span_caches();
  hak_release_all(); /* walks every run of the segments that go */
}

/* Past its first 64 chunks (349,504 records, for 1.3 GiB of span segments)
 * the pool names its chunks through a table it maps. Runs whose records
 * come from there are walked by their segments' page words, merge with the
 * blocks freed beside them, and go with their segments. Without a purge
 * delay, what comes back is purged at once: the blocks' pages, written by
 * free, do not add up to gigabytes. A page word names its record's chunk
 * in its bits 15 and up. */
TEST_T(runs_whose_records_lie_past_the_first_64_chunks_are_walked_merged_and_go, 180) {
  hak_opt.purge_delay_ms = 0;
  free(malloc(8192)); /* the thread's heap, mapped at its first malloc */
  flush_span_caches();
  hak_release_all();
  size_t mapped_before = atomic_load(&hak_gstats.mapped);
  enum { N = 2 * 352000 }; /* 5.4 GiB of 8 KiB blocks */
  static void *ps[N];
  uint8_t *lo = NULL, *hi = NULL; /* blocks in a row, whose pages the caches' lists wrote */
  for (int i = 0; i < N; i++) {
    REQUIRE((ps[i] = malloc(8192)) != NULL);
    if (ps[i] != hi) {
      if (lo) madvise(lo, (size_t)(hi - lo), MADV_DONTNEED);
      lo = ps[i];
    }
    hi = (uint8_t *)ps[i] + 8192;
  }
  madvise(lo, (size_t)(hi - lo), MADV_DONTNEED);
  for (int i = 0; i < N; i += 2) free(ps[i]);
  flush_span_caches();
  hak_span_purge(true); /* and the 4 MiB that waited in the class's transfer */
  uint32_t far = 0;
  for (int i = 0; i < N; i += 2) {
    uint32_t w = page_word(ps[i]);
    if ((w & HAK_PAGE_TAG) == HAK_PAGE_FREE && w >> 15 > far) far = w >> 15;
  }
  CHECK_MSG(far >= 64, "the furthest chunk named: %u", far);
  hak_usage_t u = {0};
  hak_span_usage(&u);
  size_t cls = hak_size_class(8192);
  /* but for what a thread that only frees stages, less than a batch */
  CHECK_MSG(u.blocks_used[cls] >= N / 2 && u.blocks_used[cls] < N / 2 + 8,
            "%zu blocks of 8 KiB found by walking the runs, %d in use", u.blocks_used[cls], N / 2);
  for (int i = 1; i < N; i += 2) free(ps[i]);
  flush_span_caches();
  hak_release_all();
  /* The segments went. The pool's chunks (67 MiB, a record for each page
   * of the segments) and table go with the last span segment: a block a
   * runtime took before the test (UBSan's) keeps them. */
  size_t mapped_after = atomic_load(&hak_gstats.mapped);
  CHECK_MSG(mapped_after < mapped_before + ((size_t)128 << 20), "%zu KiB mapped after, %zu before",
            mapped_after >> 10, mapped_before >> 10);
}

/* The usable size of a new block of the given size. */
static size_t class_usable(size_t size) { return hak_class_size[hak_size_class(size + HAK_CANARY)] - HAK_CANARY; }

TEST(a_slab_block_grown_by_a_little_moves_a_quarter_up) {
  uint8_t *p = malloc(1000);
  REQUIRE(p != NULL);
  fill(p, 1000, 5); /* the bytes asked for (the sanitizers check the object size) */
  size_t old = malloc_usable_size(p);
  uint8_t *q = realloc(p, old + 1); /* a class an eighth up would hold it */
  REQUIRE(q != NULL);
  CHECK_MSG(malloc_usable_size(q) >= old + old / 4, "%zu B grew to %zu", old, malloc_usable_size(q));
  CHECK(verify(q, 1000, 5) == 1000);
  size_t big = 2 * malloc_usable_size(q) + 1; /* more than a quarter: the size asked */
  uint8_t *r = realloc(q, big);
  REQUIRE(r != NULL);
  CHECK(malloc_usable_size(r) == class_usable(big));
  CHECK(verify(r, 1000, 5) == 1000);
  free(r);
  /* A quarter up is past the slab classes: the first span class, not
   * the slab class an eighth up (6 KiB went through 6.5 and 7 KiB). */
  uint8_t *s = malloc(6000);
  REQUIRE(s != NULL);
  old = malloc_usable_size(s);
  REQUIRE(class_usable(old + 1) < HAK_SLAB_MAX - HAK_CANARY + 1);
  uint8_t *t = realloc(s, old + 1);
  REQUIRE(t != NULL);
  CHECK_MSG(malloc_usable_size(t) == class_usable(HAK_SLAB_MAX - HAK_CANARY + 1), "%zu B grew to %zu", old,
            malloc_usable_size(t));
  free(t);
}

TEST(span_realloc_grows_and_shrinks_in_place) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  hak_release_all();
  uint8_t *a = malloc(20000), *b = malloc(20000), *guard = malloc(20000);
  REQUIRE(a && b && guard && b == a + 20480);
  fill(a, 20000, 7);
  free(b);
  flush_span_caches();
  uint8_t *r = realloc(a, 40000); /* into b's pages */
  CHECK(r == a);
  CHECK(verify(r, 20000, 7) == 20000);
  CHECK(malloc_usable_size(r) == 40960);
  r = realloc(r, 12000); /* below half: the tail goes back */
  CHECK(r == a);
  CHECK(verify(r, 12000, 7) == 12000);
  CHECK(malloc_usable_size(r) == 12288);
  CHECK((page_word(a + 12288) & HAK_PAGE_TAG) == HAK_PAGE_FREE);
  free(r);
  free(guard);
}

/* Growing into pages never used takes them only when no run of used ones
 * fits: buffers grown again and again would otherwise touch new pages at
 * every round. */
TEST(span_realloc_grows_into_new_pages_only_when_no_used_run_fits) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  fill_span_batches();
  hak_release_all();
  uint8_t *x = malloc(60000), *g1 = malloc(20000), *g2 = malloc(20000), *a = malloc(20000);
  REQUIRE(x && g1 && g2 && a && page_start(g1) == page_start(x) + 65536 &&
          page_start(g2) == page_start(g1) + 20480 && page_start(a) == page_start(g2) + 20480);
  fill(a, 20000, 3);
  uint8_t *r = realloc(a, 40000); /* no free run of used pages: in place */
  CHECK(r == a);
  CHECK(malloc_usable_size(r) == 40960);
  free(x);
  flush_span_caches(); /* x's 16 pages: a free run of used pages */
  uint8_t *s = realloc(r, 45000); /* grown: at the page */
  CHECK(s == page_start(x));
  CHECK(verify(s, 20000, 3) == 20000);
  CHECK(malloc_usable_size(s) == 49152);
  CHECK((page_word(a) & HAK_PAGE_TAG) == HAK_PAGE_FREE); /* not in a cache */
  free(s);
  free(g1);
  free(g2);
}

/* A block of 32 KiB or more that realloc moves goes back to the page heap
 * (any size can take its pages); a smaller one to the thread's cache. */
TEST(span_realloc_gives_a_big_block_it_moves_to_the_page_heap) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  hak_release_all();
  uint8_t *s = malloc(20000), *s2 = malloc(20000), *a = malloc(40000), *guard = malloc(40000);
  REQUIRE(s && s2 && a && guard && page_start(s2) == page_start(s) + 20480 &&
          page_start(guard) == page_start(a) + 40960);
  fill(s, 20000, 4);
  fill(a, 40000, 5);
  uint8_t *t = realloc(s, 30000), *b = realloc(a, 60000); /* no room after either */
  REQUIRE(t && b && t != s && b != a);
  CHECK(verify(t, 20000, 4) == 20000);
  CHECK(verify(b, 40000, 5) == 40000);
  CHECK((page_word(s) & HAK_PAGE_TAG) == HAK_PAGE_USED); /* in the cache */
  CHECK((page_word(a) & HAK_PAGE_TAG) == HAK_PAGE_FREE);
  free(t);
  free(b);
  free(s2);
  free(guard);
}

TEST(calloc_of_a_span_is_zero_on_reused_pages) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  uint8_t *a = malloc(100000);
  REQUIRE(a != NULL);
  memset(a, 0xAB, 100000);
  free(a);
  uint8_t *b = calloc(1, 100000); /* from the cache */
  CHECK(b == a);
  CHECK_MSG(first_nonzero(b, 100000) == 100000, "byte %zu", first_nonzero(b, 100000));
  memset(b, 0xCD, 100000);
  free(b);
  flush_span_caches();
  uint8_t *c = calloc(1, 50000); /* from the page heap, dirty */
  CHECK(c == a);
  CHECK_MSG(first_nonzero(c, 50000) == 50000, "byte %zu", first_nonzero(c, 50000));
  free(c);
}

TEST(free_span_runs_are_purged_after_delay) {
  hak_opt.purge_delay_ms = 50;
  start_purger();
  uint8_t *a = malloc(200000), *guard = malloc(200000);
  REQUIRE(a && guard);
  memset(a, 3, 200000);
  free(a);
  flush_span_caches();
  REQUIRE(resident_pages(a, 48 * 4096) == 48);
  WAIT_FOR(resident_pages(a, 48 * 4096) == 0);
  int resident = resident_pages(a, 48 * 4096);
  CHECK_MSG(resident == 0, "%d pages still resident", resident);
  uint8_t *b = calloc(1, 200000); /* purged pages read zero */
  CHECK(first_nonzero(b, 200000) == 200000);
  free(b);
  free(guard);
}

/* Writes and frees two one-chunk blocks (their chunks in chunks[], if
 * asked); returns the arena's free committed bytes then, at least the
 * two blocks' bytes. */
static size_t free_two_written_chunks(uint8_t **chunks) {
  uint8_t *a = malloc(ONE_CHUNK), *b = malloc(ONE_CHUNK);
  REQUIRE(a && b);
  memset(a, 0xAB, ONE_CHUNK);
  memset(b, 0xAB, ONE_CHUNK);
  if (chunks) {
    chunks[0] = (uint8_t *)hak_large_header(a);
    chunks[1] = (uint8_t *)hak_large_header(b);
  }
  free(a);
  free(b);
  hak_large_kept_release(hak_tls_heap, true);
  size_t cached = atomic_load(&hak_gstats.large_cached);
  REQUIRE(cached >= 2 * ONE_CHUNK);
  return cached;
}

/* Pages move between the tiers instead of being held twice. Once the page
 * heap has held a segment's worth of blocks, a new span segment takes the
 * committed pages of the arena's free chunks (two one-chunk blocks written
 * and freed), so a block there is resident before it is written, and a
 * calloc from those pages reads zero. A program's first span blocks do not
 * take them (4 MiB of pages for one block). */
TEST(a_new_span_segment_takes_the_pages_of_free_large_chunks) {
  keep_freed_large_blocks();
  flush_span_caches();
  hak_release_all(); /* no dirty span run left: the blocks below need new segments */
  size_t cached = free_two_written_chunks(NULL);
  enum { N = 40, BLOCK = 262144 }; /* 10 MiB of the largest span class */
  static uint8_t *ps[N];
  int resident_at = -1;
  for (int i = 0; i < N; i++) {
    REQUIRE((ps[i] = i % 2 ? calloc(1, BLOCK) : malloc(BLOCK)) != NULL);
    if (i == 0) /* but the page of its free-list link */
      CHECK_MSG(resident_pages(ps[0], BLOCK) <= 1, "the first block has %d pages resident",
                resident_pages(ps[0], BLOCK));
    if (i % 2)
      CHECK_MSG(first_nonzero(ps[i], BLOCK) == BLOCK, "calloc'd block %d: byte %zu", i,
                first_nonzero(ps[i], BLOCK));
    else if (resident_at < 0 && resident_pages(ps[i], BLOCK) == BLOCK / 4096)
      resident_at = i;
  }
  CHECK_MSG(resident_at >= 0, "no block had its pages before it was written");
  CHECK_MSG(atomic_load(&hak_gstats.large_cached) + 2 * ONE_CHUNK <= cached,
            "the arena still holds %zu of its %zu free committed bytes",
            atomic_load(&hak_gstats.large_cached), cached);
  for (int i = 0; i < N; i++) free(ps[i]);
}

/* The same for slab segments: a heap's new segment, past its first, takes
 * the committed pages of the arena's free chunks (two one-chunk blocks
 * written and freed), so that its first block is resident before it is
 * written, and none of its units counts as zero (their slabs' unused
 * pages are purged on time). */
TEST(a_heaps_new_slab_segment_takes_the_pages_of_free_large_chunks) {
  keep_freed_large_blocks();
  hak_opt.segment_cache = 0; /* new segments are fresh ones */
  hak_release_all();
  void *first = malloc(1000); /* the heap has a segment */
  REQUIRE(first != NULL);
  size_t cached = free_two_written_chunks(NULL);
  enum { N = 5000 }; /* 1000 B each: more than a segment */
  static uint8_t *ps[N];
  size_t segments = atomic_load(&hak_gstats.segments);
  int n = 0, resident = -1;
  while (n < N && atomic_load(&hak_gstats.segments) == segments) {
    REQUIRE((ps[n] = malloc(1000)) != NULL);
    resident = resident_pages(ps[n], 4096);
    memset(ps[n++], 1, 1000);
  }
  REQUIRE(atomic_load(&hak_gstats.segments) == segments + 1); /* a new segment */
  hak_segment_t *seg = hak_segment_of(ps[n - 1]);
  CHECK_MSG(resident == 1, "the new segment's first block was not resident before its write");
  CHECK_MSG(seg->zero_units == 0, "units counted zero: %#llx", (unsigned long long)seg->zero_units);
  CHECK_MSG(atomic_load(&hak_gstats.large_cached) + 2 * ONE_CHUNK <= cached,
            "the arena still holds %zu of its %zu free committed bytes",
            atomic_load(&hak_gstats.large_cached), cached);
  for (int i = 0; i < n; i++) free(ps[i]);
  free(first);
}

/* A new segment that takes the arena's pages keeps its own reserved_from,
 * not the word that lay there (in a block's body, any): one under 4 MiB
 * made its units refused, and malloc failed with ENOMEM. */
TEST(a_new_slab_segment_over_the_arenas_pages_keeps_its_bounds) {
  keep_freed_large_blocks();
  hak_opt.segment_cache = 0; /* new segments are fresh ones */
  hak_release_all();
  void *first = malloc(1000); /* the heap has a segment */
  REQUIRE(first != NULL);
  uint8_t *chunks[2];
  size_t cached = free_two_written_chunks(chunks);
  for (int k = 0; k < 2; k++) /* where a segment's reserved_from lies: a small word */
    memcpy(chunks[k] + offsetof(hak_segment_t, reserved_from), &(uint32_t){1000}, 4);
  enum { N = 5000 }; /* 1000 B each: more than a segment */
  static uint8_t *ps[N];
  size_t segments = atomic_load(&hak_gstats.segments);
  int n = 0;
  while (n < N && atomic_load(&hak_gstats.segments) == segments) {
    REQUIRE((ps[n] = malloc(1000)) != NULL);
    memset(ps[n++], 1, 1000);
  }
  REQUIRE(atomic_load(&hak_gstats.segments) == segments + 1); /* a new segment */
  REQUIRE(atomic_load(&hak_gstats.large_cached) + 2 * ONE_CHUNK <= cached); /* over the chunks */
  /* the segment over them serves the blocks (a refusal would have made
   * malloc take one more segment) */
  hak_segment_t *seg = hak_segment_of(ps[n - 1]);
  CHECK_MSG(seg->reserved_from % HAK_UNIT_SIZE == 0 && seg->zero_units == 0,
            "reserved from %u, zero units %#llx",
            seg->reserved_from, (unsigned long long)seg->zero_units);
  for (int i = 0; i < 500 && n < N; i++) {
    REQUIRE((ps[n] = malloc(1000)) != NULL);
    memset(ps[n++], 1, 1000);
  }
  CHECK(hak_segment_of(ps[n - 1]) == seg && atomic_load(&hak_gstats.segments) == segments + 1);
  for (int i = 0; i < n; i++) free(ps[i]);
  free(first);
}

/* The arena faulting in new pages while the page heap holds more free
 * committed pages than pages of blocks: the excess idle for a quarter of
 * the purge delay goes back to the OS at once, not after the delay. Free
 * pages no more than those in use stay, and so do pages freed just now. */
TEST(large_pages_faulted_in_purge_the_page_heaps_idle_excess) {
  hak_opt.purge_delay_ms = 1000; /* 250 ms idle for this, 1 s for the timed purge */
  flush_span_caches();
  hak_release_all(); /* the arena has no committed free chunk to give */
  enum { N = 24, BLOCK = 262144, PAGES = BLOCK / 4096 };
  static uint8_t *ps[N];
  for (int i = 0; i < N; i++) {
    REQUIRE((ps[i] = malloc(BLOCK)) != NULL);
    memset(ps[i], 1, BLOCK);
  }
  for (int i = 0; i < N; i += 2) free(ps[i]); /* as many free as in use */
  flush_span_caches();
  usleep(300000);
  size_t big = (size_t)8 << 20;
  uint8_t *x = malloc(big);
  REQUIRE(x != NULL);
  memset(x, 2, big);
  for (int i = 0; i < N; i += 2)
    CHECK_MSG(resident_pages(ps[i], BLOCK) == PAGES, "block %d: %d of %d pages resident", i,
              resident_pages(ps[i], BLOCK), PAGES);
  for (int i = 1; i < N; i += 2) free(ps[i]);
  flush_span_caches();
  uint8_t *y = malloc(big); /* the odd blocks were freed just now */
  REQUIRE(y != NULL);
  memset(y, 3, big);
  int left = 0;
  for (int i = 1; i < N; i += 2) left += resident_pages(ps[i], BLOCK);
  CHECK_MSG(left == N / 2 * PAGES, "%d of %d pages freed just now resident", left, N / 2 * PAGES);
  usleep(300000);
  uint8_t *z = malloc(big);
  REQUIRE(z != NULL);
  memset(z, 4, big);
  left = 0;
  for (int i = 0; i < N; i++) left += resident_pages(ps[i], BLOCK);
  CHECK_MSG(left == 0, "%d of %d pages of the freed blocks still resident", left, N * PAGES);
  free(x);
  free(y);
  free(z);
}

/* A free run shorter than 64 KiB waits to merge with a neighbour or for
 * its segment to empty: the timed purge leaves it committed, while it
 * purges a longer one freed at the same time; a forced purge takes both. */
TEST(short_free_span_runs_wait_for_their_neighbours) {
  hak_opt.purge_delay_ms = 20;
  start_purger();
  flush_span_caches();
  fill_span_batches();
  hak_release_all(); /* no other free run to merge with */
  char *a = malloc(20000), *b = malloc(20000), *c = malloc(20000), *d = malloc(131072),
       *e = malloc(20000);
  REQUIRE(b == a + 20480 && c == b + 20480 && d == c + 20480 && e == d + 131072);
  memset(b, 1, 20000);
  memset(d, 1, 131072);
  free(b);
  free(d);
  flush_span_caches();
  WAIT_FOR(resident_pages(d, 32 * 4096) == 0);
  int short_run = resident_pages(b, 5 * 4096), long_run = resident_pages(d, 32 * 4096);
  CHECK_MSG(short_run == 5, "%d of 5 pages of the short run resident", short_run);
  CHECK_MSG(long_run == 0, "%d of 32 pages of the long run resident", long_run);
  hak_span_purge(true);
  short_run = resident_pages(b, 5 * 4096);
  CHECK_MSG(short_run == 0, "%d of 5 pages resident after a forced purge", short_run);
  free(a);
  free(c);
  free(e);
}

/* Runs kept apart, each shorter than 64 KiB, merge once idle: together
 * they are a long run, which the timed purge returns. */
TEST(short_span_runs_apart_merge_and_are_purged_when_idle) {
  hak_opt.purge_delay_ms = 20;
  start_purger();
  flush_span_caches();
  hak_release_all();
  char *a = malloc(20000), *b = malloc(24000), *c = malloc(28000), *guard = malloc(12000);
  REQUIRE(b == a + 20480 && c == b + 24576 && guard == c + 28672); /* first fills */
  memset(a, 1, 20000);
  memset(b, 1, 24000);
  memset(c, 1, 28000);
  free(a);
  free(b);
  free(c);
  flush_span_caches();
  CHECK(page_word(b) != 0); /* apart */
  WAIT_FOR(resident_pages(a, 18 * 4096) == 0);
  int resident = resident_pages(a, 18 * 4096);
  CHECK_MSG(resident == 0, "%d of 18 pages resident", resident);
  free(guard);
}

/* While the program maps new memory, what it freed waits HAK_GROWTH_WAIT
 * delays before it is purged; once it stops, one delay. */
TEST(purge_waits_while_the_program_maps_memory) {
  hak_opt.purge_delay_ms = 100;
  uint64_t now = hak_clock_ms();
  hak_purge_growing(now, false);
  size_t mapped = atomic_load(&hak_gstats.os_mapped_total);
  char *p = malloc(64 << 20); /* fresh chunks of the large arena */
  REQUIRE(p != NULL);
  REQUIRE(atomic_load(&hak_gstats.os_mapped_total) != mapped);
  CHECK(hak_purge_growing(now, false));
  CHECK(!hak_purge_growing(now + 10000, false)); /* nothing mapped since */
  free(p);
}

/* Holding more span pages than at the purge's last look is growth too,
 * though nothing is mapped: a run freed then waits HAK_GROWTH_WAIT delays,
 * while it would wait one once the program stops growing. */
TEST(span_runs_wait_while_the_program_takes_span_pages) {
  hak_opt.purge_delay_ms = 100;
  start_purger(); /* before: starting it allocates */
  flush_span_caches();
  hak_release_all();
  enum { N = 16, H = 3 * N }; /* the thread's span cache takes holes ahead */
  char *holes[H], *seps[H], *z[N];
  for (int i = 0; i < H; i++) {
    holes[i] = malloc(20000);
    seps[i] = malloc(20000);
    REQUIRE(holes[i] && seps[i]);
  }
  uint8_t *x = malloc(200000), *guard = malloc(200000);
  REQUIRE(x && guard);
  for (int i = 0; i < H; i++) free(holes[i]); /* 5-page runs for z, too short to purge */
  flush_span_caches();
  usleep(250000);
  memset(x, 1, 200000);
  free(x);
  flush_span_caches();
  usleep(150000); /* nothing taken or mapped for over a delay */
  CHECK_MSG(resident_pages(x, 48 * 4096) == 0, "%d of 48 pages resident after a delay",
            resident_pages(x, 48 * 4096));
  uint8_t *y = malloc(200000);
  REQUIRE(y != NULL);
  memset(y, 1, 200000);
  usleep(50000); /* the purger sees it taken */
  free(y);
  flush_span_caches();
  for (int i = 0; i < N; i++) { /* 400 ms of blocks taken, none from y's run */
    usleep(25000);
    REQUIRE((z[i] = malloc(20000)) != NULL);
  }
  CHECK_MSG(resident_pages(y, 48 * 4096) == 48, "%d of 48 pages resident while growing",
            resident_pages(y, 48 * 4096));
  usleep(250000);
  CHECK_MSG(resident_pages(y, 48 * 4096) == 0, "%d of 48 pages resident once growth stopped",
            resident_pages(y, 48 * 4096));
  for (int i = 0; i < N; i++) free(z[i]);
  for (int i = 0; i < H; i++) free(seps[i]);
  free(guard);
}

/* Whether the segments of ps[0..n), but first, are unmapped. */
static bool others_unmapped(void **ps, int n, hak_segment_t *first) {
  for (int i = 0; i < n; i++)
    if (hak_segment_of(ps[i]) != first && hak_segment_of(ps[i]) != NULL) return false;
  return true;
}

/* Span segments all free go back to the segment cache once their pages
 * have been idle for the purge delay, and from there to the OS (but the
 * first one, which may hold a block of the runtime's). */
TEST(span_segments_all_free_go_back_to_the_segment_cache) {
  hak_opt.purge_delay_ms = 50;
  start_purger();
  enum { N = 100 }; /* 128 KiB blocks, 31 to a segment */
  static void *ps[N];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(131072)) != NULL);
  hak_segment_t *first = hak_segment_of(ps[0]);
  size_t segments = atomic_load(&hak_gstats.segments), ours = 0;
  for (int i = 0; i < N; i++) ours += i == 0 || hak_segment_of(ps[i]) != hak_segment_of(ps[i - 1]);
  REQUIRE(ours >= 4);
  for (int i = 0; i < N; i++) free(ps[i]);
  flush_span_caches();
  /* purged, cached, and unmapped after the delay again */
  WAIT_FOR(others_unmapped(ps, N, first));
  size_t now = atomic_load(&hak_gstats.segments);
  CHECK_MSG(now + ours - 1 <= segments, "segments %zu -> %zu, %zu of them spans'", segments, now,
            ours);
  CHECK(others_unmapped(ps, N, first));
}

/* Span segments emptied at once stay committed until the purge delay: a
 * loop that frees a batch of buffers and allocates it again reuses them
 * without page faults (the segment cache keeps one segment committed). */
TEST(span_segments_emptied_in_a_burst_stay_committed_until_the_delay) {
  hak_opt.purge_delay_ms = 100000;
  enum { N = 100 }; /* 128 KiB blocks, 31 to a segment */
  static void *ps[N];
  fill_blocks(ps, N, 131072, 1);
  for (int i = 0; i < N; i++) free(ps[i]);
  flush_span_caches();
  for (int i = 0; i < N; i++) {
    int resident = resident_pages(ps[i], 131072);
    CHECK_MSG(resident == 32, "block %d: %d of 32 pages resident", i, resident);
  }
  size_t faults = fill_blocks(ps, N, 131072, 2);
  CHECK_MSG(faults < 100, "%zu faults", faults);
  for (int i = 0; i < N; i++) free(ps[i]);
}

/* The same for slab segments a live thread empties. */
TEST(slab_segments_emptied_in_a_burst_stay_committed_until_the_delay) {
  hak_opt.purge_delay_ms = 100000;
  enum { N = 6000 }; /* 2 KiB blocks: 12 MiB, three segments or more */
  static void *ps[N];
  fill_blocks(ps, N, 2000, 1);
  hak_segment_t *first = hak_segment_of(ps[0]), *last = hak_segment_of(ps[N - 1]);
  REQUIRE(first != last);
  for (int i = 0; i < N; i++) free(ps[i]);
  CHECK(atomic_load(&first->heap) == hak_tls_heap); /* not cached, not purged */
  CHECK(atomic_load(&last->heap) == hak_tls_heap);
  size_t faults = fill_blocks(ps, N, 2000, 2);
  CHECK_MSG(faults < 100, "%zu faults", faults);
  for (int i = 0; i < N; i++) free(ps[i]);
}

/* A segment with no block left goes back whatever its free runs are: here
 * two dirty ones between purged ones, which do not merge, and the last
 * span segment, kept until the purge, which releases it whole (a runtime
 * that keeps a span block of its own, as UBSan's does, keeps it). */
TEST(span_segment_with_no_block_left_goes_back_whatever_its_runs) {
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  hak_release_all(); /* no span segment, unless the runtime's */
  char *a = malloc(20000), *b = malloc(20000), *c = malloc(20000), *d = malloc(20000);
  REQUIRE(b == a + 20480 && c == b + 20480 && d == c + 20480); /* 5 pages each */
  free(a);
  free(c);
  flush_span_caches();
  hak_span_purge(true); /* a's and c's pages purged */
  free(b);
  free(d);
  flush_span_caches(); /* b and d: dirty runs of 5 pages, apart */
  bool empty = hak_segment_of(a)->span.used_pages == 0; /* not if the runtime has a block */
  hak_span_purge(true);
  if (empty) CHECK(hak_segmap_of(a) != HAK_SEGMAP_SPANS);
  char *e = malloc(20000), *f = malloc(1000);
  CHECK(e && f);
  free(e);
  free(f);
}

typedef struct {
  void *p;
  bool cached; /* p was in the freeing thread's cache */
} remote_free_t;

static void *free_span_in_thread(void *arg) {
  remote_free_t *r = arg;
  free(r->p);
  r->cached = hak_tls_heap->free[span_number(50000)] == r->p;
  return NULL;
}

TEST(span_freed_by_another_thread_goes_to_its_cache_and_back_at_exit) {
  hak_opt.purge_delay_ms = 100000;
  remote_free_t r = {malloc(50000), false};
  REQUIRE(r.p != NULL);
  run_thread(free_span_in_thread, &r);
  CHECK(r.cached);
  /* the thread's exit gave its cache back: the pages are a free run */
  CHECK((page_word(r.p) & HAK_PAGE_TAG) == HAK_PAGE_FREE);
  CHECK(malloc(50000) == r.p);
}

/* Grows this thread's caches of the seven classes from 96 KiB up as far
 * as they go (48 blocks of each: 4.5 to 12 MiB a class, 55 MiB for the
 * seven): each round overflows them, then runs them dry. */
static void grow_span_caches(void) {
  enum { N = 48, K = 7 };
  static const size_t sizes[K] = {98304, 114688, 131072, 163840, 196608, 229376, 262144};
  void *ps[K][N];
  for (int round = 0; round < 8; round++) {
    for (int i = 0; i < N; i++)
      for (int k = 0; k < K; k++) REQUIRE((ps[k][i] = malloc(sizes[k])) != NULL);
    for (int i = 0; i < N; i++)
      for (int k = 0; k < K; k++) free(ps[k][i]);
  }
}

static void *grow_alone(void *arg) {
  grow_span_caches();
  *(size_t *)arg = hak_tls_heap->span_grown;
  return NULL;
}

/* A thread's caches grow by 24 MiB at most: enough for a loop over a
 * batch of buffers of some 20 MiB. */
TEST(a_threads_span_caches_grow_within_its_bound) {
  size_t grown = 0;
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, grow_alone, &grown) == 0);
  pthread_join(t, NULL);
  CHECK_MSG(grown <= (size_t)24 << 20 && grown > (size_t)23 << 20, "grew by %zu", grown);
}

static pthread_barrier_t grown, checked;

static void *grow_and_wait(void *arg) {
  grow_span_caches();
  *(size_t *)arg = hak_tls_heap->span_grown;
  pthread_barrier_wait(&grown);
  pthread_barrier_wait(&checked);
  return NULL;
}

/* Every thread's caches grow by 128 MiB at most, and a thread's growth
 * goes when its heap retires. */
TEST(span_caches_of_all_threads_grow_within_a_bound) {
  enum { T = 24 };
  pthread_t t[T];
  size_t each[T];
  size_t before = hak_span_cache_growth();
  pthread_barrier_init(&grown, NULL, T + 1);
  pthread_barrier_init(&checked, NULL, T + 1);
  for (int i = 0; i < T; i++) REQUIRE(pthread_create(&t[i], NULL, grow_and_wait, &each[i]) == 0);
  pthread_barrier_wait(&grown);
  size_t all = hak_span_cache_growth() - before, sum = 0, most = 0;
  for (int i = 0; i < T; i++) {
    sum += each[i];
    if (each[i] > most) most = each[i];
  }
  CHECK_MSG(most <= (size_t)24 << 20, "the most a thread grew: %zu", most);
  CHECK_MSG(all == sum && all <= (size_t)128 << 20 && all > (size_t)124 << 20, "%zu, sum %zu",
            all, sum);
  pthread_barrier_wait(&checked);
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  hak_heaps_retire_parked(); /* parked, a heap keeps its bounds for the next thread */
  CHECK(hak_span_cache_growth() == before);
}

/* A cache that is not used goes back to the page heap while another
 * class refills. */
TEST(idle_span_cache_goes_back_to_the_page_heap) {
  hak_opt.purge_delay_ms = 100000;
  enum { N = 200 }; /* a cache of 5 at first: the first round refills 40 times */
  static void *ps[N];
  size_t idle = span_number(100000);
  void *a = malloc(100000);
  free(a);
  REQUIRE(hak_tls_heap->free[idle] == a);
  for (int round = 0; round < 10 && hak_tls_heap->free[idle] != NULL; round++) {
    for (int k = 0; k < N; k++) ps[k] = malloc(12000);
    for (int k = 0; k < N; k++) free(ps[k]);
  }
  CHECK(hak_tls_heap->free[idle] == NULL);
  CHECK((page_word(a) & HAK_PAGE_TAG) == HAK_PAGE_FREE);
}

/* Frees the blocks it is handed, allocating nothing, and reports whether
 * its heap drained and how many blocks its cache of their class holds. */
typedef struct {
  void **ps;
  int n;
  size_t cls;
  bool drained;
  size_t cached;
} free_only_t;

static void *free_only(void *arg) {
  free_only_t *f = arg;
  for (int i = 0; i < f->n; i++) free(f->ps[i]);
  f->drained = hak_tls_heap->draining;
  f->cached = cache_len(f->cls);
  return NULL;
}

/* A thread that gives back 4 MiB with no refill between frees only: its
 * caches go back and take no block, however far a thread's caches may
 * grow (24 MiB). Its frees fill batches that wait for the threads that
 * allocate, which take one whole at a refill: four blocks freed in a row,
 * freed last first. */
TEST(a_thread_that_only_frees_hands_its_batches_over) {
  enum { N = 512, BATCH = 4 }; /* 8 MiB of 16 KiB blocks, 4 to a batch */
  static void *ps[N];
  size_t cls = span_number(16000);
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(16000)) != NULL);
  free_only_t f = {ps, N, cls, false, 0};
  run_thread(free_only, &f);
  CHECK(f.drained);
  CHECK_MSG(f.cached == 0, "%zu blocks cached", f.cached);
  void *more[BATCH];
  int m = 0;
  while (hak_tls_heap->free[cls] != NULL) { /* what the refills left */
    REQUIRE(m < BATCH);
    more[m++] = malloc(16000);
  }
  void *got[BATCH];
  got[0] = malloc(16000);
  /* the batch, the top of the other thread's frees, counted as this cache */
  CHECK_MSG(cache_counted(cls) == cache_len(cls), "%u counted, %zu held", cache_counted(cls),
            cache_len(cls));
  for (int i = 1; i < BATCH; i++) got[i] = malloc(16000);
  int j = 0;
  while (j < N && ps[j] != got[0]) j++;
  CHECK_MSG(j < N, "%p: not a block the thread freed", got[0]);
  for (int i = 1; i < BATCH && j < N; i++)
    CHECK_MSG(j >= i && got[i] == ps[j - i], "block %d of the batch", i);
  for (int i = 0; i < BATCH; i++) free(got[i]);
  for (int i = 0; i < m; i++) free(more[i]);
}

/* A refill of a class whose transfer is empty takes a batch of its blocks
 * at their page's start: they serve every size of the class, where they
 * would wait for a size past the colours. */
TEST(a_refill_takes_a_batch_of_blocks_at_their_page) {
  enum { N = 512 }; /* 8 MiB of 16 KiB blocks, a thread that drains */
  static void *ps[N];
  size_t size = 16000, fits = 14000, at_page = span_number(size);
  REQUIRE(at_page == hak_span_at_page(span_number(fits)));
  hak_span_purge(true); /* no batch waits */
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(size)) != NULL);
  free_only_t f = {ps, N, at_page, false, 0};
  run_thread(free_only, &f);
  REQUIRE(f.drained);
  flush_span_caches();
  uint8_t *p = malloc(fits);
  int j = 0;
  while (j < N && ps[j] != p) j++;
  CHECK_MSG(j < N, "%p: not a block the other thread freed", (void *)p);
  CHECK(hak_page_offset(p) == 0 && malloc_usable_size(p) >= fits);
  free(p);
  flush_span_caches();
  hak_span_purge(true);
}

/* Grows this thread's cache of blocks of size until its bound stops growing: rounds
 * that free more blocks than it may hold and take them again (it ran dry
 * after it overflowed). The n blocks are in use again at the end, the cache
 * and the transfer hold none of the class; returns the bound. */
static unsigned grow_span_cache(size_t size, void **ps, int n) {
  size_t c = span_number(size) - HAK_SLAB_CLASSES;
  unsigned max;
  do {
    max = hak_tls_heap->span_max[c];
    for (int i = 0; i < n; i++) free(ps[i]);
    for (int i = 0; i < n; i++) REQUIRE((ps[i] = malloc(size)) != NULL);
  } while (hak_tls_heap->span_max[c] != max);
  flush_span_caches();
  hak_span_purge(true); /* and the transfer */
  return max;
}

/* A cache that may grow no more gives its overflow to the page heap, where
 * blocks of any class may take its pages: in the transfer it waited past
 * the thread's bound, for this class alone. */
TEST(a_cache_that_may_grow_no_more_overflows_to_the_page_heap) {
  /* the cache holds 102 blocks (16 MiB); 18 overflows in a row are not
   * 4 MiB given back: not a thread that drains */
  enum { N = 120 };
  size_t size = 160000, cls = span_number(size);
  static void *ps[N];
  hak_opt.purge_delay_ms = 100000;
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(size)) != NULL);
  unsigned max = grow_span_cache(size, ps, N);
  REQUIRE(max < N);
  for (int i = 0; i < N; i++) free(ps[i]);
  REQUIRE(!hak_tls_heap->draining);
  CHECK(cache_len(cls) == max);
  for (unsigned i = max; i < N; i++)
    CHECK_MSG((page_word(ps[i]) & HAK_PAGE_TAG) != HAK_PAGE_USED, "block %u of %d not given back",
              i, N);
}

/* A thread whose use of a class swings by more than its cache holds
 * overflows many times with no refill between, and takes from the cache
 * between the overflows: it keeps its caches (given 8 MiB in a row, a
 * thread that only frees drains). */
TEST(a_thread_whose_use_swings_does_not_drain) {
  enum { N = 112, CYCLES = 4, TAKE = 4, OVER = 8 };
  size_t size = 250000, cls = span_number(size);
  static void *ps[N];
  hak_opt.purge_delay_ms = 100000;
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(size)) != NULL);
  unsigned max = grow_span_cache(size, ps, N);
  REQUIRE(max + CYCLES * (TAKE + OVER) <= N);
  int next = 0;
  while (next < (int)max) free(ps[next++]); /* the cache is full */
  for (int k = 0; k < CYCLES; k++) {
    for (int i = 0; i < TAKE; i++) REQUIRE(malloc(size) != NULL); /* from the cache */
    for (int i = 0; i < TAKE + OVER; i++) free(ps[next++]); /* OVER overflows */
    CHECK_MSG(!hak_tls_heap->draining, "drained in cycle %d", k);
  }
  CHECK_MSG(cache_len(cls) == max, "%zu blocks cached, bound %u", cache_len(cls), max);
}

/* A refill that takes pages never used (or purged) while the thread's
 * caches hold more than 4 MiB trims them: a thread that has moved from one
 * size to another takes the pages the first size's cache did not use, not
 * new ones, without waiting for the next trim of its period. */
/* The thread's cache of blocks of `size` holds the n blocks ps it took
 * and freed, the page heap no dirty run, and no trim of the period comes
 * in the next refills: the thread has moved on from that size. */
static void cache_of_a_size_left(void **ps, int n, size_t size) {
  size_t cls = span_number(size);
  hak_opt.purge_delay_ms = 100000;
  for (int i = 0; i < n; i++) REQUIRE((ps[i] = malloc(size)) != NULL);
  REQUIRE(grow_span_cache(size, ps, n) >= (unsigned)n); /* the page heap holds no dirty run */
  for (int i = 0; i < n; i++) free(ps[i]);
  REQUIRE(cache_len(cls) == (size_t)n);
  hak_tls_heap->span_refills = 0;
}

TEST(a_fresh_refill_trims_the_caches_of_sizes_left) {
  enum { N = 48 }; /* 12 MiB of 256 KiB blocks */
  size_t size = 250000, cls = span_number(size);
  static void *ps[N];
  cache_of_a_size_left(ps, N, size);
  void *b[3];
  /* The first trim finds the cache ran dry before it; the second gives back
   * three quarters of what it held since, unused; the third block takes
   * one of those. */
  for (int i = 0; i < 3; i++) REQUIRE((b[i] = malloc(100000)) != NULL);
  CHECK_MSG(cache_len(cls) == N / 4, "%zu blocks of 256 KiB cached", cache_len(cls));
  bool reused = false;
  for (int i = 0; i < N; i++)
    reused |= (char *)b[2] >= (char *)ps[i] && (char *)b[2] < (char *)ps[i] + size;
  CHECK_MSG(reused, "%p: new pages", b[2]);
  for (int i = 0; i < 3; i++) free(b[i]);
  flush_span_caches();
}

/* Blocks another thread took and keeps in use. */
static void *take_16_mib_of_spans(void *arg) {
  void **ps = arg;
  for (int i = 0; i < 64; i++) REQUIRE((ps[i] = malloc(250000)) != NULL);
  return NULL;
}

/* What the thread that moved on holds decides, not the program: another
 * thread's 16 MiB in use make its 12 MiB cached less than half of all the
 * span pages in use. */
TEST(a_fresh_refill_trims_the_caches_of_sizes_left_while_another_thread_holds_more) {
  enum { N = 48 };
  size_t size = 250000, cls = span_number(size);
  static void *ps[N], *other[64];
  run_thread(take_16_mib_of_spans, other);
  cache_of_a_size_left(ps, N, size);
  void *b[3];
  for (int i = 0; i < 3; i++) REQUIRE((b[i] = malloc(100000)) != NULL);
  CHECK_MSG(cache_len(cls) == N / 4, "%zu blocks of 256 KiB cached", cache_len(cls));
  for (int i = 0; i < 3; i++) free(b[i]);
  for (int i = 0; i < 64; i++) free(other[i]);
  flush_span_caches();
}

/* A refill that takes new pages while the program grows (its span pages
 * in use at their most, the caches under half of what the thread holds)
 * keeps the caches: those pages are its working set. Once it holds fewer
 * pages than it did, such a refill trims them, as for a thread that moved
 * on to other sizes. */
TEST(a_fresh_refill_trims_the_caches_only_once_the_program_stops_growing) {
  enum { LIVE = 48, N = 24 }; /* 12 MiB in use, 4.9 MiB cached */
  size_t cached = span_number(200000);
  void *live[LIVE], *ps[N], *b[4];
  hak_opt.purge_delay_ms = 100000;
  flush_span_caches();
  hak_release_all();
  for (int i = 0; i < LIVE; i++) REQUIRE((live[i] = malloc(250000)) != NULL);
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(200000)) != NULL);
  REQUIRE(grow_span_cache(200000, ps, N) >= N);
  for (int i = 0; i < N; i++) free(ps[i]);
  REQUIRE(cache_len(cached) == N);
  hak_tls_heap->span_refills = 0; /* no trim of the period in what follows */
  for (int i = 0; i < 2; i++) REQUIRE((b[i] = malloc(100000)) != NULL); /* new pages */
  CHECK_MSG(cache_len(cached) == N, "%zu blocks of 200 KiB cached while growing", cache_len(cached));
  for (int i = 0; i < 4; i++) REQUIRE(realloc(live[i], 100000) == live[i]); /* 144 pages back */
  hak_span_purge(true);
  /* the first trim finds the cache ran dry before it, the second gives
   * back three quarters of it */
  for (int i = 2; i < 4; i++) REQUIRE((b[i] = malloc(100000)) != NULL);
  CHECK_MSG(cache_len(cached) == N / 4, "%zu blocks of 200 KiB cached after", cache_len(cached));
  for (int i = 0; i < 4; i++) free(b[i]);
  for (int i = 0; i < LIVE; i++) free(live[i]);
  flush_span_caches();
}

/* The next span refill trims the caches (the last of a trim period). */
static void trim_span_caches(size_t size) {
  hak_tls_heap->span_refills = hak_tls_heap->span_trim_period - 1;
  REQUIRE(hak_tls_heap->free[span_number(size)] == NULL);
  free(malloc(size));
  REQUIRE(hak_tls_heap->span_refills == 0);
}

/* A trim gives back three quarters of the blocks a cache held and did not
 * use since the last one, those on top, and nothing of a cache that ran
 * dry in between, however little it was used. */
TEST(a_trim_gives_back_what_a_cache_did_not_use) {
  enum { DRY = 8, IDLE = 5 }; /* the first bounds of the classes of 8 and 12 KiB */
  size_t dry = span_number(8000), idle = span_number(12000), c = idle - HAK_SLAB_CLASSES;
  void *d[DRY], *u[IDLE];
  flush_span_caches();
  fill_span_batches();
  for (int i = 0; i < DRY; i++) REQUIRE((d[i] = malloc(8000)) != NULL);
  for (int i = 0; i < IDLE; i++) REQUIRE((u[i] = malloc(12000)) != NULL);
  for (int i = 0; i < DRY; i++) free(d[i]);
  for (int i = 0; i < IDLE; i++) free(u[i]);
  REQUIRE(cache_len(dry) == DRY && cache_len(idle) == IDLE);
  trim_span_caches(160000); /* both ran dry when they were filled: nothing goes */
  CHECK(cache_len(dry) == DRY && cache_len(idle) == IDLE);
  for (int i = 0; i < DRY; i++) d[i] = malloc(8000); /* runs dry */
  for (int i = 0; i < DRY; i++) free(d[i]);
  free(malloc(12000)); /* uses one block: 4 not used */
  void *top = hak_tls_heap->free[idle];
  trim_span_caches(200000);
  CHECK(cache_len(dry) == DRY);
  CHECK_MSG(cache_len(idle) == IDLE - 3, "%zu left", cache_len(idle));
  for (hak_block_t *b = hak_tls_heap->free[idle]; b != NULL; b = hak_next(b))
    CHECK(b != top); /* gone from the top */
  CHECK(cache_counted(idle) == cache_len(idle));
  CHECK(hak_tls_heap->span_max[c] == IDLE); /* not below its first bound */
  flush_span_caches();
}

/* Trims come half as often (up to 256 refills apart) after one whose
 * classes, 3 in 4 of them, ran dry before the next, and twice as often
 * (down to 16 apart) after one whose classes did not. */
TEST(trims_come_less_often_when_what_they_took_was_needed) {
  const uint64_t took = UINT64_C(0xF) << 1; /* span classes 1-4; 160000 B is another */
  const uint64_t three = UINT64_C(0x7) << 1, two = UINT64_C(0x3) << 1; /* of the 4, refilled */
  static const struct {
    uint64_t refilled;
    uint32_t period;
  } steps[] = {{three, 32}, {three, 64}, {three, 128}, {three, 256}, {three, 256},
               {two, 128},  {two, 64},   {two, 32},    {two, 16},    {two, 16}};
  free(malloc(12000));
  hak_heap_t *h = hak_tls_heap;
  REQUIRE(h->span_trim_period == 16);
  for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
    flush_span_caches();
    h->span_trimmed = took;
    h->span_refilled = steps[i].refilled;
    trim_span_caches(160000);
    CHECK_MSG(h->span_trim_period == steps[i].period, "step %zu: %u refills, not %u", i,
              h->span_trim_period, steps[i].period);
  }
}

TEST(current_slab_stays_through_ping_pong) {
  start_purger();
  void *p = malloc(1024);
  hak_slab_t *slab = slab_of_ptr(p);
  free(p);
  size_t taken = atomic_load(&hak_gstats.slabs_allocated);
  for (int i = 0; i < 10000; i++) {
    p = malloc(1024);
    REQUIRE(slab_of_ptr(p) == slab);
    free(p);
  }
  CHECK(slab->state == HAK_SLAB_ACTIVE);
  CHECK(atomic_load(&hak_gstats.slabs_allocated) == taken);
}

TEST(reused_slab_tail_is_purged_after_delay) {
  hak_opt.purge_delay_ms = 50;
  start_purger();
  hak_slab_t *first = fill_three_slabs_and_free();
  REQUIRE(first->state == HAK_SLAB_FREE && !unit_purged(first));
  /* a new class takes a slab whose memory is still committed: the one just
   * released, committed beyond the blocks carved from it */
  char *q = malloc(40);
  REQUIRE(slab_of_ptr(q) == first);
  memset(q, 7, 40);
  CHECK(first->dirty_tail);
  hak_segment_t *seg = hak_segment_of_slab(first);
  uint8_t *tail = hak_slab_start(seg, first) + 32768;
  size_t tail_bytes = hak_slab_bytes(first) - 32768;
  CHECK(resident_pages(tail, tail_bytes) > 0);
  struct timespec ts = {0, 400 * 1000000L};
  nanosleep(&ts, NULL);
  CHECK_MSG(resident_pages(tail, tail_bytes) == 0, "%d pages resident",
            resident_pages(tail, tail_bytes));
  CHECK(!first->dirty_tail && first->zero);
  for (int i = 0; i < 40; i++) CHECK(q[i] == 7);
  /* the purged tail is carved again as zero memory */
  for (int i = 0; i < 1000; i++) {
    char *z = calloc(1, 40);
    REQUIRE(z != NULL);
    for (int j = 0; j < 40; j++) REQUIRE(z[j] == 0);
    memset(z, 9, 40);
  }
}

/* Once a reused slab's dirty tail is purged, everything past its carved
 * blocks reads as zero: calloc hands out the next blocks carved without
 * clearing them. The page of the last carved block is not purged, so what
 * the slab's previous user left there must be cleared. */
TEST(purged_tail_is_zero_from_the_last_carved_block) {
  start_purger(); /* before: starting it allocates */
  hak_release_all(); /* no committed free unit but the one released below */
  hak_opt.purge_delay_ms = 50;
  enum { N = 140 }; /* 1000 B blocks: two full 64 KiB slabs, and more */
  char *ps[N];
  for (int i = 0; i < N; i++) ps[i] = malloc(1000);
  hak_slab_t *old = slab_of_ptr(ps[0]);
  for (int i = 0; i < N; i++)
    if (slab_of_ptr(ps[i]) == old) free(ps[i]); /* not current: released */
  REQUIRE(old->state == HAK_SLAB_FREE);
  char *q = calloc(1, 48); /* 341 blocks of 48 B: 16368 bytes, 16 into a page */
  hak_slab_t *s = slab_of_ptr(q);
  REQUIRE(s == old && s->dirty_tail); /* the released unit, still committed */
  uint8_t *carved = hak_slab_start(hak_segment_of_slab(s), s) + (size_t)s->reserved * 48;
  size_t rest = (size_t)(-(uintptr_t)carved & 4095);
  REQUIRE(rest > 8);
  memset(carved, 0xAA, rest); /* what the previous user left */
  struct timespec ts = {0, 400 * 1000000L};
  nanosleep(&ts, NULL); /* the purger purges the tail */
  REQUIRE(!s->dirty_tail && s->zero);
  size_t bad = 0;
  for (int i = 0; i < 400; i++) { /* past the first run */
    unsigned char *z = calloc(1, 48);
    REQUIRE(z != NULL);
    for (int j = 0; j < 48; j++) bad += z[j] != 0;
  }
  CHECK_MSG(bad == 0, "%zu non-zero bytes from calloc", bad);
}

TEST(freed_slab_is_purged_after_delay) {
  hak_opt.purge_delay_ms = 0;
  hak_slab_t *first = fill_three_slabs_and_free();
  CHECK(first->state == HAK_SLAB_FREE);
  CHECK(unit_purged(first));
  int resident = resident_pages(hak_slab_start(hak_segment_of_slab(first), first), 16 * 4096);
  CHECK_MSG(resident == 0, "%d pages still resident", resident);
}

/* Creating the purger thread allocates, and may free. This file's
 * pthread_create, which the library's call binds to, first takes what is
 * left of one class's list, as a malloc of that class inside pthread_create
 * would, or frees a block. */
static size_t reenter_cls = SIZE_MAX;
static void *reentered[64];
static int n_reentered;
static void *reenter_free;

typedef int pthread_create_fn(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
  static pthread_create_fn *real;
  if (real == NULL && (real = (pthread_create_fn *)dlsym(RTLD_NEXT, "pthread_create")) == NULL) {
    fputs("unit: no pthread_create after this file's\n", stderr);
    abort();
  }
  size_t cls = reenter_cls;
  reenter_cls = SIZE_MAX;
  if (cls != SIZE_MAX)
    while (hak_tls_heap->free[cls] != NULL && n_reentered < 64)
      reentered[n_reentered++] = malloc(hak_class_size[cls]);
  void *f = reenter_free;
  reenter_free = NULL;
  free(f);
  return real(t, attr, fn, arg);
}

/* The refill that starts the purger takes its block first. */
TEST(purger_start_that_allocates_leaves_the_refill_its_block) {
  REQUIRE(atomic_load(&hak_purge_started) == 0); /* a forked child: not yet */
  run_thread(no_work, NULL); /* a program with threads, which gets the purger */
  size_t cls = hak_size_class(1000); /* a first carve of 4 blocks */
  REQUIRE(hak_tls_heap->queue[cls].first == NULL); /* the refill takes the long way */
  reenter_cls = cls;
  hak_purge_wake(); /* something to purge: the next such refill starts the thread */
  void *p = malloc(1000);
  CHECK(atomic_load(&hak_purge_started) == 1 && reenter_cls == SIZE_MAX);
  CHECK(n_reentered > 0);
  CHECK(p != NULL);
  free(p);
  for (int i = 0; i < n_reentered; i++) free(reentered[i]);
}

/* A thread that allocates blocks and lives until told. */
typedef struct {
  void *ps[2];
  sem_t ready, go;
} holder_t;

static void *hold_two(void *arg) {
  holder_t *h = arg;
  h->ps[0] = malloc(64);
  h->ps[1] = malloc(64);
  sem_post(&h->ready);
  sem_wait(&h->go);
  return NULL;
}

/* A remote free that flushes an outbox of an exited thread's slab starts
 * the purger; the free that creating its thread makes (of the same class)
 * is not lost when the outer free then fills the outbox. */
TEST(purger_start_inside_a_remote_free_loses_no_block) {
  holder_t dead = {0}, live = {0};
  holder_t *both[] = {&dead, &live};
  for (int i = 0; i < 2; i++) {
    sem_init(&both[i]->ready, 0, 0);
    sem_init(&both[i]->go, 0, 0);
  }
  pthread_t td, tl;
  REQUIRE(pthread_create(&td, NULL, hold_two, &dead) == 0);
  REQUIRE(pthread_create(&tl, NULL, hold_two, &live) == 0);
  sem_wait(&dead.ready);
  sem_wait(&live.ready);
  REQUIRE(slab_of_ptr(live.ps[0]) == slab_of_ptr(live.ps[1]));
  free(dead.ps[0]); /* waits in this thread's outbox */
  sem_post(&dead.go);
  pthread_join(td, NULL); /* its slab has no owner now */
  REQUIRE(atomic_load(&hak_purge_started) == 0);
  reenter_free = live.ps[1];
  free(live.ps[0]); /* flushes the outbox: the purger starts, frees live.ps[1] */
  CHECK(atomic_load(&hak_purge_started) == 1 && reenter_free == NULL);
  hak_free_flush_outboxes(hak_tls_heap);
  hak_slab_t *slab = slab_of_ptr(live.ps[0]);
  CHECK(on_remote_list(slab, live.ps[0]));
  CHECK(on_remote_list(slab, live.ps[1]));
  sem_post(&live.go);
  pthread_join(tl, NULL);
  free(dead.ps[1]);
}

TEST(purge_happens_without_further_allocation) {
  hak_opt.purge_delay_ms = 50;
  start_purger();
  hak_slab_t *first = fill_three_slabs_and_free();
  REQUIRE(first->state == HAK_SLAB_FREE);
  CHECK(!unit_purged(first)); /* not yet: the delay has not passed */
  struct timespec ts = {0, 400 * 1000000L};
  nanosleep(&ts, NULL); /* no malloc or free from here on */
  CHECK(unit_purged(first));
}

TEST(full_slab_comes_back_on_local_free) {
  enum { N = 64 }; /* 1 KiB class: 64 per slab (56 in slab 0) */
  void *ps[3 * N];
  for (int i = 0; i < 3 * N; i++) ps[i] = malloc(1024);
  hak_slab_t *s0 = slab_of_ptr(ps[0]);
  CHECK(s0->state == HAK_SLAB_FULL);
  CHECK(atomic_load(&s0->owner) == 0);
  free(ps[0]);
  CHECK(s0->state == HAK_SLAB_ACTIVE);
  CHECK(atomic_load(&s0->owner) == hak_thread_token());
  for (int i = 1; i < 3 * N; i++) free(ps[i]);
}

/* The current slab, run dry while another slab has freed blocks, waits at
 * the back of the queue, still the thread's: its frees take the fast path. */
TEST(current_slab_run_dry_waits_at_the_back) {
  enum { N = 400 }; /* 1 KiB class: 64 per slab (56 in slab 0), 256 once busy */
  void *ps[N];
  int n = 0;
  ps[n++] = malloc(1024);
  hak_slab_t *a = slab_of_ptr(ps[0]), *b = a;
  while (b == a && n < N) b = slab_of_ptr(ps[n++] = malloc(1024));
  REQUIRE(b != a && a->state == HAK_SLAB_FULL);
  free(ps[0]); /* a is back on the queue, behind b */
  REQUIRE(a->state == HAK_SLAB_ACTIVE);
  hak_slab_queue_t *q = &hak_tls_heap->queue[a->cls];
  REQUIRE(q->first == b);
  hak_slab_t *got = b;
  while (got == b && n < N) got = slab_of_ptr(ps[n++] = malloc(1024));
  REQUIRE(got == a);
  CHECK(q->first == a && q->last == b);
  CHECK(b->state == HAK_SLAB_ACTIVE);
  CHECK(atomic_load(&b->owner) == hak_thread_token());
  CHECK(b->used == b->capacity);
  void *last_of_b = ps[n - 2];
  REQUIRE(slab_of_ptr(last_of_b) == b);
  free(last_of_b);
  CHECK(b->local_free == last_of_b && b->used == b->capacity - 1);
  for (int i = 1; i < n; i++)
    if (ps[i] != last_of_b) free(ps[i]);
}

TEST(full_slab_with_remote_frees_is_revived) {
  enum { N = 3 * 64 };
  void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = malloc(1000);
  hak_slab_t *s0 = slab_of_ptr(ps[0]);
  REQUIRE(s0->state == HAK_SLAB_FULL);
  batch_t b = {ps, 8};
  run_thread(free_batch, &b);
  CHECK(atomic_load(&hak_tls_heap->full_remote) == 1);
  /* exhaust the current slab: the refill must reuse s0's blocks */
  int reused = 0;
  for (int i = 0; i < 200 && !reused; i++) {
    void *p = malloc(1000);
    reused = slab_of_ptr(p) == s0;
  }
  CHECK(reused);
}

TEST(refill_takes_freed_blocks_before_carving) {
  enum { SIZE = 256, MAX = 1024 };
  size_t cls = hak_size_class(SIZE);
  void *ps[MAX], *more[MAX];
  int n = 0, m = 0;
  ps[n++] = malloc(SIZE);
  hak_slab_t *a = slab_of_ptr(ps[0]), *b;
  void *p;
  while ((b = slab_of_ptr(p = malloc(SIZE))) == a && n < MAX) ps[n++] = p;
  REQUIRE(b != a);
  more[m++] = p;
  for (int i = 0; i < n; i += 2) free(ps[i]); /* holes in the full slab */
  while (hak_tls_heap->free[cls] != NULL && m < MAX) more[m++] = malloc(SIZE);
  REQUIRE(hak_tls_heap->free[cls] == NULL && b->reserved < b->capacity);
  uint32_t carved = b->reserved;
  /* the current slab could carve more, but a's holes come first */
  p = malloc(SIZE);
  CHECK(slab_of_ptr(p) == a);
  CHECK(b->reserved == carved);
  CHECK(hak_tls_heap->queue[cls].first == a);
  free(p);
  for (int i = 1; i < n; i += 2) free(ps[i]);
  for (int i = 0; i < m; i++) free(more[i]);
}

/* A block freed while its slab's first run is still being handed out
 * comes back at the next malloc of its class (a program that allocates
 * and drops temporaries while it grows gets its objects in a row), and
 * calloc clears it. */
TEST(a_fresh_runs_frees_come_back_first_and_calloc_clears_them) {
  enum { SIZE = 1000 }; /* a fresh slab's first carve: 4 blocks */
  size_t cls = hak_size_class(SIZE);
  unsigned char *p = calloc(1, SIZE); /* first use of this class: fresh slab */
  REQUIRE(p != NULL && hak_tls_heap->free[cls] != NULL);
  for (int i = 0; i < SIZE; i++) REQUIRE(p[i] == 0);
  unsigned char *next = (unsigned char *)hak_tls_heap->free[cls];
  memset(p, 0xEE, SIZE);
  free(p);
  unsigned char *q = calloc(1, SIZE);
  CHECK(q == p);
  for (int i = 0; i < SIZE; i++) REQUIRE(q[i] == 0);
  memset(q, 0xEE, SIZE);
  free(q);
  unsigned char *r = malloc(SIZE);
  CHECK(r == p);
  unsigned char *s = calloc(1, SIZE); /* the run goes on where it was */
  CHECK(s == next);
  for (int i = 0; i < SIZE; i++) REQUIRE(s[i] == 0);
  free(r);
  free(s);
}

/* ---- threads: abandonment and adoption ---- */

static size_t exit_block_size = 64; /* of alloc_and_exit's blocks */
static void *alloc_and_exit(void *arg) {
  void **ps = arg;
  for (int i = 0; i < 100; i++) ps[i] = malloc(exit_block_size);
  return NULL;
}
static void *alloc_one(void *arg) {
  *(void **)arg = malloc(64);
  return NULL;
}

TEST(exited_thread_segments_are_adopted) {
  void *ps[100];
  run_thread(alloc_and_exit, ps);
  hak_segment_t *seg = hak_segment_of(ps[0]);
  CHECK(atomic_load(&seg->heap) == NULL); /* abandoned */
  CHECK(slab_of_ptr(ps[0])->state == HAK_SLAB_ORPHAN);
  void *q;
  run_thread(alloc_one, &q);
  CHECK(hak_segment_of(q) == seg); /* the next thread adopted it */
  for (int i = 0; i < 100; i++) free(ps[i]);
  free(q);
}

TEST(free_into_exited_threads_segment_takes_it_over) {
  void *ps[100];
  run_thread(alloc_and_exit, ps);
  hak_segment_t *seg = hak_segment_of(ps[0]);
  REQUIRE(atomic_load(&seg->heap) == NULL);
  size_t live = hak_stats_live_blocks();
  free(ps[0]); /* reclaim on free: this thread now owns the segment */
  CHECK(hak_stats_live_blocks() == live - 1); /* counted once */
  CHECK(atomic_load(&seg->heap) == hak_tls_heap);
  hak_slab_t *slab = slab_of_ptr(ps[1]);
  CHECK(slab->state == HAK_SLAB_ACTIVE && atomic_load(&slab->owner) == hak_thread_token());
  uint32_t used = slab->used;
  free(ps[1]); /* now a local free */
  CHECK(slab->used == used - 1);
  CHECK(atomic_load(&slab->remote) == NULL);
  for (int i = 2; i < 100; i++) free(ps[i]);
}

/* A thread that leaves its heap behind (it drops its exit handler here, as
 * a thread that allocates again after the handler ran does), then a thread
 * with the same thread pointer: its new heap must retire the old one, or
 * its frees would pass the owner test of the old heap's slabs. */
typedef struct {
  void *p;          /* block of the first thread */
  uintptr_t token;  /* the thread's token */
  bool owner_ok;    /* second thread: p's slab is not ours unless its segment is */
} token_probe_t;
static void *alloc_and_leave_heap(void *arg) {
  token_probe_t *t = arg;
  t->p = malloc(64);
  t->token = hak_thread_token();
  pthread_setspecific(hak_thread_key, NULL);
  return NULL;
}
static void *malloc_then_probe(void *arg) {
  token_probe_t *t = arg;
  free(malloc(64));
  t->token = hak_thread_token();
  hak_slab_t *slab = slab_of_ptr(t->p);
  t->owner_ok = atomic_load(&slab->owner) != t->token ||
                atomic_load(&hak_segment_of(t->p)->heap) == hak_tls_heap;
  return NULL;
}

TEST(new_thread_retires_heap_left_with_its_thread_pointer) {
  token_probe_t a = {0}, b = {0};
  run_thread(alloc_and_leave_heap, &a);
  REQUIRE(atomic_load(&slab_of_ptr(a.p)->owner) == a.token); /* left ACTIVE */
  b.p = a.p;
  run_thread(malloc_then_probe, &b);
  REQUIRE(b.token == a.token); /* glibc gave the new thread the cached stack */
  CHECK(b.owner_ok);
  CHECK(atomic_load(&slab_of_ptr(a.p)->owner) != a.token ||
        atomic_load(&hak_segment_of(a.p)->heap) == NULL);
  free(a.p);
}

static void *heap_before_first_call(void *arg) {
  *(hak_heap_t **)arg = hak_tls_heap;
  return NULL;
}

/* A new thread points at the sentinel, which lies in read-only memory: a
 * path that wrote through a heap pointer before taking a heap would fault
 * there, not corrupt what every new thread reads. */
TEST(a_new_threads_heap_is_the_read_only_sentinel) {
  hak_heap_t *seen = NULL;
  run_thread(heap_before_first_call, &seen);
  CHECK(seen == HAK_HEAP_EMPTY);
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    *(volatile uintptr_t *)&HAK_HEAP_EMPTY->free[0] = 1;
    _exit(0);
  }
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "status %#x", status);
}

TEST(idle_threads_full_slabs_go_back_once_others_free_them) {
  /* this thread allocates a few slabs' worth, then only waits (a main
   * thread that handed its blocks to workers); a worker frees them */
  start_purger();
  enum { N = 200 };
  void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = malloc(1000);
  hak_slab_t *first = slab_of_ptr(ps[0]);
  REQUIRE(first->state == HAK_SLAB_FULL);
  batch_t b = {ps, N};
  run_thread(free_batch, &b);
  for (int i = 0; i < 200 && first->state != HAK_SLAB_FREE; i++) usleep(10000);
  CHECK_MSG(first->state == HAK_SLAB_FREE, "state %d", first->state);
}

/* ---- threads: parked heaps ---- */

TEST(exited_threads_heap_serves_the_next_thread) {
  hak_opt.purge_delay_ms = 100000; /* the parked heap stays */
  start_purger();
  void *ps[100];
  run_thread(alloc_and_exit, ps);
  hak_segment_t *seg = hak_segment_of(ps[0]);
  hak_heap_t *parked = atomic_load(&seg->heap);
  hak_slab_t *slab = slab_of_ptr(ps[0]);
  CHECK(parked != NULL && parked != hak_tls_heap); /* parked, not abandoned */
  CHECK(slab->state == HAK_SLAB_ACTIVE && atomic_load(&slab->owner) == 0);
  size_t live = hak_stats_live_blocks();
  uint32_t used = slab->used;
  free(ps[0]); /* freed as the owner would, under the heap's lock */
  CHECK(hak_stats_live_blocks() == live - 1);
  CHECK(atomic_load(&seg->heap) == parked);
  CHECK(slab->local_free == ps[0] && slab->used == used - 1);
  void *q;
  run_thread(alloc_one, &q);
  CHECK(hak_segment_of(q) == seg);       /* the new thread took the heap */
  CHECK(atomic_load(&slab->owner) == 0); /* and parked it again */
  for (int i = 1; i < 100; i++) free(ps[i]);
  free(q);
  CHECK(hak_stats_live_blocks() == live - 100);
}

/* Two threads alive at once, so that each exits with its own heap; the
 * second exits after the first has. */
static pthread_barrier_t both_allocated;
static sem_t second_may_exit;
static void *alloc_then_exit_first(void *arg) {
  alloc_and_exit(arg);
  pthread_barrier_wait(&both_allocated);
  return NULL;
}
static void *alloc_then_exit_second(void *arg) {
  alloc_then_exit_first(arg);
  sem_wait(&second_may_exit);
  return NULL;
}

/* A span cache's bound, of the thread that grew it and of the next. */
typedef struct {
  hak_heap_t *heap;
  unsigned max;
  bool empty;
} span_bound_t;

#define SPAN_BOUND_SIZE 40000 /* one block to a batch: the first bound is 1 */

static void *grow_a_span_cache(void *arg) {
  enum { N = 64, ROUNDS = 3 };
  span_bound_t *sb = arg;
  size_t cls = hak_size_class(SPAN_BOUND_SIZE);
  void *ps[N];
  for (int r = 0; r < ROUNDS; r++) { /* overflows, then runs dry: grows */
    for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(SPAN_BOUND_SIZE)) != NULL);
    for (int i = 0; i < N; i++) free(ps[i]);
  }
  sb->heap = hak_tls_heap;
  sb->max = hak_tls_heap->span_max[cls - HAK_SLAB_CLASSES];
  return NULL;
}

static void *probe_a_span_cache(void *arg) {
  span_bound_t *sb = arg;
  size_t cls = hak_size_class(SPAN_BOUND_SIZE);
  free(malloc(16)); /* takes a heap */
  sb->heap = hak_tls_heap;
  sb->max = hak_tls_heap->span_max[cls - HAK_SLAB_CLASSES];
  sb->empty = hak_tls_heap->free[cls] == NULL;
  return NULL;
}

/* A parked heap's span caches are empty, but keep the bounds they grew
 * to: the next thread is likely to use the classes as the last one did. */
TEST(a_parked_heap_keeps_its_span_cache_bounds) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  span_bound_t a = {0}, b = {0};
  run_thread(grow_a_span_cache, &a);
  REQUIRE(a.max > 1);
  run_thread(probe_a_span_cache, &b);
  REQUIRE(b.heap == a.heap);
  CHECK_MSG(b.max == a.max, "bound %u, was %u", b.max, a.max);
  CHECK(b.empty);
}

/* Rounds of blocks of 600 KiB that overflow the cache of their class and
 * then run it dry, as grow_a_span_cache's do for 40,000 B. */
static void *churn_a_big_span_class(void *arg) {
  enum { N = 8, ROUNDS = 3, SIZE = 600 << 10 };
  span_bound_t *sb = arg;
  size_t cls = hak_size_class(SIZE);
  void *ps[N];
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < N; i++) {
      REQUIRE((ps[i] = malloc(SIZE)) != NULL);
      CHECK(hak_segmap_of(ps[i]) == HAK_SEGMAP_SPANS);
    }
    for (int i = 0; i < N; i++) free(ps[i]);
  }
  sb->max = hak_tls_heap->span_max[cls - HAK_SLAB_CLASSES];
  sb->empty = hak_span_count(hak_tls_heap, cls) <= 1;
  return NULL;
}

/* Blocks of 256 KiB to 1 MiB are span blocks, but the caches of their
 * classes keep one block: what they free goes back to the page heap,
 * where a block of any size takes its pages. */
TEST(span_caches_of_blocks_over_256_KiB_keep_one_block) {
  span_bound_t big = {0}, small = {0};
  run_thread(churn_a_big_span_class, &big);
  CHECK_MSG(big.max == 1 && big.empty, "bound %u", big.max);
  run_thread(grow_a_span_cache, &small); /* a class of 40,000 B grows */
  CHECK(small.max > 1);
}

/* Two threads allocate 100 blocks each and exit, the first before the
 * second: two heaps parked, older and newer. */
static void park_two_heaps(void **first, void **second, hak_heap_t **older, hak_heap_t **newer) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  pthread_t a, b;
  pthread_barrier_init(&both_allocated, NULL, 2);
  sem_init(&second_may_exit, 0, 0);
  REQUIRE(pthread_create(&a, NULL, alloc_then_exit_first, first) == 0);
  REQUIRE(pthread_create(&b, NULL, alloc_then_exit_second, second) == 0);
  pthread_join(a, NULL);
  sem_post(&second_may_exit);
  pthread_join(b, NULL);
  *older = atomic_load(&hak_segment_of(first[0])->heap);
  *newer = atomic_load(&hak_segment_of(second[0])->heap);
  REQUIRE(*older != NULL && *newer != NULL && *older != *newer); /* both parked */
}

TEST(new_thread_takes_the_heap_parked_longest) {
  void *first[100], *second[100], *q;
  hak_heap_t *older, *newer;
  park_two_heaps(first, second, &older, &newer);
  run_thread(alloc_one, &q);
  CHECK(atomic_load(&hak_segment_of(q)->heap) == older);
  for (int i = 0; i < 100; i++) {
    free(first[i]);
    free(second[i]);
  }
  free(q);
}

/* A new thread's first call frees a block of a parked heap, then allocates. */
typedef struct {
  void *victim, *q;
  hak_heap_t *heap;
} free_first_t;

static void *free_then_alloc(void *arg) {
  free_first_t *f = arg;
  free(f->victim);
  f->q = malloc(64);
  f->heap = hak_tls_heap;
  return NULL;
}

/* A thread whose first call frees a parked heap's block takes that heap,
 * not the one parked longest: a worker handed the last one's blocks
 * (larson's lineages) then frees them as their owner. */
TEST(new_thread_takes_the_parked_heap_of_the_block_it_frees_first) {
  void *first[100], *second[100];
  hak_heap_t *older, *newer;
  park_two_heaps(first, second, &older, &newer);
  free_first_t f = {.victim = second[50]};
  run_thread(free_then_alloc, &f);
  CHECK(f.heap == newer);
  CHECK_MSG(f.q == second[50], "%p, not the block just freed %p", f.q, second[50]);
  CHECK(atomic_load(&hak_segment_of(second[0])->heap) == newer && newer->parked); /* again */
  for (int i = 0; i < 100; i++) {
    free(first[i]);
    if (i != 50) free(second[i]);
  }
  free(f.q);
}

/* Threads alive at once, past one chunk of the heap pool: each records
 * its heap once it has one. */
#define NUMBERED_THREADS 70
static pthread_barrier_t all_have_heaps;

static void *record_heap(void *arg) {
  free(malloc(64));
  *(hak_heap_t **)arg = hak_tls_heap;
  pthread_barrier_wait(&all_have_heaps);
  return NULL;
}

/* A heap's number (a span block's hint, span.c) names that heap, across
 * the pool's chunks; 0 names none. */
TEST(a_heaps_number_names_that_heap) {
  hak_heap_t *heaps[NUMBERED_THREADS];
  pthread_t t[NUMBERED_THREADS];
  pthread_barrier_init(&all_have_heaps, NULL, NUMBERED_THREADS + 1);
  for (int i = 0; i < NUMBERED_THREADS; i++) REQUIRE(pthread_create(&t[i], NULL, record_heap, &heaps[i]) == 0);
  pthread_barrier_wait(&all_have_heaps);
  for (int i = 0; i < NUMBERED_THREADS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&all_have_heaps);
  CHECK(hak_heap_numbered(0) == NULL);
  for (int i = 0; i < NUMBERED_THREADS; i++) {
    CHECK_MSG(heaps[i]->number != 0 && hak_heap_numbered(heaps[i]->number) == heaps[i], "thread %d: number %u",
              i, heaps[i]->number);
    for (int j = 0; j < i; j++) CHECK(heaps[j] != heaps[i] && heaps[j]->number != heaps[i]->number);
  }
}

/* A thread creates its successor, hands it a block, and exits once the
 * successor is about to free it (or, if stays, joins it). With cancel,
 * the successor has a cancel pending when it frees. */
typedef struct {
  sem_t freeing;
  pthread_t successor;
  bool stays, cancel;
  /* the creator waits for the free yielding, not asleep, and the successor
   * counts the voluntary context switches of its free */
  bool creator_yields;
  atomic_int freeing_now;
  long free_switches;
  unsigned exit_delay_us; /* the creator's pause between the free and its exit */
  size_t size;            /* the block's, 64 B if 0 */
  atomic_int cancel_sent;
  void *block, *q, *result;
  hak_heap_t *creator, *heap;
  bool creator_live; /* when the successor freed the block */
} handover_t;

static void *free_creators_block(void *arg) {
  handover_t *h = arg;
  if (h->cancel) {
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
    while (!atomic_load(&h->cancel_sent)) sched_yield();
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
  }
  sem_post(&h->freeing);
  atomic_store(&h->freeing_now, 1);
  h->creator_live = !__atomic_load_n(&h->creator->parked, __ATOMIC_RELAXED);
  struct rusage before, after;
  getrusage(RUSAGE_THREAD, &before);
  free(h->block);
  getrusage(RUSAGE_THREAD, &after);
  h->free_switches = after.ru_nvcsw - before.ru_nvcsw;
  h->q = malloc(h->size);
  h->heap = hak_tls_heap;
  if (h->cancel) pthread_testcancel();
  return NULL;
}

static void *hand_over(void *arg) {
  handover_t *h = arg;
  h->block = malloc(h->size);
  h->creator = hak_tls_heap;
  REQUIRE(pthread_create(&h->successor, NULL, free_creators_block, h) == 0);
  if (h->cancel) {
    pthread_cancel(h->successor);
    atomic_store(&h->cancel_sent, 1);
  }
  if (h->creator_yields) {
    while (!atomic_load(&h->freeing_now)) sched_yield();
  } else {
    sem_wait(&h->freeing);
  }
  if (h->exit_delay_us) usleep(h->exit_delay_us);
  if (h->stays) pthread_join(h->successor, &h->result);
  return NULL;
}

static void run_handover(handover_t *h) {
  if (h->size == 0) h->size = 64;
  sem_init(&h->freeing, 0, 0);
  pthread_t c;
  REQUIRE(pthread_create(&c, NULL, hand_over, h) == 0);
  pthread_join(c, NULL);
  if (!h->stays) pthread_join(h->successor, &h->result);
  sem_destroy(&h->freeing);
}

/* Hand-overs, up to 20, until a successor takes its live creator's heap
 * (its next malloc of the size returns the block): the tries made, or 0.
 * With another_parked, two heaps of other threads, blocks of them in use,
 * are parked first: the creator takes one, and the other is parked when
 * the successor frees; else none is but the creator's. The block is of
 * size bytes. */
static int tries_until_the_creators_heap_is_taken(unsigned exit_delay_us, bool another_parked, size_t size) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  for (int tries = 1; tries <= 20; tries++) {
    hak_heaps_retire_parked();
    void *first[100], *second[100];
    hak_heap_t *older, *newer;
    if (another_parked) park_two_heaps(first, second, &older, &newer);
    handover_t h = {.exit_delay_us = exit_delay_us, .size = size};
    run_handover(&h);
    bool taken = h.creator_live && h.heap == h.creator && h.q == h.block;
    free(h.q);
    for (int i = 0; another_parked && i < 100; i++) {
      free(first[i]);
      free(second[i]);
    }
    if (taken) return tries;
  }
  return 0;
}

/* The same in a new process, where the wait's bound is its first one: up
 * to `runs` of them, until one ends with more than `least` tries. The
 * waits are timed: on a loaded machine a thread may not run for
 * milliseconds, which fails a try (the creator parked before the free, or
 * could not park within the wait) or passes one (the successor woke after
 * the park), and one process that ran undisturbed decides. */
/* fn's result (0-255) in a new process. */
static int in_new_process(int (*fn)(const void *), const void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(fn(arg));
  int status;
  REQUIRE(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status));
  return WEXITSTATUS(status);
}

typedef struct {
  unsigned exit_delay_us;
  bool another_parked;
  size_t size;
} handover_tries_t;

static int handover_tries(const void *arg) {
  const handover_tries_t *t = arg;
  return tries_until_the_creators_heap_is_taken(t->exit_delay_us, t->another_parked, t->size);
}

static int tries_in_new_processes(unsigned exit_delay_us, bool another_parked, size_t size, int least,
                                  int runs) {
  handover_tries_t t = {exit_delay_us, another_parked, size};
  int tries = 0;
  for (int run = 0; run < runs && tries <= least; run++) tries = in_new_process(handover_tries, &t);
  return tries;
}

/* A thread whose first call frees a block of its creator, which is about
 * to exit, waits for the creator's heap to park and takes it, when no heap
 * is parked: its next malloc of the size returns the block. Up to 20
 * tries, for one whose creator could not run within the wait; a try where
 * the creator had parked before the free proves nothing. */
TEST(new_thread_waits_for_the_heap_of_its_exiting_creator) {
  CHECK_MSG(tries_in_new_processes(0, false, 64, 0, 5) != 0, "not in 20 tries");
}

/* The same while another thread's heap is parked, which the successor
 * would take at once: it waits for its creator's all the same (a chain of
 * workers keeps to one heap; larson 4t 1-8 KiB, 62.9 MiB against 86.8). */
TEST(new_thread_waits_for_its_creators_heap_while_another_is_parked) {
  CHECK_MSG(tries_in_new_processes(0, true, 64, 0, 5) != 0, "not in 20 tries");
}

/* The same for a span block, which lies in no heap's segment: its last
 * page names the heap that took it from the page heap. */
TEST(new_thread_waits_for_its_creators_heap_when_the_block_is_a_span_block) {
  CHECK_MSG(tries_in_new_processes(0, true, 12000, 0, 5) != 0, "not in 20 tries");
}

/* The creator and its successor on one CPU, the creator runnable when the
 * successor frees its block (it waits for the free with sched_yield): once
 * creators have taught the wait a bound of milliseconds (they parked 1 ms
 * after their successors' frees), the successor's wait for the creator's
 * heap yields the CPU to it, and makes no voluntary context switch; a wait
 * asleep left cores idle where threads outnumber them (larson 4t 8-128, 2
 * cores: 185% busy against 195%). In a new process, with tries until the
 * creator was live at the free: 1 if the successor then took its heap
 * without a voluntary switch. */
static int handover_on_one_cpu_yields(const void *unused) {
  tries_until_the_creators_heap_is_taken(1000, false, 0); /* until the bound covers 1 ms */
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  for (int tries = 0; tries < 20; tries++) {
    hak_heaps_retire_parked();
    handover_t h = {.creator_yields = true};
    run_handover(&h);
    free(h.q);
    if (!h.creator_live) continue;
    if (h.heap != h.creator) return 2;
    return h.free_switches == 0 ? 1 : 3;
  }
  return 0;
}

TEST(the_wait_for_the_creators_heap_yields_the_cpu) {
  int result = 0;
  for (int run = 0; run < 3 && result != 1; run++) /* one undisturbed run decides */
    result = in_new_process(handover_on_one_cpu_yields, NULL);
  CHECK_MSG(result != 0, "the creator was never live at the free");
  CHECK_MSG(result != 2, "the successor did not take its creator's heap");
  CHECK_MSG(result != 3, "the successor's free slept");
}

/* A creator that parks 1 ms after its successor's free, 20 times the
 * wait's first bound: the first successor gives up, and how late the
 * creator parked then makes the next ones wait long enough. Three
 * processes, not five: a bound that starts at 5 ms passes in one of about
 * 30, when its first successor takes another heap. */
TEST(the_wait_for_the_creators_heap_learns_how_late_creators_park) {
  int tries = tries_in_new_processes(1000, false, 64, 1, 3);
  CHECK_MSG(tries != 0, "not in 20 tries");
  CHECK_MSG(tries != 1, "the first successor waited 1 ms");
}

/* A creator that lives on (it joins its successor) never parks: the
 * successor gives up waiting and takes a heap of its own. */
TEST(new_thread_whose_creator_lives_on_takes_a_heap_of_its_own) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  hak_heaps_retire_parked();
  handover_t h = {.stays = true};
  run_handover(&h);
  CHECK(h.creator_live);
  CHECK(h.heap != NULL && h.heap != HAK_HEAP_EMPTY && h.heap != h.creator);
  CHECK(h.q != h.block);
  free(h.q);
}

/* free is no cancellation point: the wait for the creator's heap does not
 * act on a pending cancel (which would unwind the thread holding the lock
 * of the heaps' lists, out of free). */
TEST(the_wait_for_the_creators_heap_is_no_cancellation_point) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  hak_heaps_retire_parked();
  handover_t h = {.cancel = true};
  run_handover(&h);
  CHECK(h.result == PTHREAD_CANCELED);
  CHECK_MSG(h.q != NULL && h.heap != NULL, "the thread unwound in free");
  void *q = NULL;
  run_thread(alloc_one, &q); /* the heaps' lock is free */
  CHECK(q != NULL);
  free(q);
  free(h.q);
}

/* A thread that has a heap (the one parked longest) frees a block of the
 * heap parked after it, then allocates a block of the same size. */
typedef struct {
  void *victim, *q;
  hak_heap_t *took, *heap;
} young_free_t;

static void *alloc_free_parked_alloc(void *arg) {
  young_free_t *f = arg;
  void *mine = malloc(exit_block_size);
  f->took = hak_tls_heap;
  free(f->victim);
  f->q = malloc(exit_block_size);
  f->heap = hak_tls_heap;
  free(mine);
  return NULL;
}

/* Parks two heaps of blocks of size bytes, and runs a young thread that
 * frees one of the newer heap's blocks (alloc_free_parked_alloc); the
 * caller frees the rest. */
static void young_thread_frees_into_parked(size_t size, void **first, void **second,
                                           hak_heap_t **older, hak_heap_t **newer,
                                           young_free_t *f) {
  exit_block_size = size;
  park_two_heaps(first, second, older, newer);
  f->victim = second[50];
  run_thread(alloc_free_parked_alloc, f);
  exit_block_size = 64;
  CHECK(f->took == *older);
  CHECK((*older)->parked && (*newer)->parked); /* the thread exited */
}

static void free_parked_blocks(void **first, void **second, void *q) {
  for (int i = 0; i < 100; i++) {
    free(first[i]);
    if (i != 50) free(second[i]);
  }
  free(q);
}

/* A young thread that frees a block of 1 KiB or more of a parked heap
 * takes that heap, its own parked: a worker that started before the last
 * one exited keeps to the last one's heap. */
TEST(young_thread_takes_the_parked_heap_it_frees_a_big_block_into) {
  void *first[100], *second[100];
  hak_heap_t *older, *newer;
  young_free_t f = {0};
  young_thread_frees_into_parked(2048, first, second, &older, &newer, &f);
  CHECK(f.heap == newer);
  CHECK_MSG(f.q == second[50], "%p, not the block just freed %p", f.q, second[50]);
  free_parked_blocks(first, second, f.q);
}

/* Blocks under 1 KiB: the thread keeps its heap, and the block goes back
 * to the parked one. */
TEST(young_thread_keeps_its_heap_when_it_frees_a_small_block_into_a_parked_one) {
  void *first[100], *second[100];
  hak_heap_t *older, *newer;
  young_free_t f = {0};
  young_thread_frees_into_parked(512, first, second, &older, &newer, &f);
  CHECK(f.heap == older);
  CHECK(f.q != second[50] && hak_segment_of(f.q) != hak_segment_of(second[0]));
  free_parked_blocks(first, second, f.q);
}

/* A key whose destructor runs after hakmem's in each round and re-arms
 * itself until the last round, where it frees late_victim. */
static pthread_key_t late_key;
static void *late_victim;
static void free_in_the_last_round(void *round) {
  if ((uintptr_t)round < PTHREAD_DESTRUCTOR_ITERATIONS) {
    pthread_setspecific(late_key, (void *)((uintptr_t)round + 1));
    return;
  }
  free(late_victim);
}
static void *alloc_then_free_late(void *arg) {
  *(void **)arg = malloc(64); /* takes the parked heap; the first round parks it again */
  pthread_setspecific(late_key, (void *)1);
  return NULL;
}

/* A free from a destructor after the thread's exit handler does not take
 * the parked heap: after the last round nothing would park it again. */
TEST(a_free_after_the_exit_handler_takes_no_parked_heap) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  void *ps[100], *own;
  run_thread(alloc_and_exit, ps);
  hak_heap_t *parked = atomic_load(&hak_segment_of(ps[0])->heap);
  REQUIRE(parked != NULL && parked->parked);
  REQUIRE(pthread_key_create(&late_key, free_in_the_last_round) == 0);
  late_victim = ps[0];
  run_thread(alloc_then_free_late, &own);
  CHECK(atomic_load(&hak_segment_of(ps[1])->heap) == parked && parked->parked);
  pthread_key_delete(late_key);
  for (int i = 1; i < 100; i++) free(ps[i]);
  free(own);
}

/* ... nor a heap for its outboxes: the block goes to its slab at once,
 * not to the outbox of a heap no thread would flush. */
TEST(a_free_after_the_exit_handler_hands_the_block_over_at_once) {
  void *b = malloc(64), *keep = malloc(64), *own;
  hak_slab_t *slab = slab_of_ptr(b);
  REQUIRE(slab == slab_of_ptr(keep) && atomic_load(&slab->remote) == NULL);
  REQUIRE(pthread_key_create(&late_key, free_in_the_last_round) == 0);
  late_victim = b;
  run_thread(alloc_then_free_late, &own);
  CHECK(atomic_load(&slab->remote) == b); /* on its slab's remote list */
  pthread_key_delete(late_key);
  free(own);
  free(keep);
}

TEST(emptied_parked_heap_waits_for_the_next_thread) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  void *ps[100], *q;
  run_thread(alloc_and_exit, ps);
  hak_segment_t *seg = hak_segment_of(ps[0]);
  hak_heap_t *parked = atomic_load(&seg->heap);
  REQUIRE(parked != NULL);
  for (int i = 0; i < 99; i++) free(ps[i]);
  CHECK(!parked->parked_empty); /* one block left */
  free(ps[99]);
  CHECK(atomic_load(&seg->heap) == parked && parked->parked_empty); /* not retired */
  void *p = ps[99];
  run_thread(alloc_one, &q);
  CHECK(hak_segment_of(q) == seg); /* the new thread took it */
  bool freed = false; /* its lists were ready */
  for (int i = 0; i < 100; i++) freed |= q == ps[i];
  CHECK_MSG(freed, "%p is not one of the blocks freed (the last %p)", q, p);
  free(q);
}

/* Threads alive at once (so each has a heap of its own) that free their
 * blocks and exit one after the other. */
enum { EMPTY_RETIRED = 2, EMPTY_EXITERS = HAK_KEEP_EMPTY_HEAPS + EMPTY_RETIRED };
static pthread_barrier_t exiters_ready;
static sem_t exiter_turn[EMPTY_EXITERS];
static void *alloc_free_and_exit_in_turn(void *arg) {
  int i = (int)(intptr_t)((void **)arg)[0];
  void *p = malloc(64);
  ((void **)arg)[1] = p;
  pthread_barrier_wait(&exiters_ready);
  sem_wait(&exiter_turn[i]);
  free(p);
  return NULL;
}

/* Parks the heaps of EMPTY_EXITERS threads, each of which held a block,
 * empty, into h (the one parked longest first). */
static void park_empty_heaps(hak_heap_t *h[EMPTY_EXITERS]) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  void *arg[EMPTY_EXITERS][2];
  pthread_t t[EMPTY_EXITERS];
  pthread_barrier_init(&exiters_ready, NULL, EMPTY_EXITERS);
  for (int i = 0; i < EMPTY_EXITERS; i++) {
    sem_init(&exiter_turn[i], 0, 0);
    arg[i][0] = (void *)(intptr_t)i;
    REQUIRE(pthread_create(&t[i], NULL, alloc_free_and_exit_in_turn, arg[i]) == 0);
  }
  for (int i = 0; i < EMPTY_EXITERS; i++) {
    sem_post(&exiter_turn[i]);
    pthread_join(t[i], NULL);
  }
  for (int i = 0; i < EMPTY_EXITERS; i++) {
    h[i] = atomic_load(&hak_segment_of(arg[i][1])->heap);
    CHECK_MSG(h[i] != NULL && h[i]->parked && h[i]->parked_empty, "heap %d retired", i);
    REQUIRE(h[i] != NULL);
  }
}

/* After park_empty_heaps: the first EMPTY_RETIRED retired, the others wait. */
static void check_oldest_empty_heaps_retired(hak_heap_t *h[EMPTY_EXITERS]) {
  for (int i = 0; i < EMPTY_EXITERS; i++) {
    if (i < EMPTY_RETIRED) /* retired: the struct back in the pool */
      CHECK_MSG(!h[i]->parked, "heap %d waits too", i);
    else
      CHECK_MSG(h[i]->parked && h[i]->parked_empty, "heap %d retired", i);
  }
}

/* Every empty heap waits, until threads take memory not committed yet:
 * then those parked longest retire, one a slab, but for a few. */
TEST(empty_heaps_wait_until_a_thread_takes_new_pages) {
  hak_heap_t *h[EMPTY_EXITERS];
  park_empty_heaps(h);
  enum { BIG = 2000 };
  static void *big[BIG]; /* 14 MiB of 7,000-byte blocks: slabs on new pages */
  for (int i = 0; i < BIG; i++) REQUIRE((big[i] = malloc(7000)) != NULL);
  check_oldest_empty_heaps_retired(h);
  for (int i = 0; i < BIG; i++) free(big[i]);
}

/* The same for a thread that allocates large blocks, one retired a block. */
TEST(empty_heaps_retire_as_a_thread_takes_large_blocks) {
  hak_heap_t *h[EMPTY_EXITERS];
  park_empty_heaps(h);
  void *big[EMPTY_RETIRED];
  for (int i = 0; i < EMPTY_RETIRED; i++) REQUIRE((big[i] = malloc(2 << 20)) != NULL);
  check_oldest_empty_heaps_retired(h);
  for (int i = 0; i < EMPTY_RETIRED; i++) free(big[i]);
}

/* Blocks that take no new pages retire none: large ones the thread takes
 * again, span blocks from pages it gave back (a tree of threads that each
 * took a block a round retired an empty heap each time, and the next
 * threads built theirs on new pages: forkjoin 8 5 20 4141 1 ran 1.31x as
 * fast without). */
TEST(empty_heaps_wait_while_a_thread_reuses_its_pages) {
  enum { SPANS = 64 };
  static void *big[EMPTY_RETIRED], *span[SPANS];
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  for (int i = 0; i < EMPTY_RETIRED; i++) REQUIRE((big[i] = malloc(2 << 20)) != NULL);
  for (int i = 0; i < SPANS; i++) REQUIRE((span[i] = malloc(64 << 10)) != NULL);
  for (int i = 0; i < EMPTY_RETIRED; i++) free(big[i]);
  for (int i = 0; i < SPANS; i++) free(span[i]);
  hak_heap_t *h[EMPTY_EXITERS];
  park_empty_heaps(h);
  for (int i = 0; i < EMPTY_RETIRED; i++) REQUIRE((big[i] = malloc(2 << 20)) != NULL);
  for (int i = 0; i < SPANS; i++) REQUIRE((span[i] = malloc(64 << 10)) != NULL);
  for (int i = 0; i < EMPTY_EXITERS; i++)
    CHECK_MSG(h[i]->parked && h[i]->parked_empty, "heap %d retired", i);
  for (int i = 0; i < EMPTY_RETIRED; i++) free(big[i]);
  for (int i = 0; i < SPANS; i++) free(span[i]);
}

/* Span blocks on new pages retire them as slabs do. */
TEST(empty_heaps_retire_as_a_thread_takes_span_blocks_on_new_pages) {
  enum { SPANS = 64 };
  static void *span[SPANS];
  hak_heap_t *h[EMPTY_EXITERS];
  park_empty_heaps(h);
  for (int i = 0; i < SPANS; i++) REQUIRE((span[i] = malloc(64 << 10)) != NULL);
  check_oldest_empty_heaps_retired(h);
  for (int i = 0; i < SPANS; i++) free(span[i]);
}

/* Fills a slab of 1000-byte blocks and keeps one 64-byte block; exits
 * once the test thread has freed the 1000-byte ones. */
typedef struct {
  void *ps[200], *keep;
  sem_t filled, freed;
} fill_t;
static void *fill_then_wait(void *arg) {
  fill_t *f = arg;
  for (int i = 0; i < 200; i++) f->ps[i] = malloc(1000);
  f->keep = malloc(64);
  sem_post(&f->filled);
  sem_wait(&f->freed);
  return NULL;
}

TEST(parked_heap_empties_when_its_last_block_is_freed_after_full_slabs_emptied) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  fill_t f;
  sem_init(&f.filled, 0, 0);
  sem_init(&f.freed, 0, 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, fill_then_wait, &f) == 0);
  sem_wait(&f.filled);
  REQUIRE(slab_of_ptr(f.ps[0])->state == HAK_SLAB_FULL);
  for (int i = 0; i < 200; i++) free(f.ps[i]); /* remote: the FULL slab empties */
  hak_free_flush_outboxes(hak_tls_heap);
  sem_post(&f.freed);
  pthread_join(t, NULL);
  hak_segment_t *seg = hak_segment_of(f.keep);
  hak_heap_t *parked = atomic_load(&seg->heap);
  REQUIRE(parked != NULL && !parked->parked_empty);
  free(f.keep);
  CHECK(parked->parked_empty); /* the emptied FULL slab did not count */
}

/* A thread's 100 blocks, all but the last freed here: its heap stays parked. */
static void *one_block_of_exited_thread(void) {
  void *ps[100];
  run_thread(alloc_and_exit, ps);
  for (int i = 0; i < 99; i++) free(ps[i]);
  return ps[99];
}

TEST(parked_heap_retires_after_the_purge_delay) {
  hak_opt.purge_delay_ms = 20;
  start_purger();
  void *p = one_block_of_exited_thread();
  hak_segment_t *seg = hak_segment_of(p);
  REQUIRE(atomic_load(&seg->heap) != NULL);
  for (int i = 0; i < 300 && atomic_load(&seg->heap) != NULL; i++) usleep(10000);
  CHECK(atomic_load(&seg->heap) == NULL); /* abandoned */
  free(p);
}

TEST(collect_retires_parked_heaps) {
  hak_opt.purge_delay_ms = 100000;
  start_purger();
  void *p = one_block_of_exited_thread();
  hak_segment_t *seg = hak_segment_of(p);
  hak_heap_t *parked = atomic_load(&seg->heap);
  REQUIRE(parked != NULL && parked != hak_tls_heap);
  hak_collect(true); /* retires it: this thread takes the abandoned segment */
  CHECK(atomic_load(&seg->heap) == hak_tls_heap);
  free(p);
}

static void *alloc_1000_and_exit(void *arg) {
  void **ps = arg;
  for (int i = 0; i < 1000; i++) ps[i] = malloc(64);
  return NULL;
}

TEST(exiting_thread_gives_its_free_lists_back) {
  /* the thread's heap list holds blocks it never handed out: at exit they
   * must go back to their slab, or the slab can never become empty */
  static void *ps[1000];
  run_thread(alloc_1000_and_exit, ps);
  hak_slab_t *last = slab_of_ptr(ps[999]);
  uint32_t handed_out = 0;
  for (int i = 0; i < 1000; i++) handed_out += slab_of_ptr(ps[i]) == last;
  CHECK_MSG(last->used == handed_out, "slab used %u, blocks handed out of it %u", last->used,
            handed_out);
  for (int i = 0; i < 1000; i++) free(ps[i]);
}

static void *churn_thread(void *arg) {
  void *p[16];
  for (int i = 0; i < 16; i++) p[i] = malloc(16 + 64 * i);
  for (int i = 0; i < 16; i++) free(p[i]);
  return NULL;
}

TEST(thread_churn_reuses_segments) {
  hak_stats_t s0, s1;
  run_thread(churn_thread, NULL);
  hak_stats_get(&s0);
  for (int i = 0; i < 2000; i++) {
    run_thread(churn_thread, NULL);
  }
  hak_stats_get(&s1);
  CHECK_MSG(s1.segments <= s0.segments + 2, "segments %zu -> %zu", s0.segments, s1.segments);
}

static pthread_barrier_t both_allocated;

/* Writes blocks in a segment of its own, waits until the other thread has
 * too, frees them and exits: its segment, all free, goes to the cache once
 * its heap retires. */
static void *fill_and_exit_together(void *arg) {
  enum { N = 64 };
  void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = memset(malloc(1000), 1, 1000);
  *(hak_slab_t **)arg = slab_of_ptr(ps[0]);
  pthread_barrier_wait(&both_allocated);
  for (int i = 0; i < N; i++) free(ps[i]);
  return NULL;
}

TEST(segment_cache_keeps_only_the_last_segment_committed) {
  hak_opt.purge_delay_ms = 100000; /* no purge but the cache's own */
  start_purger();
  hak_slab_t *slab[2];
  pthread_t t[2];
  pthread_barrier_init(&both_allocated, NULL, 2);
  for (int i = 0; i < 2; i++)
    REQUIRE(pthread_create(&t[i], NULL, fill_and_exit_together, &slab[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&both_allocated);
  hak_heaps_retire_parked(); /* the heaps go, and their empty segments to the cache */
  REQUIRE(hak_segment_of_slab(slab[0]) != hak_segment_of_slab(slab[1]));
  REQUIRE(slab[0]->state == HAK_SLAB_FREE && slab[1]->state == HAK_SLAB_FREE);
  /* whichever exited first was purged when the other's segment came */
  CHECK(unit_purged(slab[0]) != unit_purged(slab[1]));
  hak_slab_t *older = unit_purged(slab[0]) ? slab[0] : slab[1];
  uint8_t *blocks = hak_slab_start(hak_segment_of_slab(older), older);
  int resident = resident_pages(blocks, HAK_UNIT_SIZE - HAK_SEG_HEADER);
  CHECK_MSG(resident == 0, "%d pages resident", resident);
}

TEST(live_block_count_returns_to_zero) {
  /* glibc's pthread_create allocates (the thread's DTV, kept with its
   * cached stack): start one first so the baseline includes it, after the
   * purger, which would take that stack */
  start_purger();
  batch_t none = {NULL, 0};
  run_thread(free_batch, &none);
  size_t base = hak_stats_live_blocks();
  void *ps[1000];
  for (int i = 0; i < 1000; i++) ps[i] = malloc((size_t)(i * 97) % 300000 + 1);
  CHECK(hak_stats_live_blocks() == base + 1000);
  batch_t b = {ps, 500};
  run_thread(free_batch, &b);
  for (int i = 500; i < 1000; i++) free(ps[i]);
  CHECK_MSG(hak_stats_live_blocks() == base, "live %zu, base %zu", hak_stats_live_blocks(), base);
}

static void *free_others(void *arg) {
  void **slot = arg;
  free(*slot); /* a block another thread allocated */
  *slot = malloc(100 + ((uintptr_t)slot & 0xff));
  return NULL;
}

TEST(thread_churn_with_cross_frees_leaks_nothing) {
  start_purger();
  void *slot = malloc(64);
  run_thread(free_others, &slot); /* warm glibc's stack cache */
  size_t base = hak_stats_live_blocks();
  for (int i = 0; i < 3000; i++) {
    run_thread(free_others, &slot);
  }
  CHECK_MSG(hak_stats_live_blocks() == base, "live %zu, base %zu", hak_stats_live_blocks(), base);
  free(slot);
}

/* ---- options ---- */

static char *capture_stderr(void (*fn)(void)) {
  static char buf[4096];
  int fds[2];
  if (pipe(fds) != 0) return NULL;
  int saved = dup(2);
  dup2(fds[1], 2);
  fn();
  dup2(saved, 2);
  close(fds[1]);
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  buf[n > 0 ? n : 0] = 0;
  return buf;
}

TEST(options_parse_warn_and_profile) {
  setenv("HAKMEM_PROFILE", "lowmem", 1);
  setenv("HAKMEM_SEGMENT_CACHE", "3", 1);
  setenv("HAKMEM_PURGE_DELAY_MS", "12x", 1);
  setenv("HAKMEM_NO_SUCH_THING", "1", 1);
  char *err = capture_stderr(hak_options_load);
  CHECK(strcmp(hak_opt.profile, "lowmem") == 0);
  CHECK(hak_opt.segment_cache == 3);      /* explicit beats the profile */
  CHECK(hak_opt.purge_delay_ms == 0);     /* from the profile; bad value ignored */
  CHECK(hak_opt.large_cache_mb == 0);
  CHECK(strstr(err, "unknown option HAKMEM_NO_SUCH_THING") != NULL);
  CHECK(strstr(err, "bad value HAKMEM_PURGE_DELAY_MS=12x") != NULL);
}

TEST_MAIN("unit")
