/* glibc-compatible introspection and memory return: the numbers must move
 * by what the test allocates, and free memory must really leave RSS. */
#define _GNU_SOURCE /* unshare */
#include "harness.h"
#include "hakmem.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <sched.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/single_threaded.h>
#include <sys/wait.h>

/* The process's threads, or -1. */
static long threads_now(void) { return th_proc_status("Threads"); }

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The background purger starts (and allocates its thread's DTV) the first
 * time memory waits to be purged: start it before measuring deltas. */
static void start_background_purger(void) {
  free(malloc(1 << 20));
  sleep_ms(20);
}

TEST(mallinfo2_in_use_moves_by_the_allocated_bytes) {
  enum { N = 2000 };
  static void *ps[N];
  start_background_purger();
  struct mallinfo2 a = mallinfo2();
  for (int i = 0; i < N; i++) ps[i] = malloc(1000); /* 1 KiB class */
  struct mallinfo2 b = mallinfo2();
  CHECK_MSG(b.uordblks - a.uordblks == (size_t)N * 1024, "delta %zu", b.uordblks - a.uordblks);
  for (int i = 0; i < N; i++) free(ps[i]);
  struct mallinfo2 c = mallinfo2();
  CHECK_MSG(c.uordblks == a.uordblks, "in use %zu after free, %zu before", c.uordblks, a.uordblks);
  CHECK(c.fordblks >= (size_t)N * 1024 - 64 * 1024); /* still held, as free space */
}

/* Blocks of 64 KiB and more freed in a row wait in batches for other
 * threads' refills: free, not in use. */
TEST(mallinfo2_in_use_comes_back_after_page_sized_blocks_are_freed_in_a_row) {
  size_t sizes[] = {65536, 100000, 200000, 1000000};
  static void *ps[64];
  /* A first round starts the purger, whose thread keeps a block of glibc's
   * (its TLS vector). */
  for (int round = 0; round < 2; round++)
    for (unsigned k = 0; k < 4; k++) {
      struct mallinfo2 a = mallinfo2();
      for (int i = 0; i < 64; i++) REQUIRE((ps[i] = malloc(sizes[k])) != NULL);
      for (int i = 0; i < 64; i++) free(ps[i]);
      struct mallinfo2 c = mallinfo2();
      if (round == 1)
        CHECK_MSG(c.uordblks + c.hblkhd == a.uordblks + a.hblkhd,
                  "%zu B blocks: in use %zu after, %zu before", sizes[k], c.uordblks + c.hblkhd,
                  a.uordblks + a.hblkhd);
    }
}

TEST(mallinfo_counts_large_blocks) {
  struct mallinfo2 a = mallinfo2();
  void *p = malloc(10 << 20), *q = malloc(3 << 20);
  struct mallinfo2 b = mallinfo2();
  CHECK(b.hblks == a.hblks + 2);
  CHECK(b.hblkhd - a.hblkhd >= (13u << 20) && b.hblkhd - a.hblkhd < (13u << 20) + 65536);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  struct mallinfo old = mallinfo();
#pragma GCC diagnostic pop
  CHECK(old.hblks == (int)b.hblks);
  free(p);
  free(q);
  struct mallinfo2 c = mallinfo2();
  CHECK(c.hblks == a.hblks && c.hblkhd == a.hblkhd);
}

TEST(hak_stats_get_tracks_mapping) {
  hak_stats_t a, b;
  hak_stats_get(&a);
  void *p = malloc(64 << 20);
  hak_stats_get(&b);
  CHECK(b.mapped >= a.mapped + (64u << 20));
  CHECK(b.large_live == a.large_live + 1);
  CHECK(b.os_mapped_total >= a.os_mapped_total + (64u << 20));
  free(p);
}

TEST(malloc_info_writes_xml) {
  void *p = malloc(100);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  REQUIRE(f != NULL);
  CHECK(malloc_info(0, f) == 0);
  fclose(f);
  CHECK(strncmp(buf, "<malloc version=\"hakmem-1\">", 27) == 0);
  CHECK(strstr(buf, "<size from=\"97\" to=\"112\"") != NULL); /* the 100-byte block's class */
  CHECK(strstr(buf, "<system type=\"current\"") != NULL);
  CHECK(strstr(buf, "</malloc>\n") != NULL);
  CHECK(malloc_info(1, stdout) == -1 && errno == EINVAL);
  free(buf);
  free(p);
}

TEST(mallopt_accepts_common_parameters) {
  CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1);
  CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1);
  CHECK(mallopt(M_ARENA_MAX, 2) == 1);
  CHECK(mallopt(12345, 1) == 0);
}

