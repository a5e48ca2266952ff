/* The kernel interface: mappings, purges, clock and RSS. Nothing here
 * allocates memory through malloc. */
#define _GNU_SOURCE
#include "internal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAP_FLAGS (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)

/* The program locks its future memory (mlockall(MCL_FUTURE)): found by
 * hak_os_found_locked, or by the limit below. */
static _Atomic bool future_locked;

/* The program locked its future memory under a limit (RLIMIT_MEMLOCK,
 * 8 MiB by default for users but root), which the kernel applies to every
 * new mapping, accessible or not, and it refused one (EAGAIN). From then
 * on reservations are unlocked and what is made accessible is locked, so
 * that the limit counts the pages in use, as under glibc, not address
 * space; and no range is moved, since its hole would be mapped again. */
static _Atomic bool lock_limited;

static bool is_lock_limited(void) { return atomic_load_explicit(&lock_limited, memory_order_relaxed); }

/* From then on memory is made accessible as it is used, as under strict
 * overcommit, and locked pages are purged as hak_os_empty says. */
static void found_future_locked(void) {
  atomic_store_explicit(&hak_commit_strict, 1, memory_order_relaxed);
  atomic_store_explicit(&future_locked, true, memory_order_relaxed);
}

static void *os_mmap(void *addr, size_t size, int prot, int flags) {
  void *p = mmap(addr, size, prot, flags, -1, 0);
  if (p == MAP_FAILED && errno == EAGAIN && !is_lock_limited()) {
    found_future_locked();
    atomic_store_explicit(&lock_limited, true, memory_order_relaxed);
  }
  return p;
}

/* A new mapping of size bytes. Under the lock limit an inaccessible one
 * is made unlocked before it grows to its size: the kernel would count it
 * whole against the limit, with no page in it, and mremap applies the
 * limit to locked mappings only. */
static void *map_fresh(size_t size, int prot) {
  if (prot != PROT_NONE || !is_lock_limited() || size <= HAK_PAGE_SIZE)
    return os_mmap(NULL, size, prot, MAP_FLAGS);
  void *p = os_mmap(NULL, HAK_PAGE_SIZE, PROT_NONE, MAP_FLAGS);
  if (p == MAP_FAILED) return p;
  void *grown = munlock(p, HAK_PAGE_SIZE) == 0 ? mremap(p, HAK_PAGE_SIZE, size, MREMAP_MAYMOVE) : MAP_FAILED;
  if (grown == MAP_FAILED) munmap(p, HAK_PAGE_SIZE);
  return grown;
}

/* The start of the last aligned mapping: the next one is asked for just
 * below it, where the kernel's top-down search would put it anyway. */
static _Atomic uintptr_t aligned_below;

/* size bytes aligned to align, ending where the last aligned mapping
 * starts, or NULL: one mmap instead of three, and the kernel merges the
 * two into one area, which fork copies once (7 segments as 7 areas took a
 * fork 12 us more than as one). */
static void *map_below_last(size_t size, size_t align, int prot) {
  uintptr_t end = atomic_load_explicit(&aligned_below, memory_order_relaxed);
  if (end < size + align) return NULL;
  uintptr_t want = (end - size) & ~(uintptr_t)(align - 1);
  void *p = os_mmap((void *)want, size, prot, MAP_FLAGS);
  if (p == MAP_FAILED) return NULL;
  if ((uintptr_t)p == want) return p;
  munmap(p, size); /* the hint was taken */
  return NULL;
}

/* size bytes aligned to align, by mapping align more and trimming both
 * ends, or NULL. */
static void *map_over(size_t size, size_t align, int prot) {
  size_t over = size + (align > HAK_PAGE_SIZE ? align : 0);
  if (over < size) return NULL;
  uint8_t *raw = map_fresh(over, prot);
  if (raw == MAP_FAILED) return NULL;
  uint8_t *p = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
  if (p > raw) munmap(raw, (size_t)(p - raw));
  if (raw + over > p + size) munmap(p + size, (size_t)(raw + over - (p + size)));
  return p;
}

/* size bytes aligned to align where a limit (of locked memory, or of
 * address space) refuses map_over's more: the kernel's top-down search
 * leaves free space below the mapping it chose, whose start is moved down
 * to the alignment. NULL if that space is taken. */
