/* Segments: 4 MiB aligned regions of 64 units of 64 KiB. A slab is a run
 * of 1 or 2 units, placed where the most units are still committed; a
 * freed slab's units serve slabs of any class. A segment belongs to one
 * heap, is abandoned when its thread exits (and adopted by the next heap
 * that needs a slab), and goes to a small global cache when all its units
 * are free. The span tier takes its segments from the same cache and gives
 * them back to it. The global lock guards only the abandoned list and the
 * cache: memory coming from or going back to the OS. */
#include "internal.h"

HAK_FORK_HELD pthread_mutex_t hak_segment_lock = PTHREAD_MUTEX_INITIALIZER;

/* Segments of exited threads, doubly linked through next/prev so that a
 * thread freeing into one can take it out (reclaim on free). All under
 * hak_segment_lock. */
static hak_segment_t *abandoned;
static hak_segment_t *cache;
static size_t cache_count;

#define ALL_UNITS UINT64_MAX

_Static_assert(HAK_MAX_SLABS == 64, "one bit per unit in a uint64_t");
_Static_assert(sizeof(hak_segment_t) <= HAK_SEG_HEADER - HAK_GUARD_PAGES * HAK_PAGE_SIZE,
               "segment header too big");
_Static_assert(sizeof(hak_slab_t) == 128, "slab descriptor is two cache lines");
_Static_assert(offsetof(hak_segment_t, unit) == 64, "free reads a unit at a one-byte displacement");

/* Units first .. first + n - 1 as a mask. */
static inline uint64_t units_mask(unsigned first, unsigned n) {
  return (n >= 64 ? ALL_UNITS : ((UINT64_C(1) << n) - 1)) << first;
}

/* The slab in use that starts at or after unit *u, *u moved past it; NULL
 * when there is none. */
static hak_slab_t *slab_from(hak_segment_t *seg, unsigned *u) {
  if (*u >= HAK_MAX_SLABS) return NULL;
  uint64_t used = ~seg->free_units & (ALL_UNITS << *u);
  if (used == 0) return NULL;
  hak_slab_t *s = &seg->slabs[__builtin_ctzll(used)];
  *u = s->index + s->units;
  return s;
}

/* Bytes available to slabs in the units of mask (unit 0 holds the header). */
static size_t units_bytes(uint64_t mask) {
  return (size_t)__builtin_popcountll(mask) * HAK_UNIT_SIZE - (mask & 1 ? HAK_SEG_HEADER : 0);
}

/* Bytes of seg's FREE units that are still committed. */
static size_t committed_free_bytes(const hak_segment_t *seg) {
  return units_bytes(seg->free_units & ~seg->purged_units);
}

/* Gives units first .. first + n - 1 back to the OS: their memory is zero.
 * Units past reserved_from hold no page and are not touched: locked memory
 * is locked again as it is purged (hak_os_empty), and under a limit of
 * locked memory they would count against it. */
static void purge_units(hak_segment_t *seg, unsigned first, unsigned n) {
  size_t start = first ? (size_t)first << HAK_UNIT_SHIFT : HAK_SEG_HEADER;
  size_t end = (size_t)(first + n) << HAK_UNIT_SHIFT;
  size_t accessible_end = seg->reserved_from && seg->reserved_from < end ? seg->reserved_from : end;
  hak_os_purge_within((uint8_t *)seg + start, end - start, accessible_end > start ? accessible_end - start : 0);
  seg->purged_units |= units_mask(first, n);
  seg->zero_units |= units_mask(first, n);
}

/* ---- segment lists: a heap's own, and the abandoned ones ---- */

static void list_push(hak_segment_t **head, hak_segment_t *seg) {
  seg->prev = NULL;
  seg->next = *head;
  if (*head) (*head)->prev = seg;
  *head = seg;
}

static void list_remove(hak_segment_t **head, hak_segment_t *seg) {
  if (seg->prev) seg->prev->next = seg->next;
  else *head = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  seg->next = seg->prev = NULL;
}

/* A heap's segments with free units come before the full ones, so that a
 * search for units stops at the first full one: a program with hundreds of
 * segments filled them all. */