TEST(malloc_stats_prints_glibc_layout_and_report) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  int saved = dup(2);
  dup2(fds[1], 2);
  malloc_stats();
  dup2(saved, 2);
  close(fds[1]);
  char buf[4096];
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = 0;
  CHECK(strstr(buf, "in use bytes") != NULL);
  CHECK(strstr(buf, "hakmem statistics") != NULL);
}

/* 256 MiB of small and mid blocks, all freed: RSS must come back down. */
static void **fill(size_t count, size_t size) {
  void **ps = malloc(count * sizeof *ps);
  for (size_t i = 0; i < count; i++) {
    ps[i] = malloc(size);
    memset(ps[i], 1, size);
  }
  return ps;
}
static void drain(void **ps, size_t count) {
  for (size_t i = 0; i < count; i++) free(ps[i]);
  free(ps);
}

TEST(malloc_trim_returns_freed_memory_now) {
  long start = th_vm_rss_kib();
  void **a = fill(400000, 300), **b = fill(8000, 20000);
  long full = th_vm_rss_kib();
  drain(a, 400000);
  drain(b, 8000);
  CHECK(malloc_trim(0) == 1);
  long after = th_vm_rss_kib();
  printf("    VmRSS: start %ld KiB, full %ld KiB, after free+trim %ld KiB\n", start, full, after);
  CHECK(full - start > 200 * 1024);
  CHECK_MSG(after - start < (full - start) / 20, "only %ld of %ld KiB returned",
            full - after, full - start);
}

TEST(hak_collect_force_returns_freed_memory_now) {
  long start = th_vm_rss_kib();
  void **a = fill(100000, 1000);
  long full = th_vm_rss_kib();
  drain(a, 100000);
  hak_collect(true);
  long after = th_vm_rss_kib();
  CHECK_MSG(after - start < (full - start) / 20, "start %ld full %ld after %ld", start, full,
            after);
}

/* The purge delay is honoured even when the program stops calling malloc.
 * Options are read at start-up, so this runs in a fresh process
 * (this binary with --purge-child) with the delay set. */
static int purge_child(void) {
  long start = th_vm_rss_kib();
  void **a = fill(200000, 600), **b = fill(4000, 30000);
  long full = th_vm_rss_kib();
  drain(a, 200000);
  drain(b, 4000);
  long just_freed = th_vm_rss_kib();
  sleep_ms(1200); /* no allocation from here on */
  long later = th_vm_rss_kib();
  printf("    VmRSS: start %ld, full %ld, just freed %ld, 1.2 s later %ld KiB (delay 200 ms)\n",
         start, full, just_freed, later);
  if (full - start < 150 * 1024) return 2;
  return later - start < (full - start) / 10 ? 0 : 1;
}

/* The same for threads that churn, free everything and then stay alive
 * without another call: what their heaps, span caches and kept large
 * blocks hold must go back too (slab blocks of 300 B, span blocks of 20 KiB
 * and large blocks of 1 MiB, freed in rounds so that the caches grow to
 * their bounds). */
