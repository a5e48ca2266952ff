/* Segments: 4 MiB aligned regions split into slabs of one kind.
 * A segment belongs to one heap, is abandoned when its thread exits (and
 * adopted by the next heap that needs a slab of its kind), and goes to a
 * small global cache when all its slabs are free. The global lock guards
 * only the abandoned lists and the cache: memory coming from or going back
 * to the OS. */
#include "internal.h"

_Atomic uint8_t hak_segmap[HAK_SEGMAP_SIZE];
pthread_mutex_t hak_segment_lock = PTHREAD_MUTEX_INITIALIZER;

/* Segments of exited threads, per kind, doubly linked through next/prev so
 * that a thread freeing into one can take it out (reclaim on free). All
 * under hak_segment_lock. */
static hak_segment_t *abandoned[HAK_KIND_COUNT];
static hak_segment_t *cache;
static size_t cache_count;

static const uint8_t kind_shift[HAK_KIND_COUNT] = {
    HAK_SMALL_SLAB_SHIFT, HAK_MID_SLAB_SHIFT, HAK_BIG_SLAB_SHIFT};

_Static_assert(sizeof(hak_segment_t) <= HAK_SEG_HEADER - HAK_GUARD_PAGES * HAK_PAGE_SIZE,
               "segment header too big");
_Static_assert(sizeof(hak_slab_t) == 128, "slab descriptor is two cache lines");

void hak_segmap_set(hak_segment_t *seg, bool on) {
  uintptr_t chunk = (uintptr_t)seg >> HAK_SEG_SHIFT;
  atomic_store_explicit(&hak_segmap[chunk & (HAK_SEGMAP_SIZE - 1)], on, memory_order_release);
}

/* ---- segment lists: a heap's own, per kind, and the abandoned ones ---- */

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

static void heap_link(hak_heap_t *heap, hak_segment_t *seg) {
  list_push(&heap->segments[seg->kind], seg);
  atomic_store_explicit(&seg->heap, heap, memory_order_release);
}

static void heap_unlink(hak_heap_t *heap, hak_segment_t *seg) {
  list_remove(&heap->segments[seg->kind], seg);
  atomic_store_explicit(&seg->heap, NULL, memory_order_release);
}

static void abandoned_push(hak_segment_t *seg) {
  list_push(&abandoned[seg->kind], seg);
  seg->abandoned = 1;
}

static void abandoned_remove(hak_segment_t *seg) {
  list_remove(&abandoned[seg->kind], seg);
  seg->abandoned = 0;
}

/* ---- the cache of free segments ---- */

static void segment_unmap(hak_segment_t *seg) {
  hak_segmap_set(seg, false);
  for (unsigned i = 0; i < seg->slab_count; i++) /* unmap counts them again */
    if (seg->slabs[i].purged) HAK_STAT_ADD(committed, hak_slab_bytes(seg, &seg->slabs[i]));
  HAK_STAT_SUB(segments, 1);
  if (!hak_purge_unmap_later(seg, HAK_SEG_SIZE)) hak_os_unmap(seg, HAK_SEG_SIZE);
}

static void purge_free_slabs(hak_segment_t *seg, uint64_t now, bool force, uint64_t *next);

static void cache_put(hak_segment_t *seg) {
  bool unmap_now = false;
  pthread_mutex_lock(&hak_segment_lock);
  if (cache_count >= (size_t)hak_opt.segment_cache) {
    unmap_now = true;
  } else {
    seg->cached_since_ms = hak_clock_ms();
    seg->next = cache;
    cache = seg;
    cache_count++;
  }
  pthread_mutex_unlock(&hak_segment_lock);
  if (unmap_now) segment_unmap(seg);
  else if (hak_opt.purge_delay_ms == 0) { /* every slab of a cached segment is free */
    uint64_t none = 0;
    purge_free_slabs(seg, 0, true, &none);
  }
  else hak_purge_wake();
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
  uintptr_t start = (uintptr_t)hak_slab_start(seg, s) + (uintptr_t)s->reserved * s->block_size;
  uintptr_t end = (uintptr_t)hak_slab_start(seg, s) + hak_slab_bytes(seg, s);
  start = (start + HAK_PAGE_SIZE - 1) & ~(uintptr_t)(HAK_PAGE_SIZE - 1);
  if (start < end) hak_os_purge((void *)start, end - start);
  s->zero = 1;
  __atomic_store_n(&s->dirty_tail, 0, __ATOMIC_RELEASE); /* after zero, for slab_extend */
}

