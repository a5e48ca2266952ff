/* The exported malloc family and C++ operators, and nothing else; none of
 * them in a build with -DHAK_NO_OVERRIDE, whose program keeps its malloc and
 * calls hakmem by the hak_* names only. */
#include "internal.h"

#ifndef HAK_NO_OVERRIDE

#include <unistd.h>

/* Each entry point starts a 64-byte line, so that the fast path of malloc
 * and free is fetched in as few lines and decode windows as can be
 * (random_mixed ws=400: 1.02x, 21 interleaved runs). */
#define EXPORT HAK_EXPORT __attribute__((aligned(64)))

EXPORT void *malloc(size_t size) { return hak_malloc_inline(size); }
EXPORT void free(void *p) { hak_free_inline(p); }
EXPORT void *calloc(size_t n, size_t size) { return hak_alloc_zero(n, size); }
EXPORT void *realloc(void *p, size_t size) { return hak_realloc_impl(p, size); }
EXPORT void *reallocarray(void *p, size_t n, size_t size) { return hak_reallocarray(p, n, size); }
EXPORT size_t malloc_usable_size(void *p) { return hak_usable_size_inline(p); }
EXPORT void free_sized(void *p, size_t size) { hak_free_inline(p); }
EXPORT void free_aligned_sized(void *p, size_t align, size_t size) { hak_free_inline(p); }
EXPORT int posix_memalign(void **out, size_t align, size_t size) {
  return hak_posix_memalign_inline(out, align, size);
}
EXPORT void *aligned_alloc(size_t align, size_t size) {
  return hak_aligned_alloc_inline(align, size);
}
/* glibc accepts any alignment for memalign, rounding up to a power of two. */
EXPORT void *memalign(size_t align, size_t size) {
  if (align <= 16) return hak_malloc_inline(size);
  if (align & (align - 1)) {
    if (align > ((size_t)1 << 62)) {
      errno = EINVAL;
      return NULL;
    }
    align = (size_t)1 << (64 - __builtin_clzl(align));
  }
  return hak_alloc_aligned_inline(align, size);
}
EXPORT void *valloc(size_t size) { return hak_alloc_aligned_inline(HAK_PAGE_SIZE, size); }
EXPORT void *pvalloc(size_t size) {
  size_t rounded = hak_page_up(size);
  if (rounded < size) {
    errno = ENOMEM;
    return NULL;
  }
  return hak_alloc_aligned(HAK_PAGE_SIZE, rounded ? rounded : HAK_PAGE_SIZE);
}

/* glibc's other names, for programs that call them directly: each of them
 * that glibc exports, or its block would go to the wrong allocator. */
void *__libc_malloc(size_t size) SAME_AS(malloc);
void __libc_free(void *p) SAME_AS(free);
void cfree(void *p) SAME_AS(free); /* binaries linked against glibc before 2.26 */
EXPORT void *__libc_calloc(size_t n, size_t size) { return hak_alloc_zero(n, size); }
EXPORT void *__libc_realloc(void *p, size_t size) { return hak_realloc_impl(p, size); }
void *__libc_memalign(size_t align, size_t size) SAME_AS(memalign);
void *__libc_valloc(size_t size) SAME_AS(valloc);
void *__libc_pvalloc(size_t size) SAME_AS(pvalloc);

/* ---- C++ operators (Itanium ABI names) ----
 * A failed `new` calls the installed new_handler and retries; without one it
 * throws std::bad_alloc through libstdc++ (present in any C++ program). */
typedef void (*new_handler_t)(void);
extern new_handler_t _ZSt15get_new_handlerv(void) __attribute__((weak));
extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn));

static HAK_NOINLINE void *new_failed(size_t size, size_t align, bool nothrow) {
  for (;;) {
    new_handler_t handler = _ZSt15get_new_handlerv ? _ZSt15get_new_handlerv() : NULL;
    if (handler == NULL) {
      if (nothrow) return NULL;
      if (_ZSt17__throw_bad_allocv) _ZSt17__throw_bad_allocv();
      hak_fatal("hakmem: out of memory in operator new(%zu)", size);
    }
    handler();
    void *p = align ? hak_alloc_aligned(align, size) : hak_malloc_inline(size);
    if (p) return p;
  }
}

/* Everything but a list's pop, out of line: the hit needs no frame. */
static HAK_NOINLINE void *new_miss(size_t size, bool nothrow) {
  void *p = hak_malloc_inline(size);
  return p ? p : new_failed(size, 0, nothrow);
}

HAK_INLINE void *op_new(size_t size, bool nothrow) {
  void *p = hak_malloc_pop_or(size, false);
  return HAK_LIKELY(p != NULL) ? p : new_miss(size, nothrow);
}
static void *op_new_aligned(size_t size, size_t align, bool nothrow) {
  if (!hak_valid_alignment(align)) {
    if (nothrow) return NULL;
    hak_fatal("hakmem: operator new with invalid alignment %zu", align);
  }
  void *p = hak_alloc_aligned_inline(align, size);
  return p ? p : new_failed(size, align, nothrow);
}

EXPORT void *_Znwm(size_t n) { return op_new(n, false); }
void *_Znam(size_t n) SAME_AS(_Znwm);
EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const void *nt) { return op_new(n, true); }
void *_ZnamRKSt9nothrow_t(size_t n, const void *nt) SAME_AS(_ZnwmRKSt9nothrow_t);
EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t al) { return op_new_aligned(n, al, false); }
void *_ZnamSt11align_val_t(size_t n, size_t al) SAME_AS(_ZnwmSt11align_val_t);
EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt) {
  return op_new_aligned(n, al, true);
}
void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt)
    SAME_AS(_ZnwmSt11align_val_tRKSt9nothrow_t);
/* Each delete is free, under the name of free's body of its signature. */
EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *nt) { hak_free_inline(p); }
EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) {
  hak_free_inline(p);
}
void _ZdlPv(void *p) SAME_AS(free);
void _ZdaPv(void *p) SAME_AS(free);
void _ZdlPvm(void *p, size_t n) SAME_AS(free_sized);
void _ZdaPvm(void *p, size_t n) SAME_AS(free_sized);
void _ZdlPvSt11align_val_t(void *p, size_t al) SAME_AS(free_sized);
void _ZdaPvSt11align_val_t(void *p, size_t al) SAME_AS(free_sized);
void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t al) SAME_AS(free_aligned_sized);
void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t al) SAME_AS(free_aligned_sized);
void _ZdaPvRKSt9nothrow_t(void *p, const void *nt) SAME_AS(_ZdlPvRKSt9nothrow_t);
void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt)
    SAME_AS(_ZdlPvSt11align_val_tRKSt9nothrow_t);

#endif /* HAK_NO_OVERRIDE */
