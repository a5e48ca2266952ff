/* Allocation: the generic path behind the inline fast path, and the
 * aligned, zeroing and resizing variants. */
#include "internal.h"

/* A block of cls from the heap, refilling its list if empty (a new
 * thread's sentinel heap is replaced there); NULL with ENOMEM when out of
 * memory. */
static void *alloc_class(hak_heap_t *heap, size_t cls, size_t size) {
  if (hak_class_is_span(cls)) return hak_span_malloc_slow(size, heap, hak_span_at_page(cls));
  void *b = hak_heap_pop(heap, cls);
  if (HAK_UNLIKELY(b == NULL)) return hak_heap_refill(size, heap, cls);
  HAK_CSTAT_ALLOC(cls, size);
  return b;
}

/* A class whose blocks are all `align`-aligned: block sizes that are a
 * multiple of align, in slabs whose start is 4 KiB aligned. The size
 * rounded up to align (align for 0) has such a class: classes step by 16
 * below 128 B, and above by an eighth or a quarter of a power of two, so
 * each is a multiple of any align up to its step, and every multiple of a
 * larger align is a class itself. */
static void *alloc_aligned_slab(size_t align, size_t size) {
  size_t need = size + HAK_CANARY == 0 ? align : hak_aligned_need(size, align);
  if (need > HAK_BIG_MAX) return hak_large_alloc(size, align, false);
  size_t cls = hak_size_class(need);
  HAK_ASSERT(hak_class_size[cls] % align == 0);
  void *b = alloc_class(hak_tls_heap, cls, size);
  HAK_ASSERT(((uintptr_t)b & (align - 1)) == 0);
  return b;
}

void *hak_alloc_aligned(size_t align, size_t size) {
  HAK_ASSERT(hak_valid_alignment(align));
  if (align <= 16) return hak_malloc_inline(size);
  if (align <= HAK_SLAB_ALIGN_MAX && size <= HAK_BIG_MAX) return alloc_aligned_slab(align, size);
  if (align <= HAK_BIG_MAX && size <= HAK_BIG_MAX - HAK_CANARY) return hak_span_alloc_aligned(size, align);
  return hak_large_alloc(size, align, false);
}