/* Purges the segment's FREE slabs, and the dirty tails of its other slabs,
 * whose delay has passed (all if force); lowers *next to the earliest
 * deadline still pending (0: none). */
static void purge_free_slabs(hak_segment_t *seg, uint64_t now, bool force, uint64_t *next) {
  for (unsigned i = 0; i < seg->slab_count; i++) {
    hak_slab_t *s = &seg->slabs[i];
    if (s->state != HAK_SLAB_FREE) {
      if (s->dirty_tail && purge_due(s->dirty_since_ms, now, force, next)) purge_tail(seg, s);
      continue;
    }
    if (s->purged || !purge_due(s->free_since_ms, now, force, next)) continue;
    hak_os_purge(hak_slab_start(seg, s), hak_slab_bytes(seg, s));
    s->purged = 1;
    s->zero = 1;
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
  for (unsigned k = 0; k < HAK_KIND_COUNT; k++) {
    hak_segment_t *seg = abandoned[k];
    while (seg) {
      hak_segment_t *after = seg->next;
      for (unsigned i = 0; i < seg->slab_count; i++) {
        hak_slab_t *s = &seg->slabs[i];
        if (hak_slab_state(s) != HAK_SLAB_ORPHAN) continue;
        hak_slab_collect_remote(s);
        if (s->used == 0) slab_mark_free(NULL, s);
      }
      if (seg->used_slabs == 0) {
        abandoned_remove(seg);
        seg->next = release;
        release = seg;
      } else {
        purge_free_slabs(seg, now, force, &next);
      }
      seg = after;
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

static bool segment_all_purged(const hak_segment_t *seg) {
  for (unsigned i = 0; i < seg->slab_count; i++)
    if (!seg->slabs[i].purged) return false;
  return true;
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

/* Marks a slab FREE and schedules its purge; the segment stays. */
/* heap is NULL for a slab of an abandoned segment: the purger, which frees
 * those, also purges them. */
static void slab_mark_free(hak_heap_t *heap, hak_slab_t *slab) {
  hak_segment_t *seg = hak_segment_of_slab(slab);
  HAK_ASSERT(slab->state != HAK_SLAB_FREE && slab->used == 0);
  HAK_ASSERT(slab->free_to == &slab->local_free);
  atomic_store_explicit(&slab->owner, 0, memory_order_relaxed);
  hak_slab_set_state(slab, HAK_SLAB_FREE);
  slab->zero = 0; /* its blocks were used */
  slab->local_free = NULL;
  slab->reserved = 0;
  __atomic_store_n(&slab->dirty_tail, 0, __ATOMIC_RELAXED); /* all of it is purged */
  slab->free_since_ms = hak_clock_ms();
  seg->used_slabs--;
  if (hak_opt.purge_delay_ms == 0) {
    hak_os_purge(hak_slab_start(seg, slab), hak_slab_bytes(seg, slab));
    slab->purged = 1;
    slab->zero = 1;
  } else {
    schedule_purge(heap, slab->free_since_ms);
  }
}

/* An empty segment goes to the cache unless it is the heap's only one of
 * its kind (kept to avoid map/unmap thrash at a size boundary). True if it
 * went. */
static bool segment_release_if_empty(hak_heap_t *heap, hak_segment_t *seg) {
  if (seg->used_slabs != 0 || (!seg->prev && !seg->next)) return false;
  heap_unlink(heap, seg);
  cache_put(seg);
  return true;
}

void hak_segment_free_slab(hak_heap_t *heap, hak_slab_t *slab) {
  slab_mark_free(heap, slab);
  segment_release_if_empty(heap, hak_segment_of_slab(slab));
}

/* ---- acquiring segments and slabs ---- */

static void segment_init(hak_segment_t *seg, unsigned kind, bool fresh) {
  bool purged[HAK_MAX_SLABS];
  unsigned old_count = fresh ? 0 : seg->slab_count;
  for (unsigned i = 0; i < HAK_MAX_SLABS; i++) purged[i] = false;
  /* A reused segment keeps track of which parts are still committed, per
   * old slab; a part is purged only if it was purged under the old layout. */
  if (!fresh) {
    unsigned shift = seg->slab_shift;
    for (unsigned i = 0; i < HAK_MAX_SLABS; i++) {
      unsigned old = (unsigned)(((size_t)i << HAK_SMALL_SLAB_SHIFT) >> shift);
      purged[i] = old < old_count ? seg->slabs[old].purged : true;
    }
  }
  memset(seg, 0, sizeof *seg);
  seg->kind = (uint8_t)kind;
  seg->slab_shift = kind_shift[kind];
  seg->slab_count = (uint8_t)(HAK_SEG_SIZE >> seg->slab_shift);
  seg->map_size = HAK_SEG_SIZE;
  unsigned per = HAK_MAX_SLABS / seg->slab_count; /* 64 KiB units per slab */
  for (unsigned u = 0; u < HAK_MAX_SLABS; u++) seg->unit_slab[u] = &seg->slabs[u / per];
  for (unsigned i = 0; i < seg->slab_count; i++) {
    hak_slab_t *s = &seg->slabs[i];
    s->index = (uint8_t)i;
    s->state = HAK_SLAB_FREE;
    /* committed if any of its 64 KiB parts is: a purge covers it all */
    bool all_purged = true;
    for (unsigned j = 0; j < per; j++) all_purged &= purged[i * per + j];
    s->purged = all_purged;
    s->zero = fresh || all_purged;
  }
}

static hak_segment_t *segment_new(void) {
  hak_segment_t *seg = hak_os_map_aligned(HAK_SEG_SIZE, HAK_SEG_SIZE);
  if (seg == NULL) return NULL;
  if (!hak_segmap_usable(seg)) {
    hak_os_unmap(seg, HAK_SEG_SIZE);
    errno = ENOMEM;
    return NULL;
  }
  HAK_STAT_ADD(segments, 1);
  if (HAK_GUARD_PAGES)
    hak_os_guard((uint8_t *)seg + HAK_SEG_HEADER - HAK_PAGE_SIZE, HAK_PAGE_SIZE, true);
  hak_segmap_set(seg, true);
  return seg;
}

/* Takes a FREE slab of seg, preferring one whose memory is still
 * committed: reusing it costs no page faults and no new RSS. */
static hak_slab_t *segment_take_slab(hak_heap_t *heap, hak_segment_t *seg) {
  hak_slab_t *s = NULL;
  for (unsigned i = 0; i < seg->slab_count; i++) {
    hak_slab_t *c = &seg->slabs[i];
    if (c->state != HAK_SLAB_FREE) continue;
    if (s == NULL || !c->zero) s = c;
    if (!c->zero) break;
  }
  if (s != NULL) {
    if (s->purged) {
      HAK_STAT_ADD(committed, hak_slab_bytes(seg, s));
      s->purged = 0;
    }
    if (!s->zero && hak_opt.purge_delay_ms != 0) {
      s->dirty_since_ms = hak_clock_ms();
      __atomic_store_n(&s->dirty_tail, 1, __ATOMIC_RELAXED);
      schedule_purge(heap, s->dirty_since_ms);
    }
    seg->used_slabs++;
    HAK_STAT_ADD(slabs_allocated, 1);
  }
  return s;
}

/* Takes an abandoned segment; false if it was empty and went away. */
static bool segment_adopt(hak_heap_t *heap, hak_segment_t *seg) {
  heap_link(heap, seg);
  for (unsigned i = 0; i < seg->slab_count; i++) {
    hak_slab_t *s = &seg->slabs[i];
    if (s->state == HAK_SLAB_ORPHAN && !hak_slab_adopt(heap, s)) slab_mark_free(heap, s);
  }
  return !segment_release_if_empty(heap, seg);
}

static hak_segment_t *pop_abandoned(unsigned kind) {
  pthread_mutex_lock(&hak_segment_lock);
  hak_segment_t *seg = abandoned[kind];
  if (seg) abandoned_remove(seg);
  pthread_mutex_unlock(&hak_segment_lock);
  return seg;
}

hak_slab_t *hak_segment_alloc_slab(hak_heap_t *heap, unsigned kind, bool *adopted) {
  *adopted = false;
  for (hak_segment_t *seg = heap->segments[kind]; seg; seg = seg->next) {
    if (seg->used_slabs < seg->slab_count) return segment_take_slab(heap, seg);
  }
  hak_segment_t *seg = pop_abandoned(kind);
  if (seg) {
    *adopted = true;
    bool ours = segment_adopt(heap, seg);
    return ours && seg->used_slabs < seg->slab_count ? segment_take_slab(heap, seg) : NULL;
  }
  pthread_mutex_lock(&hak_segment_lock);
  seg = cache;
  if (seg) {
    cache = seg->next;
    cache_count--;
  }
  pthread_mutex_unlock(&hak_segment_lock);
  bool fresh = seg == NULL;
  if (fresh) seg = segment_new();
  if (seg == NULL) return NULL;
  segment_init(seg, kind, fresh);
  heap_link(heap, seg);
  return segment_take_slab(heap, seg);
}

void hak_segment_purge(hak_heap_t *heap, bool force) {
  uint64_t now = hak_clock_ms(), next = 0;
  for (unsigned k = 0; k < HAK_KIND_COUNT; k++) {
    for (hak_segment_t *seg = heap->segments[k], *after; seg; seg = after) {
      after = seg->next;
      purge_free_slabs(seg, now, force, &next);
      /* An empty segment kept against thrash (the heap's last of its kind)
       * goes once all of it has been idle for the delay. */
      if (seg->used_slabs == 0 && segment_all_purged(seg)) {
        heap_unlink(heap, seg);
        segment_unmap(seg);
      }
    }
  }
  __atomic_store_n(&heap->next_purge_ms, next, __ATOMIC_RELAXED);
  hak_segment_cache_collect(force);
}

void hak_segment_abandon_all(hak_heap_t *heap) {
  for (unsigned k = 0; k < HAK_KIND_COUNT; k++) {
    while (heap->segments[k]) {
      hak_segment_t *seg = heap->segments[k];
      heap_unlink(heap, seg);
      for (unsigned i = 0; i < seg->slab_count; i++) {
        hak_slab_t *s = &seg->slabs[i];
        if (s->state == HAK_SLAB_FREE) continue;
        atomic_store_explicit(&s->owner, 0, memory_order_relaxed);
        hak_slab_collect_remote(s);
        hak_slab_set_state(s, HAK_SLAB_ORPHAN);
        if (s->used == 0) slab_mark_free(heap, s);
      }
      if (seg->used_slabs == 0) {
        cache_put(seg);
        continue;
      }
      pthread_mutex_lock(&hak_segment_lock);
      abandoned_push(seg);
      pthread_mutex_unlock(&hak_segment_lock);
      hak_purge_wake();
    }
  }
}

void hak_segment_usage(hak_segment_t *seg, hak_usage_t *u) {
  u->segments++;
  for (unsigned i = 0; i < seg->slab_count; i++) {
    hak_slab_t *s = &seg->slabs[i];
    size_t bytes = hak_slab_bytes(seg, s);
    if (hak_slab_state(s) == HAK_SLAB_FREE) {
      u->slabs_free++;
      if (!s->purged) u->cached_bytes += bytes;
      continue;
    }
    uint32_t used = __atomic_load_n(&s->used, __ATOMIC_RELAXED);
    if (used > s->reserved) used = s->reserved; /* attached (see slab->used) */
    u->slabs_used++;
    u->blocks_used[s->cls] += used;
    u->blocks_free[s->cls] += s->capacity - used;
    u->used_bytes += (size_t)used * s->block_size;
    u->free_bytes += (size_t)(s->capacity - used) * s->block_size;
  }
}

void hak_segment_usage_abandoned(hak_usage_t *u) {
  pthread_mutex_lock(&hak_segment_lock);
  for (unsigned k = 0; k < HAK_KIND_COUNT; k++)
    for (hak_segment_t *seg = abandoned[k]; seg; seg = seg->next) hak_segment_usage(seg, u);
  for (hak_segment_t *seg = cache; seg; seg = seg->next) {
    u->segments++;
    for (unsigned i = 0; i < seg->slab_count; i++)
      if (!seg->slabs[i].purged) u->cached_bytes += hak_slab_bytes(seg, &seg->slabs[i]);
  }
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
  for (unsigned k = 0; k < HAK_KIND_COUNT; k++) {
    hak_segment_t *seg;
    while ((seg = pop_abandoned(k)) != NULL) segment_adopt(heap, seg);
  }
}