static void heap_list_place(hak_heap_t *heap, hak_segment_t *seg) {
  if (seg->free_units != 0 || heap->segments_last == NULL) {
    list_push(&heap->segments, seg);
    if (seg->next == NULL) heap->segments_last = seg;
    return;
  }
  seg->next = NULL;
  seg->prev = heap->segments_last;
  heap->segments_last->next = seg;
  heap->segments_last = seg;
}

static void heap_list_remove(hak_heap_t *heap, hak_segment_t *seg) {
  if (heap->segments_last == seg) heap->segments_last = seg->prev;
  list_remove(&heap->segments, seg);
}

static void heap_link(hak_heap_t *heap, hak_segment_t *seg) {
  heap_list_place(heap, seg);
  atomic_store_explicit(&seg->heap, heap, memory_order_release);
}

static void heap_unlink(hak_heap_t *heap, hak_segment_t *seg) {
  heap_list_remove(heap, seg);
  atomic_store_explicit(&seg->heap, NULL, memory_order_release);
}

static void abandoned_push(hak_segment_t *seg) {
  list_push(&abandoned, seg);
  seg->abandoned = 1;
}

static void abandoned_remove(hak_segment_t *seg) {
  list_remove(&abandoned, seg);
  seg->abandoned = 0;
}

/* ---- the cache of free segments ---- */

static void segment_unmap(hak_segment_t *seg) {
  hak_segmap_set(seg, HAK_SEGMAP_NONE);
  HAK_STAT_ADD(committed, units_bytes(seg->purged_units)); /* unmap counts them again */
  HAK_STAT_SUB(segments, 1);
  if (!hak_purge_unmap_later(seg, HAK_SEG_SIZE)) hak_os_unmap(seg, HAK_SEG_SIZE);
}

static void purge_free_slabs(hak_segment_t *seg, uint64_t now, bool force, uint64_t *next);

/* The cache keeps only the segment cached last committed (it is reused
 * first); an older one is purged when a newer one comes. Threads that come
 * and go free whole segments in bursts, faster than new threads take them,
 * and a cache of committed segments would hold the peak of every burst.
 * The purge is done under the lock, so that no thread takes the segment
 * and fork never copies it half purged. */
static void cache_put(hak_segment_t *seg) {
  uint64_t none = 0;
  /* before it is in the cache, where another thread may take it */
  if (hak_opt.purge_delay_ms == 0) purge_free_slabs(seg, 0, true, &none);
  pthread_mutex_lock(&hak_segment_lock);
  bool unmap_now = cache_count >= (size_t)hak_opt.segment_cache;
  if (!unmap_now) {
    for (hak_segment_t *older = cache; older; older = older->next)
      if (committed_free_bytes(older) != 0) purge_free_slabs(older, 0, true, &none);
    seg->cached_since_ms = hak_clock_ms();
    seg->next = cache;
    cache = seg;
    cache_count++;
  }
  pthread_mutex_unlock(&hak_segment_lock);
  if (unmap_now) segment_unmap(seg);
  else if (hak_opt.purge_delay_ms != 0) hak_purge_wake();
}

bool hak_segment_cache_collect(bool force) {
  uint64_t now = hak_clock_ms();
  hak_segment_t *unmap_list = NULL;
  pthread_mutex_lock(&hak_segment_lock);
  for (hak_segment_t **pp = &cache; *pp;) {
    hak_segment_t *s = *pp;
    if (force || now - s->cached_since_ms >= (uint64_t)hak_opt.purge_delay_ms) {
      *pp = s->next;
      cache_count--;
      s->next = unmap_list;
      unmap_list = s;
    } else {
      pp = &s->next;
    }
  }
  bool pending = cache != NULL;
  pthread_mutex_unlock(&hak_segment_lock);
  while (unmap_list) {
    hak_segment_t *s = unmap_list;
    unmap_list = s->next;
    segment_unmap(s);
  }
  return pending;
}

static void slab_mark_free(hak_heap_t *heap, hak_slab_t *slab);

/* Whether something freed at `since` is due (else lowers *next to its
 * deadline; 0 means none pending). */
