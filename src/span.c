/* Spans: blocks of 8 KiB to 1 MiB (the span classes), each a run of
 * whole pages of a span segment of its own, so that the pages a freed block
 * gives back serve a block of any size: a program whose sizes move, or that
 * frees every other block and then asks for bigger ones, reuses them, where
 * slabs of one class kept them for that class alone. A block starts at a
 * colour of its first page (internal.h: hak_span_colour), so that the
 * first lines of blocks on different pages fall in different cache sets;
 * a size that does not fit after every colour, or an alignment, takes it
 * at its page's start, where it then stays.
 *
 * Two levels. Each thread keeps a cache of free blocks per class: the
 * heap's list of the class, which malloc's fast path pops as it pops a slab
 * class's list. free pushes onto the cache of the freeing thread, whichever
 * thread allocated the block; past the cache's bound, a batch goes back to
 * the page heap. A cache that runs dry takes a batch and may grow: it ends
 * up holding what the thread's use of the class swings by, so that a
 * steady program stops going to the page heap. The page heap is global,
 * under one lock taken once per batch: free runs of pages, split to serve
 * a block and merged with their free neighbours of alike memory (the page
 * words in a segment's header name them), found by best fit in bins by
 * length, runs with committed pages first. A short run that a block gave
 * back stays apart from its neighbours until they are needed whole, for
 * the next block of its length. A run idle for the purge delay is purged,
 * and a segment with no block left goes back to the segment cache once its
 * runs are purged. */
#define _GNU_SOURCE /* PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP */
#include "internal.h"

static pthread_mutex_t hak_span_lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;

/* What a free run's memory is. Only alike runs merge (see runs_alike). */
enum {
  RUN_DIRTY,  /* may hold committed pages; counted as committed */
  RUN_ZERO,   /* zero, never used since mapped; counted as committed */
  RUN_PURGED, /* zero, returned to the OS; not counted */
};

typedef struct run_s run_t;
struct run_s {
  run_t *next, *prev; /* its bin */
  hak_segment_t *seg;
  uint64_t since_ms; /* DIRTY: when a block was last given back into it */
  uint32_t handle;   /* what its pages' words hold (run_mark) */
  uint16_t first, pages;
  uint8_t state;
};

/* Bin n (1 <= n < 64) holds the runs of n pages, and the 16 bins after it
 * the longer ones, 4 a doubling of their length (64-79 pages, 80-95, ...,
 * 896-1022): a search scans one of those for the shortest that fits. One
 * list of every run over 63 pages took 28% of the time of a loop of 256
 * KiB-1 MiB blocks over 300 slots, scanned at every refill. bins[0] the
 * dirty runs, bins[1] the zero and purged ones. */
#define SHORT_BINS 64
#define BINS (SHORT_BINS + 16)
typedef unsigned __int128 bin_mask_t;
static run_t *bins[2][BINS];
static bin_mask_t bin_mask[2];
static hak_segment_t *segments; /* every span segment, linked by next/prev */
static size_t nsegments;
static size_t pages_in_use; /* pages of blocks in every span segment */
static size_t dirty_pages;  /* pages of the dirty runs */
static size_t pages_in_use_most; /* the most there have been */
static size_t apart_segments; /* segments with runs apart (span.apart_most) */

/* Run records come from a pool that always holds one for each page of the
 * segments, so giving pages back never allocates. Fewer do not do: runs
 * that do not merge lie side by side (a dirty run and a zero one, or runs
 * apart), and 8 KiB blocks cut into the tails that realloc gave back made
 * 3 runs of 5 pages. Records are taken from their chunk only when first
 * needed, so that the pages of the pool touched are those of the most
 * runs there have been at once, and the pool goes back to the OS when the
 * last span segment does. A page word names a record by its chunk's number
 * and its place there in 30 bits: words of 32 bits keep a segment's header
 * to two pages (three with pointers, one more page per 16 blocks of 256
 * KiB). */
#define RUNS_PER_SEGMENT (HAK_SPAN_PAGES - HAK_SPAN_FIRST_PAGE)
#define POOL_CHUNK ((size_t)256 * 1024)
#define CHUNK_SLOT_BITS 13
#define POOL_CHUNKS_MAX ((size_t)1 << (30 - CHUNK_SLOT_BITS)) /* 2.7 TiB of segments */
typedef struct {
  size_t used; /* records taken from it */
} pool_chunk_t;
#define CHUNK_RUNS ((POOL_CHUNK - sizeof(pool_chunk_t)) / sizeof(run_t))
_Static_assert(CHUNK_RUNS <= (1u << CHUNK_SLOT_BITS), "a chunk's records fit its slot bits");
_Static_assert(offsetof(hak_segment_t, span) + sizeof(((hak_segment_t *)0)->span) <= 2 * HAK_PAGE_SIZE,
               "a span segment's header fits two pages");
/* The chunks by number: the first CHUNKS_NEAR (records for 1.3 GiB of
 * span segments) in the library's data, the others in a table mapped when
 * a program needs them. A table of every chunk in the bss (1 MiB) was
 * charged to the commit of every process and of each child of a fork. */
#define CHUNKS_NEAR 64
static pool_chunk_t *chunk_near[CHUNKS_NEAR];
static pool_chunk_t **chunk_far; /* POOL_CHUNKS_MAX entries, the first CHUNKS_NEAR unused */
static run_t *pool;              /* records given back */
static size_t nchunks, chunk_filling; /* chunk chunk_filling may have records left */
static size_t pool_total;

/* A thread's cache of a class moves BATCH_BYTES of blocks (at least one)
 * to or from the page heap at a time. It may hold a batch at first, and
 * twice as many each time it runs dry after it overflowed (the thread's
 * use of the class swings by more than it holds), up to CACHE_CLASS_BYTES;
 * the thread's caches may grow by CACHE_THREAD_BYTES in all, and all the
 * threads' by CACHE_ALL_BYTES: caches are not purged, and a program with
 * many threads could otherwise keep several MiB in each. A thread's bound
 * holds a loop over a batch of buffers of some 20 MiB (bench/batch.c),
 * which would otherwise take the page heap's lock for most buffers; what
 * a cache holds and does not use goes back at the next trim. The bound of
 * all threads' caches holds 8 threads that each churn 1000 blocks of 16 B
 * to 64 KiB: at 64 MiB their classes went through the page heap's lock
 * (0.67x the speed), and its re-carved blocks touched new pages (110 MiB
 * against 46). A class's bound holds the swing of a few hundred slots of
 * 64-256 KiB blocks (at 4 MiB, 16 blocks of 256 KiB, their loops spent a
 * tenth of their time refilling and overflowing a block at a time). */
#define BATCH_BYTES ((size_t)64 * 1024)
#define CACHE_CLASS_BYTES ((size_t)16 << 20)
#define CACHE_THREAD_BYTES ((size_t)24 << 20)
#define CACHE_ALL_BYTES ((size_t)128 << 20)
/* The caches of the classes over 256 KiB keep their first bound, one
 * block: a free past it gives the block back to the page heap, where a
 * block of any size takes its pages. Grown as the others, they held blocks
 * that other sizes took new pages beside: 300 slots of 256 KiB-1 MiB
 * blocks, every page written, peaked at 260 MiB against 249, 100 slots of
 * 256 KiB-4 MiB at 360 against 344, and a producer handing 256 KiB-1 MiB
 * blocks to a consumer at 16.3 against 11.3 MiB, 0.81x as fast. A slab
 * that faults in new pages has that block purged (hak_span_slab_grows): a
 * hash table's rehashes left an old bucket array in one, which stayed
 * committed while its nodes grew (cxx_containers umap over 100,000 keys,
 * 5.8-5.9 MiB against mimalloc's 5.2-5.4; 5.6 since). Purged in the
 * classes over 64 KiB too, they faulted in again for a loop of 64-256 KiB
 * blocks (12.6 MiB against 11.2) and one over a batch of buffers (0.87x
 * the speed). */
#define CACHE_GROW_MAX ((size_t)256 * 1024)
static _Atomic size_t grown_all; /* the sum of the heaps' span_grown */
/* Span refills between two trims of the caches (trim_unused): at least
 * TRIM_MIN, and twice as many as the last time when the last trim took
 * from caches that then ran dry, up to TRIM_MAX. A thread whose use of
 * many classes swings (random sizes of 16 B to 256 KiB) refills the
 * classes a trim took from; with a fixed period of 16 the refills came
 * faster, so did the trims, and every class ended up refilling from the
 * page heap a block at a time (465k refills in 2M steps, against 63k). */
#define TRIM_MIN 16
#define TRIM_MAX 256
/* Bytes given back by overflows in a row, with no refill between and
 * nothing taken from the cache between two of them (each finds below its
 * batch what the one before left), after which a thread is taken to be
 * freeing only: it gives all its caches back and keeps none until it
 * allocates a span again, so that its memory can go back to the OS even
 * if it never calls malloc again. A thread whose use of a class swings
 * takes from its cache between overflows (judged by refills alone,
 * random_mixed of 256 KiB blocks drained a thousand times in 3M steps);
 * one that frees in batches drains while its caches are smaller than a
 * batch, but they keep growing, and stop overflowing once they hold one. */
