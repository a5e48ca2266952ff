/* hakmem types and layout constants.
 *
 * Layers, each using only the ones below it:
 *   override  -> alloc/free (API) -> heap -> slab, span -> segment/large -> os
 *   options, stats and init are used by every layer and use only os.
 *
 * Memory is taken from the OS in 4 MiB aligned *segments*. A slab segment
 * is 64 *units* of 64 KiB; a slab is a run of 1 unit (2 for a small class
 * that filled a slab; shorter when only that many committed units are
 * free) and holds blocks of one size class up to 7 KiB. A span segment is
 * 1024 pages of 4 KiB; a block of 8 KiB to 1 MiB is a run of whole pages
 * of its own (a span), so the pages a freed block gives back serve a block
 * of any size. Large blocks get a segment-aligned mapping of their own with
 * the same header, so for every pointer p handed out, (p - 1) rounded down
 * to 4 MiB is its segment header. Minus one because a block aligned to
 * >= 4 MiB sits exactly at the end of its header's chunk. */
#ifndef HAK_TYPES_H
#define HAK_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HAK_SEG_SHIFT 22
#define HAK_SEG_SIZE ((size_t)1 << HAK_SEG_SHIFT)
#define HAK_SEG_MASK (HAK_SEG_SIZE - 1)
#ifndef HAK_SECURE
#define HAK_SECURE 0
#endif
#define HAK_PAGE_SIZE ((size_t)4096)
#if HAK_SECURE
/* Secure builds put a PROT_NONE guard page between the metadata and the
 * first block of every segment, and an 8-byte canary at the end of every
 * slab block. */
#define HAK_SEG_HEADER ((size_t)16384)
#define HAK_LARGE_OFFSET ((size_t)8192)
#define HAK_GUARD_PAGES 1
#define HAK_CANARY ((size_t)8)
#else
/* Bytes at the start of a segment taken by its header (slab 0 starts after). */
#define HAK_SEG_HEADER ((size_t)12288)
/* Large blocks start 2 KiB after their header, on its page: a block the
 * program touches at its start only costs one page, not two. */
#define HAK_LARGE_OFFSET ((size_t)2048)
#define HAK_GUARD_PAGES 0
#define HAK_CANARY ((size_t)0)
#endif

/* What a segment holds (seg->kind). */
enum {
  HAK_KIND_SLABS = 0, /* slabs of blocks up to HAK_SLAB_MAX */
  HAK_KIND_SPANS = 1, /* one block per run of pages, HAK_SLAB_MAX < size <= HAK_BIG_MAX */
  HAK_KIND_LARGE = 2, /* a single large block */
};
/* A class that filled a slab takes slabs of at least this many blocks, up
 * to this many units; no slab holds more than HAK_SLAB_MAX_BLOCKS (slab.c). */
#define HAK_BUSY_BLOCKS 256
#define HAK_BUSY_MAX_UNITS 32
#define HAK_SLAB_MAX_BLOCKS 8192
#define HAK_UNIT_SHIFT 16
#define HAK_UNIT_SIZE ((size_t)1 << HAK_UNIT_SHIFT)
#define HAK_MAX_SLABS (HAK_SEG_SIZE >> HAK_UNIT_SHIFT) /* 64 units */
#define HAK_PAGE_SHIFT 12
#define HAK_SPAN_PAGES (HAK_SEG_SIZE >> HAK_PAGE_SHIFT) /* 1024 pages */
#define HAK_SPAN_FIRST_PAGE (HAK_SEG_HEADER >> HAK_PAGE_SHIFT) /* after the header */

/* Size classes: 32 small classes (16..1024 B: 16-byte steps to 128, then 8
 * steps per doubling), 22 more slab classes to 7 KiB (8 per doubling too: no
 * slab size wastes more than 12.5%), and 27 span classes of whole pages (8
 * and 12 KiB, then 4 per doubling from 16 KiB to 1 MiB). */
