/* The hak_* prefixed API (include/hakmem.h), C23 free_sized /
 * free_aligned_sized, statistics, hak_collect and hak_version. */
#include "harness.h"
#include "blocks.h"
#include "hakmem.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* C23; glibc 2.36 has neither, so these must come from hakmem. Weak so the
 * suite still links (and reports a clear failure) if they are missing. */
void free_sized(void *p, size_t size) __attribute__((weak));
void free_aligned_sized(void *p, size_t alignment, size_t size) __attribute__((weak));

/* ---------- hak_malloc / hak_free / hak_usable_size ---------- */

TEST(hak_malloc_aligned_usable_and_writable_0_to_2MiB) {
  for (size_t s = 0; s <= (2u << 20); s = next_size(s)) {
    unsigned char *p = hak_malloc(s);
    REQUIRE(p != NULL);
    CHECK_MSG(aligned_to(p, 16), "hak_malloc(%zu) = %p", s, (void *)p);
    size_t us = hak_usable_size(p);
    CHECK_MSG(us >= s, "hak_usable_size(hak_malloc(%zu)) = %zu", s, us);
    memset(p, 0x5c, us);
    hak_free(p);
  }
}

TEST(hak_malloc_zero_unique_and_hak_free_null) {
  void *a = hak_malloc(0), *b = hak_malloc(0);
  CHECK(a != NULL && b != NULL && a != b);
  hak_free(a);
  hak_free(b);
  hak_free(NULL);
  CHECK(hak_usable_size(NULL) == 0);
}

TEST(hak_malloc_huge_fails_with_enomem_then_recovers) {
  size_t bad[] = {SIZE_MAX, SIZE_MAX - 1, (size_t)PTRDIFF_MAX + 1, SIZE_MAX / 2 + 7,
                  (size_t)1 << 62};
  for (unsigned i = 0; i < 5; i++) {
    errno = 0;
    void *p = hak_malloc(opaque(bad[i]));
    CHECK_MSG(p == NULL, "hak_malloc(%zu) = %p", bad[i], p);
    CHECK_MSG(errno == ENOMEM, "hak_malloc(%zu): errno %d", bad[i], errno);
  }
  void *p = hak_malloc(4000);
  CHECK(p != NULL);
  hak_free(p);
}

TEST(hak_and_std_names_are_the_same_allocator) {
  size_t sizes[] = {1, 100, 5000, 300000, 5u << 20};
  for (unsigned i = 0; i < 5; i++) {
    unsigned char *p = hak_malloc(sizes[i]);
    REQUIRE(p);
    CHECK(hak_usable_size(p) == malloc_usable_size(p));
    fill(p, sizes[i], i);
    unsigned char *q = realloc(p, sizes[i] * 2); /* std realloc of a hak block */
    REQUIRE(q);
    CHECK(verify(q, sizes[i], i) == sizes[i]);
    free(q);
    p = malloc(sizes[i]);
    REQUIRE(p);
    CHECK(hak_usable_size(p) == malloc_usable_size(p));
    fill(p, sizes[i], i);
    q = hak_realloc(p, sizes[i] + 1);
    REQUIRE(q);
    CHECK(verify(q, sizes[i], i) == sizes[i]);
    hak_free(q);
  }
}

/* ---------- hak_calloc ---------- */

TEST(hak_calloc_zeroes_fresh_and_reused_dirty_blocks) {
  size_t sizes[] = {1, 16, 48, 1000, 4096, 30000, 65536, 200000, 1u << 20, 9u << 20, 40u << 20};
  for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t s = sizes[i];
    for (int r = 0; r < 3; r++) {
      unsigned char *d = hak_malloc(s);
      REQUIRE(d);
      memset(d, 0xAA, hak_usable_size(d));
      hak_free(d);
      unsigned char *p = hak_calloc(1, s);
      REQUIRE(p);
      size_t z = first_nonzero(p, s);
      CHECK_MSG(z == s, "hak_calloc(1,%zu) after dirty free (round %d): byte %zu nonzero", s, r, z);
      hak_free(p);
    }
  }
}

