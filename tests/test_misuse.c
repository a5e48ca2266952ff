/* Misuse: frees of pointers hakmem never returned, and double frees. Each
 * misuse runs in a forked child whose stderr goes to a pipe; the child must
 * die by SIGABRT and its stderr must contain the exact line
 *   hakmem: invalid free of 0x...     or     hakmem: double free of 0x...
 * with the address printed by %p. The child reports the address it is about
 * to misuse through a second pipe before doing it. */
#include "harness.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>

static char global_buf[256] __attribute__((aligned(64)));

typedef void (*misuse_fn)(int addr_fd);

/* Tells the parent which address the message must name. */
static void announce(int fd, const void *p) {
  char buf[64];
  int n = snprintf(buf, sizeof buf, "%p", p);
  (void)!write(fd, buf, (size_t)n);
  close(fd);
}

static size_t read_all(int fd, char *buf, size_t cap) {
  size_t n = 0;
  for (;;) {
    if (n + 1 >= cap) break;
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  buf[n] = 0;
  return n;
}

/* Does the misuse in a child; checks SIGABRT and the exact stderr line
 * "<prefix><address announced by the child>". */
static void expect_abort(misuse_fn fn, const char *prefix) {
  int errp[2], addrp[2];
  REQUIRE(pipe(errp) == 0 && pipe(addrp) == 0);
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(errp[0]);
    close(addrp[0]);
    dup2(errp[1], 2);
    close(errp[1]);
    alarm(10); /* a corrupted free list may loop: count it as a failure */
    fn(addrp[1]);
    fprintf(stderr, "(misuse was not detected: the child went on)\n");
    _exit(0);
  }
  close(errp[1]);
  close(addrp[1]);
  char err[8192], addr[64];
  read_all(errp[0], err, sizeof err);
  read_all(addrp[0], addr, sizeof addr);
  close(errp[0]);
  close(addrp[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  char want[128];
  snprintf(want, sizeof want, "%s%s", prefix, addr);
  /* the exact line: at the start of stderr or after a newline, then a newline */
  int found = 0;
  for (const char *s = err; (s = strstr(s, want)) != NULL; s++)
    if ((s == err || s[-1] == '\n') && (s[strlen(want)] == '\n' || s[strlen(want)] == 0)) found = 1;
  CHECK_MSG(addr[0] != 0, "the child did not report an address");
  CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
            "child %s (status 0x%x), want SIGABRT", WIFSIGNALED(status) ? "killed by a signal" : "exited",
            status);
  if (WIFSIGNALED(status) && WTERMSIG(status) != SIGABRT)
    fprintf(stderr, "    (signal %d)\n", WTERMSIG(status));
  CHECK_MSG(found, "stderr lacks the line \"%s\"; stderr was: \"%.300s\"", want, err);
}

#define INVALID "hakmem: invalid free of "
#define DOUBLE "hakmem: double free of "

/* ---- invalid frees ---- */

static void do_free_stack(int fd) {
  char local[64];
  memset(local, 1, sizeof local);
  __asm__ volatile("" ::"r"(local) : "memory");
  void *p = &local[16];
  announce(fd, p);
  free(p);
}
TEST(free_of_stack_address_aborts) { expect_abort(do_free_stack, INVALID); }

static void do_free_interior16(int fd) {
  char *p = malloc(64);
  REQUIRE(p);
  memset(p, 1, 64);
  announce(fd, p + 16);
  free(p + 16);
}
TEST(free_of_interior_pointer_p16_of_64B_block_aborts) { expect_abort(do_free_interior16, INVALID); }

static void do_free_interior8(int fd) {
  char *p = malloc(64);
  REQUIRE(p);
  announce(fd, p + 8);
  free(p + 8);
}
TEST(free_of_interior_pointer_p8_of_64B_block_aborts) { expect_abort(do_free_interior8, INVALID); }

static void do_free_misaligned(int fd) {
  char *p = malloc(64);
  REQUIRE(p);
  announce(fd, p + 1);
  free(p + 1);
}
TEST(free_of_misaligned_pointer_p1_aborts) { expect_abort(do_free_misaligned, INVALID); }

static void do_free_interior_large(int fd) {
  char *p = malloc(1 << 20);
  REQUIRE(p);
  announce(fd, p + 4096);
  free(p + 4096);
}
TEST(free_of_interior_pointer_of_1MiB_block_aborts) { expect_abort(do_free_interior_large, INVALID); }

/* One page past a 4 MiB boundary inside a large block: where a block after
 * a header would start, in a chunk of the block's body. */
static void do_free_large_body_chunk(int fd) {
  char *p = malloc(16 << 20);
  REQUIRE(p);
  uintptr_t m = ((uintptr_t)4 << 20) - 1;
  char *q = (char *)((((uintptr_t)p + m) & ~m) + 4096);
  announce(fd, q);
  free(q);
}
TEST(free_of_pointer_in_a_large_block_body_chunk_aborts) {
  expect_abort(do_free_large_body_chunk, INVALID);
}

static void do_free_mmap(int fd) {
  void *m = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(m != MAP_FAILED);
  announce(fd, m);
  free(m);
}
TEST(free_of_mmap_pointer_aborts) { expect_abort(do_free_mmap, INVALID); }

static void do_free_global(int fd) {
  void *p = &global_buf[64];
  announce(fd, p);
  free(p);
}
TEST(free_of_global_aborts) { expect_abort(do_free_global, INVALID); }

/* Slabs are runs of 64 KiB units in 4 MiB segments (docs/MEMORY.md). The
 * two pointers below are block-aligned, a multiple of the block size away
 * from a block, yet not blocks: free's fast path must see it too. */
#define SEG_SIZE ((uintptr_t)4 << 20)
#define UNIT_SIZE ((uintptr_t)64 << 10)

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return (x > y) - (x < y);
}