static bool purge_due(uint64_t since, uint64_t now, bool force, uint64_t *next) {
  uint64_t at = since + (uint64_t)hak_opt.purge_delay_ms;
  if (force || now >= at) return true;
  if (*next == 0 || at < *next) *next = at;
  return false;
}

/* Purges the pages of an in-use slab beyond its reserved blocks. */
static void purge_tail(hak_segment_t *seg, hak_slab_t *s) {
  uintptr_t carved = (uintptr_t)hak_slab_start(seg, s) + (uintptr_t)s->reserved * s->block_size;
  uintptr_t end = (uintptr_t)hak_slab_start(seg, s) + hak_slab_bytes(s);
  uintptr_t start = hak_page_up(carved);
  if (start > end) start = end;
  /* The page of the last block carved keeps the old bytes past it: zero
   * them, so that all the unreserved memory is zero, as s->zero says. */
  memset((void *)carved, 0, start - carved);
  if (start < end) hak_os_purge((void *)start, end - start);
  s->zero = 1;
  __atomic_store_n(&s->dirty_tail, 0, __ATOMIC_RELEASE); /* after zero, for slab_extend */
}

/* Purges the segment's FREE units, and the dirty tails of its slabs, whose
 * delay has passed (all if force), a run of units in one call; lowers
 * *next to the earliest deadline still pending (0: none). */
static void purge_free_slabs(hak_segment_t *seg, uint64_t now, bool force, uint64_t *next) {
  hak_slab_t *s;
  for (unsigned u = 0; (s = slab_from(seg, &u)) != NULL;)
    if (s->dirty_tail && purge_due(s->dirty_since_ms, now, force, next)) purge_tail(seg, s);
  uint64_t due = 0;
  for (uint64_t todo = seg->free_units & ~seg->purged_units; todo; todo &= todo - 1) {
    unsigned u = (unsigned)__builtin_ctzll(todo);
    if (purge_due(seg->slabs[u].free_since_ms, now, force, next)) due |= UINT64_C(1) << u;
  }
  while (due) {
    unsigned first = (unsigned)__builtin_ctzll(due);
    uint64_t past = ~(due >> first);
    unsigned n = past ? (unsigned)__builtin_ctzll(past) : HAK_MAX_SLABS;
    purge_units(seg, first, n);
    due &= ~units_mask(first, n);
  }
}

/* Abandoned segments whose blocks other threads have freed since: their
 * remote lists are collected (no thread owns them, and adopters take them
 * off the list under the same lock), emptied slabs freed, and segments with
 * no slab in use released. Unreleased free slabs are purged on time. */
bool hak_segment_purge_abandoned(bool force) {
  uint64_t now = hak_clock_ms(), next = 0;
  hak_segment_t *release = NULL;
  pthread_mutex_lock(&hak_segment_lock);
  for (hak_segment_t *seg = abandoned, *after; seg; seg = after) {
    after = seg->next;
    hak_slab_t *s;
    for (unsigned u = 0; (s = slab_from(seg, &u)) != NULL;) {
      if (hak_slab_state(s) != HAK_SLAB_ORPHAN) continue;
      hak_slab_collect_remote(s);
      if (s->used == 0) slab_mark_free(NULL, s);
    }
    if (seg->free_units == ALL_UNITS) {
      abandoned_remove(seg);
      seg->next = release;
      release = seg;
    } else {
      purge_free_slabs(seg, now, force, &next);
    }
  }
  pthread_mutex_unlock(&hak_segment_lock);
  while (release) {
    hak_segment_t *seg = release;
    release = seg->next;
    cache_put(seg);
  }
  return next != 0;
}

/* ---- releasing slabs ---- */

/* Something of heap's became purgeable at `since`: make sure a purge pass
 * comes (one already pending recomputes its next deadline itself). */
static void schedule_purge(hak_heap_t *heap, uint64_t since) {
  if (heap == NULL || heap->next_purge_ms != 0) return;
  uint64_t at = since + (uint64_t)hak_opt.purge_delay_ms;
  __atomic_store_n(&heap->next_purge_ms, at, __ATOMIC_RELAXED);
  hak_purge_wake();
}