#define DRAIN_BYTES ((size_t)4 << 20)
/* A refill that took pages never used or purged (the page heap had no
 * dirty run that fits) trims the caches when they hold more than this and
 * the program is not growing: the thread may have moved on to other sizes,
 * and what the caches of the sizes it left do not use is memory the
 * refills can take instead of new pages. Below it, such refills are a
 * thread's caches filling up, which trims would only cut back. A program
 * grows while the span pages in use (blocks, cached ones too) are within
 * GROWTH_SLACK_PAGES of their most, unless the thread's caches are more
 * than half of what it holds (span_held: a thread that moved on, while
 * other threads may be growing): its new pages are its working set.
 * Trimmed at such refills, random sizes of 4-64 KiB over 512 slots gave
 * back blocks of the classes they used, which other classes' refills cut,
 * so that more refills took new pages and trimmed again (86 times in 4M
 * steps): 1,334 block addresses against 928, 15.4 MiB against 11.4, and
 * 0.82x the speed. */
#define TRIM_FRESH_BYTES ((size_t)4 << 20)
#define GROWTH_SLACK_PAGES 64

static inline unsigned class_pages(size_t cls) { return hak_class_size[cls] >> HAK_PAGE_SHIFT; }
/* n blocks of cls more (or fewer) that the heap holds (span_held). */
static inline void held_add(hak_heap_t *heap, size_t cls, int64_t n) {
  heap->span_held += n * hak_class_size[cls];
}
static inline unsigned batch_of(size_t cls) {
  size_t n = BATCH_BYTES / hak_class_size[cls];
  return n ? (unsigned)n : 1;
}
static inline uint8_t *page_addr(hak_segment_t *seg, unsigned page) {
  return (uint8_t *)seg + ((size_t)page << HAK_PAGE_SHIFT);
}
static inline unsigned page_index(const void *p) { return hak_span_page_index(p); }
static inline unsigned word_pages(uint32_t w) { return w >> 16; }
/* The place of chunk n in the table. */
static inline pool_chunk_t **chunk_at(size_t n) { return n < CHUNKS_NEAR ? &chunk_near[n] : &chunk_far[n]; }
/* The record of a FREE page word. */
static inline run_t *run_of(uint32_t word) {
  pool_chunk_t *c = *chunk_at(word >> (2 + CHUNK_SLOT_BITS));
  return (run_t *)(c + 1) + ((word >> 2) & ((1u << CHUNK_SLOT_BITS) - 1));
}
static inline size_t run_bytes(const run_t *r) { return (size_t)r->pages << HAK_PAGE_SHIFT; }

/* ---- run records ---- */

static bool pool_reserve(size_t total) {
  while (pool_total < total) {
    if (nchunks == POOL_CHUNKS_MAX) return false;
    if (nchunks == CHUNKS_NEAR && chunk_far == NULL &&
        (chunk_far = hak_os_map(POOL_CHUNKS_MAX * sizeof *chunk_far)) == NULL)
      return false;
    pool_chunk_t *chunk = hak_os_map(POOL_CHUNK);
    if (chunk == NULL) return false;
    *chunk_at(nchunks++) = chunk;
    pool_total += CHUNK_RUNS;
  }
  return true;
}

static void pool_release(void) {
  while (nchunks) hak_os_unmap(*chunk_at(--nchunks), POOL_CHUNK);
  if (chunk_far) hak_os_unmap(chunk_far, POOL_CHUNKS_MAX * sizeof *chunk_far);
  chunk_far = NULL;
  pool = NULL;
  pool_total = chunk_filling = 0;
}

static run_t *run_new(hak_segment_t *seg, unsigned first, unsigned pages, uint8_t state) {
  run_t *r = pool;
  if (r != NULL) {
    pool = r->next;
  } else {
    pool_chunk_t *c; /* pool_reserve made room */
    while ((c = *chunk_at(chunk_filling))->used == CHUNK_RUNS) {
      chunk_filling++;
      HAK_ASSERT(chunk_filling < nchunks);
    }
    r = (run_t *)(c + 1) + c->used;
    r->handle = (uint32_t)(chunk_filling << CHUNK_SLOT_BITS | c->used++) << 2 | HAK_PAGE_FREE;
  }
  r->seg = seg;
  r->first = (uint16_t)first;
  r->pages = (uint16_t)pages;
  r->state = state;
  r->since_ms = 0;
  return r;
}

static void run_delete(run_t *r) {
  r->next = pool;
  pool = r;
}

/* ---- bins ---- */

static inline int run_clean(const run_t *r) { return r->state != RUN_DIRTY; }
static inline unsigned bin_of(unsigned pages) {
  if (pages < SHORT_BINS) return pages;
  unsigned k = 31u - (unsigned)__builtin_clz(pages); /* 6..9 */
  return SHORT_BINS + (k - 6) * 4 + (pages >> (k - 2) & 3);
}
static inline unsigned run_bin(const run_t *r) { return bin_of(r->pages); }
static inline unsigned mask_lowest(bin_mask_t m) {
  uint64_t low = (uint64_t)m;
  return low ? (unsigned)__builtin_ctzll(low) : 64 + (unsigned)__builtin_ctzll((uint64_t)(m >> 64));
}

static void bin_add(run_t *r) {
  int c = run_clean(r);
  unsigned b = run_bin(r);
  r->prev = NULL;
  r->next = bins[c][b];
  if (r->next) r->next->prev = r;
  bins[c][b] = r;
  bin_mask[c] |= (bin_mask_t)1 << b;
  if (!c) dirty_pages += r->pages;
}

static void bin_remove(run_t *r) {
  int c = run_clean(r);
  unsigned b = run_bin(r);
  if (r->prev) {
    r->prev->next = r->next;
  } else {
    bins[c][b] = r->next;
    if (r->next == NULL) bin_mask[c] &= ~((bin_mask_t)1 << b);
  }
  if (r->next) r->next->prev = r->prev;
  if (!c) dirty_pages -= r->pages;
}

/* The run's first and last pages name it. */
static void run_mark(run_t *r) {
  r->seg->span.page[r->first] = r->handle;
  r->seg->span.page[r->first + r->pages - 1] = r->handle;
}

/* The shortest run of at least n pages in bins[c] (the one given back last
 * among those of its length), or NULL. Only the long bin of n may hold
 * none that fits. */
static run_t *bin_find(int c, unsigned n) {
  for (bin_mask_t m = bin_mask[c] & ((bin_mask_t)-1 << bin_of(n)); m; m &= m - 1) {
    unsigned b = mask_lowest(m);
    if (b < SHORT_BINS) return bins[c][b];
    run_t *best = NULL;
    for (run_t *r = bins[c][b]; r; r = r->next)
      if (r->pages >= n && (best == NULL || r->pages < best->pages)) best = r;
    if (best) return best;
  }
  return NULL;
}

/* ---- segments ---- */

/* A segment for the page heap, its header made (outside the lock: it may
 * map memory and faults in the header); NULL when out of memory. *state
 * tells what its memory is. For a page heap used in bulk (it has held a
 * segment's worth of blocks), pages it would fault in are the committed
 * pages of the arena's free chunks, if it has some: moved, they cost no
 * fault and are not held twice (chains of realloc that restart small
 * while their freed large blocks wait in the arena). A program's first
 * span blocks do not take 4 MiB of them. */
static hak_segment_t *segment_prepare(uint8_t *state, bool bulk) {
  bool zero, purged;
  hak_segment_t *seg = hak_segment_take_empty(&zero, &purged);
  if (seg == NULL) return NULL;
  *state = purged ? RUN_PURGED : zero ? RUN_ZERO : RUN_DIRTY;
  uint32_t reserved_from = seg->reserved_from; /* before pages of the arena replace the header */
  if (bulk && *state != RUN_DIRTY && hak_large_donate_segment(seg) != 0) {
    /* one run: all of it counts as committed, as a dirty run's pages */
    if (purged)
      HAK_STAT_ADD(committed, (size_t)(HAK_SPAN_PAGES - HAK_SPAN_FIRST_PAGE) << HAK_PAGE_SHIFT);
    *state = RUN_DIRTY;
  }
  memset(seg, 0, offsetof(hak_segment_t, span) + sizeof seg->span); /* not slabs[]' pages */
  seg->reserved_from = reserved_from;
  seg->kind = HAK_KIND_SPANS;
  seg->map_size = HAK_SEG_SIZE;
  for (unsigned u = 0; u < HAK_MAX_SLABS; u++)
    seg->unit[u] = (hak_unit_t){&seg->span.none, &seg->span.none.local_free};
  return seg;
}

/* seg, prepared, joins the page heap as one free run; false (seg given
 * back) if the run records cannot be had. */
