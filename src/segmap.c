/* The segment map (internal.h). The Makefile links this file after all
 * others but large.c: the map's bytes in use then follow the library's
 * small data, and the large arena's tables (1 MiB, written only by
 * programs with large blocks) come after it, so a program's writes to the
 * library's data stay within 2 MiB. */
#include "internal.h"

_Alignas(HAK_PAGE_SIZE) _Atomic uint8_t hak_segmap[HAK_SEGMAP_SIZE];

/* As bss, the map's 32 MiB are charged to the commit of every process
 * that loads the library, which vm.overcommit_memory 2 limits, and again
 * to each child of a fork. hak_segmap_trim maps again, read-only (not
 * charged), what lies past the bytes of the segments opened so far; later
 * segments make writable what they need of it. It waits for a fork, or for
 * a purge pass a second after the first segment: in a new process that
 * mmap took 10 us, which made a spawn of /bin/echo 1.03x as long. */
#define TRIM_AFTER_MS 1000
static HAK_NEAR_DATA uint64_t first_open_ms;            /* 0 before the first segment */
static HAK_NEAR_DATA size_t needed;                     /* the map's first bytes segments need */
static HAK_NEAR_DATA size_t writable = HAK_SEGMAP_SIZE; /* the map's first bytes writable */
static HAK_NEAR_DATA _Atomic bool trim_tried;
HAK_FORK_HELD pthread_mutex_t hak_segmap_lock = PTHREAD_MUTEX_INITIALIZER;

bool hak_segmap_open(const void *start, size_t size) {
  uintptr_t first = (uintptr_t)start >> HAK_SEG_SHIFT;
  uintptr_t last = ((uintptr_t)start + size - 1) >> HAK_SEG_SHIFT;
  if (last >= HAK_SEGMAP_SIZE - 1) { /* the last chunk stands for NULL */
    errno = ENOMEM;
    return false;
  }
  /* the lowest chunk has the range's furthest byte */
  size_t need = hak_page_up(hak_segmap_slot_of_chunk(first) + 1);
  bool done = true;
  pthread_mutex_lock(&hak_segmap_lock);
  if (need > writable) {
    done = hak_os_commit((uint8_t *)hak_segmap + writable, need - writable);
    if (done) writable = need;
  }
  if (done && need > needed) needed = need;
  if (first_open_ms == 0) first_open_ms = hak_clock_ms();
  pthread_mutex_unlock(&hak_segmap_lock);
  if (!done) errno = ENOMEM;
  return done;
}

void hak_segmap_trim(bool now) {
  /* a fork from a signal handler may interrupt an open: try next time */
  if (atomic_load_explicit(&trim_tried, memory_order_relaxed) ||
      pthread_mutex_trylock(&hak_segmap_lock) != 0)
    return;
  bool trim = !atomic_load_explicit(&trim_tried, memory_order_relaxed) &&
              (now || (first_open_ms != 0 && hak_clock_ms() >= first_open_ms + TRIM_AFTER_MS));
  if (trim) {
    atomic_store_explicit(&trim_tried, true, memory_order_relaxed);
    /* past needed, no byte was ever written: readers see zeros as before */
    if (hak_os_read_only((uint8_t *)hak_segmap + needed, HAK_SEGMAP_SIZE - needed)) writable = needed;
  }
  pthread_mutex_unlock(&hak_segmap_lock);
  if (trim) hak_large_trim_tables(); /* after: its lock comes before this one */
}

void hak_segmap_set(hak_segment_t *seg, uint8_t value) {
  uintptr_t chunk = (uintptr_t)seg >> HAK_SEG_SHIFT;
  atomic_store_explicit(&hak_segmap[hak_segmap_slot_of_chunk(chunk)], value, memory_order_release);
}
