/* libFuzzer target: decodes the input into a sequence of hak_* operations
 * on up to 64 live slots and checks every result against a shadow model.
 * Built (fuzz/fuzz.mk) with clang -fsanitize=fuzzer,undefined against a
 * no-override debug build of hakmem (HAK_DEBUG=1: the allocator's own
 * assertions and invariant checks are on), so malloc stays glibc's and the
 * fuzzer's bookkeeping never touches our heap.
 *
 * Input format (all little pieces, the input is consumed byte by byte; a
 * short input just ends the sequence):
 *   op byte:   low 4 bits = operation, high 4 bits mixed into the slot
 *   slot byte: slot = (byte ^ (op >> 4)) % 64
 *   size:      tier byte + 1..3 bytes (see read_size)
 *   operations: 0,1 malloc  2 calloc  3 realloc  4 aligned_alloc
 *     5 posix_memalign  6 free  7 free_sized  8 usable_size + full check
 *     9 reallocarray  10 collect (only every 16th such op)  11 free + malloc
 *     same size  12-15 malloc (biased toward allocation)
 * Checks (any mismatch prints "fuzz_alloc: <what>" and aborts):
 *   - every block 16-byte aligned, aligned to the requested alignment;
 *   - usable_size >= requested, stable while live, every usable byte
 *     written (the whole usable range carries the slot's pattern);
 *   - calloc memory is zero;
 *   - the pattern is intact before realloc / free / usable_size, so no
 *     block was overwritten by another;
 *   - realloc keeps min(old, new) bytes; a failed realloc keeps the block;
 *   - no two live blocks overlap (O(n) check on each new block);
 *   - failures (NULL) only for requests that cannot be satisfied, with errno
 *     ENOMEM (or EINVAL for bad alignments); posix_memalign returns the code;
 *   - after the input, everything is freed and (stats builds) the allocator
 *     counts no live blocks. */
#include <hakmem.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSLOTS 64
/* The pattern loops are not worth coverage feedback and dominate the time. */
#if defined(__clang__)
#define NOCOV __attribute__((no_sanitize("coverage")))
#else
#define NOCOV
#endif
/* Bytes live at once; more is refused before calling the allocator so a
 * run cannot exhaust the machine. */
#define LIVE_BUDGET ((size_t)768 << 20)

typedef struct {
  uint8_t *p;
  size_t size;   /* requested */
  size_t usable; /* hak_usable_size at allocation */
  size_t align;  /* requested alignment (16 for plain allocations) */
  uint64_t tag;  /* pattern seed */
} slot_t;

static slot_t slots[NSLOTS];
static size_t live_bytes;
static uint64_t tag_counter;

