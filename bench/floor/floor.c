/* floor — the cheapest allocator of hakmem's kind, as a measuring stick.
 *
 * Thread-local LIFO free lists, one per size class (64-byte steps to 4 KiB,
 * 1 KiB steps to 64 KiB); malloc pops, free pushes, finding the class in a
 * byte per 64 KiB chunk. No checks, no statistics, no memory ever returned,
 * no limit on the lists: malloc takes 13 instructions, free 11. Larger
 * blocks are mapped and never unmapped. It is not an allocator to use: it
 * shows how fast a loop can go with segregated free lists at all, so that
 * `make bench-floor` tells which of hakmem's gaps to a target its fast path
 * could still close. See docs/PERFORMANCE.md. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define REGION_BYTES ((size_t)1 << 36) /* reserved once, never committed whole */
#define CHUNK_SHIFT 16
#define SMALL_MAX 4096
#define BIG_MAX 65536
#define CLASSES 125

static char *region, *bump;
static uint8_t chunk_class[REGION_BYTES >> CHUNK_SHIFT];
static __thread void *lists[CLASSES] __attribute__((tls_model("initial-exec")));

/* Classes 1..64 are 64 .. 4096 bytes, 65..124 are 5 .. 64 KiB. */
static inline size_t class_size(size_t c) { return c <= 64 ? c * 64 : (c - 64) * 1024 + SMALL_MAX; }
static inline size_t class_of(size_t n) {
  return n <= SMALL_MAX ? ((n | 1) + 63) >> 6 : ((n - SMALL_MAX + 1023) >> 10) + 64;
}

static void *map(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* A block above BIG_MAX: mapped with its size in front, for realloc. */
__attribute__((noinline)) static void *map_block(size_t n) {
  if (n > SIZE_MAX - 64) return NULL;
  char *p = map(n + 64);
  if (p == NULL) return NULL;
  *(size_t *)p = n;
  return p + 64;
}

/* Carves a fresh run of class c into its list and pops the first block. */
__attribute__((noinline)) static void *refill(size_t c) {
  static int lock;
  if (__atomic_load_n(&region, __ATOMIC_ACQUIRE) == NULL) {
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE)) {
    }
    if (region == NULL) {
      char *r = map(REGION_BYTES);
      if (r == NULL) __builtin_trap();
      bump = r;
      __atomic_store_n(&region, r, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
  }
  size_t size = class_size(c), len = c <= 64 ? (size_t)1 << CHUNK_SHIFT : (size_t)1 << 20;
  char *run = __atomic_fetch_add(&bump, len, __ATOMIC_RELAXED);
  if (run + len > region + REGION_BYTES) __builtin_trap();
  memset(&chunk_class[(size_t)(run - region) >> CHUNK_SHIFT], (int)c, len >> CHUNK_SHIFT);
  void *head = NULL;
  for (size_t off = 0; off + size <= len; off += size) {
    *(void **)(run + off) = head;
    head = run + off;
  }
  lists[c] = *(void **)head;
  return head;
}

void *malloc(size_t n) {
  if (__builtin_expect(n > BIG_MAX, 0)) return map_block(n);
  size_t c = class_of(n);
  void *b = lists[c];
  if (__builtin_expect(b != NULL, 1)) {
    lists[c] = *(void **)b;
    return b;
  }
  return refill(c);
}

void free(void *p) {
  if (p == NULL || (size_t)((char *)p - region) >= REGION_BYTES) return; /* or mapped whole */
  size_t c = chunk_class[(size_t)((char *)p - region) >> CHUNK_SHIFT];
  *(void **)p = lists[c];
  lists[c] = p;
}

void *calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  void *p = malloc(n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

void *realloc(void *p, size_t n) {
  void *q = malloc(n);
  if (q == NULL || p == NULL) return q;
  size_t old = (size_t)((char *)p - region) < REGION_BYTES
                   ? class_size(chunk_class[(size_t)((char *)p - region) >> CHUNK_SHIFT])
                   : *(size_t *)((char *)p - 64);
  memcpy(q, p, old < n ? old : n);
  free(p);
  return q;
}