/* Marks a slab's units FREE and schedules their purge; the segment stays.
 * heap is NULL for a slab of an abandoned segment: the purger, which frees
 * those, also purges them. */
static void slab_mark_free(hak_heap_t *heap, hak_slab_t *slab) {
  hak_segment_t *seg = hak_segment_of_slab(slab);
  HAK_ASSERT(slab->state != HAK_SLAB_FREE && slab->used == 0);
  HAK_ASSERT(hak_slab_free_to(slab) == &slab->local_free);
  unsigned first = slab->index, n = slab->units;
  /* Units past the blocks carved keep what they had: zero memory if the
   * slab's unreserved memory was zero. */
  size_t carved_end = (size_t)(hak_slab_start(seg, slab) - (uint8_t *)seg) +
                      (size_t)slab->reserved * slab->block_size;
  unsigned touched = (unsigned)((carved_end + HAK_UNIT_SIZE - 1) >> HAK_UNIT_SHIFT) - first;
  uint64_t run = units_mask(first, n);
  uint64_t zero = slab->zero && touched < n ? units_mask(first + touched, n - touched) : 0;
  uint64_t now = hak_clock_ms();
  for (unsigned u = first; u < first + n; u++) {
    hak_slab_t *c = &seg->slabs[u];
    atomic_store_explicit(&c->owner, 0, memory_order_relaxed);
    hak_slab_set_state(c, HAK_SLAB_FREE);
    c->local_free = NULL;
    c->reserved = 0; /* the bound stays: bad_block names a double free with it */
    c->units = 1;
    c->first_magic = slab->first_magic; /* so does a free into any unit of the slab */
    c->magic = slab->magic;
    __atomic_store_n(&c->block_bound, slab->block_bound, __ATOMIC_RELAXED);
    __atomic_store_n(&c->dirty_tail, 0, __ATOMIC_RELAXED); /* all of it is purged */
    c->free_since_ms = now;
    seg->unit[u] = (hak_unit_t){c, &c->local_free};
  }
  seg->zero_units = (seg->zero_units & ~run) | zero;
  bool was_full = seg->free_units == 0;
  seg->free_units |= run;
  if (was_full && heap != NULL &&
      atomic_load_explicit(&seg->heap, memory_order_relaxed) == heap) { /* not being abandoned */
    heap_list_remove(heap, seg);
    heap_list_place(heap, seg);
  }
  if (hak_opt.purge_delay_ms == 0) {
    purge_units(seg, first, n);
  } else {
    schedule_purge(heap, now);
  }
}

/* An empty segment goes to the cache unless it is the heap's only one
 * (kept to avoid map/unmap thrash). True if it went. */
static bool segment_release_if_empty(hak_heap_t *heap, hak_segment_t *seg) {
  if (seg->free_units != ALL_UNITS || (!seg->prev && !seg->next)) return false;
  heap_unlink(heap, seg);
  cache_put(seg);
  return true;
}

/* With a purge delay, a segment that its own thread empties stays with the
 * heap, its units committed, until their purge, which then unmaps it: a
 * thread that frees a batch of blocks and allocates it again reuses them
 * without page faults, where the segment cache, which keeps only one
 * segment committed, purged the others at once. One emptied by frees into
 * a parked heap, by the purger or by hak_collect goes to the cache, where
 * other threads take it (larson 4t 10-1000: 15.8 MiB peak kept, 15.0 not). */
void hak_segment_free_slab(hak_heap_t *heap, hak_slab_t *slab, bool keep) {
  slab_mark_free(heap, slab);
  if (!keep || hak_opt.purge_delay_ms == 0)
    segment_release_if_empty(heap, hak_segment_of_slab(slab));
}

/* ---- acquiring segments and slabs ---- */

/* A reused segment keeps track of which units are still committed. A new
 * one whose header pages are zero has only its unit table written: a zero
 * descriptor is a FREE slab of nobody's with no block (units_take sets the
 * rest), so that a thread with a few slabs touches the header's first page
 * alone, not the 8 KiB of the 64 descriptors. */
