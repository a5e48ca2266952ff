/* Black-box conformance of the standard malloc family (hakmem's when this
 * binary is linked with -lhakmem; glibc's otherwise). Expected semantics are
 * glibc's: every check here also holds under glibc 2.36, but for the one
 * test of a purge, skipped there. */
#define _GNU_SOURCE /* dladdr */
#include "harness.h"
#include "blocks.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---------- malloc / free ---------- */

TEST(malloc_returns_16_byte_aligned_for_sizes_0_to_2MiB) {
  int bad = 0;
  for (size_t s = 0; s <= 2u << 20; s = next_size(s)) {
    void *p = malloc(s);
    if (!p) {
      CHECK_MSG(p != NULL, "malloc(%zu) returned NULL", s);
      bad++;
      continue;
    }
    if (!aligned_to(p, 16)) {
      CHECK_MSG(0, "malloc(%zu) = %p not 16-byte aligned", s, p);
      bad++;
    }
    if (s) {
      ((volatile char *)p)[0] = 1;
      ((volatile char *)p)[s - 1] = 2;
    }
    free(p);
    if (bad > 10) break;
  }
  /* Also with everything live at once (a different path than alloc/free). */
  static void *live[4096];
  int n = 0;
  for (size_t s = 0; s <= 2u << 20 && n < 4096; s = next_size(s)) {
    live[n] = malloc(s);
    CHECK_MSG(live[n] && aligned_to(live[n], 16), "live malloc(%zu) = %p", s, live[n]);
    n++;
  }
  for (int i = 0; i < n; i++) free(live[i]);
}

TEST(malloc_huge_blocks_aligned_and_writable_at_both_ends) {
  size_t sizes[] = {(4u << 20) + 1, (32u << 20) - 7, 256u << 20, (size_t)1 << 30};
  for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t s = sizes[i];
    char *p = malloc(s);
    REQUIRE(p != NULL);
    CHECK_MSG(aligned_to(p, 16), "malloc(%zu) = %p", s, (void *)p);
    p[0] = 'a';
    p[s / 2] = 'b';
    p[s - 1] = 'c';
    CHECK(p[0] == 'a' && p[s / 2] == 'b' && p[s - 1] == 'c');
    CHECK(malloc_usable_size(p) >= s);
    free(p);
  }
}

TEST(malloc_zero_returns_unique_freeable_pointers) {
  enum { N = 2000 };
  static void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = malloc(0);
    REQUIRE(p[i] != NULL);
    CHECK(aligned_to(p[i], 16));
  }
  /* Sort-free uniqueness check: hash set by address. */
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      if (p[i] == p[j]) {
        CHECK_MSG(0, "malloc(0) returned %p twice (#%d and #%d)", p[i], i, j);
        goto out;
      }
out:
  for (int i = 0; i < N; i++) free(p[i]);
  void *q = malloc(0);
  CHECK(q != NULL);
  free(q);
}

TEST(free_null_is_a_no_op) {
  free(NULL);
  free(NULL);
  void *p = malloc(32);
  CHECK(p != NULL);
  free(NULL);
  free(p);
}

TEST(live_blocks_do_not_overlap) {
  enum { N = 3000 };
  static unsigned char *p[N];
  static size_t sz[N];
  unsigned r = 12345;
  for (int i = 0; i < N; i++) {
    r = r * 1103515245u + 12345u;
    unsigned k = (r >> 16) % 100;
    sz[i] = k < 80 ? 1 + (r >> 8) % 1024 : k < 97 ? 1 + (r >> 4) % 65536 : 1 + (r >> 2) % (1u << 20);
    p[i] = malloc(sz[i]);
    REQUIRE(p[i] != NULL);
    memset(p[i], (int)(i & 0xff), sz[i]);
  }
  int bad = 0;
  for (int i = 0; i < N && bad < 5; i++)
    for (size_t j = 0; j < sz[i]; j++)
      if (p[i][j] != (unsigned char)(i & 0xff)) {
        CHECK_MSG(0, "block %d (%p, %zu B) byte %zu = 0x%02x, expected 0x%02x", i, (void *)p[i],
                  sz[i], j, p[i][j], i & 0xff);
        bad++;
        break;
      }
  for (int i = 0; i < N; i++) free(p[i]);
}

/* Past the kernel's limit of mappings (vm.max_map_count, 65,530 by
 * default: the hardened build's guard page splits one per large block), a
 * large malloc fails with ENOMEM (it aborted), and a block freed serves
 * again. 40,000 blocks of 1.1 MiB: address space only, never written. */
