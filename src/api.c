/* The hak_* API: the allocator under its own names. */
#include "internal.h"

void *hak_malloc(size_t size) { return hak_malloc_inline(size); }
void hak_free(void *p) { hak_free_inline(p); }
void hak_free_sized(void *p, size_t size) { hak_free_inline(p); }
void *hak_calloc(size_t count, size_t size) { return hak_alloc_zero(count, size); }
void *hak_realloc(void *p, size_t size) { return hak_realloc_impl(p, size); }
size_t hak_usable_size(const void *p) { return hak_usable_size_inline(p); }

void *hak_reallocarray(void *p, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return hak_realloc_impl(p, total);
}

void *hak_aligned_alloc(size_t align, size_t size) { return hak_aligned_alloc_inline(align, size); }

int hak_posix_memalign(void **out, size_t align, size_t size) {
  return hak_posix_memalign_inline(out, align, size);
}

void hak_collect(bool force) {
  if (force) {
    hak_release_all();
    return;
  }
  hak_heap_collect(hak_tls_heap, false);
  hak_large_cache_collect(false);
  hak_segment_cache_collect(false);
}