enum { IDLE_THREADS = 4 };
static pthread_barrier_t idle_done, idle_release;
static void *churn_then_idle(void *arg) {
  for (int round = 0; round < 4; round++) {
    void **a = fill(40000, 300), **b = fill(1000, 20000), **c = fill(8, 1 << 20);
    drain(a, 40000);
    drain(b, 1000);
    drain(c, 8);
  }
  pthread_barrier_wait(&idle_done);
  pthread_barrier_wait(&idle_release); /* idle, alive, until the main thread has measured */
  return NULL;
}
static int idle_threads_child(void) {
  long start = th_vm_rss_kib();
  pthread_t t[IDLE_THREADS];
  pthread_barrier_init(&idle_done, NULL, IDLE_THREADS + 1);
  pthread_barrier_init(&idle_release, NULL, IDLE_THREADS + 1);
  for (int i = 0; i < IDLE_THREADS; i++)
    if (pthread_create(&t[i], NULL, churn_then_idle, NULL) != 0) return 3;
  pthread_barrier_wait(&idle_done);
  long just_freed = th_vm_rss_kib();
  sleep_ms(1200); /* no allocation from here on, in any thread */
  long later = th_vm_rss_kib();
  pthread_barrier_wait(&idle_release);
  for (int i = 0; i < IDLE_THREADS; i++) pthread_join(t[i], NULL);
  printf("    VmRSS: start %ld, just freed %ld, 1.2 s later %ld KiB (4 idle threads, delay 200 ms)\n",
         start, just_freed, later);
  /* Each thread filled 39 MiB at once; 4 MiB in all may stay (a slab per
   * class and thread, the threads' stacks). */
  return later - start < 4 * 1024 ? 0 : 1;
}

/* Runs this binary with flag, the delay at 200 ms and, if given, one more
 * option (NAME=value). */
static void run_child_with(const char *flag, char *option) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("HAKMEM_PURGE_DELAY_MS", "200", 1);
    if (option != NULL) putenv(option);
    execl("/proc/self/exe", "test_introspect", flag, (char *)NULL);
    _exit(99);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %s status %d", flag, status);
}

static void run_child(const char *flag) { run_child_with(flag, NULL); }

TEST(purge_after_delay_without_further_calls) { run_child("--purge-child"); }

/* Without the purger thread, the program's own calls purge what is due:
 * span blocks of 16,000 B and a large block, 8 MiB of each, freed, then
 * small blocks allocated and freed for 600 ms, three delays (refills, no
 * span or large block). Those calls once purged their heap's slabs only,
 * and the rest stayed committed. */
static int calls_purge_child(void) {
  if (threads_now() != 1) return 3;
  long start = th_vm_rss_kib();
  void **spans = fill(8 << 20 >> 14, 16000), **large = fill(1, 8 << 20);
  long full = th_vm_rss_kib();
  drain(spans, 8 << 20 >> 14);
  drain(large, 1);
  for (uint64_t t0 = now_ms(); now_ms() - t0 < 600;) drain(fill(2000, 300), 2000);
  long later = th_vm_rss_kib();
  printf("    VmRSS: start %ld, full %ld, 600 ms of small blocks later %ld KiB, threads %ld\n", start,
         full, later, threads_now());
  if (full - start < 14 * 1024) return 2;
  if (threads_now() != 1) return 4;
  return later - start < 3 * 1024 ? 0 : 1;
}

TEST(without_the_purger_thread_the_calls_purge_what_is_due) {
  run_child_with("--calls-purge-child", "HAKMEM_PURGE_THREAD=0");
  run_child("--calls-purge-child"); /* a program of one thread that maps little: none either */
}

/* A program whose purges run in its calls only may stop calling for good
 * after a free, as a server's process does between clients: the large
 * blocks it freed go back at once, not after a delay nothing would see
 * end. Blocks freed and taken again within the delay stay: a loop of 40
 * mallocs and frees of 1.5 MiB faults its pages in once, not 40 times. */
static int calls_idle_child(void) {
  if (threads_now() != 1) return 3;
  long start = th_vm_rss_kib();
  void **large = fill(3, 3 << 19);
  long full = th_vm_rss_kib();
  drain(large, 3);
  long freed = th_vm_rss_kib();
  long faults = th_minor_faults();
  for (int i = 0; i < 40; i++) drain(fill(1, 3 << 19), 1);
  faults = th_minor_faults() - faults;
  printf("    VmRSS: start %ld, full %ld, freed %ld KiB; 40 blocks of 1.5 MiB: %ld faults\n", start,
         full, freed, faults);
  if (full - start < 3 * 1024) return 2;
  if (freed - start > 512) return 1;
  return faults < 2 * 384 ? 0 : 4;
}

TEST(a_program_that_purges_in_its_calls_gives_back_large_blocks_at_free) {
  run_child("--calls-idle-child");
  run_child_with("--calls-idle-child", "HAKMEM_PURGE_THREAD=0");
}