static bool segment_add(hak_segment_t *seg, uint8_t state) {
  if (!pool_reserve((nsegments + 1) * RUNS_PER_SEGMENT)) {
    hak_segment_put_empty(seg, state != RUN_DIRTY, state == RUN_PURGED);
    return false;
  }
  hak_segmap_set(seg, HAK_SEGMAP_SPANS);
  seg->next = segments;
  if (segments) segments->prev = seg;
  segments = seg;
  nsegments++;
  run_t *r = run_new(seg, HAK_SPAN_FIRST_PAGE, HAK_SPAN_PAGES - HAK_SPAN_FIRST_PAGE, state);
  r->since_ms = hak_clock_ms();
  run_mark(r);
  bin_add(r);
  return true;
}

/* r's segment has no block left: its free runs (r, out of its bin, among
 * them) go, and the segment goes back to the segment cache. */
static void segment_release(run_t *r) {
  hak_segment_t *seg = r->seg;
  bool zero = true, purged = true;
  size_t purged_bytes = 0;
  run_mark(r);
  for (unsigned i = HAK_SPAN_FIRST_PAGE; i < HAK_SPAN_PAGES;) {
    run_t *x = run_of(seg->span.page[i]);
    HAK_ASSERT((seg->span.page[i] & HAK_PAGE_TAG) == HAK_PAGE_FREE && x->first == i);
    if (x != r) bin_remove(x);
    zero &= x->state != RUN_DIRTY;
    purged &= x->state == RUN_PURGED;
    if (x->state == RUN_PURGED) purged_bytes += run_bytes(x);
    i += x->pages;
    run_delete(x);
  }
  if (!purged) HAK_STAT_ADD(committed, purged_bytes); /* all of it counts as committed */
  if (seg->span.apart_most) apart_segments--;
  if (seg->prev) seg->prev->next = seg->next;
  else segments = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  nsegments--;
  if (nsegments == 0) pool_release(); /* no run is left */
  hak_segment_put_empty(seg, zero, purged);
}

/* ---- the page heap (all under hak_span_lock) ---- */

/* The block's last page names the heap that took it from the page heap,
 * heap_number: a thread whose first call frees it likely follows that
 * heap's thread (hak_span_free_slow). It starts `offset` bytes into its
 * first page (a colour, or 0), and free puts it in the cache of malloc's
 * number n (its class, or hak_span_at_page's at offset 0). */
static void block_mark(hak_segment_t *seg, unsigned first, unsigned pages, size_t n, uint32_t heap_number,
                       uintptr_t offset) {
  HAK_ASSERT(n < HAK_CLASSES || offset == 0);
  seg->span.page[first] = (uint32_t)pages << 16 | (uint32_t)hak_class_of_number(n) << 8 | HAK_PAGE_USED;
  seg->span.page_block[first] = hak_span_entry_make(n, offset);
  if (pages > 1) seg->span.page[first + pages - 1] = heap_number << 2 | HAK_PAGE_TAIL;
}
/* The number of the heap that took the block at p of cls (or number) from the page heap. */
static uint32_t block_heap_number(hak_segment_t *seg, const void *p, size_t cls) {
  return seg->span.page[page_index(p) + class_pages(cls) - 1] >> 2;
}

/* The first n pages of run r (out of its bin) are taken; the rest, if any,
 * goes back to its bin. */
static void run_take_front(run_t *r, unsigned n) {
  if (r->state == RUN_PURGED) HAK_STAT_ADD(committed, (size_t)n << HAK_PAGE_SHIFT);
  if (r->pages == n) {
    run_delete(r);
    return;
  }
  r->first = (uint16_t)(r->first + n);
  r->pages = (uint16_t)(r->pages - n);
  run_mark(r);
  bin_add(r);
}

/* Purges run r (out of its bin). */
static void run_purge(run_t *r) {
  hak_os_purge(page_addr(r->seg, r->first), run_bytes(r));
  r->state = RUN_PURGED;
}

/* Whether free runs a and b may be one: a run's pages are all dirty or
 * all zero, so that a block taken from a dirty run costs no page fault. */
static inline bool runs_alike(const run_t *a, const run_t *b) {
  return (a->state == RUN_DIRTY) == (b->state == RUN_DIRTY);
}

/* r takes in o, alike, its neighbour; o is gone. Zero and purged pages
 * together count as committed, like a new segment's. */
static void run_absorb(run_t *r, run_t *o) {
  if (r->state != o->state) {
    run_t *purged = r->state == RUN_PURGED ? r : o;
    HAK_STAT_ADD(committed, run_bytes(purged));
    r->state = RUN_ZERO;
  }
  if (o->since_ms > r->since_ms) r->since_ms = o->since_ms;
  r->pages = (uint16_t)(r->pages + o->pages);
  run_delete(o);
}

/* r, a free run out of its bin and unmarked, takes in the free runs on
 * either side that are alike, then goes into its bin; or, if its segment
 * has no block left and keep is false, the segment goes back to the
 * segment cache, and the result is true. */
static bool run_settle(run_t *r, bool keep) {
  uint32_t *pg = r->seg->span.page;
  unsigned first = r->first, end = first + r->pages;
  if (first > HAK_SPAN_FIRST_PAGE && (pg[first - 1] & HAK_PAGE_TAG) == HAK_PAGE_FREE) {
    run_t *left = run_of(pg[first - 1]);
    if (runs_alike(left, r)) {
      bin_remove(left);
      pg[first - 1] = pg[first] = 0;
      r->first = left->first;
      run_absorb(r, left);
    }
  }
  if (end < HAK_SPAN_PAGES && (pg[end] & HAK_PAGE_TAG) == HAK_PAGE_FREE) {
    run_t *right = run_of(pg[end]);
    if (runs_alike(right, r)) {
      bin_remove(right);
      pg[end - 1] = pg[end] = 0;
      run_absorb(r, right);
    }
  }
  if (r->seg->span.used_pages == 0 && !keep) {
    segment_release(r);
    return true;
  }
  run_mark(r);
  bin_add(r);
  return false;
}

/* The dirty free run that page i of seg begins or ends, or NULL (also past
 * the segment's end). */
static run_t *dirty_run_at(hak_segment_t *seg, unsigned i) {
  uint32_t w = i < HAK_SPAN_PAGES ? seg->span.page[i] : 0;
  run_t *r = (w & HAK_PAGE_TAG) == HAK_PAGE_FREE ? run_of(w) : NULL;
  return r != NULL && r->state == RUN_DIRTY ? r : NULL;
}

/* Free run r, in its bin, takes in the dirty runs that follow it (pages_give
 * left them apart), if it and they were given back at `before` or earlier. */
static void run_merge_next(run_t *r, uint64_t before) {
  if (r->state != RUN_DIRTY || r->since_ms > before) return;
  bool merged = false;
  for (run_t *next; (next = dirty_run_at(r->seg, r->first + r->pages)) != NULL && next->since_ms <= before;) {
    if (!merged) bin_remove(r);
    merged = true;
    bin_remove(next);
    r->seg->span.page[next->first - 1] = r->seg->span.page[next->first] = 0;
    run_absorb(r, next);
  }
  if (!merged) return;
  run_mark(r);
  bin_add(r);
}

/* Dirty free run r, in its bin, merged with the dirty runs on both sides:
 * the run that holds it now. */
static run_t *run_merge_around(run_t *r) {
  for (run_t *left; r->first > HAK_SPAN_FIRST_PAGE && (left = dirty_run_at(r->seg, r->first - 1)) != NULL;)
    r = left;
  run_merge_next(r, UINT64_MAX);
  return r;
}

/* The pages of the dirty runs from the one at page i of seg on, up to the
 * first page that is not in one. */
static unsigned dirty_pages_from(hak_segment_t *seg, unsigned i) {
  unsigned start = i;
  for (run_t *r; (r = dirty_run_at(seg, i)) != NULL;) i += r->pages;
  return i - start;
}

/* The first free run of seg from page i on (i the first page of a block
 * or of a run), or NULL. */
static run_t *free_run_from(hak_segment_t *seg, unsigned i) {
  uint32_t *pg = seg->span.page;
  while (i < HAK_SPAN_PAGES && (pg[i] & HAK_PAGE_TAG) != HAK_PAGE_FREE) i += word_pages(pg[i]);
  return i < HAK_SPAN_PAGES ? run_of(pg[i]) : NULL;
}

/* Whether free run r is dirty and so is the free run after it. */
static bool run_next_dirty(const run_t *r) {
  return r->state == RUN_DIRTY && dirty_run_at(r->seg, r->first + r->pages) != NULL;
}

/* The first run that runs apart make of at least `need` pages, merged, or
 * NULL. A segment where they make none notes the most they make, and is
 * not walked for more until a block goes back there. */
static run_t *runs_merge_for(unsigned need) {
  for (hak_segment_t *seg = segments; seg != NULL; seg = seg->next) {
    if (seg->span.apart_most < need) continue; /* 0: none apart */
    unsigned most = 1;
    for (run_t *r = free_run_from(seg, HAK_SPAN_FIRST_PAGE); r != NULL;) {
      unsigned pages = r->state == RUN_DIRTY ? dirty_pages_from(seg, r->first) : r->pages;
      if (r->state == RUN_DIRTY && pages >= need) {
        run_merge_next(r, UINT64_MAX);
        return r;
      }
      if (r->state == RUN_DIRTY && pages > most) most = pages;
      r = free_run_from(seg, r->first + pages);
    }
    seg->span.apart_most = (uint16_t)most;
  }
  return NULL;
}