static void segment_init(hak_segment_t *seg, bool fresh, bool header_zero) {
  if (header_zero) {
    seg->map_size = HAK_SEG_SIZE;
    seg->free_units = seg->zero_units = ALL_UNITS;
    for (unsigned u = 0; u < HAK_MAX_SLABS; u++)
      seg->unit[u] = (hak_unit_t){&seg->slabs[u], &seg->slabs[u].local_free};
    return;
  }
  uint64_t zero = fresh ? ALL_UNITS : seg->zero_units;
  uint64_t purged = fresh ? 0 : seg->purged_units;
  uint64_t now = hak_clock_ms();
  memset(seg, 0, sizeof *seg);
  seg->map_size = HAK_SEG_SIZE;
  seg->free_units = ALL_UNITS;
  seg->zero_units = zero;
  seg->purged_units = purged;
  for (unsigned u = 0; u < HAK_MAX_SLABS; u++) {
    hak_slab_t *s = &seg->slabs[u];
    seg->unit[u] = (hak_unit_t){s, &s->local_free};
    s->index = (uint8_t)u;
    s->units = 1;
    s->state = HAK_SLAB_FREE;
    s->free_since_ms = now;
  }
}

static hak_segment_t *segment_map(bool strict) {
  return strict ? hak_os_map_reserved(HAK_SEG_SIZE, HAK_SEG_SIZE, HAK_UNIT_SIZE)
                : hak_os_map_aligned(HAK_SEG_SIZE, HAK_SEG_SIZE);
}

static hak_segment_t *segment_new(void) {
  bool strict = atomic_load_explicit(&hak_commit_strict, memory_order_relaxed) > 0 ||
                (!hak_single_threaded() && hak_os_commit_strict());
  hak_segment_t *seg = segment_map(strict);
  /* a program that locked its memory had the whole segment faulted in */
  if (seg != NULL && !strict && hak_os_found_locked((uint8_t *)seg + HAK_SEG_SIZE - HAK_PAGE_SIZE)) {
    hak_os_unmap(seg, HAK_SEG_SIZE);
    seg = segment_map(strict = true);
  }
  if (seg == NULL) return NULL;
  if (strict) seg->reserved_from = HAK_UNIT_SIZE;
  /* the guard page is refused past the kernel's limit of mappings */
  if ((HAK_GUARD_PAGES && !hak_os_guard((uint8_t *)seg + HAK_SEG_HEADER - HAK_PAGE_SIZE, HAK_PAGE_SIZE, true)) ||
      !hak_segmap_open(seg, HAK_SEG_SIZE)) {
    hak_os_unmap(seg, HAK_SEG_SIZE);
    return NULL;
  }
  HAK_STAT_ADD(segments, 1);
  hak_segmap_set(seg, HAK_SEGMAP_SLABS);
  return seg;
}

/* An empty segment: the one cached last, or a new one (*fresh); NULL when
 * out of memory. */
static hak_segment_t *segment_get(bool *fresh) {
  pthread_mutex_lock(&hak_segment_lock);
  hak_segment_t *seg = cache;
  if (seg) {
    cache = seg->next;
    cache_count--;
  }
  pthread_mutex_unlock(&hak_segment_lock);
  *fresh = seg == NULL;
  return seg ? seg : segment_new();
}

/* A segment with nothing in it, from the cache or new, for the span tier;
 * NULL when out of memory. *zero: its memory past the header is zero;
 * *purged: and none of it counts as committed (all of it was purged).
 * Units purged in part of it count as committed again from here on. */
hak_segment_t *hak_segment_take_empty(bool *zero, bool *purged) {
  bool fresh;
  hak_segment_t *seg = segment_get(&fresh);
  if (seg == NULL || fresh) {
    *zero = true;
    *purged = false;
    return seg;
  }
  *zero = seg->zero_units == ALL_UNITS;
  *purged = seg->purged_units == ALL_UNITS;
  if (!*purged) HAK_STAT_ADD(committed, units_bytes(seg->purged_units));
  return seg;
}

/* The span tier is done with seg, all of it free: it becomes a slab
 * segment with every unit free and goes to the cache. */
