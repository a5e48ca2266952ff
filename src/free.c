/* Free: the generic path behind the inline fast paths (free's own and the
 * span tier's). It handles NULL, large blocks, FULL slabs of this thread,
 * frees from other threads, and names invalid and double frees. */
#include "internal.h"

#include <unistd.h>

static HAK_COLD __attribute__((noreturn)) void report(const char *what, const void *p) {
  hak_fatal("hakmem: %s of %p", what, p);
}

HAK_COLD void hak_invalid_free(const void *p) {
  report(hak_large_freed_start(p) ? "double free" : "invalid free", p);
}
HAK_COLD void hak_double_free(const void *p) { report("double free", p); }
#if HAK_SECURE
HAK_COLD void hak_overflow(const void *p) { report("heap overflow detected in block", p); }
#endif

/* A block boundary of a slab that is free again was handed out and freed
 * already. */
static HAK_COLD __attribute__((noreturn)) void bad_block(const hak_slab_t *slab, const void *p) {
  bool boundary = hak_slab_is_block(slab, p);
  report(boundary && hak_slab_state(slab) == HAK_SLAB_FREE ? "double free" : "invalid free", p);
}

/* Aborts unless p is a block start of a slab in use. */
HAK_INLINE void check_block_shared(const hak_slab_t *slab, const void *p) {
  if (HAK_UNLIKELY(!hak_slab_has_block(slab, p)))
    bad_block(slab, p);
}

/* Aborts unless p is the start of a live block of the slab. Other threads
 * call this too: the list its owner frees to is read only when the slab is
 * the caller's own. */
void hak_check_block(hak_segment_t *seg, hak_slab_t *slab, const void *p) {
  check_block_shared(slab, p);
  if (atomic_load_explicit(&seg->heap, memory_order_relaxed) == hak_tls_heap &&
      HAK_UNLIKELY(*hak_slab_free_to(slab) == p))
    report("double free", p);
}

/* Hands first .. last, blocks of slab linked in that order, to its remote
 * list. A segment with no owner is the purger's to see to; start: whether
 * the purger may be started here (no lock held, not in a fork handler).
 * The slab and its segment are read before: once the blocks are on the
 * list, the owner may take them, free the slab and unmap the segment
 * while this thread waits to run (a heap, pooled, stays mapped). */
static void hand_over(hak_slab_t *slab, hak_block_t *first, hak_block_t *last, bool start) {
  hak_heap_t *owner = atomic_load_explicit(&hak_segment_of_slab(slab)->heap, memory_order_relaxed);
  bool full = hak_slab_state(slab) == HAK_SLAB_FULL;
  hak_block_t *head = atomic_load_explicit(&slab->remote, memory_order_relaxed);
  do {
    hak_set_next(last, head);
  } while (!atomic_compare_exchange_weak_explicit(&slab->remote, &head, first,
                                                  memory_order_release, memory_order_relaxed));
  if (owner == NULL) {
    hak_purge_wake();
    if (start) hak_purge_start();
  } else if (full && atomic_exchange(&owner->full_remote, 1) == 0) {
    /* A FULL slab is off its owner's queues: tell the owner to look. */
    hak_purge_wake(); /* the owner may be idle: hak_slab_release_idle_full */
  }
}

static void free_remote_now(hak_slab_t *slab, hak_block_t *b) {
  HAK_XSTAT_ADD(remote_frees, 1);
  hand_over(slab, b, b, true);
}

static void outbox_flush(hak_outbox_t *o, bool start) {
  hak_slab_t *slab = o->slab;
  o->slab = NULL;
  hand_over(slab, o->first, o->last, start);
}

void hak_free_flush_outboxes(hak_heap_t *heap) {
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++)
    if (heap->outbox[c].slab) outbox_flush(&heap->outbox[c], false);
}

/* Frees a slab block of another live thread's slab: it waits in the
 * heap's outbox for its class while the next frees go to the same slab, and
 * they go over together, in one atomic push, once they fill the outbox
 * (hak_outbox_bytes), or when the next one is for another slab. One push per
 * block made two threads that pass blocks to each other fight over the
 * slab's remote list. Always inlined, as free_others is into both its
 * callers: called, with more registers saved in the generic path, it ran
 * xmalloc 1p1c at 0.81-0.88x. */
HAK_INLINE void free_remote_batched(hak_heap_t *heap, hak_slab_t *slab, hak_block_t *b) {
  hak_outbox_t *o = &heap->outbox[slab->cls];
  HAK_XSTAT_ADD(remote_frees, 1);
  if (HAK_LIKELY(slab == o->slab)) {
    if (HAK_UNLIKELY(b == o->first)) hak_double_free(b);
    hak_set_next(b, o->first);
    o->first = b;
    if (HAK_LIKELY(o->bytes_left > slab->block_size)) {
      o->bytes_left -= slab->block_size;
      return;
    }
    outbox_flush(o, true);
    return;
  }
  /* A thread that only frees gets a heap for its outboxes, unless it is
   * past its exit handler. */
  if (HAK_UNLIKELY(heap == HAK_HEAP_EMPTY) && (heap = hak_heap_for_free()) == NULL) {
    free_remote_now(slab, b);
    return;
  }
  /* The outbox takes the block before the old one goes over: handing over
   * may start the purger, and creating its thread may free a block of this
   * class (glibc frees the DTV of a cached stack it drops), which would then
   * land in the outbox. */
  o = &heap->outbox[slab->cls];
  hak_outbox_t old = *o;
  o->slab = slab;
  o->first = o->last = b;
  o->bytes_left = hak_outbox_bytes(slab->cls) - slab->block_size;
  if (old.slab) outbox_flush(&old, true);
}

