/* The kernel interface: mappings, purges, clock and RSS. Nothing here
 * allocates memory through malloc. */
#define _GNU_SOURCE
#include "internal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

void *hak_os_map(size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    errno = ENOMEM;
    return NULL;
  }
  hak_stats_mapped(size, true);
  return p;
}

void hak_os_unmap(void *p, size_t size) {
  if (size == 0) return;
  if (munmap(p, size) != 0) hak_fatal("hakmem: munmap(%p, %zu) failed: errno %d", p, size, errno);
  hak_stats_mapped(size, false);
}

void *hak_os_map_aligned(size_t size, size_t align) {
  /* Over-map, then trim both ends to the aligned range. */
  size_t over = size + align;
  if (over < size) {
    errno = ENOMEM;
    return NULL;
  }
  uint8_t *raw = hak_os_map(over);
  if (raw == NULL) return NULL;
  uint8_t *p = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
  hak_os_unmap(raw, (size_t)(p - raw));
  hak_os_unmap(p + size, (size_t)(raw + over - (p + size)));
  return p;
}

void hak_os_purge(void *p, size_t size) {
  if (size == 0) return;
  madvise(p, size, MADV_DONTNEED);
  HAK_STAT_ADD(os_returned, size);
  HAK_STAT_ADD(purges, 1);
  HAK_STAT_SUB(committed, size);
}

uint64_t hak_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t hak_clock_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

size_t hak_os_rss(void) {
  /* /proc/self/statm: size resident ... (in pages) */
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *s = buf;
  while (*s && *s != ' ') s++;
  size_t pages = 0;
  while (*s == ' ') s++;
  while (*s >= '0' && *s <= '9') pages = pages * 10 + (size_t)(*s++ - '0');
  return pages * (size_t)sysconf(_SC_PAGESIZE);
}

size_t hak_os_rss_peak(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (size_t)ru.ru_maxrss * 1024;
}

void *hak_os_remap(void *old, size_t old_size, size_t new_size, void *target) {
  void *p = target ? mremap(old, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, target)
                   : mremap(old, old_size, new_size, 0);
  if (p == MAP_FAILED) return NULL;
  if (new_size > old_size) hak_stats_mapped(new_size - old_size, true);
  else hak_stats_mapped(old_size - new_size, false);
  return p;
}