/* Runs apart given back at `before` or earlier merge. Returns whether
 * some wait to merge with runs given back since. */
static bool runs_merge_idle(uint64_t before) {
  bool waiting = false;
  for (hak_segment_t *seg = segments; seg != NULL && apart_segments != 0; seg = seg->next) {
    if (seg->span.apart_most == 0) continue;
    bool left = false;
    for (run_t *r = free_run_from(seg, HAK_SPAN_FIRST_PAGE); r != NULL;
         r = free_run_from(seg, r->first + r->pages)) {
      run_merge_next(r, before);
      left |= run_next_dirty(r);
    }
    if (!left) {
      seg->span.apart_most = 0;
      apart_segments--;
    }
    waiting |= left;
  }
  return waiting;
}

/* A block of up to APART_PAGES pages given back stays a run of its own,
 * apart from its free neighbours, which the next block of its length takes
 * (bin_find, the last given back first). Merged at once, such runs were cut
 * again at other places by blocks of other lengths, and a program of random
 * sizes of 8-64 KiB wrote new lines all the time: over 2M steps its blocks
 * took 1,230 places and 3,515 pages (tcmalloc 592 and 2,268), and its
 * reads of the blocks missed the last-level cache twice as often. Runs
 * apart merge when a block fits no dirty run, when a longer one is cut,
 * and once idle, before a purge. Longer blocks merge at once: a batch of
 * buffers of 16-256 KiB freed together and asked for again at other sizes
 * cut runs kept apart out of the middle of free space, and took new pages
 * (35.9 MiB at 64 KiB, 38.8 at 128 KiB, against 34.7 merged at once). */
#define APART_PAGES 16

/* Pages first .. first + n - 1 of seg, a block's, are free again; purged
 * at once if purge. */
static void pages_give(hak_segment_t *seg, unsigned first, unsigned n, uint64_t now, bool purge) {
  seg->span.page[first] = seg->span.page[first + n - 1] = 0;
  seg->span.page_block[first] = 0;
  seg->span.used_pages -= n;
  pages_in_use -= n;
  run_t *r = run_new(seg, first, n, RUN_DIRTY);
  r->since_ms = now;
  /* A segment that empties stays, its memory committed, until the purger
   * has purged it after the delay: a program that frees a burst of spans
   * and allocates them again (a loop over a batch of buffers) reuses it
   * without a page fault, where the segment cache, which keeps only one
   * segment committed, purged the others at once. Without a delay only
   * the last one stays, against map/unmap thrash. */
  if (purge || hak_opt.purge_delay_ms == 0) {
    run_purge(r);
    run_settle(r, nsegments == 1);
    return;
  }
  if (n > APART_PAGES) {
    run_settle(r, true);
    return;
  }
  run_mark(r);
  bin_add(r);
  if (seg->span.apart_most == 0) apart_segments++;
  seg->span.apart_most = HAK_SPAN_PAGES;
}

/* A block of malloc's number n at a multiple of align_pages pages (a
 * power of two; the segment is aligned to more; 1 for a class: the block
 * at its first page's colour, hak_span_colour): the shortest committed run that
 * fits, merged with the runs apart beside it if it is longer; else the
 * first that runs apart make; else the shortest zero run. An aligned block
 * looks for a run long enough to hold one at any start, and cuts it at the
 * first multiple; the pages before stay a free run. *clean tells whether
 * its memory is zero. NULL when there is no room, or (*refused) when its
 * memory is refused. */
static void *block_take(size_t number, unsigned align_pages, uint32_t heap_number, bool *clean,
                        bool *refused) {
  unsigned n = class_pages(number), need = n + align_pages - 1;
  run_t *r = bin_find(0, need);
  if (r == NULL && apart_segments != 0)
    r = runs_merge_for(need);
  else if (r != NULL && r->pages > need && r->seg->span.apart_most != 0)
    r = run_merge_around(r); /* what is left of it is as long as can be */
  if (r == NULL) r = bin_find(1, need);
  if (r == NULL) return NULL;
  unsigned at = (r->first + align_pages - 1) & ~(align_pages - 1);
  *refused = !hak_segment_commit(r->seg, (size_t)(at + n) << HAK_PAGE_SHIFT);
  if (*refused) return NULL;
  bin_remove(r);
  hak_segment_t *seg = r->seg;
  if (at > r->first) {
    run_t *before = run_new(seg, r->first, at - r->first, r->state);
    before->since_ms = r->since_ms;
    run_mark(before);
    bin_add(before);
    r->pages = (uint16_t)(r->pages - before->pages);
    r->first = (uint16_t)at;
  }
  *clean = run_clean(r);
  run_take_front(r, n);
  uint8_t *b = page_addr(seg, at);
  uintptr_t offset = align_pages == 1 && number < HAK_CLASSES ? hak_span_colour(b) : 0;
  block_mark(seg, at, n, number, heap_number, offset);
  seg->span.used_pages += n;
  pages_in_use += n;
  if (pages_in_use > pages_in_use_most) pages_in_use_most = pages_in_use;
  return b + offset;
}

/* The block at p goes back to the page heap, purged if purge. */
static void block_give(void *p, uint64_t now, bool purge) {
  hak_segment_t *seg = hak_segment_base(p);
  unsigned first = page_index(p);
  uint32_t w = seg->span.page[first];
  HAK_ASSERT((w & HAK_PAGE_TAG) == HAK_PAGE_USED);
  pages_give(seg, first, word_pages(w), now, purge);
}

/* Gives a list of blocks back to the page heap, purged if purge. */
static void give_locked(hak_block_t *list, uint64_t now, bool purge) {
  while (list) {
    hak_block_t *next = hak_next(list);
    block_give(list, now, purge);
    list = next;
  }
}

static void give_list(hak_block_t *list) {
  uint64_t now = hak_clock_ms();
  pthread_mutex_lock(&hak_span_lock);
  give_locked(list, now, false);
  pthread_mutex_unlock(&hak_span_lock);
  hak_purge_wake();
}

/* ---- the transfer ---- */

/* A thread that only frees (draining) hands its span blocks to the threads
 * that allocate in batches: its frees for a cache (of a class, or of its
 * blocks at their page's start) build a batch in its heap (a
 * compare-and-swap each, as the purger may take it), and a full one goes
 * on a stack per cache, which a refill takes a batch from whole. A
 * pipeline's consumer gave each block back to the page heap's runs and its
 * producer carved them again, a few blocks at a time, both under the page
 * heap's lock, which they fought over (xmalloc 1p1c of 8-32 KiB blocks:
 * 30% of the time in pthread_mutex_lock). A full cache that may grow no
 * more gives its overflow to the page heap, not here: it would wait beyond
 * the thread's bound, for that thread's next refill of the class only
 * (batch: 46 MiB against 35, once the trims came less often). At most
 * TRANSFER_BYTES wait per class; a purge gives back the batches of a class
 * that did not move since the one before, and the unfinished batches of a
 * heap that freed nothing since, so a thread that frees and goes idle
 * keeps nothing. */
#define TRANSFER_BYTES ((size_t)4 << 20)
/* A lock and a line per cache: a pipeline moves batches of several
 * classes at once, and one lock for all had its threads wait on each other
 * (xmalloc 1p1c of 8-32 KiB blocks: 1.36x with a lock per class). */
typedef struct __attribute__((aligned(64))) {
  pthread_mutex_t lock;
  hak_block_t *top; /* linked through their first block's third word */
  unsigned count;
  bool moved;
} transfer_t;
static transfer_t transfer[HAK_SPAN_CACHES] = {
    [0 ... HAK_SPAN_CACHES - 1] = {.lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP}};

/* Batches of span cache c that may wait: TRANSFER_BYTES of them (16 of
 * the largest class, 64 of 64 KiB). */
static inline unsigned transfer_max(size_t c) {
  size_t cls = HAK_SLAB_CLASSES + c;
  return (unsigned)(TRANSFER_BYTES / (batch_of(cls) * hak_class_size[cls]));
}

/* The word of a cached block's depth, free while the batch waits here: the
 * refill that takes the batch numbers it again (batch_number). */
static inline hak_block_t **batch_link(hak_block_t *batch) {
  return (hak_block_t **)hak_span_depth(batch);
}

static void transfer_push(size_t c, hak_block_t *batch) {
  transfer_t *t = &transfer[c];
  unsigned max = transfer_max(c); /* two divisions: not under the lock */
  pthread_mutex_lock(&t->lock);
  bool room = t->count < max;
  if (room) {
    *batch_link(batch) = t->top;
    __atomic_store_n(&t->top, batch, __ATOMIC_RELAXED);
    t->count++;
    t->moved = true;
  }
  pthread_mutex_unlock(&t->lock);
  if (room)
    hak_purge_wake(); /* for the pass that gives it back if nothing takes it */
  else
    give_list(batch);
}