TEST(hak_calloc_overflow_fails_with_enomem) {
  size_t c[][2] = {{SIZE_MAX, 2}, {(size_t)1 << 32, (size_t)1 << 32}, {65537, 281470681808897ull},
                   {SIZE_MAX / 8 + 1, 8}};
  for (unsigned i = 0; i < 4; i++) {
    errno = 0;
    void *p = hak_calloc(opaque(c[i][0]), opaque(c[i][1]));
    CHECK_MSG(p == NULL, "hak_calloc(%zu,%zu) = %p", c[i][0], c[i][1], p);
    CHECK_MSG(errno == ENOMEM, "hak_calloc(%zu,%zu): errno %d", c[i][0], c[i][1], errno);
  }
}

/* ---------- hak_realloc / hak_reallocarray ---------- */

TEST(hak_realloc_null_and_zero) {
  size_t before = in_use_bytes();
  void *p = hak_realloc(NULL, 100);
  REQUIRE(p);
  CHECK(hak_usable_size(p) >= 100);
  void *q = hak_realloc(p, 0);
  hak_free(q); /* NULL or freeable */
  for (int i = 0; i < 1000; i++) {
    p = hak_malloc(1u << 20);
    REQUIRE(p);
    hak_free(hak_realloc(p, 0));
  }
  CHECK_MSG(in_use_bytes() < before + 4096, "%zu bytes still in use", in_use_bytes() - before);
}

TEST(hak_realloc_preserves_contents_across_tiers) {
  size_t t[] = {16, 1024, 64 * 1024, 1u << 20, 64u << 20};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++) {
      if (a == b) continue;
      unsigned char *p = hak_malloc(t[a]);
      REQUIRE(p);
      fill(p, t[a], (unsigned)(a + 5 * b));
      unsigned char *q = hak_realloc(p, t[b]);
      REQUIRE(q);
      size_t keep = t[a] < t[b] ? t[a] : t[b];
      size_t bad = verify(q, keep, (unsigned)(a + 5 * b));
      CHECK_MSG(bad == keep, "hak_realloc %zu -> %zu: byte %zu lost", t[a], t[b], bad);
      CHECK(hak_usable_size(q) >= t[b]);
      hak_free(q);
    }
}

TEST(hak_realloc_failure_keeps_block) {
  unsigned char *p = hak_malloc(500);
  REQUIRE(p);
  fill(p, 500, 1);
  errno = 0;
  void *q = hak_realloc(launder(p), opaque(SIZE_MAX - 16));
  CHECK(q == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  CHECK(verify(p, 500, 1) == 500);
  hak_free(p);
}

TEST(hak_reallocarray_overflow_and_growth) {
  unsigned char *p = hak_reallocarray(NULL, 20, 5);
  REQUIRE(p);
  fill(p, 100, 2);
  errno = 0;
  void *q = hak_reallocarray(launder(p), opaque(SIZE_MAX / 4), opaque(5));
  CHECK(q == NULL);
  CHECK_MSG(errno == ENOMEM, "errno %d", errno);
  CHECK(verify(p, 100, 2) == 100);
  q = hak_reallocarray(launder(p), 3000, 7);
  REQUIRE(q);
  CHECK(verify(q, 100, 2) == 100);
  CHECK(hak_usable_size(q) >= 21000);
  hak_free(q);
}

/* ---------- hak_aligned_alloc / hak_posix_memalign ---------- */

TEST(hak_aligned_alloc_every_power_of_two_to_1GiB) {
  for (int lg = 0; lg <= 30; lg++) {
    size_t a = (size_t)1 << lg;
    size_t sizes[] = {1, 3 * 1000 + 7, a};
    int n = a <= (4u << 20) ? 3 : 2;
    for (int k = 0; k < n; k++) {
      unsigned char *p = hak_aligned_alloc(a, sizes[k]);
      CHECK_MSG(p != NULL, "hak_aligned_alloc(%zu, %zu) = NULL", a, sizes[k]);
      if (!p) continue;
      CHECK_MSG(aligned_to(p, a), "hak_aligned_alloc(%zu, %zu) = %p", a, sizes[k], (void *)p);
      CHECK(hak_usable_size(p) >= sizes[k]);
      memset(p, 0x44, sizes[k]);
      hak_free(p);
    }
  }
}

TEST(hak_aligned_alloc_bad_alignment_einval) {
  size_t bad[] = {0, 3, 24, 48, 100, 4095, (size_t)3 << 20, SIZE_MAX};
  for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
    errno = 0;
    void *p = hak_aligned_alloc(opaque(bad[i]), 64);
    CHECK_MSG(p == NULL, "hak_aligned_alloc(%zu, 64) = %p", bad[i], p);
    CHECK_MSG(errno == EINVAL, "hak_aligned_alloc(%zu, 64): errno %d", bad[i], errno);
    hak_free(p);
  }
  errno = 0;
  void *p = hak_aligned_alloc(64, opaque(SIZE_MAX - 32));
  CHECK(p == NULL);
  CHECK_MSG(errno == ENOMEM, "huge hak_aligned_alloc: errno %d", errno);
}