TEST_T(large_blocks_past_the_map_limit_fail_with_enomem_then_serve_again, 60) {
  enum { N = 40000 };
  static void *blocks[N];
  size_t size = 1100 << 10;
  int n = 0, err = 0;
  for (; n < N; n++) {
    errno = 0;
    if ((blocks[n] = malloc(size)) == NULL) {
      err = errno;
      break;
    }
  }
  CHECK_MSG(n == N || err == ENOMEM, "malloc failed after %d blocks with errno %d", n, err);
  if (n > 0) free(blocks[--n]);
  void *again = malloc(size);
  CHECK_MSG(again != NULL, "no block after one of %d was freed", n + 1);
  free(again);
  while (n > 0) free(blocks[--n]);
}

TEST(malloc_size_max_fails_with_enomem) {
  errno = 0;
  void *p = malloc(opaque(SIZE_MAX));
  CHECK(p == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  errno = 0;
  p = malloc(opaque((size_t)PTRDIFF_MAX + 1));
  CHECK(p == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  errno = 0;
  p = malloc(opaque(SIZE_MAX - 4096));
  CHECK(p == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  /* Sizes just below SIZE_MAX must not wrap around to tiny allocations. */
  for (size_t d = 1; d <= 64; d++) {
    errno = 0;
    p = malloc(opaque(SIZE_MAX - d));
    CHECK_MSG(p == NULL, "malloc(SIZE_MAX-%zu) = %p", d, p);
    free(p);
  }
}

TEST(allocation_works_after_failed_huge_requests) {
  for (int i = 0; i < 10; i++) {
    void *bad = malloc(opaque(SIZE_MAX / 2 + (size_t)i));
    CHECK(bad == NULL);
    void *bad2 = malloc(opaque((size_t)1 << 62));
    CHECK(bad2 == NULL);
  }
  size_t sizes[] = {1, 24, 1000, 70000, 3u << 20};
  for (unsigned i = 0; i < 5; i++) {
    char *p = malloc(sizes[i]);
    REQUIRE(p != NULL);
    memset(p, 0x5a, sizes[i]);
    free(p);
  }
}

/* ---------- calloc ---------- */

TEST(calloc_returns_zeroed_memory) {
  for (size_t s = 1; s <= 2u << 20; s = next_size(s)) {
    unsigned char *p = calloc(1, s);
    REQUIRE(p != NULL);
    size_t z = first_nonzero(p, s);
    CHECK_MSG(z == s, "calloc(1, %zu): byte %zu nonzero", s, z);
    free(p);
  }
  unsigned char *p = calloc(1000, 1000);
  REQUIRE(p);
  CHECK(first_nonzero(p, 1000000) == 1000000);
  free(p);
  p = calloc(1, 64u << 20);
  REQUIRE(p);
  CHECK(first_nonzero(p, 64u << 20) == (64u << 20));
  free(p);
}

TEST(calloc_zeroes_reused_dirty_blocks) {
  size_t sizes[] = {1,    8,     16,     24,     100,     512,     1000,     1024,      4096,
                    5000, 16384, 40000,  65536,  100000,  262144,  500000,   1u << 20,  (1u << 20) + 1,
                    3u << 20, 8u << 20, 33u << 20};
  for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t s = sizes[i];
    for (int round = 0; round < 4; round++) {
      unsigned char *d = malloc(s);
      REQUIRE(d);
      memset(d, 0xAA, malloc_usable_size(d));
      free(d);
      unsigned char *p = calloc(1, s);
      REQUIRE(p);
      size_t z = first_nonzero(p, s);
      CHECK_MSG(z == s, "calloc(1,%zu) after dirty free (round %d, reused=%d): byte %zu = 0x%02x",
                s, round, p == d, z, p[z]);
      /* Also as n elements. */
      free(p);
      d = malloc(s);
      REQUIRE(d);
      memset(d, 0xAA, s);
      free(d);
      p = calloc(s, 1);
      REQUIRE(p);
      z = first_nonzero(p, s);
      CHECK_MSG(z == s, "calloc(%zu,1) after dirty free: byte %zu nonzero", s, z);
      free(p);
    }
  }
}

TEST(calloc_zeroes_many_dirty_small_blocks) {
  enum { N = 5000 };
  static void *p[N];
  for (int s = 16; s <= 2048; s *= 2) {
    for (int i = 0; i < N; i++) {
      p[i] = malloc(s);
      REQUIRE(p[i]);
      memset(p[i], 0xAA, s);
    }
    for (int i = 0; i < N; i++) free(p[i]);
    for (int i = 0; i < N; i++) {
      p[i] = calloc(1, s);
      REQUIRE(p[i]);
      size_t z = first_nonzero(p[i], s);
      CHECK_MSG(z == (size_t)s, "calloc(1,%d) #%d: byte %zu nonzero", s, i, z);
      if (z != (size_t)s) break;
    }
    for (int i = 0; i < N; i++) free(p[i]);
  }
}

TEST(calloc_overflow_fails_with_enomem) {
  struct { size_t n, s; } cases[] = {
      {SIZE_MAX, 2},          {2, SIZE_MAX},         {SIZE_MAX / 2 + 1, 2},
      {(size_t)1 << 32, (size_t)1 << 32}, {SIZE_MAX / 16 + 1, 16}, {SIZE_MAX, SIZE_MAX},
      {65537, 281470681808897ull}, /* product wraps to 131072 in 64 bits */
  };
  for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
    errno = 0;
    void *p = calloc(opaque(cases[i].n), opaque(cases[i].s));
    CHECK_MSG(p == NULL, "calloc(%zu, %zu) = %p", cases[i].n, cases[i].s, p);
    CHECK_MSG(errno == ENOMEM, "calloc(%zu, %zu): errno %d", cases[i].n, cases[i].s, errno);
    free(p);
  }
  void *p = calloc(opaque(0), opaque(SIZE_MAX));
  free(p); /* zero total: NULL or a unique pointer, both fine; must not crash */
  p = calloc(opaque(SIZE_MAX), opaque(0));
  free(p);
}

/* ---------- realloc / reallocarray ---------- */

TEST(realloc_null_acts_as_malloc) {
  size_t sizes[] = {0, 1, 16, 1000, 100000, 5u << 20};
  for (unsigned i = 0; i < 6; i++) {
    char *p = realloc(NULL, sizes[i]);
    CHECK_MSG(p != NULL, "realloc(NULL, %zu) = NULL", sizes[i]);
    if (!p) continue;
    CHECK(aligned_to(p, 16));
    CHECK(malloc_usable_size(p) >= sizes[i]);
    if (sizes[i]) memset(p, 1, sizes[i]);
    free(p);
  }
}

TEST(realloc_to_zero_frees_or_returns_freeable) {
  size_t sizes[] = {1, 100, 5000, 200000, 4u << 20};
  for (unsigned i = 0; i < 5; i++) {
    size_t before = in_use_bytes();
    void *p = malloc(sizes[i]);
    REQUIRE(p);
    void *q = realloc(p, 0);
    free(q); /* NULL (glibc) or a fresh pointer; either must be freeable */
    CHECK_MSG(in_use_bytes() < before + 4096, "realloc(malloc(%zu), 0) kept %zu bytes in use",
              sizes[i], in_use_bytes() - before);
  }
  size_t before = in_use_bytes();
  for (int i = 0; i < 2000; i++) {
    void *p = malloc(1u << 20);
    REQUIRE(p);
    memset(p, 1, 4096);
    free(realloc(p, 0));
  }
  CHECK_MSG(in_use_bytes() < before + (1u << 20), "2000 realloc(1 MiB block, 0): %zu bytes in use",
            in_use_bytes() - before);
}

/* Grows and shrinks through every tier; contents must survive each move. */
TEST(realloc_preserves_contents_across_tiers) {
  size_t tiers[] = {16, 1024, 64 * 1024, 1u << 20, 64u << 20};
  enum { T = 5 };
  /* growing */
  for (int a = 0; a < T; a++)
    for (int b = 0; b < T; b++) {
      if (a == b) continue;
      size_t from = tiers[a], to = tiers[b];
      unsigned char *p = malloc(from);
      REQUIRE(p);
      fill(p, from, (unsigned)(a * 7 + b));
      unsigned char *q = realloc(p, to);
      REQUIRE(q);
      size_t keep = from < to ? from : to;
      size_t bad = verify(q, keep, (unsigned)(a * 7 + b));
      CHECK_MSG(bad == keep, "realloc %zu -> %zu: byte %zu lost", from, to, bad);
      CHECK(aligned_to(q, 16));
      CHECK(malloc_usable_size(q) >= to);
      memset(q, 0x33, to);
      free(q);
    }
}

TEST(realloc_chain_small_steps_preserves_prefix) {
  unsigned char *p = NULL;
  size_t cur = 0;
  for (size_t s = 1; s < (3u << 20); s = s + s / 3 + 1) {
    unsigned char *q = realloc(p, s);
    REQUIRE(q);
    size_t bad = verify(q, cur, 99);
    CHECK_MSG(bad == cur, "grow %zu -> %zu: byte %zu lost", cur, s, bad);
    fill(q, s, 99);
    p = q;
    cur = s;
  }
  for (size_t s = cur; s > 0; s = s / 2) {
    unsigned char *q = realloc(p, s);
    REQUIRE(q);
    size_t bad = verify(q, s, 99);
    CHECK_MSG(bad == s, "shrink to %zu: byte %zu lost", s, bad);
    p = q;
  }
  free(p);
}

TEST(realloc_same_size_and_in_usable_size_keeps_data) {
  size_t sizes[] = {10, 100, 3000, 70000, 2u << 20};
  for (unsigned i = 0; i < 5; i++) {
    unsigned char *p = malloc(sizes[i]);
    REQUIRE(p);
    fill(p, sizes[i], i);
    p = realloc(p, sizes[i]);
    REQUIRE(p);
    CHECK(verify(p, sizes[i], i) == sizes[i]);
    size_t us = malloc_usable_size(p);
    p = realloc(p, us);
    REQUIRE(p);
    CHECK(verify(p, sizes[i], i) == sizes[i]);
    free(p);
  }
}

TEST(realloc_failure_keeps_original_block) {
  unsigned char *p = malloc(1000);
  REQUIRE(p);
  fill(p, 1000, 5);
  errno = 0;
  void *q = realloc(launder(p), opaque(SIZE_MAX - 8));
  CHECK(q == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  CHECK(verify(p, 1000, 5) == 1000);
  errno = 0;
  q = realloc(launder(p), opaque((size_t)PTRDIFF_MAX + 1));
  CHECK(q == NULL);
  CHECK(errno == ENOMEM);
  CHECK(verify(p, 1000, 5) == 1000);
  free(p);
}

TEST(reallocarray_overflow_fails_and_keeps_block) {
  unsigned char *p = reallocarray(NULL, 10, 10);
  REQUIRE(p);
  fill(p, 100, 8);
  errno = 0;
  void *q = reallocarray(launder(p), opaque(SIZE_MAX / 2), opaque(3));
  CHECK(q == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  errno = 0;
  q = reallocarray(launder(p), opaque((size_t)1 << 33), opaque((size_t)1 << 33));
  CHECK(q == NULL);
  CHECK(errno == ENOMEM);
  CHECK(verify(p, 100, 8) == 100);
  q = reallocarray(p, 1000, 8);
  REQUIRE(q);
  CHECK(verify(q, 100, 8) == 100);
  CHECK(malloc_usable_size(q) >= 8000);
  free(q);
  errno = 0;
  q = reallocarray(NULL, opaque(SIZE_MAX), opaque(2));
  CHECK(q == NULL && errno == ENOMEM);
}

/* ---------- aligned allocation ---------- */

TEST(posix_memalign_rejects_bad_alignment_with_einval) {
  size_t bad[] = {0, 1, 3, 24, sizeof(void *) / 2, 12, 48, 100, 4097, (size_t)1 << 63 | 8,
                  SIZE_MAX};
  for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
    void *p = (void *)0x1234;
    int rc = posix_memalign(&p, opaque(bad[i]), 64);
    CHECK_MSG(rc == EINVAL, "posix_memalign(align=%zu) = %d", bad[i], rc);
    if (rc == 0) free(p);
  }
}

TEST(posix_memalign_huge_size_enomem) {
  size_t aligns[] = {sizeof(void *), 16, 64, 4096, 1u << 21};
  for (unsigned i = 0; i < 5; i++) {
    void *p = (void *)0x1234;
    int rc = posix_memalign(&p, aligns[i], opaque(SIZE_MAX / 2));
    CHECK_MSG(rc == ENOMEM, "posix_memalign(%zu, SIZE_MAX/2) = %d", aligns[i], rc);
    rc = posix_memalign(&p, aligns[i], opaque(SIZE_MAX - 100));
    CHECK_MSG(rc == ENOMEM, "posix_memalign(%zu, SIZE_MAX-100) = %d", aligns[i], rc);
  }
}

TEST(posix_memalign_all_valid_alignments) {
  for (size_t a = sizeof(void *); a <= (1u << 26); a *= 2) {
    size_t sizes[] = {1, 24, a, 3 * a + 5};
    for (unsigned i = 0; i < 4; i++) {
      if (sizes[i] > (64u << 20)) continue;
      void *p = NULL;
      int rc = posix_memalign(&p, a, sizes[i]);
      CHECK_MSG(rc == 0, "posix_memalign(%zu, %zu) = %d", a, sizes[i], rc);
      if (rc) continue;
      CHECK_MSG(aligned_to(p, a), "posix_memalign(%zu, %zu) = %p misaligned", a, sizes[i], p);
      CHECK(malloc_usable_size(p) >= sizes[i]);
      memset(p, 0x7e, sizes[i]);
      free(p);
    }
  }
}

/* Every power of two from 1 to 1 GiB, through aligned_alloc and memalign. */
TEST(aligned_alloc_and_memalign_every_power_of_two_to_1GiB) {
  for (int lg = 0; lg <= 30; lg++) {
    size_t a = (size_t)1 << lg;
    size_t sizes[3] = {1, 100, a};
    int nsizes = a <= (4u << 20) ? 3 : 2; /* size==a only up to 4 MiB */
    for (int k = 0; k < nsizes; k++) {
      size_t s = sizes[k];
      unsigned char *p = aligned_alloc(a, s);
      CHECK_MSG(p != NULL, "aligned_alloc(%zu, %zu) = NULL", a, s);
      if (p) {
        CHECK_MSG(aligned_to(p, a), "aligned_alloc(%zu,%zu) = %p", a, s, (void *)p);
        CHECK_MSG(aligned_to(p, a < 16 ? a : 16), "aligned_alloc(%zu) = %p", a, (void *)p);
        memset(p, 0x11, s);
        CHECK(malloc_usable_size(p) >= s);
        free(p);
      }
      p = memalign(a, s);
      CHECK_MSG(p != NULL, "memalign(%zu, %zu) = NULL", a, s);
      if (p) {
        CHECK_MSG(aligned_to(p, a), "memalign(%zu,%zu) = %p", a, s, (void *)p);
        memset(p, 0x22, s);
        CHECK(malloc_usable_size(p) >= s);
        free(p);
      }
    }
  }
}

TEST(aligned_blocks_live_together_do_not_overlap) {
  enum { N = 400 };
  static unsigned char *p[N];
  static size_t sz[N];
  for (int i = 0; i < N; i++) {
    size_t a = (size_t)16 << (i % 10); /* 16 .. 8192 */
    sz[i] = 1 + (size_t)(i * 37) % 5000;
    p[i] = aligned_alloc(a, sz[i]);
    REQUIRE(p[i]);
    CHECK(aligned_to(p[i], a));
    memset(p[i], i & 0xff, sz[i]);
  }
  for (int i = 0; i < N; i++) {
    for (size_t j = 0; j < sz[i]; j++)
      if (p[i][j] != (unsigned char)(i & 0xff)) {
        CHECK_MSG(0, "aligned block %d byte %zu overwritten", i, j);
        break;
      }
    free(p[i]);
  }
}

TEST(realloc_of_aligned_block_preserves_data) {
  unsigned char *p = aligned_alloc(4096, 5000);
  REQUIRE(p);
  fill(p, 5000, 3);
  p = realloc(p, 200000);
  REQUIRE(p);
  CHECK(verify(p, 5000, 3) == 5000);
  p = realloc(p, 100);
  REQUIRE(p);
  CHECK(verify(p, 100, 3) == 100);
  free(p);
}

TEST(valloc_is_page_aligned) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t sizes[] = {1, 100, 4095, 4096, 4097, 100000, 3u << 20};
  for (unsigned i = 0; i < 7; i++) {
    void *p = valloc(sizes[i]);
    CHECK_MSG(p != NULL, "valloc(%zu)", sizes[i]);
    if (!p) continue;
    CHECK_MSG(aligned_to(p, page), "valloc(%zu) = %p", sizes[i], p);
    memset(p, 3, sizes[i]);
    free(p);
  }
}

TEST(pvalloc_rounds_size_up_to_a_page) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t sizes[] = {1, 100, 4095, 4096, 4097, 10000, 1u << 20};
  for (unsigned i = 0; i < 7; i++) {
    size_t want = (sizes[i] + page - 1) / page * page;
    unsigned char *p = pvalloc(sizes[i]);
    CHECK_MSG(p != NULL, "pvalloc(%zu)", sizes[i]);
    if (!p) continue;
    CHECK_MSG(aligned_to(p, page), "pvalloc(%zu) = %p", sizes[i], (void *)p);
    size_t us = malloc_usable_size(p);
    CHECK_MSG(us >= want, "pvalloc(%zu): usable %zu < %zu", sizes[i], us, want);
    memset(p, 4, want); /* the whole rounded size is ours */
    free(p);
  }
  void *p = pvalloc(0);
  CHECK(p != NULL);
  free(p);
}