/* Without a delay (HAKMEM_PURGE_DELAY_MS=0, the lowmem profile) every span
 * page freed goes back at once, and a program of one thread gets no pass:
 * so do the blocks of a thread that only frees, which with a delay wait for
 * other threads' refills (8 MiB of 16,000 B and 14 MiB of 350,000 B kept
 * 7.7 MiB before). */
static int at_once_child(void) {
  long start = th_vm_rss_kib();
  void **small = fill(512, 16000), **big = fill(40, 350000);
  long full = th_vm_rss_kib();
  drain(small, 512);
  drain(big, 40);
  long freed = th_vm_rss_kib();
  printf("    VmRSS: start %ld, full %ld, freed %ld KiB\n", start, full, freed);
  if (full - start < 20 * 1024) return 2;
  return freed - start < 1024 ? 0 : 1;
}

TEST(without_a_delay_a_thread_that_only_frees_keeps_nothing) {
  run_child_with("--at-once-child", "HAKMEM_PURGE_DELAY_MS=0");
}

/* ...and in a program with threads, the batches of a thread that only
 * frees wait for the others' refills, and go back once they stop moving:
 * 2,000 blocks of 8-32 KiB written by the main thread and freed by another
 * (32 MiB of them stayed for good before the purger ran without a delay). */
enum { HANDED_BLOCKS = 2000 };
static void *free_handed(void *arg) {
  drain(arg, HANDED_BLOCKS);
  return NULL;
}

static int at_once_threads_child(void) {
  long start = th_vm_rss_kib();
  void **a = malloc(HANDED_BLOCKS * sizeof *a);
  for (int i = 0; i < HANDED_BLOCKS; i++) {
    size_t size = 8192 + (size_t)i * 7919 % 24576;
    a[i] = malloc(size);
    memset(a[i], 1, size);
  }
  long full = th_vm_rss_kib();
  pthread_t t;
  if (pthread_create(&t, NULL, free_handed, a) != 0) return 3;
  pthread_join(t, NULL);
  long freed = th_vm_rss_kib();
  sleep_ms(300); /* no call from here on */
  long later = th_vm_rss_kib();
  printf("    VmRSS: start %ld, full %ld, freed %ld, 300 ms later %ld KiB\n", start, full, freed,
         later);
  if (full - start < 30 * 1024) return 2;
  return later - start < 2048 ? 0 : 1;
}

TEST(without_a_delay_the_batches_a_thread_hands_on_go_back_once_idle) {
  run_child_with("--at-once-threads-child", "HAKMEM_PURGE_DELAY_MS=0");
}

/* Once a process has had a second thread, glibc locks its stdio and
 * libstdc++ counts shared_ptr references with atomics: a program of one
 * thread that frees what it allocates must not get a thread from hakmem
 * while it has mapped little (each round schedules purges, waits past the
 * delay, and refills: 32 blocks of 5,000 B, carved 4 at a time, take 8). */
TEST(a_program_of_one_thread_and_little_memory_gets_no_thread) {
  REQUIRE(threads_now() == 1 && __libc_single_threaded);
  for (int round = 0; round < 3; round++) {
    drain(fill(4000, 1000), 4000);
    drain(fill(8, 1 << 20), 8);
    sleep_ms(150);
    drain(fill(32, 5000), 32);
  }
  CHECK_MSG(threads_now() == 1, "threads %ld", threads_now());
  CHECK(__libc_single_threaded);
}

/* 48 MiB of blocks of 4,000 B, the first third of them freed (their slabs
 * empty), and refills: enough for a program of one thread to get the
 * purger. The blocks left, MAPPED_BLOCKS of them (NULL where freed). */
enum { MAPPED_BLOCKS = 12000 };
static void **map_enough_for_the_purger(void) {
  void **a = fill(MAPPED_BLOCKS, 4000);
  for (int i = 0; i < MAPPED_BLOCKS / 3; i++) {
    free(a[i]);
    a[i] = NULL;
  }
  drain(fill(32, 5000), 32);
  return a;
}

/* ...and gets the purger once it has mapped 32 MiB. */
TEST(a_program_of_one_thread_that_maps_32_mib_gets_the_purger) {
  REQUIRE(threads_now() == 1 && __libc_single_threaded);
  void **a = map_enough_for_the_purger();
  CHECK_MSG(threads_now() == 2, "threads %ld", threads_now());
  drain(a, MAPPED_BLOCKS);
}
TEST(idle_threads_give_back_what_they_freed) { run_child("--idle-threads-child"); }