void hak_segment_put_empty(hak_segment_t *seg, bool zero, bool purged) {
  seg->kind = HAK_KIND_SLABS;
  hak_segmap_set(seg, HAK_SEGMAP_SLABS);
  seg->zero_units = zero ? ALL_UNITS : 0;
  seg->purged_units = purged ? ALL_UNITS : 0;
  uint32_t reserved_from = seg->reserved_from;
  segment_init(seg, false, false);
  seg->reserved_from = reserved_from;
  cache_put(seg);
}

/* Where n units would go in seg: free ones, as many of them committed as
 * can be (reusing them costs no page faults and no new RSS), then in the
 * shortest run of free units that fits, at one end of it, so that long
 * runs stay whole for longer slabs (best fit). Returns whether any fits, its
 * first unit in *at and its score in *score (higher is better; the first
 * place wins a tie). Every place in one run of length len leaves len - n
 * free units beside it, so a run's places differ only in their committed
 * units (counted by a sliding window) and in touching an end of the run.
 * A run's best is its committed units (up to n) at an end: a run that
 * cannot beat the best so far is skipped, and its walk stops there (a
 * program whose buffers grow through the classes takes a slab every few
 * refills, and walked every unit of its mostly free segments for each). */
static bool units_find(const hak_segment_t *seg, unsigned n, unsigned *at, int *score) {
  uint64_t dirty = seg->free_units & ~seg->zero_units;
  bool found = false;
  for (uint64_t rest = seg->free_units; rest;) {
    unsigned a = (unsigned)__builtin_ctzll(rest);
    uint64_t gap = ~(rest >> a);
    unsigned len = gap ? (unsigned)__builtin_ctzll(gap) : HAK_MAX_SLABS - a;
    rest &= ~units_mask(a, len);
    if (len < n) continue;
    /* the run's best: as many committed units as it has, up to n, at an end */
    int most = __builtin_popcountll(dirty & units_mask(a, len));
    if (most > (int)n) most = (int)n;
    int beside = 2 * (int)(len - n), bound = most * 256 - beside;
    if (found && bound <= *score) continue;
    int committed = __builtin_popcountll(dirty & units_mask(a, n));
    for (unsigned f = a;; f++) {
      int sc = committed * 256 - beside - (f > a && f + n < a + len);
      if (!found || sc > *score) {
        found = true;
        *score = sc;
        *at = f;
        if (sc == (int)n * 256) return true; /* committed, fills its run: none is better */
      }
      if (sc == bound || f + n == a + len) break;
      committed += (int)(dirty >> (f + n) & 1) - (int)(dirty >> f & 1);
    }
  }
  return found;
}

bool hak_segment_commit(hak_segment_t *seg, size_t end) {
  if (HAK_LIKELY(seg->reserved_from == 0 || end <= seg->reserved_from)) return true;
  end = (end + HAK_UNIT_SIZE - 1) & ~(size_t)(HAK_UNIT_SIZE - 1);
  if (!hak_os_commit((uint8_t *)seg + seg->reserved_from, end - seg->reserved_from)) {
    errno = ENOMEM;
    return false;
  }
  seg->reserved_from = end < HAK_SEG_SIZE ? (uint32_t)end : 0;
  return true;
}

/* Units first .. first + n - 1 of seg become a FREE slab; NULL if their
 * memory is refused (hak_segment_commit). */
static hak_slab_t *units_take(hak_heap_t *heap, hak_segment_t *seg, unsigned first, unsigned n) {
  if (!hak_segment_commit(seg, (size_t)(first + n) << HAK_UNIT_SHIFT)) return NULL;
  uint64_t run = units_mask(first, n);
  hak_slab_t *s = &seg->slabs[first];
  HAK_STAT_ADD(committed, units_bytes(seg->purged_units & run));
  s->zero = (seg->zero_units & run) == run;
  seg->free_units &= ~run;
  seg->zero_units &= ~run;
  seg->purged_units &= ~run;
  if (seg->free_units == 0) {
    heap_list_remove(heap, seg);
    heap_list_place(heap, seg);
  }
  for (unsigned u = first; u < first + n; u++) seg->unit[u] = (hak_unit_t){s, &s->local_free};
  s->index = (uint8_t)first;
  s->units = (uint8_t)n;
  if (!s->zero && hak_opt.purge_delay_ms != 0) {
    s->dirty_since_ms = hak_clock_ms();
    __atomic_store_n(&s->dirty_tail, 1, __ATOMIC_RELAXED);
    schedule_purge(heap, s->dirty_since_ms);
  }
  HAK_STAT_ADD(slabs_allocated, 1);
  return s;
}