/* A batch of class c (batch_of blocks), or NULL. */
static hak_block_t *transfer_pop(size_t c) {
  transfer_t *t = &transfer[c];
  if (__atomic_load_n(&t->top, __ATOMIC_RELAXED) == NULL) return NULL; /* a hint */
  pthread_mutex_lock(&t->lock);
  hak_block_t *batch = t->top;
  if (batch != NULL) {
    __atomic_store_n(&t->top, *batch_link(batch), __ATOMIC_RELAXED);
    t->count--;
    t->moved = true;
  }
  pthread_mutex_unlock(&t->lock);
  return batch;
}

/* A draining heap's free of b, for span cache c: b joins a batch for the
 * other threads' refills, but where no other thread would take it and no
 * pass would give it back (hak_purge_all_at_once). */
static void drain_add(hak_heap_t *heap, size_t c, hak_block_t *b) {
  if (hak_purge_all_at_once()) {
    hak_set_next(b, NULL);
    give_list(b);
    return;
  }
  _Atomic(hak_block_t *) *open = &heap->drain_open[c];
  hak_block_t *head = atomic_load_explicit(open, memory_order_relaxed);
  if (head == NULL) heap->drain_count[c] = 0; /* done, or taken by the purger */
  hak_set_next(b, head);
  if (!atomic_compare_exchange_strong_explicit(open, &head, b, memory_order_release,
                                               memory_order_relaxed)) {
    heap->drain_count[c] = 0; /* the purger took it (it only ever empties it) */
    hak_set_next(b, NULL);
    atomic_store_explicit(open, b, memory_order_release);
  }
  atomic_store_explicit(&heap->drain_moved, 1, memory_order_relaxed);
  if (++heap->drain_count[c] < batch_of(HAK_SLAB_CLASSES + c)) return;
  heap->drain_count[c] = 0;
  hak_block_t *batch = atomic_exchange_explicit(open, NULL, memory_order_acquire);
  if (batch != NULL) transfer_push(c, batch);
}

/* The heap's unfinished batches go back to the page heap. */
static void drain_give(hak_heap_t *heap) {
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) {
    _Atomic(hak_block_t *) *open = &heap->drain_open[c];
    if (atomic_load_explicit(open, memory_order_relaxed) == NULL) continue;
    hak_block_t *list = atomic_exchange_explicit(open, NULL, memory_order_acquire);
    if (list != NULL) give_list(list);
  }
}

bool hak_span_drain_collect(hak_heap_t *heap, bool force) {
  if (atomic_exchange_explicit(&heap->drain_moved, 0, memory_order_relaxed) && !force)
    return true;
  drain_give(heap);
  return false;
}

/* The batches of every cache that did not move since the last call (of
 * every cache when forced) go back to the page heap. Returns whether some
 * still wait. */
static bool transfer_purge(bool force) {
  hak_block_t *give[HAK_SPAN_CACHES];
  bool waiting = false;
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) {
    transfer_t *t = &transfer[c];
    give[c] = NULL;
    pthread_mutex_lock(&t->lock);
    if (force || !t->moved) {
      give[c] = t->top;
      __atomic_store_n(&t->top, NULL, __ATOMIC_RELAXED);
      t->count = 0;
    }
    waiting |= t->top != NULL;
    t->moved = false;
    pthread_mutex_unlock(&t->lock);
  }
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++)
    for (hak_block_t *batch = give[c], *next; batch != NULL; batch = next) {
      next = *batch_link(batch);
      give_list(batch);
    }
  return waiting;
}

/* ---- checks ---- */

/* A pointer where a block may start (a line of the first KiB of a page)
 * inside a free run that was in use: a block freed already. Anything else
 * is no block. */
static HAK_COLD __attribute__((noreturn)) void bad_block(hak_segment_t *seg, const void *p) {
  bool freed = false;
  unsigned i = page_index(p);
  pthread_mutex_lock(&hak_span_lock);
  uintptr_t off = hak_page_offset(p);
  if (off % 64 == 0 && off <= HAK_SPAN_COLOUR_MAX && i >= HAK_SPAN_FIRST_PAGE) {
    unsigned j = i;
    while (j > HAK_SPAN_FIRST_PAGE && seg->span.page[j] == 0) j--;
    uint32_t w = seg->span.page[j];
    if ((w & HAK_PAGE_TAG) == HAK_PAGE_FREE) {
      run_t *r = run_of(w);
      freed = r->first <= i && i < r->first + r->pages && r->state != RUN_ZERO;
    }
  }
  pthread_mutex_unlock(&hak_span_lock);
  if (freed) hak_double_free(p);
  hak_invalid_free(p);
}

/* malloc's number of the block at p, in span segment seg (its class, or
 * hak_span_at_page's); aborts unless p is the start of a block not given
 * back to the page heap. A pointer at the very end of the segment reads
 * the header's page word, which is 0. */
HAK_INLINE size_t block_number(hak_segment_t *seg, const void *p) {
  uint16_t e = hak_span_entry(seg, p);
  if (HAK_UNLIKELY(!hak_span_entry_is_block(e, p))) bad_block(seg, p);
  return hak_span_entry_number(e);
}

size_t hak_span_usable_size(hak_segment_t *seg, const void *p) {
  return hak_span_block_bytes(block_number(seg, p), p) - HAK_CANARY;
}

/* ---- thread caches ---- */

void hak_span_heap_init(hak_heap_t *heap) {
  heap->span_trim_period = TRIM_MIN;
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) {
    heap->span_max[c] = heap->span_limit[c] = (uint16_t)batch_of(HAK_SLAB_CLASSES + c);
    heap->span_low[c] = 0;
  }
}

size_t hak_span_cache_growth(void) {
  return atomic_load_explicit(&grown_all, memory_order_relaxed);
}

/* The bound of cache c (of number HAK_SLAB_CLASSES + c) moves by n blocks
 * of bs bytes, and free's limit with it (n < 0: the sums wrap back). Not
 * while the heap drains (refills end that first). */
static void bound_move(hak_heap_t *heap, size_t c, int n, size_t bs) {
  size_t bytes = (size_t)n * bs;
  HAK_ASSERT(!heap->draining);
  heap->span_max[c] = heap->span_limit[c] = (uint16_t)(heap->span_max[c] + n);
  heap->span_grown += bytes;
  atomic_fetch_add_explicit(&grown_all, bytes, memory_order_relaxed);
}

/* How many blocks the bound of the cache of number cls may grow by: as many as
 * it holds, as far as the bounds allow; none over CACHE_GROW_MAX. */
static unsigned cache_more(const hak_heap_t *heap, size_t cls) {
  size_t bs = hak_class_size[cls];
  if (bs > CACHE_GROW_MAX) return 0;
  size_t max = heap->span_max[cls - HAK_SLAB_CLASSES], more = max * bs; /* doubles */
  if (max * bs + more > CACHE_CLASS_BYTES) more = CACHE_CLASS_BYTES - max * bs;
  if (heap->span_grown + more > CACHE_THREAD_BYTES) more = CACHE_THREAD_BYTES - heap->span_grown;
  size_t all = atomic_load_explicit(&grown_all, memory_order_relaxed);
  if (all + more > CACHE_ALL_BYTES) more = all < CACHE_ALL_BYTES ? CACHE_ALL_BYTES - all : 0;
  return (unsigned)(more / bs);
}

/* The cache of cls ran dry: if it overflowed since it last did, it may
 * hold twice as many. */
static void cache_grow(hak_heap_t *heap, size_t cls) {
  uint64_t bit = UINT64_C(1) << (cls - HAK_SLAB_CLASSES);
  if (!(heap->span_overflowed & bit)) return;
  heap->span_overflowed &= ~bit;
  bound_move(heap, cls - HAK_SLAB_CLASSES, (int)cache_more(heap, cls), hak_class_size[cls]);
}

/* Gives every block of the heap's caches in `mask` (bit c: cache c, of
 * number HAK_SLAB_CLASSES + c) back to the page heap, purged if purge. */
static void caches_give(hak_heap_t *heap, uint64_t mask, bool purge) {
  uint64_t now = hak_clock_ms();
  pthread_mutex_lock(&hak_span_lock);
  for (uint64_t m = mask; m; m &= m - 1) {
    size_t cls = HAK_SLAB_CLASSES + (size_t)__builtin_ctzll(m);
    held_add(heap, cls, -(int64_t)hak_span_count(heap, cls));
    give_locked(heap->free[cls], now, purge);
    heap->free[cls] = NULL;
  }
  pthread_mutex_unlock(&hak_span_lock);
  for (uint64_t m = mask; m; m &= m - 1) {
    size_t c = (size_t)__builtin_ctzll(m);
    heap->span_limit[c] = heap->draining ? 0 : heap->span_max[c];
  }
  hak_purge_wake();
}

/* The heap's caches that hold blocks of over `above` bytes (caches_give's mask). */
static uint64_t caches_held(const hak_heap_t *heap, size_t above) {
  uint64_t mask = 0;
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++)
    if (heap->free[HAK_SLAB_CLASSES + c] && hak_class_size[HAK_SLAB_CLASSES + c] > above)
      mask |= UINT64_C(1) << c;
  return mask;
}