/* Pid 1 of a pid namespace of its own that sees its parent's /proc, where
 * /proc/self/task names its threads by their outer numbers: the purger
 * must not take the missing /proc/self/task/1 for a main thread gone. */
static int purger_in_a_pid_namespace(void) {
  if (getpid() != 1) return 3;
  map_enough_for_the_purger();
  if (threads_now() != 2) return 4;
  sleep_ms(1500); /* its passes, then its look before waiting */
  return threads_now() == 2 ? 0 : 5;
}

TEST_T(the_purger_stays_in_a_pid_namespace_that_sees_its_parents_proc, 30) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWPID) != 0) _exit(TH_SKIP_STATUS);
    pid_t inner = fork();
    if (inner == 0) _exit(purger_in_a_pid_namespace());
    int status = 0;
    waitpid(inner, &status, 0);
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 99);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == TH_SKIP_STATUS) SKIP("unshare(CLONE_NEWPID) refused (no CAP_SYS_ADMIN here)");
  CHECK_MSG(WEXITSTATUS(status) == 0,
            "exit %d (4: no purger started, 5: the purger ended while main ran)", WEXITSTATUS(status));
}

/* A bit of the pagemap entry of the page holding p (mincore would answer
 * for a file's page cache); -1 if unread. */
static int pagemap_bit(const void *p, int bit) {
  int fd = open("/proc/self/pagemap", O_RDONLY);
  uint64_t entry = 0;
  bool read = fd >= 0 && pread(fd, &entry, sizeof entry, (off_t)((uintptr_t)p / 4096 * sizeof entry)) ==
                             (ssize_t)sizeof entry;
  if (fd >= 0) close(fd);
  return read ? (int)(entry >> bit & 1) : -1;
}
/* Whether the page is present in this process. */
static int page_present(const void *p) { return pagemap_bit(p, 63); }
/* Mapped by this process alone: after a fork, a page it has written since. */
static int page_exclusive(const void *p) { return pagemap_bit(p, 56); }

/* The pages of the library's writable segment (its data and bss) that
 * are present: the lowest and the highest address, 0 and 0 for none. */
typedef struct {
  uintptr_t start, end, lowest, highest;
  uintptr_t file_end; /* the end of the part from the file, where the bss begins */
  uintptr_t bss_page; /* the first page wholly of the bss: the file's part ends before it */
} present_t;
static int find_library_data(struct dl_phdr_info *info, size_t size, void *arg) {
  present_t *w = arg;
  if (!strstr(info->dlpi_name, "libhakmem.so")) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) {
      w->start = (info->dlpi_addr + ph->p_vaddr) & ~(uintptr_t)4095;
      w->end = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
      w->file_end = info->dlpi_addr + ph->p_vaddr + ph->p_filesz;
      w->bss_page = (w->file_end + 4095) & ~(uintptr_t)4095;
    }
  }
  return 1;
}

/* A fork copies, and the child's exit frees, a page table for every 2 MiB
 * range in which the process has a page present (3.3 us each): written,
 * or read and mapped to the zero page. What hakmem touches of its own data
 * for a program without large blocks (small variables, the span pool's
 * table, the segment map's bytes of the chunks mmap hands out) lies within
 * 2 MiB; the map's bytes in use were 32 MiB from the rest before they were
 * indexed from the top of the address space. */
TEST(what_the_library_touches_of_its_data_lies_within_2_mib) {
  void **small[56];
  for (int c = 0; c < 56; c++) small[c] = fill(4, 16 + (size_t)c * 128);
  void **spans = fill(8, 20000), **big_spans = fill(2, 200000);
  present_t w = {0};
  REQUIRE(dl_iterate_phdr(find_library_data, &w) == 1 && w.end > w.start);
  for (uintptr_t page = w.start; page < w.end; page += 4096) {
    int present = page_present((const void *)page);
    REQUIRE(present >= 0);
    if (!present) continue;
    if (!w.lowest) w.lowest = page;
    w.highest = page;
  }
  printf("    data and bss: %zu KiB; pages present from +0x%lx to +0x%lx\n", (w.end - w.start) >> 10,
         (unsigned long)(w.lowest - w.start), (unsigned long)(w.highest - w.start));
  CHECK(w.lowest != 0);
  CHECK_MSG(w.highest - w.lowest < (2u << 20), "present over %lu KiB",
            (unsigned long)((w.highest - w.lowest) >> 10));
  for (int c = 0; c < 56; c++) drain(small[c], 4);
  drain(spans, 8);
  drain(big_spans, 2);
}