#if defined(FUZZ_LIVE_CHECK)
/* Internal counter of the stats/debug builds (hidden symbol, static link). */
size_t hak_stats_live_blocks(void);
#endif

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...);
#include <stdarg.h>
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("fuzz_alloc: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

/* ---- input reader ---- */
typedef struct {
  const uint8_t *d;
  size_t n, i;
} rd_t;
static int rd_more(rd_t *r) { return r->i < r->n; }
static unsigned rd8(rd_t *r) { return r->i < r->n ? r->d[r->i++] : 0; }
static unsigned rd16(rd_t *r) { return rd8(r) | rd8(r) << 8; }
static unsigned rd24(rd_t *r) { return rd16(r) | rd8(r) << 16; }

/* Sizes from every tier. Boundaries of the tiers get extra weight. */
static size_t read_size(rd_t *r) {
  static const size_t edges[] = {0,      1,      15,     16,     17,      64,      128,
                                 1023,   1024,   1025,   32767,   32768,  32769,   262143,
                                 262144, 262145, 4194304 - 4096, 4194304, 4194305, 8388608,
                                 7167,   7168,   7169,   8192,   8193};
  unsigned t = rd8(r);
  switch (t & 15) {
  case 0: case 1: case 2: case 3: case 4: return rd8(r) % 65;       /* 0..64 B */
  case 5: case 6: case 7: return rd16(r) % 1025;                    /* ..1 KiB */
  case 8: case 9: return rd16(r) % 32769;                           /* ..32 KiB */
  case 10: case 11: return rd24(r) % (262144 + 1);                  /* ..256 KiB */
  case 12: return rd24(r) % (8u << 20) + 1;                         /* ..8 MiB */
  case 13: case 14: return edges[rd8(r) % (sizeof edges / sizeof *edges)] + (t >> 7);
  default: /* rare huge: 8..40 MiB, or an impossible size when the high bits say so */
    if ((t >> 4) == 15) return ((size_t)1 << 62) + rd8(r);
    if (!(t & 0x10)) return rd16(r) % 4097; /* half of these: small again */
    return ((size_t)8 << 20) + (size_t)rd16(r) * 512;
  }
}

/* ---- pattern: whole 64-bit words plus a byte tail ----
 * Blocks up to DENSE_MAX carry the pattern in every byte. Bigger ones (to
 * keep the fuzzer fast: page faults dominate) in their first and last 64 KiB
 * and in one word of every 64 KiB between. Which
 * words are patterned depends only on the length that was filled, so a
 * prefix check after realloc looks at the same words. */
#define DENSE_MAX ((size_t)1 << 20)
#define SPARSE_EDGE ((size_t)64 << 10)
#define SPARSE_STRIDE_WORDS ((size_t)8192) /* one word per 64 KiB */
static inline uint64_t word_of(uint64_t tag, size_t i) {
  return (tag * 0x9E3779B97F4A7C15ull) ^ (i * 0xC2B2AE3D27D4EB4Full);
}
/* Calls fn on each patterned word range [a, b) (in words) of a fill of
 * `filled` bytes, clipped to `limit` bytes. */
#define FOR_PATTERNED(filled, limit, BODY)                                    \
  do {                                                                         \
    size_t w_ = (limit) / 8, i_;                                               \
    if ((filled) <= DENSE_MAX) {                                               \
      for (i_ = 0; i_ < w_; i_++) BODY                                         \
    } else {                                                                   \
      size_t h_ = SPARSE_EDGE / 8, t_ = ((filled) - SPARSE_EDGE) / 8;          \
      for (i_ = 0; i_ < w_ && i_ < h_; i_++) BODY                              \
      for (i_ = h_; i_ < w_ && i_ < t_; i_ += SPARSE_STRIDE_WORDS) BODY                        \
      for (i_ = t_; i_ < w_; i_++) BODY                                        \
    }                                                                          \
  } while (0)

NOCOV static void fill(uint8_t *p, size_t n, uint64_t tag) {
  FOR_PATTERNED(n, n, {
    uint64_t v = word_of(tag, i_);
    memcpy(p + 8 * i_, &v, 8);
  });
  size_t w = n / 8;
  uint64_t v = word_of(tag, w);
  memcpy(p + 8 * w, &v, n - 8 * w);
}
/* First patterned offset in [0, n) of a fill of `filled` bytes that does not
 * carry tag's pattern, or n. */
NOCOV static size_t check_part(const uint8_t *p, size_t n, size_t filled, uint64_t tag) {
  FOR_PATTERNED(filled, n, {
    uint64_t v;
    memcpy(&v, p + 8 * i_, 8);
    if (v != word_of(tag, i_)) return 8 * i_;
  });
  size_t w = n / 8;
  int patterned = n == filled || filled <= DENSE_MAX || w < SPARSE_EDGE / 8 ||
                  w >= (filled - SPARSE_EDGE) / 8 || (w - SPARSE_EDGE / 8) % SPARSE_STRIDE_WORDS == 0;
  uint64_t v = word_of(tag, w);
  if (patterned && memcmp(p + 8 * w, &v, n - 8 * w) != 0) return 8 * w;
  return n;
}
static size_t check(const uint8_t *p, size_t n, uint64_t tag) { return check_part(p, n, n, tag); }

static void verify_slot(int s, const char *when) {
  slot_t *sl = &slots[s];
  size_t off = check(sl->p, sl->usable, sl->tag);
  if (off != sl->usable)
    fail("slot %d (%p, size %zu, usable %zu): pattern broken at offset %zu before %s", s,
         (void *)sl->p, sl->size, sl->usable, off, when);
}

/* A new block in slot s: check alignment, usable size and overlap, then
 * pattern the whole usable range. */
NOCOV static void adopt(int s, void *q, size_t size, size_t align, const char *how) {
  slot_t *sl = &slots[s];
  uint8_t *p = q;
  if ((uintptr_t)p & 15) fail("%s(%zu) returned %p: not 16-byte aligned", how, size, q);
  if (align > 16 && ((uintptr_t)p & (align - 1)))
    fail("%s(align %zu, %zu) returned %p: misaligned", how, align, size, q);
  size_t usable = hak_usable_size(p);
  if (usable < size) fail("%s(%zu) = %p: usable size %zu < request", how, size, q, usable);
  /* classes waste <= 25%, in-place realloc keeps up to 2x, the large cache
   * reuses mappings up to 2x the needed map size */
  if (usable > 2 * size + 16384 + align && usable > 64)
    fail("%s(%zu) = %p: usable size %zu is implausibly large", how, size, q, usable);
  for (int i = 0; i < NSLOTS; i++) {
    if (i == s || !slots[i].p) continue;
    uint8_t *a = slots[i].p;
    if (p < a + slots[i].usable && a < p + usable)
      fail("%s(%zu) = %p (usable %zu) overlaps slot %d %p (usable %zu)", how, size, q, usable,
           i, (void *)a, slots[i].usable);
  }
  sl->p = p;
  sl->size = size;
  sl->usable = usable;
  sl->align = align;
  sl->tag = ++tag_counter;
  fill(p, usable, sl->tag);
  live_bytes += usable;
}

static void release(int s, int sized) {
  slot_t *sl = &slots[s];
  if (!sl->p) return;
  verify_slot(s, sized ? "free_sized" : "free");
  if (hak_usable_size(sl->p) != sl->usable)
    fail("slot %d %p: usable size changed from %zu to %zu", s, (void *)sl->p, sl->usable,
         hak_usable_size(sl->p));
  if (sized)
    hak_free_sized(sl->p, sl->size);
  else
    hak_free(sl->p);
  live_bytes -= sl->usable;
  memset(sl, 0, sizeof *sl);
}

/* Requests that may legitimately fail: over the budget or absurd. */
static int too_big(size_t size) { return size > LIVE_BUDGET || live_bytes + size > LIVE_BUDGET; }

static void expect_enomem(void *q, size_t size, const char *how) {
  if (q != NULL) fail("%s(%zu) succeeded for an impossible size", how, size);
  if (errno != ENOMEM) fail("%s(%zu) failed with errno %d, not ENOMEM", how, size, errno);
}

static void op_malloc(int s, size_t size) {
  release(s, 0);
  if (size > ((size_t)1 << 48)) {
    errno = 0;
    expect_enomem(hak_malloc(size), size, "hak_malloc");
    return;
  }
  if (too_big(size)) return;
  errno = 0;
  void *q = hak_malloc(size);
  if (!q) fail("hak_malloc(%zu) failed (errno %d)", size, errno);
  adopt(s, q, size, 16, "hak_malloc");
}

NOCOV static size_t first_nonzero(const uint8_t *b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, b + i, 8);
    if (v) break;
  }
  for (; i < n; i++)
    if (b[i]) return i;
  return n;
}