TEST(hak_posix_memalign_einval_enomem_and_success) {
  size_t bad[] = {0, 3, 24, sizeof(void *) / 2, 1, 40};
  for (unsigned i = 0; i < 6; i++) {
    void *p = (void *)0x1;
    int rc = hak_posix_memalign(&p, opaque(bad[i]), 64);
    CHECK_MSG(rc == EINVAL, "hak_posix_memalign(align %zu) = %d", bad[i], rc);
  }
  void *p = NULL;
  int rc = hak_posix_memalign(&p, 64, opaque(SIZE_MAX / 2));
  CHECK_MSG(rc == ENOMEM, "hak_posix_memalign(64, SIZE_MAX/2) = %d", rc);
  for (size_t a = sizeof(void *); a <= (1u << 24); a *= 4) {
    p = NULL;
    rc = hak_posix_memalign(&p, a, 777);
    CHECK_MSG(rc == 0 && p && aligned_to(p, a), "hak_posix_memalign(%zu, 777) = %d, %p", a, rc, p);
    if (rc == 0) {
      memset(p, 1, 777);
      hak_free(p);
    }
  }
}

/* ---------- free_sized / free_aligned_sized ---------- */

/* Each free below must release its block: what stays in use afterwards is
 * at most a page (the harness's own buffers). */
static void check_all_released(size_t before, const char *what) {
  size_t after = in_use_bytes();
  CHECK_MSG(after < before + 4096, "%s: %zu bytes still in use", what, after - before);
}

TEST(free_sized_exported_and_accepts_every_size) {
  REQUIRE(free_sized != NULL);  /* hakmem must export C23 free_sized */
  REQUIRE(free_aligned_sized != NULL);
  size_t before = in_use_bytes();
  /* Alloc/free many rounds with the exact requested size: if the size were
   * misused (wrong class), the allocator would hand out overlapping blocks. */
  enum { N = 600 };
  static unsigned char *p[N];
  static size_t sz[N];
  for (int round = 0; round < 3; round++) {
    int n = 0;
    for (size_t s = 0; s <= (3u << 20) && n < N; s = next_size(s)) {
      sz[n] = s;
      p[n] = malloc(s);
      REQUIRE(p[n]);
      memset(p[n], n & 0xff, s);
      n++;
    }
    for (int i = 0; i < n; i++) {
      for (size_t j = 0; j < sz[i]; j++)
        if (p[i][j] != (unsigned char)(i & 0xff)) {
          CHECK_MSG(0, "round %d block %d (%zu B) byte %zu clobbered", round, i, sz[i], j);
          break;
        }
      free_sized(p[i], sz[i]);
    }
  }
  free_sized(NULL, 0);
  free_sized(NULL, 100);
  check_all_released(before, "free_sized");
}

TEST(free_sized_for_calloc_and_realloc_blocks) {
  REQUIRE(free_sized != NULL);
  size_t before = in_use_bytes();
  for (int i = 0; i < 2000; i++) {
    size_t n = 1 + (size_t)i % 37, m = 1 + (size_t)i % 300;
    void *p = calloc(n, m);
    REQUIRE(p);
    free_sized(p, n * m);
    p = malloc(m);
    REQUIRE(p);
    p = realloc(p, m * 50);
    REQUIRE(p);
    memset(p, 3, m * 50);
    free_sized(p, m * 50);
  }
  check_all_released(before, "free_sized of calloc and realloc blocks");
}

TEST(free_aligned_sized_for_aligned_alloc_blocks) {
  REQUIRE(free_aligned_sized != NULL);
  size_t before = in_use_bytes();
  for (int rep = 0; rep < 20; rep++)
    for (int lg = 0; lg <= 22; lg++) {
      size_t a = (size_t)1 << lg, s = a * 2 + (size_t)rep;
      void *p = aligned_alloc(a, s);
      REQUIRE(p);
      CHECK(aligned_to(p, a));
      memset(p, rep, s);
      free_aligned_sized(p, a, s);
    }
  free_aligned_sized(NULL, 64, 0);
  check_all_released(before, "free_aligned_sized");
}