static void *map_exact(size_t size, size_t align, int prot) {
  uint8_t *p = map_fresh(size, prot);
  if (p == MAP_FAILED) return NULL;
  uintptr_t down = (uintptr_t)p & ~(uintptr_t)(align - 1);
  if ((uintptr_t)p == down) return p;
  munmap(p, size);
  p = os_mmap((void *)down, size, prot, MAP_FLAGS | MAP_FIXED_NOREPLACE);
  if (p == MAP_FAILED) return NULL;
  if ((uintptr_t)p == down) return p;
  munmap(p, size); /* a kernel before 4.17 took the address as a hint */
  return NULL;
}

void hak_os_no_huge_pages(void *p, size_t size) {
  uintptr_t lo = hak_page_down((uintptr_t)p), hi = hak_page_up((uintptr_t)p + size);
  madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE);
}

bool hak_os_program_is_small(void) {
  return atomic_load_explicit(&hak_gstats.mapped, memory_order_relaxed) < HAK_HUGE_PAGES_AFTER;
}

void hak_os_populate(void *p, size_t size) {
  static _Atomic bool refused; /* by a kernel before 5.14, or a seccomp filter */
  if (atomic_load_explicit(&refused, memory_order_relaxed)) return;
  int saved = errno;
  if (madvise(p, size, MADV_POPULATE_WRITE) != 0 && (errno == EINVAL || errno == EPERM))
    atomic_store_explicit(&refused, true, memory_order_relaxed);
  errno = saved;
}

/* A mapping of a small program refuses huge pages; one under 2 MiB holds none. */
static void no_huge_pages_while_small(void *p, size_t size) {
  if (size >= HAK_HUGE_PAGE && hak_os_program_is_small()) hak_os_no_huge_pages(p, size);
}

/* An anonymous mapping of size bytes aligned to align (a power of two,
 * at least a page), not counted in the statistics; NULL with ENOMEM. */