static void op_calloc(int s, size_t size, unsigned nb) {
  release(s, 0);
  size_t n = 1 + nb % 16, each = size / n;
  if (nb & 0x80) { /* overflowing product */
    errno = 0;
    expect_enomem(hak_calloc((SIZE_MAX >> 2) + nb, 8), SIZE_MAX, "hak_calloc");
    return;
  }
  if (size > ((size_t)1 << 48)) {
    errno = 0;
    expect_enomem(hak_calloc(1, size), size, "hak_calloc");
    return;
  }
  if (too_big(n * each)) return;
  void *q = hak_calloc(n, each);
  if (!q) fail("hak_calloc(%zu, %zu) failed (errno %d)", n, each, errno);
  size_t nz = first_nonzero(q, n * each);
  if (nz != n * each)
    fail("hak_calloc(%zu, %zu) = %p: byte %zu is 0x%02x, not zero", n, each, q, nz, ((uint8_t *)q)[nz]);
  adopt(s, q, n * each, 16, "hak_calloc");
}

static void op_realloc(int s, size_t size, int array, unsigned nb) {
  slot_t *sl = &slots[s];
  size_t n = array ? 1 + nb % 8 : 1, each = size / n, want = n * each;
  if (sl->p) verify_slot(s, "realloc");
  if (size > ((size_t)1 << 48) || (array && (nb & 0x80))) { /* impossible: block must stay */
    errno = 0;
    void *q = array ? hak_reallocarray(sl->p, (nb & 0x80) ? SIZE_MAX / 2 : 1,
                                       (nb & 0x80) ? 4 : size)
                    : hak_realloc(sl->p, size);
    expect_enomem(q, size, array ? "hak_reallocarray" : "hak_realloc");
    if (sl->p) verify_slot(s, "use after failed realloc");
    return;
  }
  size_t old_usable = sl->usable;
  if (want > old_usable && too_big(want - old_usable + want)) return;
  errno = 0;
  uint8_t *q = array ? hak_reallocarray(sl->p, n, each) : hak_realloc(sl->p, want);
  if (want == 0 && sl->p) {
    /* glibc semantics: realloc(p, 0) frees p and returns NULL; returning a
     * fresh minimal block is also allowed. */
    live_bytes -= sl->usable;
    memset(sl, 0, sizeof *sl);
    if (q) adopt(s, q, 0, 16, "hak_realloc");
    return;
  }
  if (!q) fail("%s(%p, %zu) failed (errno %d)", array ? "hak_reallocarray" : "hak_realloc",
               (void *)sl->p, want, errno);
  if (sl->p) {
    size_t keep = sl->size < want ? sl->size : want;
    size_t off = check_part(q, keep, sl->usable, sl->tag);
    if (off != keep)
      fail("hak_realloc(%p size %zu -> %zu) = %p: old contents lost at offset %zu (kept %zu)",
           (void *)sl->p, sl->size, want, (void *)q, off, keep);
    live_bytes -= sl->usable;
    sl->p = NULL;
  }
  adopt(s, q, want, 16, "hak_realloc");
}