/* 48-byte blocks leave 16 bytes at the end of a unit. Among many blocks, p
 * is one whose block-size stride ends past a unit boundary where another
 * slab's block starts: p + 48 is past the end of p's slab. Freeing p first
 * gives its slab, full by then, back to the thread's queue, so that the
 * next free takes the fast path. */
static void do_free_past_last_block(int fd) {
  enum { N = 20000 };
  static uintptr_t ps[N];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = (uintptr_t)malloc(40)) != 0);
  qsort(ps, N, sizeof ps[0], cmp_ptr);
  uintptr_t bs = UINTPTR_MAX;
  for (int i = 1; i < N; i++)
    if (ps[i] - ps[i - 1] < bs) bs = ps[i] - ps[i - 1];
  REQUIRE(bs == 48);
  for (int i = 0; i + 1 < N; i++) {
    uintptr_t boundary = (ps[i] + bs + UNIT_SIZE - 1) & ~(UNIT_SIZE - 1);
    if (boundary > ps[i] + bs && boundary < ps[i] + 2 * bs && ps[i + 1] == boundary) {
      free((void *)ps[i]);
      announce(fd, (void *)(ps[i] + bs));
      free((void *)(ps[i] + bs));
      return;
    }
  }
  fprintf(stderr, "no slab end found among %d blocks\n", N);
  exit(1);
}
TEST(free_just_past_a_slabs_last_block_aborts) { expect_abort(do_free_past_last_block, INVALID); }

/* 64 bytes into a segment's header, which is a multiple of 64 bytes before
 * the first block of the segment's first slab. */
static void do_free_in_segment_header(int fd) {
  for (int i = 0; i < 200000; i++) {
    char *p = malloc(56); /* 64-byte blocks in the secure build too (8-byte canary) */
    REQUIRE(p);
    uintptr_t off = (uintptr_t)p & (SEG_SIZE - 1);
    if (off != 0 && off < UNIT_SIZE) {
      announce(fd, p - off + 64);
      free(p - off + 64);
      return;
    }
  }
  fprintf(stderr, "no block of a segment's first slab found\n");
  exit(1);
}
TEST(free_into_a_segment_header_aborts) { expect_abort(do_free_in_segment_header, INVALID); }

/* A block-aligned pointer to a block its slab has not carved yet: slabs
 * carve a page of blocks at a time, at least 4, and a 64 KiB slab holds 21
 * blocks of 3 KiB, p the first (no other test uses the class, so the
 * child's slab is a new one). */