#define HAK_SMALL_MAX ((size_t)1024)
/* Sizes whose class each heap's own table gives (hak_heap_t.small_class):
 * to the first class over 1 KiB, so that a size a little over 1 KiB (a
 * 1 KiB buffer and its header) takes malloc's first path too
 * (random_mixed, 16-1039 B: 1.008x). */
#define HAK_TABLE_MAX ((size_t)1152)
#define HAK_SLAB_MAX ((size_t)7168)   /* the largest block in a slab */
#define HAK_FAST_MAX ((size_t)1048576) /* sizes the malloc fast path serves */
#define HAK_BIG_MAX ((size_t)1048576)
/* Large blocks in the arena start at multiples of 2 MiB: finer placement
 * than a segment, and a whole page table for each chunk mremap moves. */
#define HAK_LARGE_GRAIN_SHIFT 21
#define HAK_LARGE_GRAIN ((size_t)1 << HAK_LARGE_GRAIN_SHIFT)
#define HAK_LARGE_KEPT 4 /* freed large blocks a heap keeps for its next ones */
#define HAK_SMALL_CLASSES 32
#define HAK_SLAB_CLASSES 54 /* classes below live in slabs, the others in spans */
_Static_assert(HAK_SLAB_CLASSES < 64, "a mask of slab classes fits a word");
#define HAK_CLASSES 81
#define HAK_ATTACH_MAX 4 /* slabs of a class attached to its heap at once */
#define HAK_SPAN_CLASSES (HAK_CLASSES - HAK_SLAB_CLASSES)
/* A span block starts at a colour of its first page, up to this offset
 * (internal.h, hak_span_colour). The sizes of a span class that do not
 * fit after the largest have a number of their own in malloc's table,
 * HAK_SPAN_CLASSES higher (hak_span_at_page): the list of the class's
 * blocks at their page's start. */
#define HAK_SPAN_COLOUR_MAX ((size_t)960) /* 15 lines: also the colour's bit mask */
#define HAK_NUMBERS (HAK_CLASSES + HAK_SPAN_CLASSES) /* malloc's numbers: a list each */
#define HAK_SPAN_CACHES (2 * HAK_SPAN_CLASSES) /* a thread's caches of span blocks */
_Static_assert(HAK_SPAN_CACHES <= 64, "a mask of span caches fits a word");
/* Alignments up to this are served from slabs and spans; larger ones by
 * large blocks. */
#define HAK_SLAB_ALIGN_MAX ((size_t)4096)

typedef struct hak_block_s {
  struct hak_block_s *next;
} hak_block_t;

typedef struct hak_heap_s hak_heap_t;
typedef struct hak_slab_s hak_slab_t;
typedef struct hak_segment_s hak_segment_t;

/* A unit of a segment: its slab, and where the owner's frees into it go:
 * the slab's local_free, or, while the slab is attached to its heap (the
 * heap's list of its class holds its used blocks), that list, so the next
 * malloc gets the block freed last, still in cache. Beside the slab's
 * pointer, free finds the list's address one load after the block's (the
 * slab holds it two loads after): the push that the next malloc pops then
 * waits on less. */
typedef struct {
  hak_slab_t *slab;
  hak_block_t **free_to;
} hak_unit_t;

typedef enum {
  HAK_SLAB_FREE = 0, /* not in use; memory may be purged */
  HAK_SLAB_ACTIVE,   /* in its heap's queue for its class */
  HAK_SLAB_FULL,     /* no free block seen; on its heap's full list */
  HAK_SLAB_ORPHAN,   /* in an abandoned segment */
} hak_slab_state_t;

/* One slab descriptor: two cache lines. The first holds everything the
 * owner's free fast path reads; the second the list other threads push to,
 * so remote frees do not bounce the owner's line. */