/* A new segment of a heap that has one already takes the committed pages
 * of the large arena's free chunks (2 MiB at a time, with mremap), as the
 * span tier's segments do, rather than fault in new ones: a program whose
 * small blocks grow while it frees large ones held both until the purge
 * (a hash table of 500,000 nodes, whose rehashes freed its old buckets:
 * 26.1 MiB peak against mimalloc's 23.9). Returns the units that got
 * pages; the header is written over them after. */
static uint64_t take_arena_pages(hak_segment_t *seg) {
  const unsigned half = HAK_LARGE_GRAIN >> HAK_UNIT_SHIFT;
  uint64_t units = 0;
  for (unsigned moved = hak_large_donate_segment(seg); moved; moved &= moved - 1)
    units |= units_mask((unsigned)__builtin_ctz(moved) * half, half);
  return units;
}

/* Takes an abandoned segment; false if it was empty and went away. */
static bool segment_adopt(hak_heap_t *heap, hak_segment_t *seg) {
  heap_link(heap, seg);
  hak_slab_t *s;
  for (unsigned u = 0; (s = slab_from(seg, &u)) != NULL;)
    if (s->state == HAK_SLAB_ORPHAN && !hak_slab_adopt(heap, s)) slab_mark_free(heap, s);
  return !segment_release_if_empty(heap, seg);
}

static hak_segment_t *pop_abandoned(void) {
  pthread_mutex_lock(&hak_segment_lock);
  hak_segment_t *seg = abandoned;
  if (seg) abandoned_remove(seg);
  pthread_mutex_unlock(&hak_segment_lock);
  return seg;
}

/* The best place for n units among heap's segments: false if none fits. */
static bool heap_find_units(hak_heap_t *heap, unsigned n, hak_segment_t **where, unsigned *at,
                           int *best) {
  *where = NULL;
  for (hak_segment_t *seg = heap->segments; seg && seg->free_units != 0; seg = seg->next) {
    unsigned f;
    int score;
    if (!units_find(seg, n, &f, &score)) continue;
    if (*where == NULL || score > *best) {
      *best = score;
      *where = seg;
      *at = f;
      if (score == (int)n * 256) break; /* committed, fills a run exactly */
    }
  }
  return *where != NULL;
}

/* Whether a units_find score is that of units all committed. */
static bool all_committed(int score, unsigned n) { return score > (int)(n - 1) * 256; }

hak_slab_t *hak_segment_alloc_slab(hak_heap_t *heap, unsigned n, size_t block_size,
                                   bool *adopted, bool *new_pages) {
  unsigned at = 0;
  int score = 0;
  hak_segment_t *where;
  *adopted = false;
  *new_pages = true;
  bool found = heap_find_units(heap, n, &where, &at, &score);
  /* A slab that would need memory not committed yet is shortened, down to
   * 4 blocks, to a run of units all committed: free units scattered
   * between other slabs serve it, and the peak does not grow. */
  size_t min_bytes = 4 * block_size;
  for (unsigned m = n / 2; !(found && all_committed(score, n)) && m > 0 &&
                           ((size_t)m << HAK_UNIT_SHIFT) >= min_bytes;
       m /= 2) {
    hak_segment_t *w;
    unsigned a;
    int sc;
    if (heap_find_units(heap, m, &w, &a, &sc) && all_committed(sc, m)) {
      n = m;
      where = w;
      at = a;
      score = sc;
      found = true;
    }
  }
  if (found) {
    *new_pages = !all_committed(score, n);
    return units_take(heap, where, at, n);
  }
  hak_segment_t *seg = pop_abandoned();
  if (seg) {
    *adopted = true;
    bool ours = segment_adopt(heap, seg);
    return ours && units_find(seg, n, &at, &score) ? units_take(heap, seg, at, n) : NULL;
  }
  bool fresh;
  seg = segment_get(&fresh);
  if (seg == NULL) return NULL;
  uint32_t reserved_from = seg->reserved_from; /* before pages of the arena replace the header */
  uint64_t moved = fresh && heap->segments != NULL ? take_arena_pages(seg) : 0;
  segment_init(seg, fresh, fresh && !(moved & 1));
  seg->reserved_from = reserved_from;
  heap_link(heap, seg);
  if (moved) { /* free units whose pages are committed: the first taken */
    seg->zero_units &= ~moved;
    schedule_purge(heap, hak_clock_ms());
  }
  units_find(seg, n, &at, &score);
  return units_take(heap, seg, at, n);
}