static void do_free_not_handed_out(int fd) {
  char *p = malloc(3000);
  REQUIRE(p);
  size_t bs = malloc_usable_size(p); /* its class: 3 KiB */
  announce(fd, p + 5 * bs);
  free(p + 5 * bs);
}
TEST(free_of_a_block_not_handed_out_yet_aborts) { expect_abort(do_free_not_handed_out, INVALID); }

/* Blocks of 8 KiB to 1 MiB are runs of whole pages (spans), each starting
 * at a colour of its first page (a line in its first KiB) or at the page:
 * a pointer into a span's second page, and the first page after the last
 * span handed out (never used: no block freed there before). */
static void do_free_span_interior(int fd) {
  char *p = malloc(100000);
  REQUIRE(p);
  announce(fd, p + 4096);
  free(p + 4096);
}
TEST(free_of_a_page_inside_a_span_aborts) { expect_abort(do_free_span_interior, INVALID); }

static void do_free_past_spans(int fd) {
  char *p = malloc(200000);
  REQUIRE(p);
  size_t n = malloc_usable_size(p); /* 224 KiB, whole pages */
  announce(fd, p + n);
  free(p + n);
}
TEST(free_of_a_page_never_handed_out_in_a_span_segment_aborts) {
  expect_abort(do_free_past_spans, INVALID);
}

/* The start of the page of a span block at a colour, and the line after
 * a span block's start: where other blocks start, not this one. */
static void do_free_span_page_start(int fd) {
  char *p = NULL;
  for (int i = 0; i < 16 && (p == NULL || ((uintptr_t)p & 4095) == 0); i++) p = malloc(10000);
  REQUIRE(p && ((uintptr_t)p & 4095) != 0);
  char *s = (char *)((uintptr_t)p & ~(uintptr_t)4095);
  announce(fd, s);
  free(s);
}
TEST(free_of_the_page_start_of_a_span_at_a_colour_aborts) {
  expect_abort(do_free_span_page_start, INVALID);
}

static void do_free_span_next_line(int fd) {
  char *p = malloc(10000);
  REQUIRE(p);
  announce(fd, p + 64);
  free(p + 64);
}
TEST(free_of_the_line_after_a_span_start_aborts) { expect_abort(do_free_span_next_line, INVALID); }

static void do_realloc_stack(int fd) {
  char local[64];
  memset(local, 1, sizeof local);
  __asm__ volatile("" ::"r"(local) : "memory");
  void *p = &local[0];
  announce(fd, p);
  void *q = realloc(p, 100);
  fprintf(stderr, "realloc returned %p\n", q);
}
TEST(realloc_of_stack_address_aborts) { expect_abort(do_realloc_stack, INVALID); }

/* malloc_usable_size checks its pointer as free does: a slab block's
 * interior, a span's second page, memory not from malloc. */
static void usable_size_of(int fd, void *p) {
  announce(fd, p);
  fprintf(stderr, "malloc_usable_size returned %zu\n", malloc_usable_size(p));
}
static void do_usable_size_interior(int fd) {
  char *p = malloc(64);
  REQUIRE(p);
  usable_size_of(fd, p + 16);
}
static void do_usable_size_span_interior(int fd) {
  char *p = malloc(100000);
  REQUIRE(p);
  usable_size_of(fd, p + 4096);
}
static void do_usable_size_global(int fd) { usable_size_of(fd, global_buf); }
TEST(usable_size_of_interior_pointer_of_64B_block_aborts) {
  expect_abort(do_usable_size_interior, INVALID);
}
TEST(usable_size_of_a_page_inside_a_span_aborts) {
  expect_abort(do_usable_size_span_interior, INVALID);
}
TEST(usable_size_of_global_aborts) { expect_abort(do_usable_size_global, INVALID); }

/* ---- double frees ---- */

static void double_free(int fd, size_t size) {
  char *keep = malloc(size); /* the slab stays in use after the first free */
  char *p = malloc(size);
  REQUIRE(p && keep);
  memset(p, 0x5A, size < 4096 ? size : 4096);
  announce(fd, p);
  free(p);
  free(p);
}
/* A block of the second unit of a slab released since: 704-byte blocks
 * fill a first slab of one unit (at most 93), after which the class takes
 * slabs of 4 units (372 blocks); the second slab is released once all its
 * blocks are freed, the class's current slab being a third. */