void hak_span_flush(hak_heap_t *heap) {
  uint64_t mask = caches_held(heap, 0);
  if (mask) caches_give(heap, mask, false);
}

void hak_span_slab_grows(hak_heap_t *heap) {
  uint64_t mask = caches_held(heap, CACHE_GROW_MAX);
  if (mask) caches_give(heap, mask, true);
}

/* The thread frees and takes no span: its caches go back and take no
 * block (every free goes to the transfer) until its next refill. */
static void drain(hak_heap_t *heap) {
  heap->draining = 1;
  hak_span_flush(heap);
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) heap->span_limit[c] = 0;
}

static void drain_end(hak_heap_t *heap) {
  drain_give(heap);
  heap->draining = 0;
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) heap->span_limit[c] = heap->span_max[c];
}

/* The caches go back, empty but with the bounds they grew to: the thread
 * that takes the parked heap next is likely to use the classes as the last
 * one did (a server's workers, one after another), and would otherwise
 * overflow and refill through the page heap until its caches grew again. */
void hak_span_heap_done(hak_heap_t *heap) {
  hak_span_flush(heap);
  drain_end(heap);
  heap->span_overflowed = 0;
  heap->span_given_in_row = 0;
  heap->span_refills = 0;
  heap->span_trimmed = heap->span_refilled = 0;
  heap->span_held = 0;
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) heap->span_low[c] = 0;
}

void hak_span_heap_retire(hak_heap_t *heap) {
  atomic_fetch_sub_explicit(&grown_all, heap->span_grown, memory_order_relaxed);
  heap->span_grown = 0;
  hak_span_heap_init(heap);
}

/* free's checks of block b of class cls, counted as freed. */
static void block_freed(hak_heap_t *heap, size_t cls, hak_block_t *b) {
  if (heap->free[cls] == b) hak_double_free(b); /* the sentinel's lists are empty */
  hak_block_check_free(b, hak_span_block_bytes(cls, b));
  HAK_CSTAT_FREE(cls);
}

/* free's fast path found the block at p (in span segment seg) not a block
 * in use, or the one freed just before, or its class's cache empty or
 * full, or the thread without a heap: names the fault, or frees the block
 * the long way. */
HAK_NOINLINE void hak_span_free_slow(hak_segment_t *seg, void *p) {
  size_t number = block_number(seg, p), c = number - HAK_SLAB_CLASSES;
  hak_heap_t *heap = hak_tls_heap;
  hak_block_t *b = p;
  block_freed(heap, number, b);
  if (heap == HAK_HEAP_EMPTY) /* as free_heapless: the heap that took it, if any */
    heap = hak_heap_for_heir(hak_heap_numbered(block_heap_number(seg, p, number)));
  if (heap == NULL) { /* no cache takes it */
    hak_set_next(b, NULL);
    give_list(b);
    return;
  }
  if (heap->draining) {
    held_add(heap, number, -1);
    drain_add(heap, c, b);
    return;
  }
  unsigned held = hak_span_count(heap, number), n = held + 1; /* with b */
  hak_set_next(b, heap->free[number]);
  *hak_span_depth(b) = n;
  heap->free[number] = b;
  if (held < heap->span_limit[c]) { /* it was empty, or the heap new */
    hak_span_low_note(heap, c, held);
    return;
  }
  /* Full: the batch freed last, this block first, goes back to the page
   * heap, where blocks of any class can take its pages. */
  if (n > batch_of(number)) n = batch_of(number);
  hak_block_t *last = b;
  for (unsigned i = 1; i < n; i++) last = hak_next(last);
  hak_block_t *rest = hak_next(last);
  /* What the last overflow left is still there: the thread took none of
   * it since, as a thread that only frees (see DRAIN_BYTES). */
  bool only_frees = rest == heap->span_left[c];
  heap->free[number] = heap->span_left[c] = rest;
  hak_set_next(last, NULL);
  heap->span_overflowed |= UINT64_C(1) << c;
  held_add(heap, number, -(int64_t)n);
  give_list(b);
  heap->span_given_in_row = only_frees ? heap->span_given_in_row + (size_t)n * hak_class_size[number] : 0;
  if (heap->span_given_in_row >= DRAIN_BYTES) drain(heap);
  hak_purge_start();
}

/* The next trim comes twice as many refills later if 3 in 4 of the classes
 * the last one took from have refilled since, else half as many (see
 * TRIM_MIN). */
static void trim_period_update(hak_heap_t *heap) {
  int trimmed = __builtin_popcountll(heap->span_trimmed);
  if (trimmed > 0) {
    uint32_t period = heap->span_trim_period;
    if (4 * __builtin_popcountll(heap->span_trimmed & heap->span_refilled) >= 3 * trimmed)
      period = period * 2 < TRIM_MAX ? period * 2 : TRIM_MAX;
    else
      period = period / 2 > TRIM_MIN ? period / 2 : TRIM_MIN;
    heap->span_trim_period = period;
  }
  heap->span_trimmed = heap->span_refilled = 0;
}

/* Each cache gives back three quarters of the blocks it held and did not
 * use since the last trim (the fewest it held: jemalloc's low-water mark),
 * the blocks on top, and its bound goes down as much (not below a batch):
 * a program whose sizes drift (strings and arrays that grow) would
 * otherwise keep a cache in every class it went through, while a cache
 * that ran dry since keeps all it holds, even if it moved only a few times
 * (a loop over a batch of buffers of many sizes). */
static void trim_unused(hak_heap_t *heap) {
  hak_block_t *give = NULL;
  trim_period_update(heap);
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) {
    size_t cls = HAK_SLAB_CLASSES + c;
    /* the caches given back, a batch overflowed */
    hak_span_low_note(heap, c, hak_span_count(heap, cls));
    unsigned low = heap->span_low[c]; /* fewest held */
    unsigned n = low - low / 4;
    if (n > 0) {
      held_add(heap, cls, -(int64_t)n);
      heap->span_trimmed |= UINT64_C(1) << c;
      hak_block_t *first = heap->free[cls], *last = first;
      for (unsigned i = 1; i < n; i++) last = hak_next(last);
      heap->free[cls] = hak_next(last);
      hak_set_next(last, give);
      give = first;
      unsigned grown = heap->span_max[c] - batch_of(cls);
      bound_move(heap, c, -(int)(n < grown ? n : grown), hak_class_size[cls]);
    }
    heap->span_low[c] = (uint16_t)hak_span_count(heap, cls);
  }
  if (give) give_list(give);
}

/* Bytes in the heap's caches. */
static size_t caches_bytes(const hak_heap_t *heap) {
  size_t bytes = 0;
  for (size_t cls = HAK_SLAB_CLASSES; cls < HAK_NUMBERS; cls++)
    bytes += (size_t)hak_span_count(heap, cls) * hak_class_size[cls];
  return bytes;
}

/* The heap's empty cache of cls takes list, its blocks numbered with
 * their depths, zero memory if clean. */
static void cache_set(hak_heap_t *heap, size_t cls, hak_block_t *list, bool clean) {
  heap->free[cls] = list;
  heap->clean[cls] = clean;
}

/* A batch of the transfer, n blocks, numbered with their depths: it was
 * the top of another cache, its first block's depth word its link. */
static void batch_number(hak_block_t *batch, unsigned n) {
  for (hak_block_t *b = batch; b != NULL; b = hak_next(b)) *hak_span_depth(b) = n--;
  HAK_ASSERT(n == 0);
}

/* Whether the program grows (see TRIM_FRESH_BYTES): the page heap's pages
 * in use were near their most after the fill, and the thread's caches are
 * not the most of what it holds. */
static bool growing(const hak_heap_t *heap, bool near_most, size_t cached) {
  return near_most && (int64_t)(2 * cached) <= heap->span_held;
}

/* Takes up to n blocks of cls (at multiples of align_pages pages) from
 * the page heap into taken, in the order taken (from a fresh run, by
 * address), marked as taken by the heap of heap_number; for the first,
 * the page heap may take a new segment. Returns how many; *clean tells
 * whether they are all zero memory, *near_most whether the pages in use
 * are then within GROWTH_SLACK_PAGES of their most. */
static unsigned blocks_take(size_t cls, unsigned n, unsigned align_pages, uint32_t heap_number,
                            void **taken, bool *clean, bool *near_most) {
  unsigned got = 0;
  *clean = true;
  pthread_mutex_lock(&hak_span_lock);
  while (got < n) {
    bool zero, refused = false;
    void *b = block_take(cls, align_pages, heap_number, &zero, &refused);
    if (b == NULL) {
      if (got > 0 || refused) break;
      bool bulk = pages_in_use_most >= HAK_SPAN_PAGES;
      pthread_mutex_unlock(&hak_span_lock);
      uint8_t state;
      hak_segment_t *seg = segment_prepare(&state, bulk);
      pthread_mutex_lock(&hak_span_lock);
      if (seg == NULL || !segment_add(seg, state)) break;
      continue;
    }
    taken[got++] = b;
    *clean &= zero;
  }
  *near_most = pages_in_use + GROWTH_SLACK_PAGES >= pages_in_use_most;
  pthread_mutex_unlock(&hak_span_lock);
  return got;
}