TEST(memalign_and_aligned_alloc_huge_size_fail) {
  errno = 0;
  void *p = aligned_alloc(64, opaque(SIZE_MAX - 10));
  CHECK(p == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  errno = 0;
  p = memalign(4096, opaque(SIZE_MAX / 2));
  CHECK(p == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  errno = 0;
  p = valloc(opaque(SIZE_MAX - 10));
  CHECK(p == NULL);
  CHECK(errno == ENOMEM);
  p = malloc(100);
  CHECK(p != NULL);
  free(p);
}

/* ---------- malloc_usable_size ---------- */

TEST(usable_size_covers_request_and_is_writable) {
  enum { N = 1500 };
  static unsigned char *p[N];
  static size_t us[N];
  int n = 0;
  for (size_t s = 1; s <= (2u << 20) && n < N; s = next_size(s), n++) {
    p[n] = malloc(s);
    REQUIRE(p[n]);
    us[n] = malloc_usable_size(p[n]);
    CHECK_MSG(us[n] >= s, "malloc_usable_size(malloc(%zu)) = %zu", s, us[n]);
    CHECK_MSG(us[n] <= 2 * s + 4096 + s / 4, "usable %zu absurdly large for %zu", us[n], s);
    memset(p[n], (int)(n & 0xff), us[n]);
  }
  /* Filling each whole usable area must not have clobbered a neighbour. */
  for (int i = 0; i < n; i++) {
    for (size_t j = 0; j < us[i]; j++)
      if (p[i][j] != (unsigned char)(i & 0xff)) {
        CHECK_MSG(0, "block %d (usable %zu) byte %zu clobbered", i, us[i], j);
        break;
      }
    CHECK(malloc_usable_size(p[i]) == us[i]);
    free(p[i]);
  }
  CHECK(malloc_usable_size(NULL) == 0);
}

TEST(usable_size_of_calloc_realloc_aligned) {
  void *p = calloc(7, 13);
  REQUIRE(p);
  CHECK(malloc_usable_size(p) >= 91);
  p = realloc(p, 5000);
  REQUIRE(p);
  CHECK(malloc_usable_size(p) >= 5000);
  free(p);
  p = aligned_alloc(256, 300);
  REQUIRE(p);
  CHECK(malloc_usable_size(p) >= 300);
  free(p);
}

TEST(freed_large_blocks_are_returned_or_reused) {
  /* 2 GiB of traffic through 64 MiB fully-touched blocks, one live at a time:
   * resident memory must stay near one block, not grow with the traffic. */
  long before = th_vm_rss_kib();
  long worst = 0;
  for (int i = 0; i < 32; i++) {
    char *p = malloc(64u << 20);
    REQUIRE(p);
    for (size_t o = 0; o < (64u << 20); o += 4096) p[o] = (char)(i + 1);
    escape(p);
    free(p);
    long now = th_vm_rss_kib() - before;
    if (now > worst) worst = now;
  }
  printf("    VmRSS growth peak %ld KiB over 2 GiB of 64 MiB blocks\n", worst);
  CHECK_MSG(worst < 256 * 1024, "VmRSS grew by %ld KiB", worst);
  for (int i = 0; i < 200000; i++) {
    void *p = malloc(100 + (i % 900));
    REQUIRE(p);
    escape(p);
    free(p);
  }
  long end = th_vm_rss_kib() - before;
  CHECK_MSG(end < 256 * 1024, "VmRSS grew by %ld KiB", end);
}

/* free leaves errno alone (POSIX.1-2024), and so does a call that
 * succeeds: through every tier, with large blocks given back to the OS on
 * the way (64 MiB ones, more than the cache keeps). */
TEST(free_and_successful_calls_leave_errno_alone) {
  static void *slot[64];
  unsigned s = 12345;
  long changed = 0;
  for (int i = 0; i < 20000; i++) {
    s = s * 1103515245u + 12345u;
    unsigned k = (s >> 8) % 64;
    size_t size = (s >> 20) % 4 == 0 ? (size_t)1 << ((s >> 12) % 27) : 16 + (s >> 16) % 2000;
    errno = EXDEV;
    const char *call;
    if (slot[k] == NULL) {
      call = (s >> 4) % 3 == 0 ? "calloc" : (s >> 4) % 3 == 1 ? "malloc" : "aligned_alloc";
      slot[k] = call[0] == 'c' ? calloc(1, size) : call[0] == 'm' ? malloc(size) : aligned_alloc(4096, size);
      REQUIRE(slot[k] != NULL);
    } else if ((s >> 3) % 3 == 0) {
      call = "realloc";
      REQUIRE((slot[k] = realloc(slot[k], size)) != NULL);
    } else {
      call = "free";
      free(slot[k]);
      slot[k] = NULL;
    }
    if (errno != EXDEV && changed++ == 0) fprintf(stderr, "    %s at step %d set errno %d\n", call, i, errno);
  }
  for (int k = 0; k < 64; k++) {
    errno = EXDEV;
    free(slot[k]);
    if (errno != EXDEV) changed++;
  }
  CHECK_MSG(changed == 0, "%ld calls changed errno", changed);
}

/* Pages the program locked (mlockall) refuse madvise's purge: blocks freed
 * in them and purged after the delay (100 ms) must still come back from
 * calloc as zeros. Needs CAP_IPC_LOCK or a locked-memory limit above the
 * process's size. */
TEST(calloc_is_zero_in_memory_the_program_locked) {
  enum { N = 200, SIZE = 20000 };
  static unsigned char *p[N];
  for (int i = 0; i < N; i++) {
    REQUIRE((p[i] = malloc(SIZE)) != NULL);
    memset(p[i], 0xAB, SIZE);
  }
  REQUIRE(mlockall(MCL_CURRENT) == 0);
  for (int i = 0; i < N; i++) free(p[i]);
  usleep(300000);
  int dirty = 0;
  for (int i = 0; i < N; i++) {
    unsigned char *q = calloc(1, SIZE);
    REQUIRE(q != NULL);
    dirty += first_nonzero(q, SIZE) != SIZE;
  }
  munlockall();
  CHECK_MSG(dirty == 0, "%d of %d calloc'd blocks not zero", dirty, N);
}

/* A program that locks its memory (mlockall) gets what its blocks use
 * faulted in and locked: not their whole chunks of the large arena (2 MiB
 * each), nor the arena's whole reservation (64 GiB: the kernel killed it,
 * or the timeout did). Needs CAP_IPC_LOCK or a locked-memory limit above
 * the process's size. */
TEST_T(a_program_that_locks_its_memory_gets_only_its_blocks_locked, 10) {
  enum { N = 8, MIB = 1 << 20 };
  static unsigned char *p[2 * N];
  for (int i = 0; i < N; i++) { /* locked by MCL_CURRENT */
    REQUIRE((p[i] = malloc(MIB)) != NULL);
    memset(p[i], 1, MIB);
  }
  REQUIRE(mlockall(MCL_CURRENT | MCL_FUTURE) == 0);
  long before = th_vm_rss_kib();
  for (int i = N; i < 2 * N; i++) { /* locked by MCL_FUTURE */
    REQUIRE((p[i] = malloc(i % 2 ? 300 << 10 : MIB)) != NULL);
    p[i][0] = 1;
  }
  long grown = th_vm_rss_kib() - before;
  for (int i = 0; i < 2 * N; i++) free(p[i]);
  munlockall();
  printf("    %ld KiB resident, then %ld KiB more\n", before, grown);
  /* the pages of the blocks (N / 2 of 300 KiB, N / 2 of 1 MiB), not
   * their whole 2 MiB chunks (N * 2 MiB) */
  CHECK_MSG(before < 256 << 10 && grown < N / 2 * (300 + 1024) + 1024,
            "%ld KiB resident, then %ld KiB more", before, grown);
}

static void *malloc_small_blocks(void *arg) {
  void **p = arg;
  for (int i = 0; p != NULL && i < 64; i++) p[i] = malloc(48);
  return NULL;
}

/* A thread started after mlockall(MCL_FUTURE) takes a new segment, whose
 * pages the kernel faults in as they become accessible: only those the
 * thread's slab uses are, not the segment's 4 MiB. Needs CAP_IPC_LOCK, as
 * the test above. */
TEST_T(a_thread_started_after_mlockall_has_only_the_slabs_it_uses_locked, 10) {
  static void *p[64];
  /* a program with threads frees a block: the purger starts now, its
   * stack unlocked */
  th_run_on_small_stack(malloc_small_blocks, NULL);
  void *block = malloc(1 << 20);
  REQUIRE(block != NULL);
  memset(block, 1, 1 << 20);
  free(block);
  REQUIRE(mlockall(MCL_FUTURE) == 0);
  long before = th_vm_rss_kib();
  th_run_on_small_stack(malloc_small_blocks, p);
  long grown = th_vm_rss_kib() - before;
  munlockall();
  for (int i = 0; i < 64; i++) {
    CHECK(p[i] != NULL);
    free(p[i]);
  }
  /* a 64 KiB unit, the thread's stack and its heap */
  printf("    %ld KiB more resident\n", grown);
  CHECK_MSG(grown < 1024, "%ld KiB more resident", grown);
}

static void *malloc_and_free_blocks(void *arg) {
  enum { N = 20000 };
  static void *p[N];
  for (int i = 0; i < N; i++) memset(p[i] = malloc(64), 1, 64);
  for (int i = 0; i < N; i++) free(p[i]);
  return arg;
}

/* Purges under mlockall(MCL_FUTURE), where madvise refuses locked pages:
 * a thread's segment, empty when it exits, gives its pages back after the
 * delay (100 ms), and its units never used stay out of memory; they were
 * mapped again and faulted in whole, 4 MiB. Needs CAP_IPC_LOCK, as above. */
TEST_T(a_segment_purged_under_mlockall_gives_its_pages_back, 10) {
  if (dlsym(RTLD_DEFAULT, "hak_malloc") == NULL) SKIP("glibc's malloc keeps a freed heap's pages");
  th_run_on_small_stack(malloc_small_blocks, NULL);
  REQUIRE(mlockall(MCL_FUTURE) == 0);
  long before = th_vm_rss_kib();
  th_run_on_small_stack(malloc_and_free_blocks, NULL);
  long used = th_vm_rss_kib() - before;
  usleep(600 * 1000);
  long grown = th_vm_rss_kib() - before;
  munlockall();
  printf("    %ld KiB more resident, %ld after the purge\n", used, grown);
  CHECK_MSG(used > 1024 && grown < 1024, "%ld KiB more resident, %ld after the purge", used, grown);
}

/* ---------- glibc's other names ---------- */

/* A program may call the malloc family by glibc's other names: each one that
 * glibc exports must come from the library malloc comes from, or a block
 * would go to the wrong allocator. (cfree glibc keeps for old binaries
 * only, where dlsym does not find it.) */
TEST(glibcs_other_names_come_from_the_library_of_malloc) {
  static const char *const names[] = {
      "free",           "calloc",          "realloc",        "reallocarray",
      "memalign",       "posix_memalign",  "aligned_alloc",  "valloc",
      "pvalloc",        "malloc_usable_size", "mallinfo",    "mallinfo2",
      "mallopt",        "malloc_trim",     "malloc_stats",   "malloc_info",
      "cfree",          "__libc_malloc",   "__libc_free",    "__libc_calloc",
      "__libc_realloc", "__libc_memalign", "__libc_valloc",  "__libc_pvalloc",
      "__libc_mallinfo", "__libc_mallopt"};
  Dl_info of_malloc;
  REQUIRE(dladdr(dlsym(RTLD_DEFAULT, "malloc"), &of_malloc) != 0);
  bool malloc_is_glibcs = strstr(of_malloc.dli_fname, "libc.so") != NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *f = dlsym(RTLD_DEFAULT, names[i]);
    Dl_info of_f;
    if (f == NULL) {
      CHECK_MSG(malloc_is_glibcs && strcmp(names[i], "cfree") == 0, "%s not found", names[i]);
      continue;
    }
    REQUIRE(dladdr(f, &of_f) != 0);
    CHECK_MSG(of_f.dli_fbase == of_malloc.dli_fbase, "%s is from %s, malloc from %s", names[i],
              of_f.dli_fname, of_malloc.dli_fname);
  }
  /* and their blocks are malloc's */
  void *(*libc_valloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "__libc_valloc");
  void *(*libc_pvalloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "__libc_pvalloc");
  REQUIRE(libc_valloc != NULL && libc_pvalloc != NULL);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *v = libc_valloc(100), *pv = libc_pvalloc(100);
  REQUIRE(v != NULL && pv != NULL);
  CHECK(aligned_to(v, page) && aligned_to(pv, page));
  CHECK(malloc_usable_size(v) >= 100 && malloc_usable_size(pv) >= page);
  free(v);
  free(pv);
}

TEST_MAIN("api")
