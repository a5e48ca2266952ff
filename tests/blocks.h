/* Helpers shared by the API conformance suites: values the optimizer
 * cannot see through, block contents by pattern, and a walk over sizes. */
#ifndef HAK_TEST_BLOCKS_H
#define HAK_TEST_BLOCKS_H

#include <malloc.h>
#include <stddef.h>
#include <stdint.h>

/* The bytes of blocks in use, small and large, as mallinfo2 counts them: a
 * free that kept its block would leave them counted. */
static inline size_t in_use_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

/* Opaque to the optimizer, so malloc(SIZE_MAX) etc. are really called. */
static inline size_t opaque(size_t v) {
  __asm__ volatile("" : "+r"(v));
  return v;
}
static inline void escape(void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }
/* Hides a pointer's identity (keeps -Wuse-after-free quiet after a failed realloc). */
static inline void *launder(void *p) {
  __asm__ volatile("" : "+r"(p));
  return p;
}

static inline int aligned_to(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

static inline unsigned char pat(size_t i, unsigned seed) {
  return (unsigned char)(i * 131u + (i >> 8) * 7u + seed * 29u + 1u);
}
static inline void fill(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++) b[i] = pat(i, seed);
}
/* Returns the index of the first byte that differs, or n. */
static inline size_t verify(const void *p, size_t n, unsigned seed) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != pat(i, seed)) return i;
  return n;
}
static inline size_t first_nonzero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return i;
  return n;
}

/* Sizes 0..2 MiB: every size up to 1 KiB, then a dense walk around powers of
 * two and class boundaries. */
static inline size_t next_size(size_t s) {
  if (s < 1024) return s + 1;
  if (s < 64 * 1024) return s + s / 16 + 1;
  return s + s / 8 + 3;
}

#endif