TEST(hak_free_sized_accepts_requested_sizes) {
  size_t before = in_use_bytes();
  for (int rep = 0; rep < 3; rep++)
    for (size_t s = 0; s <= (2u << 20); s = next_size(s)) {
      void *p = hak_malloc(s);
      REQUIRE(p);
      memset(p, 9, s);
      hak_free_sized(p, s);
    }
  hak_free_sized(NULL, 0);
  check_all_released(before, "hak_free_sized");
}

/* ---------- statistics, collect, version ---------- */

TEST(hak_stats_fields_sane_with_64MiB_live) {
  hak_stats_t before, live;
  memset(&before, 0xff, sizeof before);
  hak_stats_get(&before);
  char *big = hak_malloc(64u << 20);
  REQUIRE(big);
  memset(big, 1, 64u << 20);
  enum { N = 32768 };
  static void *small[N];
  for (int i = 0; i < N; i++) { /* 32 MiB of 1 KiB blocks */
    small[i] = hak_malloc(1024);
    REQUIRE(small[i]);
    memset(small[i], 2, 1024);
  }
  memset(&live, 0xff, sizeof live);
  hak_stats_get(&live);
  long rss_kib = th_vm_rss_kib();
  printf("    mapped %zu MiB, peak %zu MiB, committed %zu MiB, os_mapped_total %zu MiB, "
         "rss %zu MiB (VmRSS %ld MiB), rss_peak %zu MiB, segments %zu, large_live %zu\n",
         live.mapped >> 20, live.mapped_peak >> 20, live.committed >> 20,
         live.os_mapped_total >> 20, live.rss >> 20, rss_kib >> 10, live.rss_peak >> 20,
         live.segments, live.large_live);
  size_t want = 96u << 20;
  CHECK_MSG(live.mapped >= want, "mapped %zu < %zu with 96 MiB live", live.mapped, want);
  CHECK_MSG(live.mapped < ((size_t)8 << 30), "mapped %zu absurd", live.mapped);
  CHECK_MSG(live.mapped_peak >= live.mapped, "mapped_peak %zu < mapped %zu", live.mapped_peak,
            live.mapped);
  CHECK_MSG(live.os_mapped_total >= live.mapped, "os_mapped_total %zu < mapped %zu",
            live.os_mapped_total, live.mapped);
  CHECK_MSG(live.committed <= live.mapped, "committed %zu > mapped %zu", live.committed,
            live.mapped);
  CHECK_MSG(live.rss >= want, "rss %zu < %zu with 96 MiB touched", live.rss, want);
  long diff = (long)(live.rss >> 10) - rss_kib;
  CHECK_MSG(diff < 32 * 1024 && diff > -32 * 1024, "rss %zu KiB vs VmRSS %ld KiB",
            live.rss >> 10, rss_kib);
  CHECK_MSG(live.rss_peak > 0 && live.rss_peak + (8u << 20) >= live.rss,
            "rss_peak %zu < rss %zu (units?)", live.rss_peak, live.rss);
  CHECK_MSG(live.os_mapped_total >= before.os_mapped_total, "os_mapped_total went down");
  CHECK_MSG(live.mapped_peak >= before.mapped_peak, "mapped_peak went down");
  for (int i = 0; i < N; i++) hak_free(small[i]);
  hak_free(big);
  hak_stats_t after;
  hak_stats_get(&after);
  CHECK_MSG(after.mapped_peak >= live.mapped, "mapped_peak %zu forgot %zu", after.mapped_peak,
            live.mapped);
}

