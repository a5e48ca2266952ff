/* Large blocks (> 256 KiB or alignment > 4 KiB): one segment-aligned
 * mapping each, header first, block one page (or one alignment) later.
 * Freed blocks wait in a small cache for reuse and are unmapped once they
 * have been idle for the purge delay. Resizing uses mremap. */
#define _GNU_SOURCE
#include "internal.h"

pthread_mutex_t hak_large_lock = PTHREAD_MUTEX_INITIALIZER;
static hak_segment_t *cache; /* most recently freed first */
static size_t cache_bytes;

static size_t page_up(size_t n) { return (n + HAK_PAGE_SIZE - 1) & ~(HAK_PAGE_SIZE - 1); }

/* At once, not by the purger as segments are: a big munmap on another
 * thread contends with this thread's page faults for the next block
 * (`large` ran 10% slower that way). */
static void large_unmap(hak_segment_t *seg) {
  hak_segmap_set(seg, false);
  hak_os_unmap(seg, seg->map_size);
}

static hak_segment_t *large_resize(hak_segment_t *seg, size_t new_map);

/* Reuses cached pages (no page faults for them): the smallest cached
 * mapping that fits, used as it is up to twice the size; or else the
 * largest smaller one, grown in place or moved. A mapping more than twice
 * the size stays cached for a big request: trimming it would throw away
 * pages. NULL when nothing suits. */
static hak_segment_t *cache_take(size_t map_size) {
  hak_segment_t *fit = NULL, *smaller = NULL, **fit_pp = NULL, **smaller_pp = NULL;
  pthread_mutex_lock(&hak_large_lock);
  for (hak_segment_t **pp = &cache; *pp; pp = &(*pp)->next) {
    size_t m = (*pp)->map_size;
    if (m >= map_size && m / 2 <= map_size && (!fit || m < fit->map_size)) {
      fit = *pp;
      fit_pp = pp;
    }
    if (m < map_size && (!smaller || m > smaller->map_size)) {
      smaller = *pp;
      smaller_pp = pp;
    }
  }
  hak_segment_t *seg = fit ? fit : smaller;
  if (seg) {
    *(fit ? fit_pp : smaller_pp) = seg->next;
    cache_bytes -= seg->map_size;
    HAK_STAT_SUB(large_cached, seg->map_size);
  }
  pthread_mutex_unlock(&hak_large_lock);
  if (seg == NULL || seg == fit) return seg;
  hak_segment_t *r = large_resize(seg, map_size);
  if (r == NULL) large_unmap(seg);
  return r;
}

static hak_segment_t *large_map(size_t map_size, size_t align, size_t offset) {
  uint8_t *seg;
  if (align <= HAK_SEG_SIZE) {
    seg = hak_os_map_aligned(map_size, HAK_SEG_SIZE);
    if (seg == NULL) return NULL;
  } else {
    /* The block is aligned to more than a segment: its header sits in the
     * chunk just before it, which is where (p - 1) rounds down to. */
    size_t total = map_size + align + HAK_SEG_SIZE;
    if (total < map_size) return NULL;
    uint8_t *raw = hak_os_map(total);
    if (raw == NULL) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + offset + align - 1) & ~(uintptr_t)(align - 1));
    seg = p - offset;
    hak_os_unmap(raw, (size_t)(seg - raw));
    hak_os_unmap(seg + map_size, (size_t)(raw + total - (seg + map_size)));
  }
  if (!hak_segmap_usable(seg)) {
    hak_os_unmap(seg, map_size);
    return NULL;
  }
  /* Only the fields and slabs[0] of the header are used here: the rest of
   * the struct would overlap the block (or the guard page). */
  hak_segment_t *s = (hak_segment_t *)seg;
  if (HAK_GUARD_PAGES) hak_os_guard(seg + offset - HAK_PAGE_SIZE, HAK_PAGE_SIZE);
  s->kind = HAK_KIND_LARGE;
  s->slab_shift = 63;
  s->slab_count = 1;
  s->map_size = map_size;
  s->large_offset = offset;
  s->fresh = 1; /* slabs[0].owner stays NULL: frees go slow */
  hak_segmap_set(s, true);
  return s;
}

void *hak_large_alloc(size_t size, size_t align, bool zero) {
  if (size > PTRDIFF_MAX - 2 * HAK_SEG_SIZE - align) {
    errno = ENOMEM;
    return NULL;
  }
  HAK_SLOW_BEGIN();
  hak_process_init();
  /* align is a power of two: past HAK_LARGE_OFFSET it is at least twice
   * that, so a guard page still fits below the block */
  size_t offset = align <= HAK_LARGE_OFFSET ? HAK_LARGE_OFFSET
                  : align <= HAK_SEG_SIZE   ? align
                                            : HAK_SEG_SIZE;
  size_t map_size = page_up(offset + size);
  hak_segment_t *seg = offset == HAK_LARGE_OFFSET ? cache_take(map_size) : NULL;
  if (seg == NULL) {
    seg = large_map(map_size, align, offset);
    if (seg == NULL) {
      errno = ENOMEM;
      return NULL;
    }
  }
  seg->large_size = seg->map_size - offset;
  hak_slab_set_state(&seg->slabs[0], HAK_SLAB_ACTIVE);
  HAK_STAT_ADD(large_live, 1);
  HAK_STAT_ADD(large_bytes, seg->large_size);
  void *p = (uint8_t *)seg + offset;
  if (zero && !seg->fresh) memset(p, 0, size);
  seg->fresh = 0;
  HAK_CSTAT_ALLOC(HAK_CLASSES, size);
  HAK_SLOW_END();
  return p;
}

