/* Free: the generic path behind the inline fast path. It handles NULL,
 * large blocks, FULL slabs of this thread, frees from other threads, and
 * names invalid and double frees. */
#include "internal.h"

#include <unistd.h>

static HAK_COLD __attribute__((noreturn)) void report(const char *what, const void *p) {
  hak_fatal("hakmem: %s of %p", what, p);
}

HAK_COLD void hak_invalid_free(const void *p) { report("invalid free", p); }
HAK_COLD void hak_double_free(const void *p) { report("double free", p); }
#if HAK_SECURE
HAK_COLD void hak_overflow(const void *p) { report("heap overflow detected in block", p); }
#endif

/* Aborts unless p is the start of a block of the slab. A block boundary of
 * a slab that is free again was handed out and freed already. Other threads
 * call this too: it reads only what the owner does not change while the
 * slab is in use (block size and capacity are set before any block of the
 * slab is handed out), the state atomically, and the list its owner frees
 * to only when the slab is the caller's own. */
void hak_check_block(hak_segment_t *seg, hak_slab_t *slab, const void *p) {
  uintptr_t off = (uintptr_t)p - (uintptr_t)seg;
  bool boundary = hak_slab_is_block(slab, off);
  if (HAK_UNLIKELY(hak_slab_state(slab) == HAK_SLAB_FREE))
    report(boundary ? "double free" : "invalid free", p);
  if (HAK_UNLIKELY(!boundary ||
                   off - slab->start_off >= (size_t)slab->capacity * slab->block_size))
    report("invalid free", p);
  if (atomic_load_explicit(&seg->heap, memory_order_relaxed) == hak_tls_heap &&
      HAK_UNLIKELY(*slab->free_to == p))
    report("double free", p);
}

static void free_remote(hak_segment_t *seg, hak_slab_t *slab, hak_block_t *b) {
  hak_block_t *head = atomic_load_explicit(&slab->remote, memory_order_relaxed);
  do {
    hak_set_next(b, head);
  } while (!atomic_compare_exchange_weak_explicit(&slab->remote, &head, b, memory_order_release,
                                                  memory_order_relaxed));
  HAK_XSTAT_ADD(remote_frees, 1);
  /* A FULL slab is off its owner's queues: tell the owner to look. */
  if (hak_slab_state(slab) == HAK_SLAB_FULL) {
    hak_heap_t *owner = atomic_load_explicit(&seg->heap, memory_order_relaxed);
    if (owner) atomic_store(&owner->full_remote, 1);
  }
}

void hak_check_large(hak_segment_t *seg, const void *p) {
  if (HAK_UNLIKELY((const uint8_t *)p != (uint8_t *)seg + seg->large_offset)) hak_invalid_free(p);
  /* freed, its chunks not reused or purged since */
  if (HAK_UNLIKELY(hak_slab_state(&seg->slabs[0]) == HAK_SLAB_FREE)) hak_double_free(p);
}

HAK_NOINLINE void hak_free_generic(void *p) {
  if (p == NULL) return;
  hak_segment_t *seg = hak_segment_of(p);
  if (HAK_UNLIKELY(seg == NULL)) hak_invalid_free(p);
  if (seg->kind == HAK_KIND_LARGE) {
    hak_check_large(seg, p);
    hak_large_free(seg);
    return;
  }
  hak_slab_t *slab = hak_slab_of(seg, p);
  hak_check_block(seg, slab, p);
  hak_heap_t *heap = hak_tls_heap;
  hak_heap_t *owner = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  /* The segment of an exited thread: take it over, so this free and the
   * next ones are local and its emptied slabs go back at once; the free
   * then starts over (and is checked and counted there, once). A thread
   * without a heap leaves the segment to the purger. */
  if (owner == NULL && heap != &hak_heap_empty && hak_segment_reclaim_one(heap, seg)) {
    hak_free_inline(p);
    return;
  }
  hak_block_check_free(p, slab->block_size);
  HAK_CSTAT_FREE(slab->cls);
  if (owner != heap) {
    free_remote(seg, slab, (hak_block_t *)p);
    if (owner == NULL) {
      hak_purge_wake();
      hak_purge_start();
    }
    return;
  }
  /* Our own slab, not ACTIVE (the fast path took ACTIVE ones): FULL. */
  HAK_ASSERT(slab->state == HAK_SLAB_FULL);
  hak_block_t *b = (hak_block_t *)p;
  hak_set_next(b, slab->local_free);
  slab->local_free = b;
  slab->used--;
  hak_slab_unfull(heap, slab);
  if (slab->used == 0) hak_slab_emptied(heap, slab);
}