TEST(hak_collect_force_returns_freed_memory) {
  hak_stats_t live, after;
  long rss0 = th_vm_rss_kib();
  char *big = hak_malloc(64u << 20);
  REQUIRE(big);
  memset(big, 1, 64u << 20);
  enum { N = 16384 };
  static void *small[N];
  for (int i = 0; i < N; i++) {
    small[i] = hak_malloc(2048);
    REQUIRE(small[i]);
    memset(small[i], 2, 2048);
  }
  hak_stats_get(&live);
  long rss_live = th_vm_rss_kib();
  for (int i = 0; i < N; i++) hak_free(small[i]);
  hak_free(big);
  hak_collect(true);
  hak_stats_get(&after);
  long rss_after = th_vm_rss_kib();
  printf("    VmRSS: start %ld, live %ld, after collect %ld KiB; mapped %zu -> %zu MiB, "
         "committed %zu -> %zu MiB, os_returned %zu -> %zu MiB\n",
         rss0, rss_live, rss_after, live.mapped >> 20, after.mapped >> 20, live.committed >> 20,
         after.committed >> 20, live.os_returned >> 20, after.os_returned >> 20);
  /* 96 MiB were freed; force-collect must give back at least the 64 MiB block. */
  CHECK_MSG(rss_live - rss_after >= 56 * 1024, "VmRSS dropped only %ld KiB after hak_collect(true)",
            rss_live - rss_after);
  size_t dm = live.mapped > after.mapped ? live.mapped - after.mapped : 0;
  size_t dc = live.committed > after.committed ? live.committed - after.committed : 0;
  CHECK_MSG(dm >= (56u << 20) || dc >= (56u << 20),
            "neither mapped (-%zu) nor committed (-%zu) dropped by 56 MiB", dm, dc);
  CHECK_MSG(after.os_returned - live.os_returned >= (56u << 20),
            "os_returned grew only %zu", after.os_returned - live.os_returned);
  /* Allocation still works after collect. */
  void *p = hak_malloc(1000), *q = hak_malloc(5u << 20);
  CHECK(p && q);
  hak_free(p);
  hak_free(q);
}

TEST(hak_collect_keeps_live_blocks_intact) {
  enum { N = 5000 };
  static unsigned char *p[N];
  static size_t sz[N];
  for (int i = 0; i < N; i++) {
    sz[i] = 1 + (size_t)(i * 7919) % (i % 50 == 0 ? 600000 : 3000);
    p[i] = hak_malloc(sz[i]);
    REQUIRE(p[i]);
    fill(p[i], sz[i], (unsigned)i);
  }
  for (int i = 0; i < N; i += 2) { /* free half: slabs become partially empty */
    hak_free(p[i]);
    p[i] = NULL;
  }
  hak_collect(false);
  hak_collect(true);
  for (int i = 1; i < N; i += 2) {
    size_t bad = verify(p[i], sz[i], (unsigned)i);
    CHECK_MSG(bad == sz[i], "block %d (%zu B) byte %zu changed by hak_collect", i, sz[i], bad);
    hak_free(p[i]);
  }
  hak_collect(true);
  hak_collect(true);
  void *x = hak_malloc(123);
  CHECK(x != NULL);
  hak_free(x);
}

static void *collect_thread(void *arg) {
  for (int i = 0; i < 200; i++) {
    void *p = hak_malloc(100 + (size_t)i * 10);
    if (!p) return (void *)1;
    memset(p, 1, 100);
    hak_collect(i % 10 == 0);
    hak_free(p);
  }
  return NULL;
}

TEST(hak_collect_concurrent_with_allocating_threads) {
  pthread_t t[4];
  for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&t[i], NULL, collect_thread, NULL) == 0);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    CHECK(r == NULL);
  }
}

TEST(hak_stats_print_reports_to_stderr) {
  char path[] = "/tmp/hakstatsXXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  unlink(path);
  void *p = hak_malloc(1000);
  int saved = dup(2);
  fflush(stderr);
  dup2(fd, 2);
  hak_stats_print();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  hak_free(p);
  off_t len = lseek(fd, 0, SEEK_END);
  CHECK_MSG(len > 0, "hak_stats_print wrote nothing to stderr");
  char buf[8192] = {0};
  pread(fd, buf, sizeof buf - 1, 0);
  close(fd);
  CHECK_MSG(strstr(buf, "hakmem") != NULL, "report lacks \"hakmem\": %.200s", buf);
}

TEST(hak_version_names_hakmem_and_header_version) {
  const char *v = hak_version();
  REQUIRE(v != NULL);
  CHECK(strlen(v) > 0);
  printf("    version: %s\n", v);
  CHECK_MSG(strncmp(v, "hakmem ", 7) == 0, "version \"%s\" does not start with \"hakmem \"", v);
  char want[32];
  snprintf(want, sizeof want, " %d.%d.", HAKMEM_VERSION_MAJOR, HAKMEM_VERSION_MINOR);
  CHECK_MSG(strstr(v, want) != NULL, "version \"%s\" lacks \"%s\"", v, want);
  CHECK(hak_version() == v || strcmp(hak_version(), v) == 0);
}

TEST_MAIN("hakapi")