bool hak_large_cache_collect(bool force) {
  uint64_t now = hak_clock_ms();
  hak_segment_t *expired = NULL;
  pthread_mutex_lock(&hak_large_lock);
  for (hak_segment_t **pp = &cache; *pp;) {
    hak_segment_t *s = *pp;
    if (force || now - s->cached_since_ms >= (uint64_t)hak_opt.purge_delay_ms ||
        cache_bytes > (size_t)hak_opt.large_cache_mb << 20) {
      *pp = s->next;
      cache_bytes -= s->map_size;
      HAK_STAT_SUB(large_cached, s->map_size);
      s->next = expired;
      expired = s;
    } else {
      pp = &s->next;
    }
  }
  bool pending = cache != NULL;
  pthread_mutex_unlock(&hak_large_lock);
  while (expired) {
    hak_segment_t *s = expired;
    expired = s->next;
    large_unmap(s);
  }
  return pending;
}

void hak_large_free(hak_segment_t *seg) {
  HAK_STAT_SUB(large_live, 1);
  HAK_STAT_SUB(large_bytes, seg->large_size);
  HAK_CSTAT_FREE(HAK_CLASSES);
  size_t limit = (size_t)hak_opt.large_cache_mb << 20;
  if (seg->large_offset != HAK_LARGE_OFFSET || hak_opt.purge_delay_ms == 0 ||
      seg->map_size > limit / 2) {
    large_unmap(seg);
    return;
  }
  seg->cached_since_ms = hak_clock_ms();
  hak_slab_set_state(&seg->slabs[0], HAK_SLAB_FREE); /* a second free is a double free */
  pthread_mutex_lock(&hak_large_lock);
  seg->next = cache;
  cache = seg;
  cache_bytes += seg->map_size;
  HAK_STAT_ADD(large_cached, seg->map_size);
  pthread_mutex_unlock(&hak_large_lock);
  hak_large_cache_collect(false); /* expire old ones, enforce the limit */
  hak_purge_wake();
  hak_purge_start();
}

/* Resizes a large block's mapping to new_map bytes without copying: the
 * tail is unmapped, or the mapping grows in place, or its pages move to a
 * new segment-aligned range. Returns the (maybe moved) segment, or NULL
 * with seg unchanged. */
static hak_segment_t *large_resize(hak_segment_t *seg, size_t new_map) {
  size_t old_map = seg->map_size;
  if (new_map <= old_map) {
    hak_os_unmap((uint8_t *)seg + new_map, old_map - new_map);
    seg->map_size = new_map;
    return seg;
  }
  if (hak_os_remap(seg, old_map, new_map, NULL) != NULL) {
    seg->map_size = new_map;
    return seg;
  }
  uint8_t *raw = hak_os_map(new_map + HAK_SEG_SIZE);
  if (raw == NULL) return NULL;
  uint8_t *dst = (uint8_t *)(((uintptr_t)raw + HAK_SEG_MASK) & ~(uintptr_t)HAK_SEG_MASK);
  hak_segment_t *moved = NULL;
  if (hak_segmap_usable(dst)) {
    hak_segmap_set(seg, false);
    moved = hak_os_remap(seg, old_map, new_map, dst);
    if (moved == NULL) hak_segmap_set(seg, true);
  }
  if (moved == NULL) {
    hak_os_unmap(raw, new_map + HAK_SEG_SIZE);
    return NULL;
  }
  /* the reserved range under dst was replaced by the moved pages */
  hak_stats_mapped(new_map, false);
  hak_os_unmap(raw, (size_t)(dst - raw));
  hak_os_unmap(dst + new_map, (size_t)(raw + new_map + HAK_SEG_SIZE - (dst + new_map)));
  moved->map_size = new_map;
  hak_segmap_set(moved, true);
  return moved;
}

void *hak_large_realloc(hak_segment_t *seg, void *p, size_t size) {
  size_t offset = seg->large_offset;
  if (size <= seg->large_size && size >= seg->large_size / 2) return p;
  /* Growing moves or extends the pages; shrinking copies into a smaller
   * (often cached) block, so this mapping's pages are cached, not lost. */
  if (offset == HAK_LARGE_OFFSET && size > seg->large_size &&
      size <= PTRDIFF_MAX - 2 * HAK_SEG_SIZE) {
    size_t old_size = seg->large_size;
    hak_segment_t *r = large_resize(seg, page_up(offset + size));
    if (r != NULL) {
      r->large_size = r->map_size - offset;
      HAK_STAT_ADD(large_bytes, r->large_size - old_size);
      return (uint8_t *)r + offset;
    }
  }
  void *q = hak_malloc_inline(size);
  if (q == NULL) return NULL;
  memcpy(q, p, size < seg->large_size ? size : seg->large_size);
  hak_free_inline(p);
  return q;
}
