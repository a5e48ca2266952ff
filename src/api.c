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

static bool valid_alignment(size_t align) { return align != 0 && (align & (align - 1)) == 0; }

void *hak_aligned_alloc(size_t align, size_t size) {
  if (!valid_alignment(align)) {
    errno = EINVAL;
    return NULL;
  }
  return hak_alloc_aligned(align, size);
}

int hak_posix_memalign(void **out, size_t align, size_t size) {
  if (!valid_alignment(align) || align < sizeof(void *)) return EINVAL;
  void *p = hak_alloc_aligned(align, size);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
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
