/* hakmem internal interface: cross-file functions (prefix hak_i_ is not
 * used; internal functions are hidden by -fvisibility=hidden and named
 * hak_<layer>_<verb>) and the force-inlined fast paths. */
#ifndef HAK_INTERNAL_H
#define HAK_INTERNAL_H

#include "types.h"
#include "hakmem.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HAK_INLINE static inline __attribute__((always_inline))
#define HAK_NOINLINE __attribute__((noinline))
#define HAK_COLD __attribute__((noinline, cold))
#define HAK_LIKELY(x) __builtin_expect(!!(x), 1)
#define HAK_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HAK_EXPORT __attribute__((visibility("default")))
/* Entry points of one signature share one body under several names: a copy
 * would take lines of its own in the instruction cache, and the compiler's
 * merging of copies leaves a jump. */
#if __has_attribute(copy) /* the target's attributes from libc's headers (malloc, nothrow...) */
#define SAME_AS(target) HAK_EXPORT __attribute__((alias(#target), copy(target)))
#else
#define SAME_AS(target) HAK_EXPORT __attribute__((alias(#target)))
#endif
/* What the fork handlers write (the global locks they hold, the lists of
 * heaps the child drops) goes to .data, well under a page in all: each
 * page written across a fork is a copy-on-write fault in the parent and
 * another in the child. */
#define HAK_FORK_HELD __attribute__((section(".data")))
/* A small variable of segmap.c or large.c, whose bss follows the 32 MiB
 * segment map: there, its page written would cost every fork a page table
 * of its own (a fork loop 1.024x as long), and it would split the area
 * that the trim makes read-only, the map's tail and the large tables, in
 * two (test_introspect counts the bss's areas). */
#define HAK_NEAR_DATA __attribute__((section(".data")))

#ifndef HAK_DEBUG
#define HAK_DEBUG 0
#endif
#ifndef HAK_STATS
#define HAK_STATS 0
#endif

/* Formats into a bounded buffer and writes it to fd (no stdio: it may allocate);
   output longer than the buffer is cut, never read past. */
__attribute__((format(printf, 2, 3))) void hak_print(int fd, const char *fmt, ...);