static void *map_raw(size_t size, size_t align, int prot) {
  bool aligned = align > HAK_PAGE_SIZE;
  void *p = aligned ? map_below_last(size, align, prot) : NULL;
  if (p == NULL) p = map_over(size, align, prot);
  if (p == NULL && aligned) p = map_exact(size, align, prot);
  if (p == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  if (aligned) atomic_store_explicit(&aligned_below, (uintptr_t)p, memory_order_relaxed);
  if (prot == PROT_NONE && is_lock_limited()) munlock(p, size);
  return p;
}

void *hak_os_map(size_t size) { return hak_os_map_aligned(size, HAK_PAGE_SIZE); }

void *hak_os_map_aligned(size_t size, size_t align) {
  void *p = map_raw(size, align, PROT_READ | PROT_WRITE);
  if (p == NULL) return NULL;
  no_huge_pages_while_small(p, size);
  hak_stats_mapped(size, true);
  return p;
}

void *hak_os_reserve(size_t size, size_t align) { return map_raw(size, align, PROT_NONE); }

void *hak_os_map_reserved(size_t size, size_t align, size_t accessible) {
  uint8_t *p = hak_os_reserve(size, align);
  if (p == NULL) return NULL;
  if (!hak_os_commit(p, accessible)) {
    munmap(p, size);
    return NULL;
  }
  no_huge_pages_while_small(p, size);
  hak_stats_mapped(size, true);
  return p;
}
void hak_os_unreserve(void *p, size_t size) { munmap(p, size); }

/* Whether `page`, which holds nothing, is locked: the kernel refuses to
 * discard locked pages. madvise rather than mincore, which service
 * managers' lists of allowed system calls leave out (systemd's
 * @system-service): a service under such a list is killed at its first. */
static bool page_locked(void *page) {
  int saved = errno;
  bool locked = madvise(page, HAK_PAGE_SIZE, MADV_DONTNEED) != 0 && errno == EINVAL;
  errno = saved;
  return locked;
}

/* Whether the kernel still locks new mappings, which a program may stop
 * (munlockall): a page mapped is then locked, or refused. */
static bool still_locking(void) {
  void *p = mmap(NULL, HAK_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_FLAGS, -1, 0);
  if (p == MAP_FAILED) return errno == EAGAIN;
  bool locking = page_locked(p);
  munmap(p, HAK_PAGE_SIZE);
  return locking;
}

/* Under the lock limit, a range whose lock is refused is left accessible,
 * and unused: the caller takes it for refused. */
bool hak_os_commit(void *p, size_t size) {
  if (mprotect(p, size, PROT_READ | PROT_WRITE) != 0) return false;
  if (!is_lock_limited()) return true;
  if (still_locking()) return mlock(p, size) == 0;
  atomic_store_explicit(&lock_limited, false, memory_order_relaxed);
  return true;
}

void hak_os_fork_child(void) {
  /* a child locks nothing of its parent's (fork(2)) */
  if (is_lock_limited()) atomic_store_explicit(&lock_limited, false, memory_order_relaxed);
  if (atomic_load_explicit(&future_locked, memory_order_relaxed))
    atomic_store_explicit(&future_locked, false, memory_order_relaxed);
}

void hak_os_unmap(void *p, size_t size) {
  if (size == 0) return;
  if (munmap(p, size) != 0) hak_fatal("hakmem: munmap(%p, %zu) failed: errno %d", p, size, errno);
  hak_stats_mapped(size, false);
}

static void count_returned(size_t size) {
  HAK_STAT_ADD(os_returned, size);
  HAK_STAT_ADD(purges, 1);
  HAK_STAT_SUB(committed, size);
}

/* [p, p + size) mapped again, empty; false (errno kept) if refused. */
static bool map_empty(void *p, size_t size, int prot, int flags) {
  int saved = errno;
  bool done = os_mmap(p, size, prot, flags | MAP_FIXED) != MAP_FAILED;
  errno = saved;
  return done;
}

/* Locked pages (which madvise refuses) of a program that locks its future
 * memory, given back: unlocked, purged, and locked again as they are used,
 * as a mapping made again would have them faulted in at once. */
static bool empty_locked(void *p, size_t size) {
  if (!atomic_load_explicit(&future_locked, memory_order_relaxed) || munlock(p, size) != 0) return false;
  bool done = madvise(p, size, MADV_DONTNEED) == 0;
  if (!hak_os_lock_on_fault(p, size)) mlock(p, size);
  return done;
}

bool hak_os_lock_on_fault(void *p, size_t size) { return mlock2(p, size, MLOCK_ONFAULT) == 0; }

/* The range reads zero after it, which callers count on (calloc): madvise
 * refuses locked pages and may be filtered out, so then the range is
 * mapped again empty, or else written with zeros. */
void hak_os_empty(void *p, size_t size) {
  int saved = errno;
  if (madvise(p, size, MADV_DONTNEED) != 0 && !empty_locked(p, size) &&
      !map_empty(p, size, PROT_READ | PROT_WRITE, MAP_FLAGS))
    memset(p, 0, size);
  errno = saved;
}

void hak_os_purge_within(void *p, size_t size, size_t accessible) {
  if (size == 0) return;
  if (accessible > 0) hak_os_empty(p, accessible < size ? accessible : size);
  count_returned(size);
}

void hak_os_purge(void *p, size_t size) { hak_os_purge_within(p, size, size); }

bool hak_os_uncommit(void *p, size_t size) {
  if (!is_lock_limited()) return map_empty(p, size, PROT_NONE, MAP_FLAGS);
  /* a mapping would count against the limit whole, before the old one is gone */
  return munlock(p, size) == 0 && madvise(p, size, MADV_DONTNEED) == 0 && mprotect(p, size, PROT_NONE) == 0;
}

/* A change of protection that cannot be undone. */
static void protect(void *p, size_t size, int prot) {
  if (mprotect(p, size, prot) != 0)
    hak_fatal("hakmem: mprotect(%p, %zu) failed: errno %d", p, size, errno);
}

/* Without MAP_NORESERVE: made writable again, the range is then charged as
 * the bss around it, and the kernel merges them into one area. Mapped
 * inaccessible first: a readable mapping in a program that locked its
 * future memory (mlockall) is faulted in whole, the segment map's 32 MiB. */
bool hak_os_read_only(void *p, size_t size) {
  if (!map_empty(p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS)) return false;
  if (is_lock_limited()) munlock(p, size);
  protect(p, size, PROT_READ);
  return true;
}

bool hak_os_decommit(void *p, size_t size) {
  if (size == 0) return false;
  bool done = hak_os_uncommit(p, size);
  count_returned(size);
  HAK_STAT_SUB(mapped, size);
  return done;
}

bool hak_os_guard(void *p, size_t size, bool on) {
  if (on) return mprotect(p, size, PROT_NONE) == 0; /* refused where it splits a mapping past the limit */
  protect(p, size, PROT_READ | PROT_WRITE);
  return true;
}

uint64_t hak_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct timespec hak_clock_deadline(uint64_t ns) {
  uint64_t t = hak_clock_ns() + ns;
  return (struct timespec){.tv_sec = (time_t)(t / 1000000000u), .tv_nsec = (long)(t % 1000000000u)};
}

uint64_t hak_clock_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Bytes read from `at` in a file of /proc, -1 if none. open, pread and
 * close are cancellation points: a thread cancelled in them would leave
 * malloc with the caller's lock held. */
static ssize_t proc_pread(const char *path, void *buf, size_t size, off_t at) {
  int cancel_state;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
  ssize_t n = -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = pread(fd, buf, size, at);
    close(fd);
  }
  pthread_setcancelstate(cancel_state, NULL);
  return n;
}