HAK_NOINLINE int hak_posix_memalign_generic(void **out, size_t align, size_t size) {
  void *p = hak_alloc_aligned(align, size);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

void *hak_alloc_zero(size_t count, size_t size) {
  size_t total;
  if (HAK_UNLIKELY(__builtin_mul_overflow(count, size, &total))) {
    errno = ENOMEM;
    return NULL;
  }
  if (total > HAK_BIG_MAX - HAK_CANARY) return hak_large_alloc(total, 0, true);
  hak_heap_t *heap = hak_tls_heap;
  size_t number = hak_size_number(total + HAK_CANARY);
  /* Only a span refill may hand out zero memory (heap->clean); a list may
   * hold blocks freed since. */
  bool clean = false;
  void *p = hak_heap_pop(heap, number);
  if (p != NULL) {
    HAK_CSTAT_ALLOC(number, total);
  } else {
    if ((p = hak_refill_class(total, heap, number)) == NULL) return NULL;
    clean = hak_tls_heap->clean[number];
  }
  /* A never-used block of fresh memory holds only its list words. */
  memset(p, 0, clean && total > HAK_SPAN_LINK_BYTES ? HAK_SPAN_LINK_BYTES : total);
  return p;
}

/* Usable size of a block in a slab segment; aborts if p is not one. Its
 * callers tried the cheap tests already (malloc_usable_size's and
 * realloc's inline paths): this one names the fault. */
static size_t slab_block_size(hak_segment_t *seg, const void *p) {
  hak_slab_t *slab = hak_slab_of(seg, p);
  hak_check_block(seg, slab, p);
  return slab->block_size - HAK_CANARY;
}

/* A block grown by a quarter or less (a string appended to) grows again:
 * a large one is committed whole at once (large.c), and a slab block moves
 * to a class at least a quarter bigger, or to the first span class if that
 * is less (the slab classes are an eighth apart, and a buffer grown in
 * small steps was copied at each: 16 buffers grown by 100 B to 8,000 B
 * copied twice mimalloc's bytes, at 0.85x its speed; from 6 KiB it went
 * through 6.5 and 7 KiB). The span classes step by a quarter of a power
 * of two already. A block grown past GROWN_LARGE_MIN becomes a large one,
 * which grows again in place where span blocks from 320 KiB to 1 MiB would
 * be copied from class to class. A grown span block starts at its page,
 * where the whole class is its room, not the class less its colour (at
 * colours, realloc_chain's strings moved twice a class). */
#define GROWN_LARGE_MIN ((size_t)256 * 1024)
void *hak_realloc_block(size_t size, size_t old) {
  if (size <= old) return hak_malloc_inline(size);
  if (size > GROWN_LARGE_MIN - HAK_CANARY) return hak_large_alloc_grown(size, size - old <= old / 4);
  size_t more = old + old / 4;
  if (more > HAK_SLAB_MAX - HAK_CANARY) more = HAK_SLAB_MAX - HAK_CANARY + 1;
  size_t n = size - old <= old / 4 && more > size ? more : size;
  size_t cls = hak_size_class(n + HAK_CANARY);
  return hak_class_is_span(cls) ? hak_span_malloc_slow(n, hak_tls_heap, hak_span_at_page(cls)) : hak_malloc_inline(n);
}

HAK_NOINLINE void *hak_realloc_move(void *p, size_t size, size_t old) {
  void *q = hak_realloc_block(size, old);
  if (q == NULL) return NULL;
  memcpy(q, p, size < old ? size : old);
  hak_free_inline(p);
  return q;
}

HAK_NOINLINE static void *realloc_generic(void *p, size_t size) {
  if (p == NULL) return hak_malloc_inline(size);
  if (size == 0) { /* glibc: frees and returns NULL */
    hak_free_inline(p);
    return NULL;
  }
  hak_segment_t *seg = hak_segment_of(p);
  if (HAK_UNLIKELY(seg == NULL)) hak_invalid_free(p);
  if (seg->kind == HAK_KIND_LARGE) {
    hak_check_large(seg, p);
    return hak_large_realloc(seg, p, size);
  }
  if (seg->kind == HAK_KIND_SPANS) return hak_span_realloc(seg, p, size);
  size_t old = slab_block_size(seg, p);
  /* In place when it fits and wastes at most half the block. */
  if (size <= old && size >= old / 2) return p;
  return hak_realloc_move(p, size, old);
}

/* The common case first, with no call: a block that keeps fitting. Any
 * slab in use will do, as nothing changes: a block of a FULL slab (a string
 * that grew a while ago) took the generic path, and which one did was a
 * branch the processor could not predict. size 0 never fits (old / 2 >= 4).
 * A span block is checked by its first page's entry, as free checks it;
 * the segment map tells the tiers apart, so it reads nothing of a slab. */
void *hak_realloc_impl(void *p, size_t size) {
  uint8_t m = hak_segmap_of(p); /* NONE for NULL; the arena's blocks go generic */
  hak_segment_t *seg = hak_segment_base(p);
  if (HAK_LIKELY(m == HAK_SEGMAP_SLABS) && seg->kind != HAK_KIND_LARGE) {
    hak_slab_t *slab = hak_slab_of(seg, p);
    size_t old = slab->block_size - HAK_CANARY;
    if (HAK_LIKELY(hak_slab_has_block(slab, p))) {
      if (size <= old && size >= old / 2) return p;
      /* A block of the thread's own slab moves without a second lookup
       * (the block test above is the one free's own path makes). */
      if (size != 0 && atomic_load_explicit(&slab->owner, memory_order_relaxed) == hak_thread_token())
        return hak_realloc_move(p, size, old);
    }
  } else if (m == HAK_SEGMAP_SPANS) {
    uint16_t e = hak_span_entry(seg, p);
    size_t old = hak_span_block_bytes(hak_span_entry_number(e), p) - HAK_CANARY;
    if (HAK_LIKELY(hak_span_entry_is_block(e, p) && size <= old && size >= old / 2)) return p;
  }
  return realloc_generic(p, size);
}

HAK_NOINLINE size_t hak_usable_size_generic(const void *p) {
  if (p == NULL) return 0;
  hak_segment_t *seg = hak_segment_of(p);
  if (HAK_UNLIKELY(seg == NULL)) hak_invalid_free(p);
  if (seg->kind == HAK_KIND_LARGE) return seg->large_size;
  if (seg->kind == HAK_KIND_SPANS) return hak_span_usable_size(seg, p);
  return slab_block_size(seg, p);
}