/* Fills the heap's empty cache of cls with up to n blocks (blocks_take).
 * Returns how many. */
static unsigned cache_fill(hak_heap_t *heap, size_t cls, unsigned n, unsigned align_pages,
                           bool *near_most) {
  /* linked once the lock is dropped: writing a link may fault a page in,
   * which other threads would wait for */
  void *taken[BATCH_BYTES >> HAK_PAGE_SHIFT];
  HAK_ASSERT(n <= sizeof taken / sizeof taken[0]);
  bool clean;
  unsigned got = blocks_take(cls, n, align_pages, heap->number, taken, &clean, near_most);
  hak_block_t *head = NULL;
  for (unsigned i = got; i-- > 0;) {
    hak_set_next(taken[i], head);
    *hak_span_depth(taken[i]) = got - i;
    head = taken[i];
  }
  cache_set(heap, cls, head, clean);
  return got;
}

/* Blocks a fill of span cache c takes: 1, 2, 4, ... up to a batch, so
 * that a thread that uses a class a few times (a pool of a thousand
 * threads, each with a buffer of 8 KiB; bash) does not write the first
 * page of a batch of blocks. */
_Static_assert(2 * (BATCH_BYTES / HAK_SLAB_MAX) <= UINT8_MAX, "span_fill_next holds twice a batch");
static unsigned fill_size(hak_heap_t *heap, size_t c) {
  HAK_ASSERT(c < HAK_SPAN_CACHES);
  unsigned n = heap->span_fill_next[c] ? heap->span_fill_next[c] : 1;
  unsigned batch = batch_of(HAK_SLAB_CLASSES + c);
  if (n >= batch) return batch;
  heap->span_fill_next[c] = (uint8_t)(2 * n);
  return n;
}

/* The heap's cache of malloc's number cls ran dry: noted for the trims,
 * and its bound may grow (cache_grow). */
static void ran_dry(hak_heap_t *heap, size_t cls) {
  size_t c = cls - HAK_SLAB_CLASSES;
  heap->span_low[c] = 0;
  heap->span_refilled |= UINT64_C(1) << c;
  cache_grow(heap, cls);
}

/* The refill of the heap's empty cache of malloc's number cls, with
 * blocks at multiples of align_pages pages (1 for a class: at their
 * colours); pops one. */