/* The text of a /proc file, NUL-terminated (what fits); false if unread. */
static bool proc_read(const char *path, char *buf, size_t size) {
  ssize_t n = proc_pread(path, buf, size - 1, 0);
  if (n <= 0) return false;
  buf[n] = 0;
  return true;
}

bool hak_os_overcommit_never(void) {
  char buf[8];
  return proc_read("/proc/sys/vm/overcommit_memory", buf, sizeof buf) && buf[0] == '2';
}

_Atomic int hak_commit_strict = -1;

bool hak_os_commit_strict(void) {
  int strict = atomic_load_explicit(&hak_commit_strict, memory_order_relaxed);
  if (strict < 0) {
    strict = hak_os_overcommit_never();
    atomic_store_explicit(&hak_commit_strict, strict, memory_order_relaxed);
  }
  return strict;
}

/* A "Name:   123 kB" field of /proc/self/status, in bytes (0 if absent).
 * VmHWM rather than getrusage: ru_maxrss is inherited across exec. */
static size_t proc_status_kib(const char *field) {
  char buf[4096];
  if (!proc_read("/proc/self/status", buf, sizeof buf)) return 0;
  const char *s = strstr(buf, field);
  if (s == NULL) return 0;
  s += strlen(field);
  while (*s == ' ' || *s == '\t') s++;
  size_t kib = 0;
  while (*s >= '0' && *s <= '9') kib = kib * 10 + (size_t)(*s++ - '0');
  return kib * 1024;
}

/* Field n (3 or more: those after the command name) of a stat file. */
static const char *stat_field(const char *stat, int n) {
  const char *s = strrchr(stat, ')');
  if (s == NULL) return NULL;
  for (int f = 2; f < n && s != NULL; f++) s = strchr(s + 1, ' ');
  return s ? s + 1 : NULL;
}

bool hak_os_found_locked(void *page) {
  if (!page_locked(page)) return false;
  found_future_locked();
  return true;
}

size_t hak_os_rss(void) { return proc_status_kib("VmRSS:"); }
size_t hak_os_rss_peak(void) { return proc_status_kib("VmHWM:"); }

/* The threads of the process: /proc/self/task's link count is 2 more,
 * and reading it takes no descriptor, which a program that lists its own
 * (CPython's test_subprocess) would see. */
static long threads_now(void) {
  struct stat st;
  if (stat("/proc/self/task", &st) == 0 && st.st_nlink > 2) return (long)st.st_nlink - 2;
  char buf[1024];
  if (!proc_read("/proc/self/stat", buf, sizeof buf)) return -1;
  const char *threads = stat_field(buf, 20);
  return threads != NULL ? strtol(threads, NULL, 10) : -1;
}

bool hak_os_last_thread(void) {
  long n = threads_now();
  if (n == 1) return true;
  /* The main thread that called pthread_exit stays a zombie, counted.
   * Its exe link fails with ENOENT once it has let go of the address
   * space: read with no descriptor, unlike its stat file. Its task
   * directory must be there first (a /proc of another pid namespace has
   * none of that number). */
  pid_t pid = getpid();
  if (n != 2 || gettid() == pid) return false;
  char path[64], target[1];
  int len = snprintf(path, sizeof path, "/proc/self/task/%d", (int)pid);
  if (access(path, F_OK) != 0) return false;
  snprintf(path + len, sizeof path - (size_t)len, "/exe");
  return readlink(path, target, sizeof target) < 0 && errno == ENOENT;
}

/* Read from the page table (/proc/self/pagemap: bit 63 present, 62
 * swapped), not by mincore (page_locked says why). */
#define PAGEMAP_BATCH 64
static ssize_t pages_in(void *p, size_t size) { /* -1: unreadable */
  uint64_t entries[PAGEMAP_BATCH];
  size_t n = size >> HAK_PAGE_SHIFT, bytes = n * sizeof entries[0], in = 0;
  off_t at = (off_t)(((uintptr_t)p >> HAK_PAGE_SHIFT) * sizeof entries[0]);
  if (n > PAGEMAP_BATCH || proc_pread("/proc/self/pagemap", entries, bytes, at) != (ssize_t)bytes)
    return -1;
  for (size_t i = 0; i < n; i++) in += (entries[i] >> 62) != 0;
  return (ssize_t)(in << HAK_PAGE_SHIFT);
}