/* A fork's child copies each page it writes, and its exit writes the page
 * where the library's bss begins (crtstuff's flag that its destructors
 * ran). The first thread's heap lies on that page: a child of a program of
 * one thread that frees and allocates, as a shell's subshell does, then
 * copies no other page of the library's data. */
static int fork_pages_child(void) {
  void **blocks = fill(64, 40);
  present_t w = {0};
  if (dl_iterate_phdr(find_library_data, &w) != 1 || w.file_end <= w.start) return 2;
  /* the first fork trims the segment map (docs/MEMORY.md) */
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, NULL, 0);
  pid = fork();
  if (pid == 0) {
    free(blocks[7]);
    blocks[7] = malloc(40);
    uintptr_t copied[8];
    int n = 0;
    for (uintptr_t page = w.start; page < w.end && n < 8; page += 4096) {
      int exclusive = page_exclusive((const void *)page);
      if (exclusive < 0) _exit(3);
      if (exclusive && page_present((const void *)page) == 1) copied[n++] = page;
    }
    /* printed after the scan: stdout's buffer is a malloc */
    for (int i = 0; i < n; i++)
      printf("    the child copied +0x%lx of the library's data (its file's part ends at +0x%lx)\n",
             (unsigned long)(copied[i] - w.start), (unsigned long)(w.file_end - w.start));
    fflush(stdout);
    /* the bss's first byte: on the page where the file's part ends, or on
     * the next if the bss is aligned to a page (hakmem's is) */
    _exit(n == 1 && (copied[0] == (w.file_end & ~(uintptr_t)4095) ||
                     copied[0] == w.bss_page)
              ? 0
              : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  drain(blocks, 64);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 4;
}

TEST(a_forked_child_writes_one_page_of_the_librarys_data_the_one_its_exit_writes) {
  run_child("--fork-pages-child");
}

/* The areas of /proc/self/maps in the library's data and bss (only its bss,
 * past the file's part, with bss_only) that are writable, or read-only (its
 * relocated .data.rel.ro, and the segment map once trimmed): how many, and
 * their KiB in *kib; -1 if unknown. */
static int library_areas(bool bss_only, bool writable, long *kib) {
  present_t w = {0};
  FILE *f = fopen("/proc/self/maps", "r");
  if (dl_iterate_phdr(find_library_data, &w) != 1 || f == NULL) {
    if (f) fclose(f);
    return -1;
  }
  uintptr_t from = bss_only ? w.bss_page : w.start;
  char line[512], perms[8];
  unsigned long lo, hi;
  size_t bytes = 0;
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && (perms[1] == 'w') == writable && hi > from &&
        lo < w.end) {
      bytes += (hi < w.end ? hi : w.end) - (lo > from ? lo : from);
      n++;
    }
  fclose(f);
  if (kib) *kib = (long)(bytes >> 10);
  return n;
}
static long library_data_kib(bool writable) {
  long kib = -1;
  return library_areas(false, writable, &kib) < 0 ? -1 : kib;
}

/* A program that never forks: a purge pass a second after its first
 * segment makes the segment map's unused bytes read-only, which the kernel
 * does not charge to its commit (a fork does it at once; unit_core tests
 * that), and the large arena's tables (1,064 KiB) while it has no large
 * block. What stays writable, and charged, is the library's small data
 * (20 KiB) and the map's pages from the top of the address space down to
 * its lowest segment, one per 16 GiB: up to 256 KiB where the kernel's
 * randomization puts the mappings 1 TiB down. Less than 512 KiB in all
 * (the span pool's table of chunks made it 1 MiB more). The map's tail and
 * the large tables make one read-only area, no variable between them: each
 * area costs every fork a copy (large.c's small variables are in .data).
 * Span blocks freed after the second, then small blocks for 600 ms (three
 * delays), make the program's own calls pass. */