void hak_check_large(hak_segment_t *seg, const void *p) {
  if (HAK_UNLIKELY((const uint8_t *)p != (uint8_t *)seg + seg->large_offset)) hak_invalid_free(p);
  /* freed, its chunks not reused or purged since */
  if (HAK_UNLIKELY(hak_slab_state(&seg->slabs[0]) == HAK_SLAB_FREE)) hak_double_free(p);
}

/* The rare frees: a large block, a block of an exited thread's segment, or
 * of this thread's FULL slab. */
HAK_NOINLINE static void free_slow(hak_segment_t *seg, void *p) {
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
  if (owner == NULL && heap != HAK_HEAP_EMPTY && hak_segment_reclaim_one(heap, seg)) {
    hak_free_inline(p);
    return;
  }
  hak_block_check_free(p, slab->block_size);
  HAK_CSTAT_FREE(slab->cls);
  if (owner != heap) {
    free_remote_now(slab, (hak_block_t *)p);
    return;
  }
  /* Our own slab, not ACTIVE (the fast path took ACTIVE ones): FULL. */
  HAK_ASSERT(slab->state == HAK_SLAB_FULL);
  pthread_mutex_lock(&heap->lock); /* FULL slabs are the purger's too */
  hak_slab_take_back(heap, slab, (hak_block_t *)p);
  pthread_mutex_unlock(&heap->lock);
  if (slab->used == 0) hak_slab_emptied(heap, slab);
}

/* A block of a parked heap's slab, freed by heap's thread: as its owner
 * would, under its lock, or as a remote free if a thread took the heap
 * meanwhile. A young heap's thread may take the parked heap instead and
 * free the block as its owner (heap.c, hak_heap_switch_to_parked): before
 * the block's checks, which mark it freed. */
HAK_NOINLINE static void free_parked(hak_segment_t *seg, hak_heap_t *owner, hak_heap_t *heap,
                                     hak_slab_t *slab, void *p) {
  if (heap != HAK_HEAP_EMPTY && hak_heap_switch_to_parked(heap, owner, slab->block_size)) {
    hak_free_inline(p);
    return;
  }
  hak_block_check_free(p, slab->block_size);
  HAK_CSTAT_FREE(slab->cls);
  if (!hak_heap_free_parked(owner, seg, slab, (hak_block_t *)p))
    free_remote_batched(heap, slab, (hak_block_t *)p);
}

/* A block of another thread's slab (live, or parked), freed by heap's. */
HAK_INLINE void free_others(hak_segment_t *seg, hak_heap_t *owner, hak_heap_t *heap, void *p) {
  hak_slab_t *slab = hak_slab_of(seg, p);
  check_block_shared(slab, p);
  if (HAK_UNLIKELY(__atomic_load_n(&owner->parked, __ATOMIC_RELAXED))) {
    free_parked(seg, owner, heap, slab, p);
    return;
  }
  hak_block_check_free(p, slab->block_size);
  HAK_CSTAT_FREE(slab->cls);
  free_remote_batched(heap, slab, (hak_block_t *)p);
}

/* A thread without a heap frees another thread's block. It takes that
 * heap if it is parked or parks soon (heap.c: hak_heap_for_heir), whose
 * blocks it was likely handed (a worker that follows another), and frees
 * the block as the owner. A path of its own, reached by a jump, so that
 * the generic path saves no more registers for it. */
HAK_NOINLINE static void free_heapless(hak_segment_t *seg, hak_heap_t *owner, void *p) {
  hak_heap_t *heap = hak_heap_for_heir(owner);
  if (heap == owner)
    hak_free_inline(p);
  else
    free_others(seg, owner, heap != NULL ? heap : HAK_HEAP_EMPTY, p);
}

/* The common case first, in few registers: a block of another live
 * thread's slab. */
HAK_NOINLINE void hak_free_generic(void *p) {
  if (p == NULL) return; /* first, before the registers are saved */
  hak_segment_t *seg = hak_segment_of(p);
  if (HAK_UNLIKELY(seg == NULL)) hak_invalid_free(p);
  hak_heap_t *owner = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  hak_heap_t *heap = hak_tls_heap;
  if (HAK_LIKELY(seg->kind != HAK_KIND_LARGE && owner != NULL && owner != heap)) {
    if (HAK_UNLIKELY(heap == HAK_HEAP_EMPTY))
      free_heapless(seg, owner, p);
    else
      free_others(seg, owner, heap, p);
    return;
  }
  free_slow(seg, p);
}
