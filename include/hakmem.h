/* hakmem — a fast general-purpose allocator.
 *
 * Linking or preloading libhakmem replaces the malloc family. The hak_*
 * functions below are the same allocator under their own names: beside
 * the malloc family, or alone in a library built with
 * `make CFLAGS=-DHAK_NO_OVERRIDE`, which exports no name of glibc's (the
 * program keeps its malloc; hakmem's blocks go back by hak_free). */
#ifndef HAKMEM_H
#define HAKMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HAKMEM_VERSION_MAJOR 0
#define HAKMEM_VERSION_MINOR 1

#if defined(__GNUC__)
#define HAK_API __attribute__((visibility("default")))
#define HAK_MALLOC_ATTR(...) __attribute__((malloc, __VA_ARGS__))
#else
#define HAK_API
#define HAK_MALLOC_ATTR(...)
#endif

HAK_API void *hak_malloc(size_t size) HAK_MALLOC_ATTR(alloc_size(1));
HAK_API void *hak_calloc(size_t count, size_t size) HAK_MALLOC_ATTR(alloc_size(1, 2));
HAK_API void *hak_realloc(void *p, size_t size) __attribute__((alloc_size(2)));
HAK_API void *hak_reallocarray(void *p, size_t count, size_t size)
    __attribute__((alloc_size(2, 3)));
HAK_API void hak_free(void *p);
/* Frees p, which was allocated with `size` bytes (C23 free_sized). */
HAK_API void hak_free_sized(void *p, size_t size);
/* alignment: a power of two; size need not be a multiple of it. NULL + EINVAL
 * for a bad alignment, NULL + ENOMEM when out of memory. */
HAK_API void *hak_aligned_alloc(size_t alignment, size_t size)
    HAK_MALLOC_ATTR(alloc_size(2), alloc_align(1));
HAK_API int hak_posix_memalign(void **out, size_t alignment, size_t size);
HAK_API size_t hak_usable_size(const void *p);

/* Statistics, in the user's terms. Fields a build does not track are 0. */
typedef struct hak_stats_s {
  size_t mapped;          /* bytes currently mapped from the OS */
  size_t mapped_peak;     /* highest value of `mapped` */
  size_t committed;       /* mapped bytes not returned with madvise */
  size_t os_mapped_total; /* bytes ever mapped */
  size_t os_returned;     /* bytes ever returned (munmap + madvise) */
  size_t segments;        /* live segments */
  size_t large_live;      /* large blocks in use */
  size_t large_cached;    /* bytes of large blocks held in the cache */
  size_t refills;         /* slow-path refills of a thread's free list */
  size_t slabs_allocated; /* slabs ever handed to a thread */
  size_t purges;          /* madvise/munmap calls that returned memory */
  size_t remote_collects; /* remote free lists collected by their owner */
  size_t rss;             /* current resident set (from /proc), bytes */
  size_t rss_peak;        /* peak resident set (getrusage), bytes */
} hak_stats_t;

HAK_API void hak_stats_get(hak_stats_t *out);
/* Prints the statistics report to stderr. */
HAK_API void hak_stats_print(void);
/* Returns free memory to the OS: cached blocks of this thread, empty slabs,
 * and, with force, all cached segments and large blocks now. */
HAK_API void hak_collect(bool force);
/* "hakmem 0.1.0 (release)" */
HAK_API const char *hak_version(void);

#ifdef __cplusplus
}
#endif
#endif