static int map_trim_child(void) {
  drain(fill(100, 100), 100);
  long first = library_data_kib(false);
  sleep_ms(1100);
  drain(fill(512, 16000), 512);
  for (uint64_t t0 = now_ms(); now_ms() - t0 < 600;) drain(fill(2000, 300), 2000);
  long later = library_data_kib(false), writable = library_data_kib(true);
  int areas_read_only = library_areas(true, false, NULL);
  int areas_writable = library_areas(true, true, NULL);
  printf("    read-only KiB of the library's data: %ld at the first segment, %ld 1.7 s later, "
         "when %ld KiB are writable; the bss in %d writable and %d read-only areas\n",
         first, later, writable, areas_writable, areas_read_only);
  return first >= 0 && first < 1024 && later >= 33000 && writable >= 0 && writable < 512 &&
                 areas_writable == 1 && areas_read_only == 1
             ? 0
             : 1;
}

TEST(a_second_after_its_first_segment_the_segment_map_is_read_only_but_what_segments_use) {
  run_child("--map-trim-child");
}

/* Whether the area holding p says VM_NOHUGEPAGE ("nh" in its VmFlags);
 * -1 if no area holds it. */
static int area_refuses_huge_pages(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  int in_area = 0, result = -1;
  while (result < 0 && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3) /* an area's first line */
      in_area = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    else if (in_area && strncmp(line, "VmFlags:", 8) == 0)
      result = strstr(line, " nh") != NULL;
  }
  fclose(f);
  return result;
}

/* Where the kernel backs every aligned 2 MiB it can with a huge page
 * (transparent_hugepage/enabled = always), a page written in a segment
 * took 2 MiB of RSS: a program of a few blocks held 12 MiB instead of 2.2.
 * What a program maps while it holds less than 64 MiB mapped refuses huge
 * pages: slab and span segments, the large arena's first chunks, a block
 * mapped on its own. What it maps after gets the kernel's policy. */
TEST(a_small_programs_mappings_refuse_transparent_huge_pages) {
  void *slab = malloc(100), *span = malloc(20000), *large = malloc(3 << 20);
  void *own = malloc((size_t)20 << 30); /* past the arena's largest block */
  REQUIRE(slab && span && large);
  CHECK_MSG(area_refuses_huge_pages(slab) == 1, "slab segment: %d", area_refuses_huge_pages(slab));
  CHECK_MSG(area_refuses_huge_pages(span) == 1, "span segment: %d", area_refuses_huge_pages(span));
  CHECK_MSG(area_refuses_huge_pages(large) == 1, "large arena: %d", area_refuses_huge_pages(large));
  if (own) CHECK_MSG(area_refuses_huge_pages(own) == 1, "own mapping: %d", area_refuses_huge_pages(own));
  free(own); /* 20 GiB held would make the program big at once */
  own = NULL;
  void **blocks = fill(24000, 4000); /* 96 MiB: the last in a segment mapped past 64 MiB */
  CHECK_MSG(area_refuses_huge_pages(blocks[23999]) == 0, "a segment of a program past 64 MiB: %d",
            area_refuses_huge_pages(blocks[23999]));
  drain(blocks, 24000);
  free(slab);
  free(span);
  free(large);
  free(own);
}

/* The last page of the 64 KiB (a segment unit) holding p. */
static const char *last_page_of_unit(const void *p) {
  return (const char *)(((uintptr_t)p | 0xFFFF) - 0xFFF);
}

/* Blocks of size into out (400 at most) until one past the 200th lies 8 to
 * 40 KiB into its unit: a block of a busy class (whose slab is longer than a
 * unit) where the carves, 8 KiB at most, have not reached the unit's end.
 * Returns how many. */
static size_t fill_into_a_busy_unit(void **out, size_t size) {
  for (size_t i = 0; i < 400; i++) {
    out[i] = malloc(size);
    size_t into = (uintptr_t)out[i] & 0xFFFF;
    if (i >= 200 && into >= 8192 && into < 40960) return i + 1;
  }
  return 400;
}