static void *refill(size_t size, hak_heap_t *heap, size_t cls, unsigned align_pages) {
  HAK_ASSERT(hak_class_is_span(cls) && heap->free[cls] == NULL);
  if (HAK_UNLIKELY(heap == HAK_HEAP_EMPTY) && (heap = hak_heap_get()) == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  HAK_SLOW_BEGIN();
  HAK_STAT_ADD(refills, 1);
  heap->span_given_in_row = 0;
  if (heap->draining) drain_end(heap);
  size_t c = cls - HAK_SLAB_CLASSES;
  ran_dry(heap, cls);
  if (++heap->span_refills >= heap->span_trim_period) {
    heap->span_refills = 0;
    trim_unused(heap);
  }
  hak_block_t *batch = align_pages == 1 ? transfer_pop(c) : NULL;
  /* blocks at their page's start serve every size of the class */
  if (batch == NULL && align_pages == 1 && cls < HAK_CLASSES)
    batch = transfer_pop(hak_span_at_page(cls) - HAK_SLAB_CLASSES);
  bool near_most = false;
  bool filled = false;
  if (batch != NULL) {
    batch_number(batch, batch_of(cls));
    cache_set(heap, cls, batch, false);
  } else if (cache_fill(heap, cls, fill_size(heap, c), align_pages, &near_most) == 0) {
    /* Out of memory: once, give back what waits for a purge, in a cache
     * or for the purger's unmap, and look again for the one block. */
    hak_release_all();
    cache_fill(heap, cls, 1, align_pages, &near_most);
  } else {
    filled = true;
  }
  held_add(heap, cls, hak_span_count(heap, cls));
  if (filled && heap->clean[cls]) {
    hak_heaps_trim_empty(); /* their pages for those the refill took */
    size_t cached = caches_bytes(heap);
    if (cached > TRIM_FRESH_BYTES && !growing(heap, near_most, cached)) trim_unused(heap);
  }
  void *b = hak_heap_pop(heap, cls);
  HAK_SLOW_END();
  return hak_refill_done(b, cls, size);
}

/* A block of the class's other cache, for the empty one of malloc's
 * number n, before a refill: one at its page's start serves every size of
 * its class, and one at its colour moves to its page's start for good. */
static void *other_cache_pop(hak_heap_t *heap, size_t n) {
  size_t cls = hak_class_of_number(n);
  uint8_t *b = (uint8_t *)hak_list_pop(heap, n == cls ? hak_span_at_page(cls) : cls);
  if (b == NULL) return NULL;
  heap->clean[n] = 0; /* for calloc: not the last refill's */
  if (n != cls) {
    hak_segment_base(b)->span.page_block[page_index(b)] = hak_span_entry_make(n, 0);
    b = (uint8_t *)hak_page_down((uintptr_t)b);
  }
  hak_block_handout(b, hak_span_block_bytes(n, b));
  return b;
}

void *hak_span_malloc_slow(size_t size, hak_heap_t *heap, size_t number) {
  void *b = hak_heap_pop(heap, number);
  if (b == NULL) {
    if ((b = other_cache_pop(heap, number)) == NULL) return refill(size, heap, number, 1);
    ran_dry(heap, number); /* as its refill would note */
  }
  HAK_CSTAT_ALLOC(number, size);
  return b;
}

/* A block of size bytes at a multiple of align (8 KiB-1 MiB), of the class
 * of the size rounded up to align if that is at most twice as much (such
 * blocks tile the runs cut for them), else of the size's own: the head of
 * the class's cache of blocks at their page's start if it is at such a
 * multiple; else, if the cache is
 * empty, a refill of blocks at such multiples, so that a thread that asks
 * for aligned blocks of a class gets back those it freed; else one block
 * straight from the page heap. Such alignments went to the large blocks'
 * arena, a 2 MiB chunk each, under its lock: aligned_alloc(8192, 1-16 KiB)
 * ran at 0.17x tcmalloc's speed. */
void *hak_span_alloc_aligned(size_t size, size_t align) {
  size_t need = hak_aligned_need(size, align);
  size_t cls = hak_size_class(need <= 2 * (size + HAK_CANARY) ? need : size + HAK_CANARY);
  if (cls < HAK_SLAB_CLASSES) cls = HAK_SLAB_CLASSES;
  cls = hak_span_at_page(cls);
  unsigned align_pages = (unsigned)(align >> HAK_PAGE_SHIFT);
  hak_heap_t *heap = hak_tls_heap;
  hak_block_t *b = heap->free[cls];
  if (b == NULL) return refill(size, heap, cls, align_pages);
  if (((uintptr_t)b & (align - 1)) == 0) {
    void *p = hak_heap_pop(heap, cls);
    HAK_CSTAT_ALLOC(cls, size);
    return p;
  }
  HAK_SLOW_BEGIN();
  void *taken = NULL;
  bool clean, near_most;
  if (blocks_take(cls, 1, align_pages, heap->number, &taken, &clean, &near_most) == 0) {
    hak_release_all(); /* as a refill does */
    blocks_take(cls, 1, align_pages, heap->number, &taken, &clean, &near_most);
  }
  if (taken != NULL) {
    held_add(heap, cls, 1);
    hak_block_handout(taken, hak_class_size[cls]);
  }
  HAK_SLOW_END();
  return hak_refill_done(taken, cls, size);
}

/* ---- realloc ---- */

/* What resize_in_place did. */
typedef enum { RESIZED, NO_ROOM, ROOM_UNUSED } resize_t;

/* The block at p, of class cls, becomes one of class ncls where it is:
 * shorter, its tail given back, or longer, into the free run after it.
 * A zero run after it is left when a dirty run elsewhere fits the longer
 * block (ROOM_UNUSED): its pages would grow the memory the program
 * touches, while the block can move to pages touched already, its own
 * going back to the page heap (buffers grown round after round took new
 * pages at every round). */
static resize_t resize_in_place(hak_segment_t *seg, void *p, size_t cls, size_t ncls) {
  uint32_t *pg = seg->span.page;
  unsigned first = page_index(p), n = class_pages(cls), m = class_pages(ncls);
  uint32_t heap_number = block_heap_number(seg, p, cls);
  resize_t done = RESIZED;
  pthread_mutex_lock(&hak_span_lock);
  if (m < n) {
    pg[first + n - 1] = 0;
    block_mark(seg, first, m, ncls, heap_number, hak_page_offset(p));
    pages_give(seg, first + m, n - m, hak_clock_ms(), false);
  } else {
    uint32_t w = first + n < HAK_SPAN_PAGES ? pg[first + n] : 0;
    run_t *r = (w & HAK_PAGE_TAG) == HAK_PAGE_FREE ? run_of(w) : NULL;
    if (r != NULL) run_merge_next(r, UINT64_MAX);
    if (r == NULL || r->pages < m - n) {
      done = NO_ROOM;
    } else if (r->state != RUN_DIRTY && bin_find(0, m) != NULL) {
      done = ROOM_UNUSED;
    } else if (!hak_segment_commit(seg, (size_t)(first + m) << HAK_PAGE_SHIFT)) {
      done = NO_ROOM;
    } else {
      bin_remove(r);
      pg[first + n - 1] = pg[first + n] = 0;
      run_take_front(r, m - n);
      block_mark(seg, first, m, ncls, heap_number, hak_page_offset(p));
      seg->span.used_pages += m - n;
      pages_in_use += m - n;
    }
  }
  pthread_mutex_unlock(&hak_span_lock);
  return done;
}

/* A block that realloc moves out of this size goes back to the page heap,
 * not to the thread's cache: a buffer that grew out of a class rarely
 * comes back to it soon, and the caches of every class it went through
 * held its old blocks (4 buffers grown by 1,000 B to 250 KB, 50 rounds:
 * 7.7 MiB, mimalloc 4.6). Its copy costs more than the page heap's lock
 * (realloc_chain's copies below 32 KiB ran at 0.92x that way). */
#define MOVE_GIVES_BACK ((size_t)32 * 1024)

/* hak_realloc_move, but the block at p, of class cls, goes back to the
 * page heap after free's checks. */
static void *move_giving_back(void *p, size_t size, size_t old, size_t cls) {
  void *q = hak_realloc_block(size, old);
  if (q == NULL) return NULL;
  memcpy(q, p, old);
  block_freed(hak_tls_heap, cls, p);
  if (hak_tls_heap != HAK_HEAP_EMPTY) held_add(hak_tls_heap, cls, -1);
  hak_set_next(p, NULL);
  give_list(p);
  return q;
}

void *hak_span_realloc(hak_segment_t *seg, void *p, size_t size) {
  size_t number = block_number(seg, p), off = hak_page_offset(p);
  size_t old = hak_class_size[number] - off - HAK_CANARY;
  if (size <= old && size >= old / 2) return p;
  resize_t done = NO_ROOM;
  if (size + HAK_CANARY > HAK_SLAB_MAX && size <= HAK_BIG_MAX - HAK_CANARY - off) {
    size_t ncls = hak_size_class(size + HAK_CANARY + off); /* p stays at its colour */
    done = resize_in_place(seg, p, number, ncls);
    if (done == RESIZED) {
      hak_block_resized(p, hak_class_size[ncls] - off);
      HAK_CSTAT_FREE(number);
      HAK_CSTAT_ALLOC(ncls, size);
      return p;
    }
  }
  if (size > old && (done == ROOM_UNUSED || hak_class_size[number] >= MOVE_GIVES_BACK))
    return move_giving_back(p, size, old, number);
  return hak_realloc_move(p, size, old);
}

/* ---- purge, usage, fork ---- */

/* A purge costs a system call and, while other threads run, a TLB
 * shootdown on each of their CPUs, whatever its size: the timed purge
 * leaves runs shorter than this to merge into a longer one or to go with
 * their segment (a program that frees every other block and then asks for
 * bigger ones paid an interrupt per hole, and faulted the holes in again). */
#define PURGE_MIN_PAGES 16
/* The purges walk the bins from this index: below it, bin n is runs of n pages. */
_Static_assert(PURGE_MIN_PAGES < SHORT_BINS, "the short bins hold the runs left unpurged");

/* Purges dirty run r, in its bin. It merges only with zero runs, in the
 * other bins; true if its segment went back, which takes the segment's
 * other runs out of their bins (maybe the next one of the caller's walk). */
static bool dirty_run_purge(run_t *r) {
  bin_remove(r);
  run_purge(r);
  return run_settle(r, false);
}

static size_t pages_in_use_seen; /* pages_in_use at the last timed purge */

/* Whether every dirty run of seg has been idle for the delay. */
static bool segment_idle(hak_segment_t *seg, uint64_t now, uint64_t delay) {
  for (unsigned i = HAK_SPAN_FIRST_PAGE; i < HAK_SPAN_PAGES;) {
    run_t *x = run_of(seg->span.page[i]);
    if (x->state == RUN_DIRTY && now - x->since_ms < delay) return false;
    i += x->pages;
  }
  return true;
}

bool hak_span_purge(bool force) {
  bool pending = transfer_purge(force);
  uint64_t now = hak_clock_ms(), delay = (uint64_t)hak_opt.purge_delay_ms;
  pthread_mutex_lock(&hak_span_lock);
  /* While the program grows, what it freed waits: it is what it soon asks
   * for again, here no longer than any free run it has (it frees every
   * other block and then asks for bigger ones); purged, it would fault in
   * again. Holding more span pages than at the last look is growth too:
   * such a program refilled its segments from their free runs, and maps
   * nothing new while it does. */
  bool took = pages_in_use > pages_in_use_seen;
  pages_in_use_seen = pages_in_use;
  uint64_t wait = hak_purge_growing(now, took) ? delay * HAK_GROWTH_WAIT : delay;
  /* runs apart may make a long one; those given back since stay apart */
  if (runs_merge_idle(force ? UINT64_MAX : now >= wait ? now - wait : 0)) pending = true;
  for (unsigned b = force ? 1 : PURGE_MIN_PAGES; b < BINS; b++) {
    for (run_t *r = bins[0][b], *next; r; r = next) {
      next = r->next;
      if (!force && now - r->since_ms < wait) {
        pending = true;
        continue;
      }
      if (dirty_run_purge(r)) next = bins[0][b];
    }
  }
  /* the segments with no block left go whole, whatever their runs */
  for (hak_segment_t *seg = segments, *next; seg; seg = next) {
    next = seg->next;
    if (seg->span.used_pages != 0) continue;
    if (!force && !segment_idle(seg, now, delay)) {
      pending = true;
      continue;
    }
    run_t *r = run_of(seg->span.page[HAK_SPAN_FIRST_PAGE]);
    bin_remove(r);
    segment_release(r);
  }
  pthread_mutex_unlock(&hak_span_lock);
  return pending;
}

void hak_span_shed(size_t bytes) {
  size_t pages = bytes >> HAK_PAGE_SHIFT;
  /* a run freed just now may be what a block still in the page heap's
   * classes grows into next */
  uint64_t now = hak_clock_ms(), idle = (uint64_t)hak_opt.purge_delay_ms / 4;
  pthread_mutex_lock(&hak_span_lock);
  runs_merge_idle(UINT64_MAX);
  /* the longest runs first: fewest calls */
  for (unsigned b = BINS - 1; b >= PURGE_MIN_PAGES && pages && dirty_pages > pages_in_use; b--) {
    for (run_t *r = bins[0][b], *next; r && pages && dirty_pages > pages_in_use; r = next) {
      next = r->next;
      if (now - r->since_ms < idle) continue;
      pages = pages > r->pages ? pages - r->pages : 0;
      if (dirty_run_purge(r)) next = bins[0][b];
    }
  }
  pthread_mutex_unlock(&hak_span_lock);
}

void hak_span_usage(hak_usage_t *u) {
  pthread_mutex_lock(&hak_span_lock);
  for (hak_segment_t *seg = segments; seg; seg = seg->next) {
    for (unsigned i = HAK_SPAN_FIRST_PAGE; i < HAK_SPAN_PAGES;) {
      uint32_t w = seg->span.page[i];
      if ((w & HAK_PAGE_TAG) == HAK_PAGE_FREE) {
        run_t *r = run_of(w);
        if (r->state == RUN_DIRTY) u->cached_bytes += run_bytes(r);
        i += r->pages;
        continue;
      }
      HAK_ASSERT((w & HAK_PAGE_TAG) == HAK_PAGE_USED);
      size_t cls = hak_span_word_class(w);
      u->blocks_used[cls]++;
      u->used_bytes += hak_class_size[cls];
      i += word_pages(w);
    }
  }
  pthread_mutex_unlock(&hak_span_lock);
  /* The transfer's blocks are free, though their pages say used. */
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) {
    size_t n = 0;
    pthread_mutex_lock(&transfer[c].lock);
    for (hak_block_t *batch = transfer[c].top; batch != NULL; batch = *batch_link(batch))
      for (hak_block_t *b = batch; b != NULL; b = hak_next(b)) n++;
    pthread_mutex_unlock(&transfer[c].lock);
    hak_usage_unused(u, hak_class_of_number(HAK_SLAB_CLASSES + c), n);
  }
}

void hak_span_fork_prepare(void) {
  pthread_mutex_lock(&hak_span_lock);
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) pthread_mutex_lock(&transfer[c].lock);
}
void hak_span_fork_parent(void) {
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) pthread_mutex_unlock(&transfer[c].lock);
  pthread_mutex_unlock(&hak_span_lock);
}
void hak_span_fork_child(void) {
  for (size_t c = 0; c < HAK_SPAN_CACHES; c++) pthread_mutex_init(&transfer[c].lock, NULL);
  pthread_mutex_init(&hak_span_lock, NULL);
}