static void op_aligned(int s, size_t size, unsigned ab, int posix) {
  release(s, 0);
  /* alignment 2^0 .. 2^23 mostly, sometimes 2^26, sometimes invalid */
  size_t align;
  int bad = 0;
  unsigned e = ab % 32;
  if (e < 24)
    align = (size_t)1 << e;
  else if (e < 28)
    align = (size_t)1 << (e - 4 + (e == 27 ? 3 : 0)); /* 2^20 .. 2^26 */
  else if (e < 30) {
    align = 48 + (ab >> 5); /* not a power of two */
    bad = 1;
  } else {
    align = 0;
    bad = 1;
  }
  if (posix && align < sizeof(void *)) bad = 1;
  if (size > ((size_t)1 << 48)) return;
  if (!bad && too_big(size + align)) return;
  void *q = NULL;
  errno = 0;
  if (posix) {
    void *sentinel = (void *)0x1234;
    q = sentinel;
    int rc = hak_posix_memalign(&q, align, size);
    if (bad) {
      if (rc != EINVAL) fail("hak_posix_memalign(align %zu) returned %d, not EINVAL", align, rc);
      if (q != sentinel) fail("hak_posix_memalign(align %zu) failed but wrote *out", align);
      return;
    }
    if (rc != 0) fail("hak_posix_memalign(align %zu, %zu) returned %d", align, size, rc);
  } else {
    q = hak_aligned_alloc(align, size);
    if (bad) {
      if (q || errno != EINVAL)
        fail("hak_aligned_alloc(align %zu) = %p errno %d, want NULL EINVAL", align, q, errno);
      return;
    }
    if (!q) fail("hak_aligned_alloc(%zu, %zu) failed (errno %d)", align, size, errno);
  }
  adopt(s, q, size, align < 16 ? 16 : align, posix ? "hak_posix_memalign" : "hak_aligned_alloc");
}

static void op_usable(int s) {
  slot_t *sl = &slots[s];
  if (!sl->p) {
    if (hak_usable_size(NULL) != 0) fail("hak_usable_size(NULL) != 0");
    return;
  }
  size_t u = hak_usable_size(sl->p);
  if (u != sl->usable) fail("slot %d %p: usable size changed from %zu to %zu", s, (void *)sl->p, sl->usable, u);
  verify_slot(s, "usable_size");
}

static void free_all(void) {
  for (int s = 0; s < NSLOTS; s++) release(s, s & 1);
  if (live_bytes != 0) fail("model: %zu live bytes after freeing every slot", live_bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  rd_t r = {data, size, 0};
  static unsigned collects;
#if defined(FUZZ_LIVE_CHECK)
  size_t live0 = hak_stats_live_blocks();
#endif
  while (rd_more(&r)) {
    unsigned op = rd8(&r);
    int s = (int)((rd8(&r) ^ (op >> 4)) % NSLOTS);
    switch (op & 15) {
    case 0: case 1: case 12: case 13: case 14: case 15:
      op_malloc(s, read_size(&r));
      break;
    case 2: {
      size_t sz = read_size(&r);
      op_calloc(s, sz, rd8(&r));
      break;
    }
    case 3: op_realloc(s, read_size(&r), 0, 0); break;
    case 9: {
      size_t sz = read_size(&r);
      op_realloc(s, sz, 1, rd8(&r));
      break;
    }
    case 4: case 5: {
      size_t sz = read_size(&r);
      op_aligned(s, sz, rd8(&r), (op & 15) == 5);
      break;
    }
    case 6: release(s, 0); break;
    case 7: release(s, 1); break;
    case 8: op_usable(s); break;
    case 10:
      if ((++collects & 15) == 0) hak_collect(op >> 7);
      break;
    case 11: { /* free then malloc the same size: immediate reuse */
      size_t sz = slots[s].p ? slots[s].size : 1;
      op_malloc(s, sz);
      break;
    }
    }
  }
  free_all();
#if defined(FUZZ_LIVE_CHECK)
  size_t live1 = hak_stats_live_blocks();
  if (live1 != live0) fail("allocator counts %zu live blocks after the input, %zu before", live1, live0);
#endif
  return 0;
}