struct __attribute__((aligned(64))) hak_slab_s {
  /* The token (hak_thread_token) of the heap that may free into its units'
   * free_to without atomics. 0 unless the slab is ACTIVE, so every other
   * case (full, abandoned, large) takes the slow path with a single
   * comparison. */
  _Atomic(uintptr_t) owner;
  /* floor(2^64 / block_size) + 1, so block_size * magic = 2^64 + step
   * with 1 <= step <= block_size. For |n| < 2^32, n * magic (mod 2^64) is
   * k * step when n = k * block_size, and at least magic - 2^32 (> 2^32)
   * otherwise: below block_bound exactly when n is the offset of one of
   * the blocks carved from the first. free checks a pointer with one
   * multiply: p * magic - first_magic is n * magic, mod 2^64. */
  uint64_t magic;
  uint64_t first_magic; /* the first block's address * magic (mod 2^64) */
  /* Reserved blocks not on local_free (the heap's list counts as in use).
   * An attached slab's frees go to the heap's list yet decrement it, so it
   * starts at HAK_USED_ATTACHED and is counted again on detaching. */
  uint32_t used;
  uint32_t block_size;
  uint32_t capacity;   /* blocks that fit in the slab */
  uint32_t reserved;   /* blocks carved from the slab so far */
  uint8_t cls;
  uint8_t state;  /* hak_slab_state_t */
  uint8_t units;  /* its length in units (1 while FREE) */
  uint8_t index;  /* its first unit */
  hak_block_t *local_free; /* blocks freed by the owner */
  /* reserved * step (see magic), so a block not handed out yet fails the
   * test too; a FREE slab's units keep the bound it had, to name a double
   * free. Written by the owner, with relaxed atomic stores (other threads
   * check their frees against it); the owner reads it plainly. */
  uint64_t block_bound;
  _Atomic(hak_block_t *) remote __attribute__((aligned(64))); /* other threads' frees */
  union {
    struct {
      hak_slab_t *next, *prev; /* heap queue or full list */
    };
    uint64_t free_since_ms; /* FREE: when the unit was released */
  };
  /* FULL: the remote list's head when the purger last counted it (a hint:
   * the same head, nothing new to count; see hak_slab_release_idle_full). */
  hak_block_t *remote_seen;
  uint8_t zero; /* its unreserved memory is zero (fresh or purged) */
  /* The current slab of a class that shrank to it: released when it empties
   * (see hak_slab_emptied); cleared when the heap takes blocks from it. */
  uint8_t retiring;
  /* Taken while its memory was still committed: the part not reserved yet
   * is purged once it has stayed unused for the purge delay. Set by the
   * owner under the heap lock, cleared by the purge under the same lock;
   * while set, the owner carves new blocks under the lock. */
  uint8_t dirty_tail;
  uint64_t dirty_since_ms;
};

struct hak_segment_s {
  uint8_t kind;         /* HAK_KIND_* */
  uint8_t fresh;        /* large: never handed out before (memory is zero) */
  uint8_t abandoned;    /* on the abandoned list (guarded by the segment lock) */
  uint8_t grown;        /* large: realloc grew it (it grows again) */
  /* Slab and span segments: where the part not yet readable and writable
   * starts, 0 if none is. Under strict overcommit (hak_os_commit_strict)
   * a new segment of a program with threads is reserved, and made
   * accessible unit by unit as slabs and blocks take them: every thread's
   * segment was charged 4 MiB. So is any new segment once the program has
   * locked its memory (hak_os_found_locked): it was faulted in whole. */
  uint32_t reserved_from;
  /* Slab segments, one bit per unit: FREE units; of those, the ones whose
   * memory is zero (never used, or purged), and the ones purged (returned
   * to the OS). A FREE unit's descriptor is slabs[unit], in state
   * HAK_SLAB_FREE. A segment in the cache keeps the last two. */
  uint64_t free_units, zero_units, purged_units;
  _Atomic(hak_heap_t *) heap; /* owning heap; NULL when abandoned, cached or of spans */
  hak_segment_t *next, *prev; /* heap's segment list, or a global list */
  /* Each unit's slab and list: free finds both with a constant shift and
   * one load each. A slab's descriptor is slabs[its first unit]. In a span
   * or large segment every unit maps to a descriptor whose owner is 0, so
   * that free's fast path hands their blocks to the generic path. On
   * whole lines, four entries to a line, after fields that fit the first:
   * where one entry in four straddled two lines, free read both. */
  hak_unit_t unit[HAK_MAX_SLABS] __attribute__((aligned(64)));
  size_t map_size;    /* bytes mapped from the segment start */
  size_t large_size;  /* large: usable bytes */
  size_t large_offset;/* large: block offset from the segment start */
  uint64_t cached_since_ms;
  union {
    hak_slab_t slabs[HAK_MAX_SLABS]; /* slab segments; a large header uses slabs[0] */
    struct {
      hak_slab_t none; /* what every unit maps to: owner 0, state FREE */
      unsigned used_pages; /* pages of blocks (cached ones too) */
      /* 0, or at most how many pages dirty free runs side by side make:
       * pages_give leaves runs apart (span.c) */
      uint16_t apart_most;
      /* One word per page (span.c): the first page of a block holds its
       * class and length, its last page a tail mark, the first and last
       * pages of a free run the run's handle; every other page 0. */
      uint32_t page[HAK_SPAN_PAGES];
      /* On a block's first page the number of the cache free puts it in
       * (its class, or hak_span_at_page's), and in the high byte where on
       * the page the block starts, in lines (its colour, or 0); 0
       * elsewhere. What free's fast path reads, 32 pages to a line where
       * the words hold 16 (with 400 blocks of 8-32 KiB live, words of 8
       * bytes overflowed L1). */
      uint16_t page_block[HAK_SPAN_PAGES];
    } span;
  };
};