/* A program past 64 MiB carves pages by the thousand: a carve that enters
 * a unit's worth (64 KiB) of a busy class's slab has the kernel write all
 * of it in one call, instead of a fault a page. A class's first slab, and
 * any slab of a small program, has only the pages it carves. */
TEST(a_big_programs_carve_has_its_whole_unit_written_at_once) {
  static void *small[400], *busy[400];
  size_t nsmall = fill_into_a_busy_unit(small, 1024);
  REQUIRE(nsmall < 400);
  int small_end = page_present(last_page_of_unit(small[nsmall - 1]));
  CHECK_MSG(small_end == 0, "a small program's unit: %d", small_end);
  void **blocks = fill(24000, 4000); /* 96 MiB */
  char *first = malloc(512); /* a class's first slab: 4 KiB carved */
  REQUIRE(first);
  int first_end = page_present(last_page_of_unit(first));
  CHECK_MSG(first_end == 0, "a first slab's unit: %d", first_end);
  size_t nbusy = fill_into_a_busy_unit(busy, 2048);
  REQUIRE(nbusy < 400);
  int busy_end = page_present(last_page_of_unit(busy[nbusy - 1]));
  CHECK_MSG(busy_end == 1, "a big program's unit: %d", busy_end);
  for (size_t i = 0; i < nbusy; i++) free(busy[i]);
  for (size_t i = 0; i < nsmall; i++) free(small[i]);
  free(first);
  drain(blocks, 24000);
}

/* A fresh slab of blocks over 1 KiB carves 1, 1, 2, then 4 blocks at a
 * time: a class a program uses once has its block's page written, not the
 * three after it that a carve of four would link. */
static int first_carve_child(void) {
  char *block = malloc(4000); /* a block a page */
  if (block == NULL) return 2;
  int after[3];
  for (int i = 0; i < 3; i++) after[i] = page_present(block + 4096 * (i + 1));
  printf("    the three pages after the first block of 4000 B present: %d %d %d\n", after[0], after[1],
         after[2]);
  free(block);
  return after[0] == 0 && after[1] == 0 && after[2] == 0 ? 0 : 1;
}

TEST(a_class_used_once_writes_one_page_of_blocks_over_1_kib) { run_child("--first-carve-child"); }

/* Refuses madvise(MADV_POPULATE_WRITE) with EPERM from here on, as a
 * sandbox's seccomp filter may; false if the filter cannot be set. */
static bool refuse_populate(void) {
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_POPULATE_WRITE, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {sizeof code / sizeof code[0], code};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

/* Where the kernel refuses to write pages ahead, a big program's pages
 * fault in one by one, and malloc leaves errno as it was. */
TEST(pages_written_ahead_refused_leave_errno_alone) {
  REQUIRE(refuse_populate());
  errno = 12345;
  void **blocks = fill(24000, 4000); /* 96 MiB: refused from the first carve past 64 */
  static void *busy[400];
  size_t nbusy = fill_into_a_busy_unit(busy, 2048);
  CHECK_MSG(errno == 12345, "errno %d", errno);
  REQUIRE(nbusy < 400);
  int busy_end = page_present(last_page_of_unit(busy[nbusy - 1]));
  CHECK_MSG(busy_end == 0, "refused, yet written: %d", busy_end);
  for (size_t i = 0; i < nbusy; i++) free(busy[i]);
  drain(blocks, 24000);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--purge-child") == 0) return purge_child();
  if (argc > 1 && strcmp(argv[1], "--idle-threads-child") == 0) return idle_threads_child();
  if (argc > 1 && strcmp(argv[1], "--calls-purge-child") == 0) return calls_purge_child();
  if (argc > 1 && strcmp(argv[1], "--calls-idle-child") == 0) return calls_idle_child();
  if (argc > 1 && strcmp(argv[1], "--map-trim-child") == 0) return map_trim_child();
  if (argc > 1 && strcmp(argv[1], "--fork-pages-child") == 0) return fork_pages_child();
  if (argc > 1 && strcmp(argv[1], "--first-carve-child") == 0) return first_carve_child();
  if (argc > 1 && strcmp(argv[1], "--at-once-child") == 0) return at_once_child();
  if (argc > 1 && strcmp(argv[1], "--at-once-threads-child") == 0) return at_once_threads_child();
  return th_main("introspect", argc, argv);
}