/* ---- assertions (debug builds only) ---- */
HAK_COLD __attribute__((noreturn, format(printf, 1, 2))) void hak_fatal(const char *fmt, ...);
#if HAK_DEBUG
#define HAK_ASSERT(c)                                                        \
  do {                                                                       \
    if (HAK_UNLIKELY(!(c)))                                                  \
      hak_fatal("hakmem: assertion failed: %s (%s:%d)", #c, __FILE__, __LINE__); \
  } while (0)
#else
#define HAK_ASSERT(c) ((void)0)
#endif

/* ---- size classes (classes.c) ---- */
/* The block size of each class, and of each of malloc's numbers past them. */
extern const uint32_t hak_class_size[HAK_NUMBERS];
extern const uint8_t hak_fast_class[HAK_FAST_MAX / 16 + 1];

/* The class of malloc's number for a size: the numbers past the classes
 * are those of the lists of span blocks at their page's start
 * (HAK_SPAN_COLOUR_MAX). */
HAK_INLINE size_t hak_class_of_number(size_t n) { return n < HAK_CLASSES ? n : n - HAK_SPAN_CLASSES; }
/* The number of the list of span class cls's blocks at their page's start. */
HAK_INLINE size_t hak_span_at_page(size_t cls) { return cls + HAK_SPAN_CLASSES; }
/* malloc's number of a size <= HAK_BIG_MAX: its class, or for a size past
 * the colours of a span class, hak_span_at_page's. */
_Static_assert(HAK_FAST_MAX == HAK_BIG_MAX, "the table covers every slab size");
HAK_INLINE size_t hak_size_number(size_t size) { return hak_fast_class[(size + 15) >> 4]; }
/* Class of a size <= HAK_BIG_MAX. */
HAK_INLINE size_t hak_size_class(size_t size) { return hak_class_of_number(hak_size_number(size)); }
HAK_INLINE bool hak_class_is_span(size_t cls) { return cls >= HAK_SLAB_CLASSES; }

/* ---- os.c: the only place that talks to the kernel ---- */
void *hak_os_map(size_t size);
void hak_os_unmap(void *p, size_t size);
/* Maps size bytes aligned to align (power of two >= page); NULL on failure. */
void *hak_os_map_aligned(size_t size, size_t align);
void hak_os_purge(void *p, size_t size); /* MADV_DONTNEED: RSS drops */
/* As hak_os_purge, where the range's pages past p + accessible were never
 * made accessible (a reserved segment's units): counted, not touched. */
void hak_os_purge_within(void *p, size_t size, size_t accessible);
/* As hak_os_purge, without counting it: [p, p + size) reads zero after. */
void hak_os_empty(void *p, size_t size);
/* Transparent huge pages. Where the kernel backs every aligned 2 MiB it
 * can with one (enabled=always, its own default), a page written was 2 MiB
 * of RSS (random_mixed 2M: 5.7 MiB against 2.0, mimalloc 3.6) and a purge
 * of part of one gives nothing back until the kernel splits it. What a
 * program maps while it holds less than HAK_HUGE_PAGES_AFTER mapped refuses
 * them (hak_os_map does it for mappings of HAK_HUGE_PAGE or more); a
 * program that holds more gets what the kernel gives every program (frag
 * 1 GiB ran 0.48x jemalloc's speed without them). Held, not mapped in all
 * (larson's threads come and go), and 64 MiB: larson 4t holds 41 MiB of
 * segments for 3.6 MiB of RSS, 9.1 MiB with huge pages past 32 MiB. */
#define HAK_HUGE_PAGE ((size_t)2 << 20)
#define HAK_HUGE_PAGES_AFTER ((size_t)64 << 20)
void hak_os_no_huge_pages(void *p, size_t size); /* [p, p + size) never */
bool hak_os_program_is_small(void);              /* holds under HAK_HUGE_PAGES_AFTER */
/* Has the kernel write [p, p + size)'s pages now, in one call instead of a
 * fault each (here 1.5 us a page against 2.0); nothing where it cannot. */
void hak_os_populate(void *p, size_t size);
/* PROT_NONE (false if refused: a mapping split past the kernel's limit), or
 * back to read/write */
bool hak_os_guard(void *p, size_t size, bool on);
/* Address space only, inaccessible (not charged, and not faulted in by
 * mlockall; unlocked under a limit of locked memory, hak_os_commit),
 * aligned to align; NULL on failure. */
void *hak_os_reserve(size_t size, size_t align);
/* As hak_os_map_aligned, but only the first `accessible` bytes (a page
 * multiple) readable and writable, the rest reserved (hak_os_commit). */
void *hak_os_map_reserved(size_t size, size_t align, size_t accessible);
/* Gives back a reservation no part of which was used. */
void hak_os_unreserve(void *p, size_t size);
/* Whether the kernel charges every writable private page against its
 * commit limit when it is mapped, touched or not (vm.overcommit_memory
 * 2): a reservation must then stay inaccessible until it is used. */
bool hak_os_overcommit_never(void);
/* hak_os_overcommit_never, read once: 1 or 0 once read, -1 before, which
 * a test may set first; 1 also once memory was found locked, or a limit
 * of locked memory refused a mapping. The arena
 * reads it when it is reserved, the slab and span tiers at a new segment
 * once the program has threads: a program of one thread does not pay the
 * read at every start (bash's setlocale takes a span segment beside the
 * first), and its segments are few. */
extern _Atomic int hak_commit_strict;
bool hak_os_commit_strict(void);
/* True if `page`, made accessible and holding nothing (it is discarded),
 * is locked: the program locked its future memory (mlockall), so the
 * kernel faulted in all it made accessible. hak_commit_strict is then set:
 * from then on memory is made accessible as it is used, as under strict
 * overcommit. */
bool hak_os_found_locked(void *page);
/* A fork's child locks nothing of its parent's memory. */
void hak_os_fork_child(void);
/* Locks [p, p + size) page by page as it is faulted in (MLOCK_ONFAULT);
 * false if refused. */
bool hak_os_lock_on_fault(void *p, size_t size);
/* Makes [p, p + size) of a reservation readable and writable, charged
 * against that limit; false (errno ENOMEM) if the limit refuses. Under a
 * limit of locked memory that refused a mapping (os.c), also locked:
 * false if the lock is refused, the range then accessible and unused. */
bool hak_os_commit(void *p, size_t size);
/* Maps [p, p + size) again, empty and inaccessible: its pages and its
 * charge go back (statistics unchanged). False, and nothing changed, if
 * the kernel refuses (at vm.max_map_count areas, as the range would make
 * one more). */
bool hak_os_uncommit(void *p, size_t size);
/* Maps [p, p + size) again, zero and read-only, which is not charged;
 * false if the kernel refuses. */
bool hak_os_read_only(void *p, size_t size);
/* hak_os_uncommit, and the range no longer counts as mapped either way.
 * False if refused: the range is as it was, for the caller to empty. */
bool hak_os_decommit(void *p, size_t size);
/* Moves size bytes of pages to target (replacing what is there) and maps
 * the old range again, empty and inaccessible; false (nothing done) on
 * failure. live: the pages hold a block, and target none; a move that
 * fails part way then aborts, naming the fault. */
bool hak_os_move(void *old, size_t size, void *target, bool live);
/* The pages of a and b trade places, through scratch (reserved, unused,
 * mapped again empty as hak_os_move does): 2 if they did, 1 if a took b's
 * but its own could not go to b (left empty), 0 (nothing moved) if the
 * first move fails. */
int hak_os_swap(void *a, void *b, void *scratch, size_t size);
/* Bytes of [p, p + size) in memory or swapped out, at most 64 pages;
 * size if the kernel cannot tell. */
size_t hak_os_resident(void *p, size_t size);
/* mremap: in place when target is NULL, else moved to target (replacing
 * what is mapped there); NULL on failure. */
void *hak_os_remap(void *old, size_t old_size, size_t new_size, void *target);
uint64_t hak_clock_ms(void);
uint64_t hak_clock_ns(void);
/* CLOCK_MONOTONIC ns from now, as the deadline of a timed wait. */
struct timespec hak_clock_deadline(uint64_t ns);
size_t hak_os_rss(void);
size_t hak_os_rss_peak(void);
/* Whether the calling thread is the process's last (a main thread that
 * called pthread_exit not counted); false when /proc cannot tell. */
bool hak_os_last_thread(void);

/* ---- segment map (segmap.c): one byte per 4 MiB chunk of the 47-bit
 * address space (32 MiB of address space, untouched but for the chunks
 * hakmem uses) ---- */
#define HAK_SEGMAP_SIZE ((size_t)1 << (47 - HAK_SEG_SHIFT))
extern _Atomic uint8_t hak_segmap[HAK_SEGMAP_SIZE];
/* What a chunk's byte says, so that free goes to its tier in one compare. */
enum {
  HAK_SEGMAP_NONE = 0,  /* not ours */
  HAK_SEGMAP_SLABS = 1, /* a slab segment, or a large block's own mapping */
  HAK_SEGMAP_SPANS = 2, /* a span segment */
  HAK_SEGMAP_LARGE = 3, /* the large arena: headers at HAK_LARGE_GRAIN boundaries */
};

/* Chunk c's byte is the map's byte ~c: the chunks mmap hands out, at the
 * top of the address space, have the map's first bytes, which lie within
 * 2 MiB of the library's other data (segmap.c), so that a fork copies one
 * page table for all of it (bash's subshells: 1.01-1.02x). */
HAK_INLINE size_t hak_segmap_slot_of_chunk(uintptr_t chunk) { return ~chunk & (HAK_SEGMAP_SIZE - 1); }
/* The slot of (p - 1)'s chunk, from -p (which is ~(p - 1)): free's load of
 * the byte then waits on three instructions, not four (larson 8-128 B
 * 1.024x, unit.segmap_slot_of_a_pointer_is_its_chunks). */
HAK_INLINE size_t hak_segmap_slot(const void *p) {
  return ((0 - (uintptr_t)p) >> HAK_SEG_SHIFT) & (HAK_SEGMAP_SIZE - 1);
}
/* The byte of (p - 1)'s chunk. NULL maps to the last chunk of the address
 * space, which is never used. A plain read: a chunk's byte is set before
 * any of its blocks is handed out and changed only once none is live, so
 * only a free of a pointer that is not (or no longer) a block can race
 * with the write. */
HAK_INLINE uint8_t hak_segmap_of(const void *p) { return *(const uint8_t *)&hak_segmap[hak_segmap_slot(p)]; }
/* Whether (p - 1)'s chunk is a segment of ours. */
HAK_INLINE bool hak_segmap_has(const void *p) { return hak_segmap_of(p) != HAK_SEGMAP_NONE; }

/* Whether segments may start in [start, start + size) (none in the last
 * chunk, which stands for NULL), the map's bytes for them made writable
 * (segmap.c says why they may not be); false with ENOMEM if not. */
bool hak_segmap_open(const void *start, size_t size);
/* Once: the map's bytes that no segment needs made read-only, now or if
 * the first segment is a second old (segmap.c says why). */
void hak_segmap_trim(bool now);
/* The large arena's tables read-only while there is no arena (large.c). */
void hak_large_trim_tables(void);
extern pthread_mutex_t hak_segmap_lock; /* taken last */

/* The header of the arena block that (p - 1) is in the first chunk of,
 * or NULL; (p - 1) is in the arena: its segment-map byte is
 * HAK_SEGMAP_LARGE (large.c). */
hak_segment_t *hak_large_header(const void *p);
/* p was where an arena block started, freed and its header gone since
 * (its chunk purged, or its pages moved to another block): freeing it
 * again is a double free. */
bool hak_large_freed_start(const void *p);
/* The start of (p - 1)'s chunk, whose segment-map byte hak_segmap_of reads:
 * the segment of a slab or span block p, unchecked. */
HAK_INLINE hak_segment_t *hak_segment_base(const void *p) {
  return (hak_segment_t *)(((uintptr_t)p - 1) & ~(uintptr_t)HAK_SEG_MASK);
}
/* The segment of p, or NULL if p is not in memory hakmem handed out. */
HAK_INLINE hak_segment_t *hak_segment_of(const void *p) {
  uint8_t m = hak_segmap_of(p);
  if (HAK_UNLIKELY(m == HAK_SEGMAP_NONE)) return NULL;
  if (HAK_UNLIKELY(m == HAK_SEGMAP_LARGE)) return hak_large_header(p);
  return hak_segment_base(p);
}
/* Where p's unit is in the segment's array: (p's offset >> HAK_UNIT_SHIFT)
 * * 16 bytes, from p in two instructions. Its fields are read at that
 * offset from their own first one, so that each read is one instruction. */
_Static_assert(sizeof(hak_unit_t) == 16, "hak_unit_byte scales by 16");
HAK_INLINE uintptr_t hak_unit_byte(const void *p) {
  return ((uintptr_t)p >> (HAK_UNIT_SHIFT - 4)) & ((uintptr_t)(HAK_MAX_SLABS - 1) << 4);
}
HAK_INLINE hak_slab_t *hak_unit_slab(hak_segment_t *seg, uintptr_t byte) {
  return *(hak_slab_t **)((uint8_t *)&seg->unit[0].slab + byte);
}
HAK_INLINE hak_block_t **hak_unit_free_to(hak_segment_t *seg, uintptr_t byte) {
  return *(hak_block_t ***)((uint8_t *)&seg->unit[0].free_to + byte);
}
/* The slab of p's unit. A large block's header maps every unit to its
 * slabs[0] (large.c), wherever in the 4 MiB p is. */
HAK_INLINE hak_slab_t *hak_slab_of(hak_segment_t *seg, const void *p) {
  return hak_unit_slab(seg, hak_unit_byte(p));
}
HAK_INLINE uint8_t *hak_slab_start(hak_segment_t *seg, hak_slab_t *slab) {
  size_t off = (size_t)slab->index << HAK_UNIT_SHIFT;
  return (uint8_t *)seg + (off ? off : HAK_SEG_HEADER);
}
HAK_INLINE size_t hak_slab_bytes(const hak_slab_t *slab) {
  return ((size_t)slab->units << HAK_UNIT_SHIFT) - (slab->index ? 0 : HAK_SEG_HEADER);
}
/* A slab's state is read by other threads (remote frees look for FULL and
 * FREE slabs) while its owner changes it: relaxed atomics, plain movs. */
HAK_INLINE void hak_slab_set_state(hak_slab_t *slab, hak_slab_state_t state) {
  __atomic_store_n(&slab->state, (uint8_t)state, __ATOMIC_RELAXED);
}
HAK_INLINE hak_slab_state_t hak_slab_state(const hak_slab_t *slab) {
  return (hak_slab_state_t)__atomic_load_n(&slab->state, __ATOMIC_RELAXED);
}

/* Whether p (in the slab's segment) is the start of a block the slab has
 * carved, given its block_bound: one multiply, one subtract, one compare
 * (see slab->magic). An address before the first block wraps to a multiple
 * too large, if a multiple at all, and fails like one past the blocks. */
_Static_assert(HAK_BIG_MAX + HAK_CANARY <= ((size_t)1 << 31), "block sizes keep magic > 2^33");
_Static_assert(HAK_SEG_SIZE <= ((size_t)1 << 31), "offsets in a segment stay under 2^31");
HAK_INLINE bool hak_slab_is_block_below(const hak_slab_t *slab, const void *p, uint64_t bound) {
  return (uint64_t)(uintptr_t)p * slab->magic - slab->first_magic < bound;
}
/* The same, from any thread. */
HAK_INLINE bool hak_slab_is_block(const hak_slab_t *slab, const void *p) {
  return hak_slab_is_block_below(slab, p, __atomic_load_n(&slab->block_bound, __ATOMIC_RELAXED));
}
/* The slab's blocks carved so far become n (by its owner). */
HAK_INLINE void hak_slab_set_reserved(hak_slab_t *slab, uint32_t n) {
  slab->reserved = n;
  uint64_t step = (uint64_t)slab->block_size * slab->magic; /* wraps to the step */
  __atomic_store_n(&slab->block_bound, n * step, __ATOMIC_RELAXED);
}

/* Whether p is a block start of a slab in use: the checks any thread can
 * make, as they read only what the owner does not change while the slab is
 * in use (block size and magic are set before any block of the slab is
 * handed out), the state and the bound, atomically. A block handed out was
 * carved before, so a thread that got it sees the bound that covers it. */
HAK_INLINE bool hak_slab_has_block(const hak_slab_t *slab, const void *p) {
  return hak_slab_state(slab) != HAK_SLAB_FREE && hak_slab_is_block(slab, p);
}

HAK_INLINE hak_segment_t *hak_segment_of_slab(hak_slab_t *slab) {
  return (hak_segment_t *)((uintptr_t)slab & ~HAK_SEG_MASK);
}
/* Where the owner's frees into the slab go (see hak_unit_t). */
HAK_INLINE hak_block_t **hak_slab_free_to(hak_slab_t *slab) {
  return hak_segment_of_slab(slab)->unit[slab->index].free_to;
}

/* ---- segment.c ---- */
void hak_segmap_set(hak_segment_t *seg, uint8_t value); /* HAK_SEGMAP_* */
/* A FREE slab of n units (shorter, down to 4 blocks of block_size, to
 * reuse committed memory) in heap's segments, then adopted, cached or new
 * ones, its units set; NULL when out of memory. May adopt abandoned
 * segments: the caller re-checks its queues when *adopted is set.
 * *new_pages: whether the slab takes memory not committed yet. */
hak_slab_t *hak_segment_alloc_slab(hak_heap_t *heap, unsigned n, size_t block_size,
                                   bool *adopted, bool *new_pages);
/* Marks a slab FREE; its segment, if that empties it, goes to the cache,
 * unless `keep` (the heap's own thread frees: see segment.c). */
void hak_segment_free_slab(hak_heap_t *heap, hak_slab_t *slab, bool keep);
/* Heap is going away: release or abandon every segment it owns. */
void hak_segment_abandon_all(hak_heap_t *heap);
/* Purge FREE slabs released longer than the purge delay ago (force: all). */
void hak_segment_purge(hak_heap_t *heap, bool force);
/* Return cached segments to the OS (force: all, else expired ones). */
bool hak_segment_cache_collect(bool force); /* true while some remain */
/* Purges free slabs of abandoned segments; true while some wait. */
bool hak_segment_purge_abandoned(bool force);
/* Adopt every abandoned segment into heap and free the empty ones. */
void hak_segment_reclaim_abandoned(hak_heap_t *heap);
/* A thread freeing into an abandoned segment takes it over (false if
 * another thread did first, or it was empty and went to the cache). */
bool hak_segment_reclaim_one(hak_heap_t *heap, hak_segment_t *seg);
extern pthread_mutex_t hak_segment_lock;

/* The span tier takes whole empty segments from the segment cache (or new
 * ones) and gives them back: *zero, their memory past the header is zero;
 * *purged, none of it counts as committed. */
hak_segment_t *hak_segment_take_empty(bool *zero, bool *purged);
/* Makes seg readable and writable up to `end` bytes from its start (see
 * reserved_from); false with ENOMEM if the commit limit refuses. */
bool hak_segment_commit(hak_segment_t *seg, size_t end);
void hak_segment_put_empty(hak_segment_t *seg, bool zero, bool purged);

/* ---- span.c: blocks of the span classes ---- */
/* A span segment's page words: the low two bits tell what a page is. */
#define HAK_PAGE_FREE 1u /* first or last page of a free run: its record's handle (span.c) */
#define HAK_PAGE_USED 2u /* first page of a block: pages << 16 | class << 8 | 2 */
#define HAK_PAGE_TAIL 3u /* last page of a block of two pages or more: heap number << 2 | 3 */
#define HAK_PAGE_TAG 3u
/* p's page in its segment (0, a header page, for a pointer at the very
 * end of a segment). */
HAK_INLINE unsigned hak_span_page_index(const void *p) {
  return (unsigned)(((uintptr_t)p & HAK_SEG_MASK) >> HAK_PAGE_SHIFT);
}
/* a rounded down and up to a page (up wraps to 0 past the top). */
HAK_INLINE uintptr_t hak_page_down(uintptr_t a) { return a & ~(uintptr_t)(HAK_PAGE_SIZE - 1); }
HAK_INLINE uintptr_t hak_page_up(uintptr_t a) { return hak_page_down(a + HAK_PAGE_SIZE - 1); }
/* p's offset in its page. */
HAK_INLINE uintptr_t hak_page_offset(const void *p) { return (uintptr_t)p & (HAK_PAGE_SIZE - 1); }
/* A span block starts at its first page's colour, one of 16 lines of the
 * first KiB chosen by the page's address, unless it is one of its class's
 * blocks at their page's start (hak_span_at_page: for the sizes that do
 * not fit after every colour, and alignments). Page-aligned blocks put
 * their first lines, which malloc's pop and the program read and write,
 * in one set of L1 and 16 of L2's 1,024 sets (on the AMD hosts: 128 lines
 * for all of them); the floor allocator with page-multiple classes ran
 * mid_large_mt 8-32 KiB 1.04x faster with its blocks 256 B further apart
 * from one page to the next. */
HAK_INLINE uintptr_t hak_span_colour(const void *p) {
  uintptr_t a = (uintptr_t)p;
  return (((a >> 4) ^ a) >> 6) & HAK_SPAN_COLOUR_MAX; /* page number bits 0-3 xor 4-7, as lines */
}
/* The bytes of span block p of class (or number) cls: from p to the end of its pages. */
HAK_INLINE size_t hak_span_block_bytes(size_t cls, const void *p) {
  return hak_class_size[cls] - hak_page_offset(p);
}
HAK_INLINE size_t hak_span_word_class(uint32_t w) { return (size_t)(uint8_t)(w >> 8); }
/* The page_block entry of p's page, and what it tells: malloc's number
 * of the block that starts there, the cache free puts it in (its class, or
 * hak_span_at_page's; 0: none), and where on the page it starts. */
HAK_INLINE uint16_t hak_span_entry(const hak_segment_t *seg, const void *p) {
  return seg->span.page_block[hak_span_page_index(p)];
}
HAK_INLINE size_t hak_span_entry_number(uint16_t e) { return (uint8_t)e; }
HAK_INLINE uintptr_t hak_span_entry_offset(uint16_t e) { return ((uintptr_t)e & 0xff00) >> 2; } /* lines x 64 */
/* The entry of a block of number n starting `offset` bytes (a colour, or 0) into its first page. */
HAK_INLINE uint16_t hak_span_entry_make(size_t n, uintptr_t offset) { return (uint16_t)(offset >> 6 << 8 | n); }
/* Whether p starts a block in use, e being its page's entry. */
HAK_INLINE bool hak_span_entry_is_block(uint16_t e, const void *p) {
  return hak_page_offset(p) == hak_span_entry_offset(e) && hak_span_entry_number(e) != 0;
}
/* malloc's slow path for a span class, given as malloc's number (the
 * class, or hak_span_at_page's): a block of that cache, else of the
 * class's other one, else a refill (creating a new thread's heap first);
 * NULL with ENOMEM when out of memory. */
HAK_NOINLINE void *hak_span_malloc_slow(size_t size, hak_heap_t *heap, size_t number);
/* A span block of size bytes at a multiple of align (> HAK_SLAB_ALIGN_MAX,
 * <= HAK_BIG_MAX); NULL with ENOMEM when out of memory. */
void *hak_span_alloc_aligned(size_t size, size_t align);
/* What free's fast path does not handle for a block of span segment seg
 * (see hak_span_free_inline). */
HAK_NOINLINE void hak_span_free_slow(hak_segment_t *seg, void *p);
void *hak_span_realloc(hak_segment_t *seg, void *p, size_t size);
size_t hak_span_usable_size(hak_segment_t *seg, const void *p); /* checks p */
/* The heap's caches go back to the page heap (collect, and at its
 * thread's exit); when it retires, their growth too. */
void hak_span_flush(hak_heap_t *heap);
/* A slab of the heap's thread is about to fault in new pages: the heap's
 * caches of the classes over 256 KiB, which hold one block each, give
 * theirs back to the OS, so that a block the program has left there (a
 * hash table's old buckets) is not held beside the small blocks that grow
 * in its stead. */
void hak_span_slab_grows(hak_heap_t *heap);
void hak_span_heap_done(hak_heap_t *heap);
void hak_span_heap_retire(hak_heap_t *heap);
void hak_span_heap_init(hak_heap_t *heap); /* a new heap's cache bounds */
size_t hak_span_cache_growth(void); /* bytes the caches of all threads have grown by */
/* Purges free runs idle for the purge delay (force: all, and releases
 * every segment all free); true while some wait. */
bool hak_span_purge(bool force);
/* The large tier is about to fault in `bytes` new pages: while the page
 * heap holds more committed free pages than pages of blocks, that many of
 * them go back to the OS (runs of 64 KiB or more, idle for a quarter of
 * the purge delay), so that memory moving from one tier to the other is
 * not held twice. */
void hak_span_shed(size_t bytes);
/* The purger's look at a heap: its unfinished batches of a draining heap
 * go back if it freed none since the last look (or when forced); true if
 * some wait. */
bool hak_span_drain_collect(hak_heap_t *heap, bool force);
void hak_span_fork_prepare(void);
void hak_span_fork_parent(void);
void hak_span_fork_child(void);

/* ---- slab.c ---- */
/* A small class's detached slab's own list of at least this many blocks
 * goes to the heap in address order (slab.c, take_local). */
#define HAK_SORT_MIN 1024
void hak_slab_init(hak_slab_t *slab, size_t cls);
/* Moves remote frees to local_free. */
void hak_slab_collect_remote(hak_slab_t *slab);
/* Puts a list of blocks of slab back on its local free list. */
void hak_slab_give_back(hak_slab_t *slab, hak_block_t *list);
/* b, a block of heap's slab (not attached), freed as its owner frees it:
 * onto local_free; a FULL slab goes back to its class's queue. Under the
 * heap's lock (FULL slabs are the purger's too). */
void hak_slab_take_back(hak_heap_t *heap, hak_slab_t *slab, hak_block_t *b);
/* malloc's miss for a slab class: refills the heap's list of cls
 * (creating a new thread's heap first) and pops a block for a request of
 * size; NULL with ENOMEM when out of memory. */
HAK_NOINLINE void *hak_heap_refill(size_t size, hak_heap_t *heap, size_t cls);
/* Puts the heap's list for cls back onto its current slab (the list holds
 * only that slab's blocks); returns that slab, or NULL. */
hak_slab_t *hak_heap_return_list(hak_heap_t *heap, size_t cls);
/* Free fast path found used == 0. */
void hak_slab_emptied(hak_heap_t *heap, hak_slab_t *slab);
void hak_queue_push_front(hak_slab_queue_t *q, hak_slab_t *s);
void hak_queue_push_back(hak_slab_queue_t *q, hak_slab_t *s);
void hak_queue_remove(hak_slab_queue_t *q, hak_slab_t *s);
/* Takes an orphan slab into heap's queues; false if it is empty (the
 * caller frees it). */
bool hak_slab_adopt(hak_heap_t *heap, hak_slab_t *slab);
/* The purger, holding the heap's lock: releases the FULL slabs of an idle
 * heap whose blocks have all been freed by other threads, counting about
 * *budget remote blocks at most; true if the heap should be looked at
 * again. */
bool hak_slab_release_idle_full(hak_heap_t *heap, size_t *budget);
/* Holding the heap's lock: FULL slabs that received remote frees have them
 * collected and go back to the queue. */
void hak_heap_revive_full_locked(hak_heap_t *heap);

/* ---- heap.c ---- */
extern __thread hak_heap_t *hak_tls_heap;
/* The calling thread's token: its thread pointer, which free compares with
 * a slab's owner in one instruction (%fs:0 is a constant address, where the
 * TLS heap pointer needs its offset loaded first). Live threads have
 * distinct ones; a dead thread's may come back, so a heap releases its
 * slabs when its thread exits, and a new heap retires any heap left with
 * its token (see hak_heap_get). */
HAK_INLINE uintptr_t hak_thread_token(void) { return (uintptr_t)__builtin_thread_pointer(); }
/* The sentinel heap: all lists empty. Read-only, so that a write through
 * a thread's heap pointer before it has a heap faults at once. */
extern const hak_heap_t hak_heap_empty;
#define HAK_HEAP_EMPTY ((hak_heap_t *)&hak_heap_empty)
/* The calling thread's heap, created on first use; NULL when out of memory. */
hak_heap_t *hak_heap_get(void);
/* The heap of a thread without one that frees a block of owner's (NULL:
 * of no known heap): owner if it is parked or parks soon, else as
 * hak_heap_get's; NULL once the thread's exit handler has run. */
hak_heap_t *hak_heap_for_heir(hak_heap_t *owner);
/* The heap of that number (hak_heap_t.number), if any: a hint, its thread
 * perhaps another by now. */
hak_heap_t *hak_heap_numbered(uint32_t number);
/* A young heap's thread frees a block of block_size bytes into parked:
 * true if it parked its own heap to take that one (heap.c); the thread
 * then has it, or no heap if another thread took it first. */
bool hak_heap_switch_to_parked(hak_heap_t *heap, hak_heap_t *parked, size_t block_size);
void hak_heap_done(hak_heap_t *heap);
void hak_heap_thread_exit(hak_heap_t *heap); /* the thread's exit handler */
/* The heap a free may give a thread: hak_heap_get's, or NULL once the
 * thread's exit handler has run. */
hak_heap_t *hak_heap_for_free(void);
void hak_heap_collect(hak_heap_t *heap, bool force);
void hak_heaps_abandon_others(hak_heap_t *keep); /* fork child */
void hak_heaps_retire_parked(void); /* the heaps of exited threads, now */
/* Parked heaps with no block in use that wait for a new thread even while
 * threads take memory not committed yet. */
#define HAK_KEEP_EMPTY_HEAPS 4
/* Past those, retires the empty heap parked longest: called, holding no
 * lock, where a thread may take memory not committed yet. */
void hak_heaps_trim_empty(void);
/* Frees b, a checked block of slab, whose heap is parked; false if the
 * heap is not parked any more. */
bool hak_heap_free_parked(hak_heap_t *heap, hak_segment_t *seg, hak_slab_t *slab, hak_block_t *b);
/* fork: take every heap's lock (and the list lock); release or re-init. */
void hak_heaps_lock_all(void);
void hak_heaps_unlock_all(bool reinit);
/* Purges heaps whose delay has passed; true while any purge is pending. */
bool hak_heaps_purge_due(uint64_t now);
/* Whether a thread other than the caller holds a heap (not parked). */
bool hak_heaps_other_thread(void);
extern pthread_mutex_t hak_heaps_lock;

/* ---- usage: what is in use and free right now (introspection) ---- */
typedef struct {
  size_t blocks_used[HAK_CLASSES], blocks_free[HAK_CLASSES];
  size_t used_bytes;   /* slab blocks handed out (or in other threads' lists) */
  size_t free_bytes;   /* free space in slabs that are in use */
  size_t cached_bytes; /* free slabs, cached segments and large blocks */
} hak_usage_t;
void hak_segment_usage(hak_segment_t *seg, hak_usage_t *u);
void hak_segment_usage_abandoned(hak_usage_t *u);
void hak_heaps_usage(hak_usage_t *u); /* every heap and abandoned segment */
/* n blocks of class cls counted used are free (waiting in a list). */
static inline void hak_usage_unused(hak_usage_t *u, size_t cls, size_t n) {
  n = n < u->blocks_used[cls] ? n : u->blocks_used[cls];
  u->blocks_used[cls] -= n;
  u->blocks_free[cls] += n;
  u->used_bytes -= n * hak_class_size[cls];
  u->free_bytes += n * hak_class_size[cls];
}
/* The large blocks all heaps keep (hak_large_kept_count). */
void hak_heaps_large_kept(size_t *blocks, size_t *map_bytes);
/* Gives back the large blocks of heaps that kept none since the last
 * call (or the purger's pass); returns how many heaps it looked at. */
size_t hak_heaps_kept_sweep(void);
void hak_span_usage(hak_usage_t *u);  /* span segments */
/* Everything free goes back to the OS now: all heaps, all caches. */
bool hak_release_all(void);

/* ---- large.c ---- */
void *hak_large_alloc(size_t size, size_t align, bool zero);
/* For a block that realloc grows into a new large block: it will grow
 * again, so its next growth commits its new chunks whole, and after a
 * small step, its own chunks are committed whole at once. */
void *hak_large_alloc_grown(size_t size, bool small_step);
void hak_large_free(hak_segment_t *seg);
void *hak_large_realloc(hak_segment_t *seg, void *p, size_t size);
bool hak_large_cache_collect(bool force); /* true while some remain */
/* The heap's kept large blocks go back to the arena: all of them, or only
 * if none was kept since the last call without force. True while some
 * remain. */
bool hak_large_kept_release(hak_heap_t *heap, bool force);
/* Adds the blocks the heap keeps, and their mappings' bytes. */
void hak_large_kept_count(hak_heap_t *heap, size_t *blocks, size_t *map_bytes);
/* For reports: large blocks in use, their bytes, and the bytes of freed
 * ones held (the arena's free chunks and the blocks heaps keep). */
void hak_large_usage(size_t *live, size_t *bytes, size_t *cached);
/* Moves into each 2 MiB half of segment seg, whose pages they replace, the
 * committed pages of a free chunk of the arena (the most committed one,
 * with at least 64 KiB), while some have them; bit i set: half i got
 * pages. None in builds with guard pages (the header's would go). */
unsigned hak_large_donate_segment(void *seg);
extern pthread_mutex_t hak_large_lock;

/* ---- alloc.c / free.c ---- */
HAK_NOINLINE void hak_free_generic(void *p);
/* Hands over the blocks the heap's outboxes hold (free.c). */
void hak_free_flush_outboxes(hak_heap_t *heap);
/* The bytes of blocks of class cls that fill an outbox: a page of small
 * blocks, four of larger ones, of which a page holds fewer than 4. Each push
 * is a locked instruction, which waits for the writes of the blocks' links
 * to lines the freeing thread has not touched for a while: pushes of one or
 * two blocks of 1-7 KiB spent most of a consumer's time there (xmalloc 1p1c
 * of 1-4 KiB blocks 1.4x as fast with four pages). */
HAK_INLINE size_t hak_outbox_bytes(size_t cls) {
  return cls < HAK_SMALL_CLASSES ? HAK_PAGE_SIZE : 4 * HAK_PAGE_SIZE;
}
void *hak_alloc_aligned(size_t align, size_t size);
/* posix_memalign past its inline pop (align valid). */
HAK_NOINLINE int hak_posix_memalign_generic(void **out, size_t align, size_t size);
void *hak_alloc_zero(size_t count, size_t size);
void *hak_realloc_impl(void *p, size_t size);
/* realloc's copy: a new block for p (old usable bytes) of size > 0, p
 * freed; NULL, p still valid, when out of memory. */
HAK_NOINLINE void *hak_realloc_move(void *p, size_t size, size_t old);
/* The new block hak_realloc_move takes, not yet written. */
void *hak_realloc_block(size_t size, size_t old);
/* What hak_usable_size_inline does not handle: NULL, large blocks, and
 * pointers that are not a block in use (it aborts, naming the fault). */
HAK_NOINLINE size_t hak_usable_size_generic(const void *p);
HAK_COLD __attribute__((noreturn)) void hak_invalid_free(const void *p);
HAK_COLD __attribute__((noreturn)) void hak_double_free(const void *p);
/* Abort with a named error unless p is a live block's start (slow paths):
 * of a slab, or of a large block. */
void hak_check_block(hak_segment_t *seg, hak_slab_t *slab, const void *p);
void hak_check_large(hak_segment_t *seg, const void *p);

/* ---- options.c ---- */
#include "options.h"

/* ---- stats.c ---- */
typedef struct {
  _Atomic size_t mapped, mapped_peak, committed, os_mapped_total, os_returned;
  _Atomic size_t segments, large_live, large_bytes, large_cached;
  _Atomic size_t refills, slabs_allocated, purges, remote_collects;
  _Atomic size_t remote_frees, slow_path_ns; /* stats builds only */
} hak_gstats_t;
extern hak_gstats_t hak_gstats;
#define HAK_STAT_ADD(f, n) atomic_fetch_add_explicit(&hak_gstats.f, (n), memory_order_relaxed)
#define HAK_STAT_SUB(f, n) atomic_fetch_sub_explicit(&hak_gstats.f, (n), memory_order_relaxed)
void hak_stats_mapped(size_t n, bool on);
#define HAK_STATS_LARGE HAK_NUMBERS /* the per-class counters' index of large blocks */
#if HAK_STATS
/* Exact per-class counters (stats and debug builds only), given a class,
 * malloc's number, or HAK_STATS_LARGE. */
void hak_stats_class_alloc(size_t cls, size_t size);
void hak_stats_class_free(size_t cls);
size_t hak_stats_live_blocks(void); /* blocks allocated and not freed */
#define HAK_CSTAT_ALLOC(cls, size) hak_stats_class_alloc(cls, size)
#define HAK_CSTAT_FREE(cls) hak_stats_class_free(cls)
#define HAK_XSTAT_ADD(f, n) HAK_STAT_ADD(f, n)
/* Times a slow path into slow_path_ns. */
#define HAK_SLOW_BEGIN() uint64_t hak_slow_t0 = hak_clock_ns()
#define HAK_SLOW_END() HAK_STAT_ADD(slow_path_ns, hak_clock_ns() - hak_slow_t0)
#else
#define HAK_XSTAT_ADD(f, n) ((void)0)
#define HAK_SLOW_BEGIN() ((void)0)
#define HAK_SLOW_END() ((void)0)
#define HAK_CSTAT_ALLOC(cls, size) ((void)0)
#define HAK_CSTAT_FREE(cls) ((void)0)
#endif
void hak_stats_report(int fd);
/* The report as `key value` lines (HAKMEM_STATS_FILE). */
void hak_stats_write_records(int fd);

/* ---- purge.c: the background purger ---- */
/* Something will need purging after the delay: make sure the purger runs. */
void hak_purge_wake(void);
extern _Atomic int hak_purge_started, hak_purge_running;
void hak_purge_start_slow(void);
/* What a program of one thread maps before the purger gets a thread. */
#define HAK_PURGER_MIN_MAPPED ((size_t)32 << 20)
/* Purges run only in the program's own calls: it has no purger thread and
 * would get none (HAKMEM_PURGE_THREAD=0, a refused thread, or one thread
 * that has mapped little), so nothing gives back on time what it freed
 * before it stopped calling. */
bool hak_purge_in_calls_only(void);
/* Starts the purger thread if it was asked for and is not running, or,
 * where it runs no thread, makes a pass that is due; called only where no
 * lock is held and the caller's own work is done, as creating the thread
 * allocates (pthread_create reenters malloc). */
HAK_INLINE void hak_purge_start(void) {
  if (HAK_UNLIKELY(!atomic_load_explicit(&hak_purge_started, memory_order_relaxed)))
    hak_purge_start_slow();
}
/* Exiting threads park their heaps for the next new threads while the
 * purger runs, which retires them after the delay; without a delay they
 * retire at once, as without the purger. */
HAK_INLINE bool hak_heaps_park(void) {
  return hak_opt.purge_delay_ms != 0 &&
         atomic_load_explicit(&hak_purge_running, memory_order_acquire);
}
/* Whether the program has grown within the purge delay: mapped new memory,
 * or (took) kept more of what it had than when the caller last looked (the
 * callers look at least once per pass). Free memory then waits
 * HAK_GROWTH_WAIT delays before it is purged. */
bool hak_purge_growing(uint64_t now, bool took);
#define HAK_GROWTH_WAIT 16
/* Hands a mapping to the purger thread to unmap; false (nothing done) if
 * it is not running. */
bool hak_purge_unmap_later(void *p, size_t size);
/* Unmaps now whatever was handed over. */
void hak_purge_drain(void);
void hak_purge_fork_prepare(void);
void hak_purge_fork_parent(void);
void hak_purge_fork_child(void);

/* The end of a refill, with b popped (NULL when out of memory): the purger
 * may start now (creating its thread allocates, which could take the list
 * just refilled), and a failure sets errno. */
HAK_INLINE void *hak_refill_done(void *b, size_t cls, size_t size) {
  hak_purge_start();
  if (HAK_UNLIKELY(b == NULL)) {
    errno = ENOMEM;
    return NULL;
  }
  HAK_CSTAT_ALLOC(cls, size);
  return b;
}

/* ---- init.c ---- */
#if HAK_SECURE
uint64_t hak_random(void); /* per-thread xorshift, seeded from the secret */
#endif
void hak_process_init(void);
/* The program has never created a thread (glibc's __libc_single_threaded;
 * false without it). */
bool hak_single_threaded(void);
/* Without a purge delay, a program of one thread gives back at once all
 * it frees, even the blocks a thread that only frees would hand on to the
 * others (span.c's drain_add), and so needs no pass (hak_purge_start_slow).
 * With threads those blocks wait for the others' refills and the purger's
 * passes: given back at once, lowmem's xmalloc 1p1c of 8-32 KiB ran 163x
 * slower. Inline: drain_add asks on every free of a draining heap. */
HAK_INLINE bool hak_purge_all_at_once(void) {
  return hak_opt.purge_delay_ms == 0 && hak_single_threaded();
}
extern pthread_key_t hak_thread_key;
extern _Atomic int hak_key_ready;

/* ---- free-list links: plain, or encoded with a secret in secure builds ---- */
#if HAK_SECURE
extern uintptr_t hak_secret;
HAK_INLINE hak_block_t *hak_next(const hak_block_t *b) {
  return (hak_block_t *)((uintptr_t)b->next ^ hak_secret ^ (uintptr_t)b);
}
HAK_INLINE void hak_set_next(hak_block_t *b, hak_block_t *next) {
  b->next = (hak_block_t *)((uintptr_t)next ^ hak_secret ^ (uintptr_t)b);
}
/* Word 1 of a free block holds a keyed tag: freeing a block that carries it
 * is a double free. The last word of a live block holds a keyed canary. */
HAK_INLINE uintptr_t hak_free_tag(const void *b) {
  return hak_secret ^ (uintptr_t)b ^ (uintptr_t)0xf7eeb10cf7eeb10cull;
}
HAK_INLINE uintptr_t hak_canary(const void *b) {
  return hak_secret ^ ((uintptr_t)b * 0x9e3779b97f4a7c15ull);
}
HAK_INLINE void hak_block_handout(void *b, size_t block_size) {
  ((uintptr_t *)b)[1] = 0;
  *(uintptr_t *)((uint8_t *)b + block_size - HAK_CANARY) = hak_canary(b);
}
HAK_COLD __attribute__((noreturn)) void hak_overflow(const void *p);
/* A block kept in place by realloc now ends elsewhere. */
HAK_INLINE void hak_block_resized(void *b, size_t block_size) {
  *(uintptr_t *)((uint8_t *)b + block_size - HAK_CANARY) = hak_canary(b);
}
HAK_INLINE void hak_block_check_free(void *b, size_t block_size) {
  if (HAK_UNLIKELY(((uintptr_t *)b)[1] == hak_free_tag(b))) hak_double_free(b);
  if (HAK_UNLIKELY(*(uintptr_t *)((uint8_t *)b + block_size - HAK_CANARY) != hak_canary(b)))
    hak_overflow(b);
  ((uintptr_t *)b)[1] = hak_free_tag(b);
}
#else
HAK_INLINE hak_block_t *hak_next(const hak_block_t *b) { return b->next; }
HAK_INLINE void hak_set_next(hak_block_t *b, hak_block_t *next) { b->next = next; }
HAK_INLINE void hak_block_handout(void *b, size_t block_size) {}
HAK_INLINE void hak_block_resized(void *b, size_t block_size) {}
HAK_INLINE void hak_block_check_free(void *b, size_t block_size) {}
#endif

/* slab (p's) if it is this thread's ACTIVE slab, only then ours to read
 * without atomics, and p one of its block starts; else NULL. The test of
 * free's fast path: the slow paths name the fault. */
HAK_INLINE hak_slab_t *hak_own_slab(hak_slab_t *slab, const void *p) {
  return atomic_load_explicit(&slab->owner, memory_order_relaxed) == hak_thread_token() &&
                 hak_slab_is_block_below(slab, p, slab->block_bound) /* ours: written here */
             ? slab
             : NULL;
}

/* The address of the head of cls's list, in a register of its own, so
 * that the pop and the push load and store the head at a register alone:
 * on an Intel Xeon (2026-12-03) a malloc/free loop of one size ran 2.5x as
 * fast as with the head at heap + 8 * cls (an index register), and the
 * other workloads as fast. Written as asm: gcc folds a plain
 * &heap->free[cls] back into the load's address. */
HAK_INLINE hak_block_t **hak_heap_head(hak_heap_t *heap, size_t cls) {
#if defined(__x86_64__)
  hak_block_t **head;
  __asm__("lea (%1,%2,8), %0" : "=r"(head) : "r"(heap->free), "r"(cls));
  return head;
#else
  return &heap->free[cls];
#endif
}
/* Pops a block of cls from the heap's list, or NULL. The next block's line
 * is fetched now: the next pop of the class reads it, and the program
 * writes it (larson 8-128: 1.03x; its blocks overflow L1). */
HAK_INLINE hak_block_t *hak_list_pop(hak_heap_t *heap, size_t cls) {
  hak_block_t **head = hak_heap_head(heap, cls);
  hak_block_t *b = *head;
  if (HAK_LIKELY(b != NULL)) {
    hak_block_t *next = hak_next(b);
    *head = next;
    __builtin_prefetch(next, 1, 3);
  }
  return b;
}
HAK_INLINE void *hak_heap_pop(hak_heap_t *heap, size_t cls) {
  hak_block_t *b = hak_list_pop(heap, cls);
  if (HAK_LIKELY(b != NULL))
    hak_block_handout(b, hak_class_is_span(cls) ? hak_span_block_bytes(cls, b) : hak_class_size[cls]);
  return b;
}

/* A block of a span class's cache holds, in its third word (after the
 * link and, in checked builds, the free tag), how many blocks its list
 * holds from it down: a cache's count is its head's, which free reads to
 * bound it, and a pop, like a slab class's, updates no counter (a counter
 * in the heap, one more store a malloc and a free, ran mid_large_mt 2t
 * 8-32 KiB at 0.97x). */
HAK_INLINE uintptr_t *hak_span_depth(hak_block_t *b) { return &((uintptr_t *)b)[2]; }
/* The words of a span block its cache's list writes. */
#define HAK_SPAN_LINK_BYTES (3 * sizeof(uintptr_t))
/* Blocks in the heap's span cache of malloc's number n. */
HAK_INLINE unsigned hak_span_count(const hak_heap_t *heap, size_t n) {
  hak_block_t *head = heap->free[n];
  return head ? (unsigned)*hak_span_depth(head) : 0;
}
/* Span cache c (counted from 0) held `held` blocks before a
 * push: the fewest since the last trim is noted (span.c: trim_unused). */
HAK_INLINE void hak_span_low_note(hak_heap_t *heap, size_t c, unsigned held) {
  if (HAK_UNLIKELY(held < heap->span_low[c])) heap->span_low[c] = (uint16_t)held;
}

/* free of a block of span segment seg: onto the thread's cache its entry
 * names (of its class, or of its class's blocks at their page's start),
 * unless it is not a block in use (not where its entry says it starts, or
 * on a page of number 0, a slab class, whose list's third words are not
 * read), or the cache is empty (the sentinel's are) or full, or the block
 * is the one freed just before. The list head and the limit are read before the
 * stores, which the compiler could not otherwise tell apart from them; the
 * head's depth before the test of the block freed just before (two tests
 * merged into one branch ran mid_large_mt 2t 8-32 KiB at 0.97x). */
HAK_INLINE void hak_span_free_inline(hak_segment_t *seg, void *p) {
  uint16_t e = hak_span_entry(seg, p);
  size_t number = hak_span_entry_number(e);
  hak_heap_t *heap = hak_tls_heap;
  hak_block_t **list = hak_heap_head(heap, number);
  hak_block_t *head = *list;
  unsigned limit = heap->span_limit_of[number];
  /* the offset test of hak_span_entry_is_block; its number test, before
   * the others, put a taken jump on this path */
  if (HAK_LIKELY(hak_page_offset(p) == hak_span_entry_offset(e) && head != NULL && number >= HAK_SLAB_CLASSES)) {
    uintptr_t held = *hak_span_depth(head);
    if (HAK_LIKELY(held < limit && head != p)) {
      hak_block_check_free(p, hak_span_block_bytes(number, p));
      HAK_CSTAT_FREE(number);
      hak_set_next(p, head);
      *hak_span_depth(p) = held + 1;
      *list = p;
      hak_span_low_note(heap, number - HAK_SLAB_CLASSES, (unsigned)held);
      return;
    }
  }
  hak_span_free_slow(seg, p);
}

/* ---- fast paths ---- */

/* The refill of a class of either tier (for a span class, of malloc's number). */
HAK_INLINE void *hak_refill_class(size_t size, hak_heap_t *heap, size_t cls) {
  return hak_class_is_span(cls) ? hak_span_malloc_slow(size, heap, cls) : hak_heap_refill(size, heap, cls);
}

/* With refill false, NULL for an empty list or a large size: a caller
 * with work of its own after a miss (operator new) then needs no frame on
 * its hit path. */
HAK_INLINE void *hak_malloc_pop_or(size_t size, bool refill) {
  hak_heap_t *heap = hak_tls_heap;
  if (HAK_LIKELY(size <= HAK_TABLE_MAX - HAK_CANARY)) {
    size_t cls = heap->small_class[size + HAK_CANARY];
    void *b = hak_heap_pop(heap, cls);
    if (HAK_LIKELY(b != NULL)) {
      HAK_CSTAT_ALLOC(cls, size);
      return b;
    }
    return refill ? hak_heap_refill(size, heap, cls) : NULL;
  }
  if (HAK_LIKELY(size <= HAK_FAST_MAX - HAK_CANARY)) {
    /* a class, or malloc's number for the sizes a span class serves at a
     * page's start (HAK_SPAN_COLOUR_MAX) */
    size_t cls = hak_size_number(size + HAK_CANARY);
    void *b = hak_heap_pop(heap, cls);
    if (HAK_LIKELY(b != NULL)) {
      HAK_CSTAT_ALLOC(cls, size);
      return b;
    }
    return refill ? hak_refill_class(size, heap, cls) : NULL;
  }
  return refill ? hak_large_alloc(size, 0, false) : NULL;
}

HAK_INLINE void *hak_malloc_inline(size_t size) { return hak_malloc_pop_or(size, true); }

/* The block size an aligned block of size bytes asks for: the size (and
 * canary) rounded up to the alignment, whose class's blocks all have it
 * (alloc.c, alloc_aligned_slab). */
HAK_INLINE size_t hak_aligned_need(size_t size, size_t align) {
  return (size + HAK_CANARY + align - 1) & ~(align - 1);
}
/* An aligned block's hit: a pop from the list of that class; NULL for the
 * rest, which alloc.c serves. Through two calls, posix_memalign's hit took
 * 48 instructions; inline, 32. */
HAK_INLINE void *hak_aligned_pop(size_t align, size_t size) {
  if (HAK_LIKELY(align <= HAK_SLAB_ALIGN_MAX && size - 1 < HAK_BIG_MAX - HAK_CANARY)) {
    size_t need = hak_aligned_need(size, align);
    if (HAK_LIKELY(need <= HAK_BIG_MAX)) {
      /* a slab class, or the list of a span class's blocks at their page's start */
      size_t number = hak_size_number(need);
      if (number - HAK_SLAB_CLASSES < HAK_SPAN_CLASSES) number = hak_span_at_page(number);
      void *b = hak_heap_pop(hak_tls_heap, number);
      if (HAK_LIKELY(b != NULL)) {
        HAK_ASSERT(((uintptr_t)b & (align - 1)) == 0);
        HAK_CSTAT_ALLOC(number, size);
        return b;
      }
    }
  }
  return NULL;
}

HAK_INLINE void *hak_alloc_aligned_inline(size_t align, size_t size) {
  void *b = hak_aligned_pop(align, size);
  return HAK_LIKELY(b != NULL) ? b : hak_alloc_aligned(align, size);
}

HAK_INLINE bool hak_valid_alignment(size_t align) {
  return align != 0 && (align & (align - 1)) == 0;
}

HAK_INLINE void *hak_aligned_alloc_inline(size_t align, size_t size) {
  if (HAK_UNLIKELY(!hak_valid_alignment(align))) {
    errno = EINVAL;
    return NULL;
  }
  return hak_alloc_aligned_inline(align, size);
}

HAK_INLINE int hak_posix_memalign_inline(void **out, size_t align, size_t size) {
  if (HAK_UNLIKELY(!hak_valid_alignment(align) || align < sizeof(void *))) return EINVAL;
  void *p = hak_aligned_pop(align, size);
  if (HAK_LIKELY(p != NULL)) {
    *out = p;
    return 0;
  }
  return hak_posix_memalign_generic(out, align, size);
}

/* The byte read again, so that the first read is a compare with memory
 * (a load apart would cost free's slab path an instruction). */
HAK_INLINE uint8_t hak_segmap_reread(const void *p) {
  return atomic_load_explicit(&hak_segmap[hak_segmap_slot(p)], memory_order_relaxed);
}

HAK_INLINE void hak_free_inline(void *p) {
  hak_segment_t *seg = hak_segment_base(p);
  if (HAK_LIKELY(hak_segmap_of(p) == HAK_SEGMAP_SLABS)) {
    uintptr_t unit = hak_unit_byte(p);
    hak_slab_t *slab = hak_own_slab(hak_unit_slab(seg, unit), p);
    hak_block_t *b = (hak_block_t *)p, *head, **to;
    /* Ours, a block start (interior and misaligned pointers are not a
     * multiple of the block size), not the block freed just before.
     * Anything else goes to the generic path, which names the fault. */
    if (HAK_LIKELY(slab != NULL && (head = *(to = hak_unit_free_to(seg, unit))) != b)) {
      HAK_ASSERT(slab->state == HAK_SLAB_ACTIVE && slab->used > 0);
#if HAK_SECURE
      hak_check_block(seg, slab, p);
#endif
      hak_block_check_free(b, slab->block_size);
      HAK_CSTAT_FREE(slab->cls);
      hak_set_next(b, head);
      *to = b;
      if (HAK_LIKELY(--slab->used != 0)) return;
      hak_slab_emptied(hak_tls_heap, slab); /* the owner is this thread */
      return;
    }
  } else if (HAK_LIKELY(hak_segmap_reread(p) == HAK_SEGMAP_SPANS)) {
    hak_span_free_inline(seg, p);
    return;
  }
  hak_free_generic(p);
}

/* malloc_usable_size, which programs that count their memory (redis) call
 * at every malloc and free: a block of any slab in use, or a span block in
 * use, found and checked as realloc finds them, with no call. */
HAK_INLINE size_t hak_usable_size_inline(const void *p) {
  uint8_t m = hak_segmap_of(p); /* NONE for NULL */
  hak_segment_t *seg = hak_segment_base(p);
  if (HAK_LIKELY(m == HAK_SEGMAP_SLABS)) {
    hak_slab_t *slab = hak_slab_of(seg, p);
    if (HAK_LIKELY(hak_slab_has_block(slab, p))) return slab->block_size - HAK_CANARY;
  } else if (m == HAK_SEGMAP_SPANS) {
    uint16_t e = hak_span_entry(seg, p);
    if (HAK_LIKELY(hak_span_entry_is_block(e, p))) return hak_span_block_bytes(hak_span_entry_number(e), p) - HAK_CANARY;
  }
  return hak_usable_size_generic(p);
}

#endif