static void do_double_free_released(int fd) {
  enum { N = 600 };
  static uintptr_t ps[N];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = (uintptr_t)malloc(700)) != 0);
  uintptr_t second = ps[150]; /* past the first slab */
  for (int i = 0; i < N; i++) free((void *)ps[i]);
  for (int i = 151; i < N; i++) {
    if (ps[i] - second >= UNIT_SIZE && ps[i] - second < 2 * UNIT_SIZE) {
      announce(fd, (void *)ps[i]);
      free((void *)ps[i]);
      return;
    }
  }
  fprintf(stderr, "no block one unit after another found\n");
  exit(1);
}
/* A span given back to the page heap: 40 KiB blocks, of which a thread's
 * cache holds one at first; the others go back as they are freed. */
static void do_double_free_span(int fd) {
  enum { N = 50 };
  char *ps[N];
  for (int i = 0; i < N; i++) REQUIRE((ps[i] = malloc(40000)) != NULL);
  for (int i = 0; i < N; i++) free(ps[i]);
  announce(fd, ps[25]);
  free(ps[25]);
}
/* The report's write is a cancellation point: a thread with a cancel
 * pending must abort there, not unwind and let the program go on. */
static atomic_int cancel_sent;
static void *double_free_with_cancel_pending(void *arg) {
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
  char *keep = malloc(32), *p = malloc(32); /* keep: the slab stays in use */
  REQUIRE(p && keep);
  announce((int)(intptr_t)arg, p);
  free(p);
  while (!atomic_load(&cancel_sent)) sched_yield();
  pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
  free(p);
  return NULL;
}
static void do_double_free_cancel_pending(int fd) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, double_free_with_cancel_pending, (void *)(intptr_t)fd) == 0);
  REQUIRE(pthread_cancel(t) == 0);
  atomic_store(&cancel_sent, 1);
  pthread_join(t, NULL);
}
static void do_double_free_small(int fd) { double_free(fd, 32); }
static void do_double_free_medium(int fd) { double_free(fd, 16384); }
static void do_double_free_large(int fd) { double_free(fd, 1 << 20); }
TEST(double_free_of_small_block_aborts) { expect_abort(do_double_free_small, DOUBLE); }
TEST(double_free_of_16KiB_block_aborts) { expect_abort(do_double_free_medium, DOUBLE); }
TEST(double_free_of_1MiB_block_aborts) { expect_abort(do_double_free_large, DOUBLE); }
/* The same where the freed block stays committed, its header with it: a
 * program that has had a second thread (its purges do not run in its
 * calls only, so its frees keep large blocks for the delay). */
static void *no_work(void *arg) { return arg; }
static void do_double_free_large_kept(int fd) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, no_work, NULL) == 0 && pthread_join(t, NULL) == 0);
  double_free(fd, 1 << 20);
}
TEST(double_free_of_a_kept_1MiB_block_aborts) { expect_abort(do_double_free_large_kept, DOUBLE); }
TEST(double_free_in_a_thread_with_a_cancel_pending_aborts) {
  expect_abort(do_double_free_cancel_pending, DOUBLE);
}
/* realloc of a freed large block, whose header went with its chunk's pages
 * at the free (a program of one thread that has mapped little) */
static void do_realloc_freed_large(int fd) {
  char *p = malloc(1 << 20);
  REQUIRE(p != NULL);
  free(p);
  announce(fd, p);
  char *q = realloc(p, 2 << 20);
  fprintf(stderr, "realloc returned %p\n", (void *)q);
}
TEST(realloc_of_freed_1MiB_block_aborts) { expect_abort(do_realloc_freed_large, DOUBLE); }
TEST(double_free_in_a_released_slabs_second_unit_aborts) {
  expect_abort(do_double_free_released, DOUBLE);
}
TEST(double_free_of_a_span_given_back_to_the_page_heap_aborts) {
  expect_abort(do_double_free_span, DOUBLE);
}

/* The harness itself must see a clean run: sanity of expect_abort. */
static void do_abort_plainly(int fd) {
  static char x;
  announce(fd, &x);
  fprintf(stderr, INVALID "%p\n", (void *)&x);
  abort();
}
TEST(harness_recognises_an_abort_with_the_message) { expect_abort(do_abort_plainly, INVALID); }

TEST_MAIN("misuse")