void hak_segment_purge(hak_heap_t *heap, bool force) {
  uint64_t now = hak_clock_ms(), next = 0;
  for (hak_segment_t *seg = heap->segments, *after; seg; seg = after) {
    after = seg->next;
    purge_free_slabs(seg, now, force, &next);
    /* An empty segment kept against thrash (the heap's last one) goes once
     * all of it has been idle for the delay. */
    if (seg->free_units == ALL_UNITS && seg->purged_units == ALL_UNITS) {
      heap_unlink(heap, seg);
      segment_unmap(seg);
    }
  }
  __atomic_store_n(&heap->next_purge_ms, next, __ATOMIC_RELAXED);
  hak_segment_cache_collect(force);
}

void hak_segment_abandon_all(hak_heap_t *heap) {
  while (heap->segments) {
    hak_segment_t *seg = heap->segments;
    heap_unlink(heap, seg);
    hak_slab_t *s;
    for (unsigned u = 0; (s = slab_from(seg, &u)) != NULL;) {
      atomic_store_explicit(&s->owner, 0, memory_order_relaxed);
      hak_slab_collect_remote(s);
      hak_slab_set_state(s, HAK_SLAB_ORPHAN);
      if (s->used == 0) slab_mark_free(heap, s);
    }
    if (seg->free_units == ALL_UNITS) {
      cache_put(seg);
      continue;
    }
    pthread_mutex_lock(&hak_segment_lock);
    abandoned_push(seg);
    pthread_mutex_unlock(&hak_segment_lock);
    hak_purge_wake();
  }
}

void hak_segment_usage(hak_segment_t *seg, hak_usage_t *u) {
  u->cached_bytes += committed_free_bytes(seg);
  hak_slab_t *s;
  for (unsigned i = 0; (s = slab_from(seg, &i)) != NULL;) {
    uint32_t used = __atomic_load_n(&s->used, __ATOMIC_RELAXED);
    if (used > s->reserved) used = s->reserved; /* attached (see slab->used) */
    u->blocks_used[s->cls] += used;
    u->blocks_free[s->cls] += s->capacity - used;
    u->used_bytes += (size_t)used * s->block_size;
    u->free_bytes += (size_t)(s->capacity - used) * s->block_size;
  }
}

void hak_segment_usage_abandoned(hak_usage_t *u) {
  pthread_mutex_lock(&hak_segment_lock);
  for (hak_segment_t *seg = abandoned; seg; seg = seg->next) hak_segment_usage(seg, u);
  for (hak_segment_t *seg = cache; seg; seg = seg->next)
    u->cached_bytes += committed_free_bytes(seg);
  pthread_mutex_unlock(&hak_segment_lock);
}

bool hak_segment_reclaim_one(hak_heap_t *heap, hak_segment_t *seg) {
  pthread_mutex_lock(&hak_segment_lock);
  bool mine = seg->abandoned; /* another thread may have taken it first */
  if (mine) abandoned_remove(seg);
  pthread_mutex_unlock(&hak_segment_lock);
  if (!mine) return false;
  pthread_mutex_lock(&heap->lock);
  bool kept = segment_adopt(heap, seg);
  pthread_mutex_unlock(&heap->lock);
  return kept;
}

void hak_segment_reclaim_abandoned(hak_heap_t *heap) {
  hak_segment_t *seg;
  while ((seg = pop_abandoned()) != NULL) segment_adopt(heap, seg);
}