size_t hak_os_resident(void *p, size_t size) {
  ssize_t in = pages_in(p, size);
  return in < 0 ? size : (size_t)in;
}

/* A failed move of old leaves it as it was, except where it spans several
 * mappings (Linux 6.17 on moves them one by one; the program made them by
 * changing its block's protection) and one refuses (sealed): the first
 * ones moved, which nothing here can undo, and the fault is named. */
static __attribute__((noreturn)) void moved_in_part(void *old, size_t size, int err) {
  hak_fatal("hakmem: mremap(%p, %zu) moved part of the range and failed: errno %d", old, size, err);
}

/* A move that unmaps old moved part of it if its start is a hole. */
static void check_old_kept(void *old, size_t size) {
  int err = errno;
  if (madvise(old, HAK_PAGE_SIZE, MADV_NORMAL) != 0 && errno == ENOMEM) moved_in_part(old, size, err);
  errno = err;
}

/* A move that keeps old mapped moved part of it if its target, empty
 * before, has pages (a range of no page gives nothing to lose). */
static void check_target_empty(void *old, void *target, size_t size) {
  int err = errno;
  for (size_t at = 0, step = PAGEMAP_BATCH << HAK_PAGE_SHIFT; at < size; at += step)
    if (pages_in((uint8_t *)target + at, size - at < step ? size - at : step) > 0)
      moved_in_part(old, size, err);
  errno = err;
}

/* A failed move may have unmapped its target first (Linux before 6.17
 * does, when the source turns out not to move): it is reserved again, or,
 * if another thread's mmap took it meanwhile, the fault is named. */
static void check_target_kept(void *target, size_t size) {
  int err = errno;
  if (madvise(target, HAK_PAGE_SIZE, MADV_NORMAL) != 0 && errno == ENOMEM &&
      os_mmap(target, size, PROT_NONE, MAP_FLAGS | MAP_FIXED_NOREPLACE) != target)
    hak_fatal("hakmem: mremap to %p failed (errno %d) and another mapping took its place", target, err);
  errno = err;
}

/* The pages of [old, old + size) move to target, which they replace; old
 * stays mapped, empty (MREMAP_DONTUNMAP, Linux 5.7 on; before, no move
 * succeeds and callers copy). Left unmapped until mapped again, old was a
 * hole that another thread's mmap could take, to see it replaced. live:
 * the pages hold a block, and target none (free pages moved in part lose
 * nothing; a target that had pages would look moved to). */
static bool move_fixed(void *old, size_t size, void *target, bool live) {
  if (is_lock_limited()) return false;
  if (mremap(old, size, size, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, target) != MAP_FAILED)
    return true;
  if (live) check_target_empty(old, target, size);
  check_target_kept(target, size);
  return false;
}

/* A range a move emptied is made inaccessible again. */
static void map_again(void *p, size_t size) {
  if (os_mmap(p, size, PROT_NONE, MAP_FLAGS | MAP_FIXED) == MAP_FAILED)
    hak_fatal("hakmem: mmap(%p, %zu, MAP_FIXED) failed: errno %d", p, size, errno);
  no_huge_pages_while_small(p, size);
}

bool hak_os_move(void *old, size_t size, void *target, bool live) {
  if (!move_fixed(old, size, target, live)) return false;
  map_again(old, size);
  return true;
}

int hak_os_swap(void *a, void *b, void *scratch, size_t size) {
  if (!move_fixed(a, size, scratch, false)) return 0;
  if (!move_fixed(b, size, a, false)) {
    if (!move_fixed(scratch, size, a, false))
      hak_fatal("hakmem: mremap back to %p failed: errno %d", a, errno);
    map_again(scratch, size);
    return 0;
  }
  int traded = 2;
  if (!move_fixed(scratch, size, b, false)) { /* a's pages are dropped */
    map_again(b, size);
    traded = 1;
  }
  map_again(scratch, size);
  return traded;
}

void *hak_os_remap(void *old, size_t old_size, size_t new_size, void *target) {
  void *p = target ? mremap(old, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, target)
                   : mremap(old, old_size, new_size, 0);
  if (p == MAP_FAILED) {
    if (target) check_old_kept(old, old_size);
    return NULL;
  }
  if (new_size > old_size) hak_stats_mapped(new_size - old_size, true);
  else hak_stats_mapped(old_size - new_size, false);
  return p;
}