typedef struct {
  hak_slab_t *first, *last;
} hak_slab_queue_t;

/* Slab blocks freed to another thread's slab, not handed over yet. */
typedef struct {
  hak_slab_t *slab; /* NULL when empty */
  hak_block_t *first, *last;
  size_t bytes_left; /* handed over with the block that fills it */
} hak_outbox_t;

/* A thread's heap. `free` first: the malloc fast path indexes it directly.
 * free[c] of a slab class holds blocks of the slabs attached[c] only;
 * free[c] of a span class is the thread's cache of free spans of c, and
 * free[hak_span_at_page(c)] its cache of spans of c that start at their
 * page (the only ones for the sizes past the colours). */
struct hak_heap_s {
  hak_block_t *free[HAK_NUMBERS];
  /* The class of each size up to HAK_TABLE_MAX, indexed by the size
   * itself (two instructions fewer than hak_fast_class's (size + 15) >> 4):
   * the sentinel's (heap.c), copied into every heap. malloc reads it at
   * the heap's address, which it holds already, in one instruction; a
   * global table's address would take one more in a shared library. */
  uint8_t small_class[HAK_TABLE_MAX + 1];
  /* Held by the owner across slab-level slow paths (refill, releasing a
   * slab, collect, exit), so the background purger and fork see the heap
   * consistent. Never taken on a fast path. On the lists' page, which a
   * program writes after a fork anyway, past their lines. */
  pthread_mutex_t lock __attribute__((aligned(64)));
  hak_slab_queue_t queue[HAK_SLAB_CLASSES]; /* ACTIVE slabs; first = current */
  /* The slabs of each class whose frees (the owner's) go to free[c]. */
  hak_slab_t *attached[HAK_SLAB_CLASSES][HAK_ATTACH_MAX];
  uint8_t attached_n[HAK_SLAB_CLASSES];
  hak_slab_queue_t full[HAK_SLAB_CLASSES];  /* FULL slabs */
  /* Span caches (span.c), cache c being free[HAK_SLAB_CLASSES + c]: the
   * blocks it may hold for free's fast path (its bound, or 0 while the
   * heap drains), and its bound; the fewest it held since the last trim;
   * the bytes by which the bounds have grown in all; which caches
   * overflowed since they last ran dry. How many it holds is its head
   * block's (hak_span_depth). */
  union {
    struct {
      uint16_t span_limit_none[HAK_SLAB_CLASSES]; /* slab classes: unused */
      uint16_t span_limit[HAK_SPAN_CACHES];
    };
    uint16_t span_limit_of[HAK_NUMBERS]; /* by malloc's number */
  };
  uint16_t span_max[HAK_SPAN_CACHES];
  uint16_t span_low[HAK_SPAN_CACHES];
  size_t span_grown;
  /* Bytes of span blocks the heap took from the page heap or the transfer,
   * less those it gave back: what the thread holds, in use or cached, but
   * for blocks other threads took and it freed (span.c, growing). */
  int64_t span_held;
  uint64_t span_overflowed;
  /* The trims (span.c, trim_unused): the span caches the last one gave
   * blocks of, those refilled since, the refills since, and the refills
   * between two. */
  uint64_t span_trimmed, span_refilled;
  /* Blocks the next fill of each span cache takes, 0 for 1 (fill_size):
   * not a batch whose first pages the links write, until it has filled
   * as many. */
  uint8_t span_fill_next[HAK_SPAN_CACHES];
  /* Slab classes refilled since the last new slab and between the two
   * before; those looked at while idle (slab.c, classes_reclaim_idle). */
  uint64_t slab_refilled, slab_refilled_before, slab_checked;
  /* Slab classes whose blocks came back to a slab since the class last
   * had none (slab.c, slab_units). */
  uint64_t slab_came_back;
  uint32_t span_refills, span_trim_period;
  size_t span_given_in_row; /* by overflows that found what the last one left */
  hak_block_t *span_left[HAK_SPAN_CACHES]; /* each cache's list after its last overflow */
  uint8_t draining;         /* see DRAIN_BYTES (span.c) */
  /* A draining heap's frees of each span class not yet a batch, and how
   * many (span.c); the purger takes those of a heap that stopped freeing
   * (drain_moved unset since its last pass). */
  _Atomic(hak_block_t *) drain_open[HAK_SPAN_CACHES];
  uint8_t drain_count[HAK_SPAN_CACHES];
  _Atomic uint8_t drain_moved;
  /* The thread's last freed large blocks of one chunk (large.c: kept), the
   * mapped size of each (read by the owner only: the purger may take a
   * block and the arena reuse its header), and whether one was put there
   * since the purger's last pass. */
  _Atomic(hak_segment_t *) large_kept[HAK_LARGE_KEPT];
  size_t large_kept_map[HAK_LARGE_KEPT];
  _Atomic uint8_t large_kept_moved;
  /* Of a span cache: the blocks its last refill took are zero memory, so
   * calloc clears only their link words. Slab classes leave it 0. */
  uint8_t clean[HAK_NUMBERS];
  hak_segment_t *segments, *segments_last; /* owned: those with free units first */
  /* Set by another thread that freed into one of our FULL slabs: the next
   * refill looks at the full lists before taking a new slab. */
  _Atomic int full_remote;
  uint64_t next_purge_ms; /* earliest pending slab purge, 0 for none */
  hak_outbox_t outbox[HAK_SLAB_CLASSES]; /* see free_remote_batched */
  uint32_t releases_in_row; /* slabs released since a slab was last taken */
  uint32_t refills;          /* slab refills (the owner's), for the purger... */
  uint32_t refills_at_purge; /* ...which saw this many at its last pass */
  uint32_t refills_at_install; /* ...and this many when its thread took it */
  uintptr_t token; /* its thread's hak_thread_token: the owner of its ACTIVE slabs */
  uint32_t number; /* hak_heap_numbered's; 0 for none */
  hak_heap_t *next, *prev; /* all live heaps */
  /* Parked: its thread exited and it waits, whole, for a new thread
   * (under `lock`; free reads it unlocked as a hint). */
  bool parked;
  uint32_t parked_live; /* its slabs with blocks in use, while parked */
  bool parked_empty;    /* parked with none: holds one of heap.c's places for those */
  hak_heap_t *parked_next;
  uint64_t parked_since_ms;
  /* When a new thread gave up waiting for it to park (hak_clock_ns; 0: none
   * did): how late it parks then teaches heap.c how long to wait. */
  _Atomic uint64_t heir_gave_up_ns;
};

#endif
