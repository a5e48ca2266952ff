/* Large blocks (> 1 MiB, or aligned to more). Each starts 2 KiB after
 * a header, on the header's page (a block aligned to more: its alignment
 * after it). The header is in the arena at a chunk boundary, which free
 * finds through the segment map's HAK_SEGMAP_LARGE (hak_large_header); in
 * a mapping of its own, at a segment boundary, as for slab blocks.
 *
 * The arena is a reserved range of address space counted in 2 MiB chunks
 * (HAK_LARGE_GRAIN). A freed block leaves its chunks free but still
 * committed. Page faults are what large blocks cost, so a new block goes
 * where it reuses the most committed bytes, and its chunks that would still
 * fault take the pages of other free chunks (moved with mremap) while freed
 * blocks are seen to write most of their pages. Adjacent
 * free chunks form one run, a longer run is split, and a block grows in
 * place into free chunks after it. A free chunk is purged once it has been
 * idle for the purge delay, or sooner when free committed bytes exceed
 * HAKMEM_LARGE_CACHE_MB (or the live bytes, if more), or, where purges
 * run in the program's calls only, a bound learnt from its reuse
 * (calls_keep). A block the arena cannot hold (alignment above a chunk, or
 * no room) gets a mapping of its own, unmapped when freed.
 *
 * The reservation is inaccessible, so that mlockall faults in only what
 * blocks use: a block's chunks are made readable and writable, whole, or
 * as far as it uses them where the kernel charges every writable page it
 * maps against a limit (vm.overcommit_memory 2) or faults them all in (the
 * program locked its future memory, mlockall); there a purge makes them
 * inaccessible again, which gives their charge back (elsewhere it empties
 * them, accessible: chunks_empty), and a chunk moved away is left
 * inaccessible. */
#define _GNU_SOURCE
#include "internal.h"

HAK_FORK_HELD pthread_mutex_t hak_large_lock = PTHREAD_MUTEX_INITIALIZER;

#define GRAIN_SHIFT HAK_LARGE_GRAIN_SHIFT
#define GRAIN HAK_LARGE_GRAIN
#define GRAIN_MASK (GRAIN - 1)
#define ARENA_SHIFT 36 /* 64 GiB of address space */
#define ARENA_BYTES ((size_t)1 << ARENA_SHIFT)
#define ARENA_CHUNKS (ARENA_BYTES >> GRAIN_SHIFT)
#define ARENA_MAX_BLOCK (ARENA_BYTES / 4)
#define ARENA_MIN_CHUNKS 4 /* the least arena_reserve takes */

static HAK_NEAR_DATA uint8_t *arena; /* NULL until the first large block */
static HAK_NEAR_DATA bool arena_failed;
static HAK_NEAR_DATA size_t arena_chunks; /* ARENA_CHUNKS, or fewer (arena_reserve) */
/* The arena's tables by chunk, 1 MiB in one object. While the program
 * has no arena, the segment map's trim (segmap.c) maps its whole pages
 * read-only, which the kernel does not charge to the commit, and the
 * arena's reservation makes them writable again. All of the arena's state
 * is under hak_large_lock. */
static _Alignas(HAK_PAGE_SIZE) struct {
  /* A chunk is a block's (used), or free with its memory committed (dirty:
   * freed_ms says since when), or free and zero (neither: never used, or
   * purged). One bit a chunk, so that the walks below skip 64 chunks of
   * blocks, or of anything but dirty chunks, in a word. */
  uint64_t used_bits[ARENA_CHUNKS / 64], dirty_bits[ARENA_CHUNKS / 64];
  uint64_t freed_ms[ARENA_CHUNKS];
  /* Bytes of a chunk that may be committed: the most any block has used
   * of it since its last purge. */
  uint32_t dirt[ARENA_CHUNKS];
  /* Chunk i holds a block's header (HEAD_HERE): set by malloc, so that
   * freeing a block again is reported as a double free, and a pointer into
   * a body chunk as an invalid one. HEAD_GONE once the header of a freed
   * block went with the chunk's pages (a purge, a move), until the chunk is
   * reused. A byte, not a bit: free reads it without the lock, and no other
   * chunk's update may rewrite it. */
  uint8_t head_mark[ARENA_CHUNKS];
  /* The links of dirt_bins and run_bins, below. */
  uint32_t dirt_next[ARENA_CHUNKS], dirt_prev[ARENA_CHUNKS];
  uint32_t run_next[ARENA_CHUNKS], run_prev[ARENA_CHUNKS];
  /* The bytes from each chunk's start that are readable and writable: a
   * page multiple under hak_commit_strict, else 0 or the chunk; 0 for a
   * purged chunk (unless the kernel refused the purge's new mapping: then
   * it was only emptied). */
  uint32_t accessible[ARENA_CHUNKS];
} tab;
_Static_assert(sizeof tab % HAK_PAGE_SIZE == 0, "tab is trimmed in whole pages");
static HAK_NEAR_DATA bool tab_read_only; /* by hak_large_trim_tables */
/* Lists of chunks in bins, the chunk added last first, and a bit a
 * non-empty bin, so that a search reads no chunk it cannot use. Links are
 * chunk index + 1 (0 ends a list). */
typedef struct {
  uint32_t *head, *next, *prev;
  uint64_t *nonempty;
} chunk_bins_t;
/* The dirty chunks by their dirt in pages: a block of one chunk, or a
 * block's chunk that takes another's pages, finds the chunk that covers it
 * best. */
#define DIRT_BINS (GRAIN / HAK_PAGE_SIZE + 1)
static HAK_NEAR_DATA uint32_t dirt_head[DIRT_BINS];
static HAK_NEAR_DATA uint64_t dirt_nonempty[(DIRT_BINS + 63) / 64];
static const chunk_bins_t dirt_bins = {dirt_head, tab.dirt_next, tab.dirt_prev, dirt_nonempty};
/* The free runs below high (maximal ranges of free chunks; not the one
 * that reaches high) by length, at their first chunk: exact up to
 * RUN_EXACT chunks, then by power of two. A block of more chunks looks at
 * the runs that fit it best first. */
#define RUN_EXACT 32
#define RUN_BINS (RUN_EXACT - 5 + ARENA_SHIFT - GRAIN_SHIFT + 1)
_Static_assert(RUN_EXACT == 32 && RUN_BINS <= 64, "run_bin's classes, one word of bits");
static HAK_NEAR_DATA uint32_t run_head[RUN_BINS];
static HAK_NEAR_DATA uint64_t run_nonempty[1];
static const chunk_bins_t run_bins = {run_head, tab.run_next, tab.run_prev, run_nonempty};
static HAK_NEAR_DATA size_t high; /* chunks [0, high) have been used */
static HAK_NEAR_DATA size_t live_chunks; /* chunks of blocks */
static HAK_NEAR_DATA size_t dirty_bytes;

enum { HEAD_NONE, HEAD_HERE, HEAD_GONE };

static bool bit_get(const uint64_t *bits, size_t k) { return bits[k >> 6] >> (k & 63) & 1; }
static void bit_set(uint64_t *bits, size_t k, bool on) {
  if (on) bits[k >> 6] |= (uint64_t)1 << (k & 63);
  else bits[k >> 6] &= ~((uint64_t)1 << (k & 63));
}
/* The first chunk from i on, below high, whose bit is `on`; else high. */
static size_t bit_next(const uint64_t *bits, size_t i, bool on) {
  while (i < high) {
    uint64_t w = (on ? bits[i >> 6] : ~bits[i >> 6]) >> (i & 63);
    if (w) {
      i += (size_t)__builtin_ctzll(w);
      return i < high ? i : high;
    }
    i = (i | 63) + 1;
  }
  return high;
}

/* The first chunk of the free run that holds free chunk k. */
static size_t run_start(size_t k) {
  size_t w = k >> 6;
  uint64_t m = tab.used_bits[w] & (((uint64_t)1 << (k & 63)) - 1);
  while (!m) {
    if (w == 0) return 0;
    m = tab.used_bits[--w];
  }
  return w * 64 + 64 - (size_t)__builtin_clzll(m);
}

static void bins_push(const chunk_bins_t *t, size_t b, size_t k) {
  uint32_t h = t->head[b];
  t->next[k] = h;
  t->prev[k] = 0;
  if (h) t->prev[h - 1] = (uint32_t)k + 1;
  t->head[b] = (uint32_t)k + 1;
  t->nonempty[b >> 6] |= (uint64_t)1 << (b & 63);
}
static void bins_unlink(const chunk_bins_t *t, size_t b, size_t k) {
  uint32_t next = t->next[k], prev = t->prev[k];
  if (prev) t->next[prev - 1] = next;
  else t->head[b] = next;
  if (next) t->prev[next - 1] = prev;
  if (!t->head[b]) t->nonempty[b >> 6] &= ~((uint64_t)1 << (b & 63));
}

static void chunk_bin_add(size_t k) { bins_push(&dirt_bins, tab.dirt[k] >> HAK_PAGE_SHIFT, k); }
/* Called before chunk k's dirt changes. */
static void chunk_bin_remove(size_t k) { bins_unlink(&dirt_bins, tab.dirt[k] >> HAK_PAGE_SHIFT, k); }

static size_t run_bin(size_t len) {
  return len < RUN_EXACT ? len : RUN_EXACT - 5 + 63 - (size_t)__builtin_clzll(len);
}
/* Free run [i, end) is new, or is no more (taken, split or joined). */
static void run_add(size_t i, size_t end) {
  if (end >= high) return;
  HAK_ASSERT(run_start(i) == i && bit_next(tab.used_bits, i, true) == end);
  bins_push(&run_bins, run_bin(end - i), i);
}
static void run_remove(size_t i, size_t end) {
  if (end >= high) return;
  HAK_ASSERT(run_start(i) == i && bit_next(tab.used_bits, i, true) == end);
  bins_unlink(&run_bins, run_bin(end - i), i);
}
/* The dirty chunk that covers the most of `need` bytes (at most a chunk)
 * from its start, the least committed among those that cover them all;
 * SIZE_MAX if none has a page committed. */
static size_t dirty_best(size_t need) {
  size_t want = need >> HAK_PAGE_SHIFT, w = want >> 6;
  uint64_t m = dirt_nonempty[w] & ~(((uint64_t)1 << (want & 63)) - 1);
  while (!m && ++w < sizeof dirt_nonempty / sizeof *dirt_nonempty) m = dirt_nonempty[w];
  if (m) return dirt_head[w * 64 + (size_t)__builtin_ctzll(m)] - 1;
  /* else the most committed below want; bin 0 has no page */
  for (w = want >> 6, m = dirt_nonempty[w] & (((uint64_t)1 << (want & 63)) - 1);;
       m = dirt_nonempty[--w]) {
    if (w == 0) m &= ~(uint64_t)1;
    if (m) return dirt_head[w * 64 + 63 - (size_t)__builtin_clzll(m)] - 1;
    if (w == 0) return SIZE_MAX;
  }
}

static size_t chunks_of(size_t map_size) { return (map_size + GRAIN_MASK) >> GRAIN_SHIFT; }
static uint8_t *chunk_addr(size_t i) { return arena + (i << GRAIN_SHIFT); }
static size_t chunk_index(const void *p) {
  return (size_t)((const uint8_t *)p - arena) >> GRAIN_SHIFT;
}
/* Bytes of its k-th chunk that a block of `bytes` bytes from its header
 * uses, its first byte at offset: of a first chunk wholly below the block
 * (aligned to a chunk), the header's page only. */
static size_t chunk_use(size_t bytes, size_t offset, size_t k) {
  if (k == 0 && offset >= GRAIN) return HAK_PAGE_SIZE;
  size_t from = k << GRAIN_SHIFT;
  if (bytes <= from) return 0;
  return bytes - from < GRAIN ? bytes - from : GRAIN;
}
/* Bytes of its chunks that such a block uses. */
static size_t block_use(size_t bytes, size_t offset) {
  return offset >= GRAIN ? bytes - GRAIN + HAK_PAGE_SIZE : bytes;
}
/* Bytes of the first `need` of chunk k that may be committed. */
static size_t chunk_covers(size_t k, size_t need) { return tab.dirt[k] < need ? tab.dirt[k] : need; }
static bool in_arena(const void *p) {
  return arena != NULL && (const uint8_t *)p >= arena &&
         (const uint8_t *)p < arena + (arena_chunks << GRAIN_SHIFT);
}

/* A mapping of its own at s is a segment the segment map calls slabs, so
 * free's fast path reads the unit of the pointer: every unit maps to
 * slabs[0], whose owner is nobody, and the free goes the slow way. Set
 * before the map's byte, and again when the mapping moves, or free would
 * read the descriptor at the old address. The arena's blocks are LARGE to
 * the segment map, whose paths never read a unit (a 4 MiB mask of such a
 * pointer may not even reach its header): 64 stores a malloc they do
 * without. */
static void own_mapping_publish(hak_segment_t *s) {
  for (unsigned u = 0; u < HAK_MAX_SLABS; u++)
    s->unit[u] = (hak_unit_t){&s->slabs[0], &s->slabs[0].local_free};
  hak_segmap_set(s, HAK_SEGMAP_SLABS);
}

/* Only the fields and slabs[0] of a large header are used: the rest of
 * the struct would overlap the block (or the guard page). */
_Static_assert(offsetof(hak_segment_t, slabs) + sizeof(hak_slab_t) <= HAK_LARGE_OFFSET,
               "a large header fits below its block");
static void header_init(hak_segment_t *s, size_t map_size, size_t offset, bool fresh) {
  s->kind = HAK_KIND_LARGE;
  s->map_size = map_size;
  s->large_offset = offset;
  s->fresh = fresh; /* slabs[0].owner stays 0: frees go slow */
}

/* The chunk tables lie in the library's bss, where the kernel may back
 * their first writes with a huge page: 2 MiB of RSS for a program's first
 * large block. The arena's first HAK_HUGE_PAGES_AFTER bytes refuse them
 * too if the program is small when it reserves the arena (internal.h). */
static void no_huge_pages(uint8_t *a, size_t bytes) {
  if (hak_os_program_is_small())
    hak_os_no_huge_pages(a, bytes < HAK_HUGE_PAGES_AFTER ? bytes : HAK_HUGE_PAGES_AFTER);
  hak_os_no_huge_pages(&tab, sizeof tab);
}

void hak_large_trim_tables(void) {
  if (pthread_mutex_trylock(&hak_large_lock) != 0) return;
  if (arena == NULL && !tab_read_only)
    tab_read_only = hak_os_read_only(&tab, sizeof tab);
  pthread_mutex_unlock(&hak_large_lock);
}

/* ARENA_BYTES of address space; where that is refused (an address-space
 * limit, RLIMIT_AS), a quarter of the most that can be had, so that the
 * program's other mappings, and the blocks the arena cannot hold, find
 * room: under a limit of 4 GB every large block took a mapping of its own
 * (`large` at 0.1x tcmalloc's speed). NULL under ARENA_MIN_CHUNKS. */
static uint8_t *arena_reserve(size_t *bytes) {
  size_t size = ARENA_BYTES;
  uint8_t *a;
  while ((a = hak_os_reserve(size, HAK_SEG_SIZE)) == NULL)
    if ((size /= 2) < ARENA_MIN_CHUNKS * GRAIN * 4) return NULL;
  *bytes = size;
  if (size == ARENA_BYTES) return a;
  hak_os_unreserve(a, size);
  *bytes = size / 4;
  return hak_os_reserve(*bytes, HAK_SEG_SIZE);
}

static bool arena_init(void) {
  if (arena != NULL || arena_failed) return arena != NULL;
  /* refused (a commit or data limit): a later call tries again */
  if (tab_read_only) {
    if (!hak_os_commit(&tab, sizeof tab)) return false;
    tab_read_only = false;
  }
  size_t bytes = 0;
  uint8_t *a = arena_reserve(&bytes);
  if (a != NULL && !hak_segmap_open(a, bytes)) {
    /* the map's pages refused (a commit or data limit): a later call tries again */
    hak_os_unreserve(a, bytes);
    return false;
  }
  if (a != NULL) no_huge_pages(a, bytes);
  arena_failed = a == NULL;
  arena_chunks = bytes >> GRAIN_SHIFT;
  arena = a;
  return a != NULL;
}

static void dirty_add(size_t n, bool on) {
  if (on) {
    dirty_bytes += n;
    HAK_STAT_ADD(large_cached, n);
  } else {
    dirty_bytes -= n;
    HAK_STAT_SUB(large_cached, n);
  }
}

/* Chunk k's pages may be committed up to `used` bytes. */
static void dirt_fold(size_t k, size_t used) {
  if (used > tab.dirt[k]) tab.dirt[k] = (uint32_t)used;
}

/* Chunk k's header, if any, went with its pages. */
static void head_gone(size_t k) {
  if (tab.head_mark[k] != HEAD_NONE) tab.head_mark[k] = HEAD_GONE;
}

/* Free chunk k holds no committed pages any more (purged or moved away). */
static void chunk_forget(size_t k) {
  chunk_bin_remove(k);
  bit_set(tab.dirty_bits, k, false);
  head_gone(k);
  dirty_add(tab.dirt[k], false);
  tab.dirt[k] = 0;
}

/* Chunks [i, i + n) become part of a block (a head if first). A fresh chunk
 * starts counting as mapped. */
static void chunks_claim(size_t i, size_t n, bool first) {
  size_t start = run_start(i), end = bit_next(tab.used_bits, i, true);
  run_remove(start, end);
  size_t was_dirty = 0, fresh = 0; /* counted once: the counters are atomic */
  for (size_t k = i; k < i + n; k++) {
    if (bit_get(tab.dirty_bits, k)) {
      chunk_bin_remove(k);
      bit_set(tab.dirty_bits, k, false);
      was_dirty += tab.dirt[k];
    } else {
      fresh++;
    }
    bit_set(tab.used_bits, k, true);
    tab.head_mark[k] = first && k == i ? HEAD_HERE : HEAD_NONE;
  }
  live_chunks += n;
  if (was_dirty) dirty_add(was_dirty, false);
  if (fresh) hak_stats_mapped(fresh << GRAIN_SHIFT, true);
  /* the segment map sends every pointer of the arena's segments used so
   * far to hak_large_header */
  for (; high < i + n; high++)
    if ((high & (HAK_SEG_MASK >> GRAIN_SHIFT)) == 0)
      hak_segmap_set((hak_segment_t *)chunk_addr(high), HAK_SEGMAP_LARGE);
  if (start < i) run_add(start, i);
  if (i + n < end) run_add(i + n, end); /* the run that reaches high stays out */
}

/* Chunks [i, i + n) of blocks are free again: one run with the free runs
 * beside them. */
static void chunks_free(size_t i, size_t n) {
  size_t start = i, end = bit_next(tab.used_bits, i + n, true);
  if (i > 0 && !bit_get(tab.used_bits, i - 1)) {
    start = run_start(i - 1);
    run_remove(start, i);
  }
  if (i + n < end) run_remove(i + n, end);
  for (size_t k = i; k < i + n; k++) bit_set(tab.used_bits, k, false);
  live_chunks -= n;
  run_add(start, end);
}

/* Chunks [i, i + n) are free again, their pages kept; `used` bytes from
 * chunk i on were in the block, from offset on (see chunk_use). A head's
 * segment map bit stays until the purge, so that freeing the block again
 * is reported as a double free. */
static void chunks_release(size_t i, size_t n, size_t used, size_t offset) {
  uint64_t now = hak_clock_ms();
  chunks_free(i, n);
  size_t dirty = 0;
  for (size_t k = i; k < i + n; k++) {
    dirt_fold(k, chunk_use(used, offset, k - i));
    bit_set(tab.dirty_bits, k, true);
    tab.freed_ms[k] = now;
    dirty += tab.dirt[k];
    chunk_bin_add(k);
  }
  dirty_add(dirty, true);
}

/* A start for a block: the committed bytes it reuses there, those left
 * unused under it, and the length of the free run (see arena_find). */
typedef struct {
  size_t at, cover, waste, len;
} place_t;
/* What a search looks for: the block's chunks, the bytes its first and
 * last chunks use (see chunk_use), and the most committed bytes it can
 * reuse. */
typedef struct {
  size_t n, head, last, most;
} want_t;

/* Starts (and runs too short) that a search for a block of more than one
 * chunk reads before it takes the best of them. */
#define FIND_STARTS 64

/* Reads the starts for the block in free run [i, end) of `len` chunks,
 * one of *left each; true when none anywhere can beat the best. */
static bool place_in_run(place_t *best, const want_t *w, size_t i, size_t end, size_t len,
                         size_t *left) {
  size_t n = w->n, head = w->head, last = w->last, most = w->most;
  /* chunks before the last are covered up to their dirt, the last up to
   * `last` bytes; `full` sums the dirt of the n - 1 before s + n - 1 */
  size_t full = 0;
  for (size_t s = i, k = i; s + n <= end && *left > 0; s++, --*left) {
    for (; n > 1 && k < s + n - 1; k++) full += tab.dirt[k];
    size_t d = tab.dirt[s + n - 1];
    size_t cover = full + (d < last ? d : last), waste = d > last ? d - last : 0;
    if (n > 1 && tab.dirt[s] > head) { /* a first chunk below the block */
      cover -= tab.dirt[s] - head;
      waste += tab.dirt[s] - head;
    }
    if (best->at == SIZE_MAX || cover > best->cover ||
        (cover == best->cover &&
         (waste < best->waste || (waste == best->waste && len < best->len))))
      *best = (place_t){s, cover, waste, len};
    /* nothing later in this run can beat it; in a run of its length, what
     * another run could still beat is only the bytes left unused (the
     * search of every start cost 1.2x with 1000 blocks of 2-8 MiB) */
    if (cover == most && (waste == 0 || len == n)) return len == n;
    if (n > 1) full -= tab.dirt[s];
  }
  return false;
}

/* Where a block of map_size bytes reuses the most committed bytes: it
 * pays a page fault for every byte it does not. On a tie, the start that
 * leaves the fewest committed bytes unused under the block, then the
 * shortest run of free chunks. A block of one chunk that reuses any takes
 * the chunk that covers it best (the one freed last); a longer one looks
 * at the runs it fits best first, and at FIND_STARTS starts at most, the
 * run reaching `high` (which extends into unused chunks) last; it takes a
 * run of its length that covers all it can at once. SIZE_MAX
 * if there is no room; else *fresh (if not NULL) gets the bytes the block
 * would fault in there. */
static size_t arena_find(size_t map_size, size_t offset, size_t *fresh) {
  size_t n = chunks_of(map_size), use = block_use(map_size, offset), left = FIND_STARTS;
  place_t best = {SIZE_MAX, 0, 0, 0};
  if (n == 1 && (best.at = dirty_best(map_size)) != SIZE_MAX) {
    best.cover = chunk_covers(best.at, map_size);
    goto found;
  }
  const want_t w = {n, chunk_use(map_size, offset, 0), chunk_use(map_size, offset, n - 1),
                    use < dirty_bytes ? use : dirty_bytes};
  for (uint64_t m = run_nonempty[0] & ~(((uint64_t)1 << run_bin(n)) - 1); m && left; m &= m - 1)
    for (uint32_t l = run_head[__builtin_ctzll(m)]; l && left; l = tab.run_next[l - 1]) {
      size_t i = l - 1, end = bit_next(tab.used_bits, i, true);
      if (end - i < n) left--;
      else if (place_in_run(&best, &w, i, end, end - i, &left)) goto found;
    }
  if (best.at == SIZE_MAX || left > 0) {
    size_t i = high > 0 && !bit_get(tab.used_bits, high - 1) ? run_start(high - 1) : high;
    size_t end = high + n < arena_chunks ? high + n : arena_chunks;
    if (left == 0) left = 1; /* runs too short took them all: one start here */
    place_in_run(&best, &w, i, end, SIZE_MAX, &left);
  }
  if (best.at == SIZE_MAX) return SIZE_MAX;
found:
  if (fresh) *fresh = use - best.cover;
  return best.at;
}

/* Empties chunks [i, j) where accessible, a run of accessible bytes in one
 * call, and counts them returned unless hak_os_decommit did (it refused).
 * A purge leaves them so, but under hak_commit_strict, where mapping them
 * again inaccessible gives their charge back. Elsewhere that took an mmap
 * to purge and an mprotect to reuse, both holding the lock of the process's
 * mappings for writing, which stops its threads' page faults: 4 threads of
 * 300 KiB-1 MiB blocks under HAKMEM_PROFILE=lowmem ran 2.2x as fast with
 * madvise alone. */
static void chunks_empty(size_t i, size_t j, bool count) {
  while (i < j) {
    size_t k = i;
    while (k + 1 < j && tab.accessible[k] == GRAIN) k++;
    size_t bytes = ((k - i) << GRAIN_SHIFT) + tab.accessible[k], len = (k + 1 - i) << GRAIN_SHIFT;
    if (count) { /* returned once, and no longer mapped (as hak_os_decommit counts) */
      hak_os_purge_within(chunk_addr(i), len, bytes);
      HAK_STAT_SUB(mapped, len);
    } else {
      hak_os_empty(chunk_addr(i), bytes);
    }
    i = k + 1;
  }
}

/* Purges free chunks idle for the delay (all if force, and those freed
 * at or before `older` in any case) until no more than `keep` bytes stay
 * committed; true while some stay committed. */
static bool arena_purge_locked(bool force, uint64_t older, size_t keep) {
  uint64_t now = hak_clock_ms(), delay = (uint64_t)hak_opt.purge_delay_ms;
  bool strict = hak_os_commit_strict();
  for (size_t i = bit_next(tab.dirty_bits, 0, true); i < high && dirty_bytes > keep;
       i = bit_next(tab.dirty_bits, i, true)) {
    if (!(force || now - tab.freed_ms[i] >= delay || tab.freed_ms[i] <= older)) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < high && bit_get(tab.dirty_bits, j) && dirty_bytes > keep &&
           (force || now - tab.freed_ms[j] >= delay || tab.freed_ms[j] <= older)) {
      chunk_forget(j);
      j++;
    }
    if (strict && hak_os_decommit(chunk_addr(i), (j - i) << GRAIN_SHIFT))
      memset(&tab.accessible[i], 0, (j - i) * sizeof tab.accessible[0]);
    else /* left accessible, or the decommit refused (at the limit of areas) */
      chunks_empty(i, j, !strict);
    i = j;
  }
  return dirty_bytes != 0;
}

/* Purges the longest idle free chunks until no more than `limit` bytes
 * stay committed, and no more than the excess: the blocks freed in one
 * millisecond (four of 64 MiB) went back whole for a chunk too many, and
 * were faulted in again. */
static void trim_to_locked(size_t limit) {
  while (dirty_bytes > limit) {
    uint64_t oldest = UINT64_MAX;
    for (size_t i = bit_next(tab.dirty_bits, 0, true); i < high; i = bit_next(tab.dirty_bits, i + 1, true))
      if (tab.freed_ms[i] < oldest) oldest = tab.freed_ms[i];
    arena_purge_locked(false, oldest, limit);
  }
}

/* Dirt counts the bytes that blocks spanned, not those they wrote. Freed
 * blocks have SAMPLE_PAGES of their pages looked at (hak_os_resident, a
 * window that moves from one sample to the next), one in SAMPLE_NEAR
 * while the running share of the pages looked at that were committed is
 * near the line of moves (below), one in SAMPLE_FAR otherwise (a look took
 * 6 us on the VM of 2026-11-30). */
#define SAMPLE_PAGES 16
#define SAMPLE_NEAR 32
#define SAMPLE_FAR 256
static unsigned written_share = 192; /* of 256 */
static HAK_NEAR_DATA size_t samples, sample_in = 1;

static void sample_written(const hak_segment_t *seg) {
  if (--sample_in) return;
  sample_in = written_share >= 64 && written_share <= 192 ? SAMPLE_NEAR : SAMPLE_FAR;
  size_t first = seg->large_offset >> HAK_PAGE_SHIFT;
  size_t pages = (seg->map_size >> HAK_PAGE_SHIFT) - first;
  if (pages < SAMPLE_PAGES) return;
  size_t at = first + (size_t)(++samples * 2654435761u) % (pages - SAMPLE_PAGES + 1);
  size_t window = SAMPLE_PAGES << HAK_PAGE_SHIFT;
  size_t in = hak_os_resident((uint8_t *)seg + (at << HAK_PAGE_SHIFT), window);
  written_share = (written_share * 3 + (unsigned)(in * 256 / window)) / 4;
}

/* Free committed chunks stay within HAKMEM_LARGE_CACHE_MB, or the bytes of
 * live blocks if more (a program with more live churns more). The bound
 * is of committed bytes, and dirt their bound: while freed blocks wrote
 * less than half of their pages (the line of moves, below), it holds
 * 256 / written_share times as many bytes of dirt, up to 4 times (a share
 * that has not caught up with a change of the program's blocks keeps
 * within that). A producer that handed blocks of 256 KiB-1 MiB (large
 * blocks then), each written at its first byte, to a consumer had the
 * consumer's frees purge a chunk each, which the producer faulted in
 * again: 0.55x as fast (xmalloc 1p1c). */
static size_t cache_limit(void) {
  size_t limit = (size_t)hak_opt.large_cache_mb << 20, live = live_chunks << GRAIN_SHIFT;
  if (written_share < 128) limit = limit / (written_share > 64 ? written_share : 64) * 256;
  return limit && live > limit ? live : limit;
}

/* A program whose purges run in its calls only (hak_purge_in_calls_only)
 * may stop calling for good after a free, as a server's process does
 * between clients: 40 idle PostgreSQL backends kept 3 MiB each of the
 * blocks their sorts had freed. So its frees keep no more than calls_keep
 * bytes of free chunks. The bound learns: a block that faults in pages
 * within the delay of such a trim doubles it (at least to the block's
 * size); a pass that finds chunks idle for the delay halves it. */
static HAK_NEAR_DATA _Atomic size_t calls_keep; /* written under hak_large_lock */
static HAK_NEAR_DATA uint64_t calls_trim_ms; /* the last such trim, 0 before any */

static void calls_keep_learn(size_t map_size) {
  if (calls_trim_ms == 0 || hak_clock_ms() - calls_trim_ms >= (uint64_t)hak_opt.purge_delay_ms ||
      !hak_purge_in_calls_only())
    return;
  size_t keep = 2 * atomic_load_explicit(&calls_keep, memory_order_relaxed);
  atomic_store_explicit(&calls_keep, keep > map_size ? keep : map_size, memory_order_relaxed);
}

static void calls_keep_halve(void) {
  atomic_store_explicit(&calls_keep, atomic_load_explicit(&calls_keep, memory_order_relaxed) / 2,
                        memory_order_relaxed);
}

/* Bytes of the freed blocks that the heap keeps (kept_put). Where purges
 * run in the program's calls only, it is as a rule the only heap. */
static size_t kept_bytes(hak_heap_t *heap) {
  size_t n = 0, map = 0;
  hak_large_kept_count(heap, &n, &map);
  return map;
}

/* After a free: the cache's bound, or calls_keep's if lower. */
static void trim_locked(void) {
  size_t limit = cache_limit(), keep = atomic_load_explicit(&calls_keep, memory_order_relaxed);
  if (hak_purge_in_calls_only() && keep < limit) {
    size_t kept = kept_bytes(hak_tls_heap);
    limit = keep > kept ? keep - kept : 0;
    if (dirty_bytes > limit) calls_trim_ms = hak_clock_ms();
  }
  trim_to_locked(limit);
}

/* Moving committed pages costs less than faulting in new ones: on bare
 * metal about 12 ns a page (one mremap of a whole chunk, a page table
 * relinked) against 1.7 us; on a VM with shadow page tables about 6 us at
 * the page's first touch against 12 us. So a block that would fault in a
 * chunk's worth of pages takes them from a free committed chunk instead, if
 * any has at least 64 KiB more of them. */
#define DONATE_MIN ((size_t)65536)

/* A move pays for the pages a block will write: 1000 blocks of 2-8 MiB,
 * each written at its first byte, had every move (an mremap and an mmap)
 * bring a page or two, and moves took half the time. Pages move while the
 * share of the pages of freed blocks that were committed (written_share)
 * is at least half. The free chunk whose pages a move for `need` bytes
 * takes: the one that covers the most of them (dirty_best), if it covers
 * `least` at least and moves pay; else SIZE_MAX. */
static size_t donor_for(size_t need, size_t least) {
  if (written_share < 128) return SIZE_MAX;
  size_t donor = dirty_best(need);
  return donor != SIZE_MAX && chunk_covers(donor, need) >= least ? donor : SIZE_MAX;
}

/* Makes chunk k accessible for `need` bytes from its start (the whole
 * chunk but under hak_commit_strict: fewer calls, and the kernel merges
 * whole chunks into one area); false if the kernel refuses (its commit
 * limit, or its limit of areas). A whole chunk the kernel faulted in (the
 * program locked its memory) is made inaccessible again past `need`. */
static bool chunk_commit(size_t k, size_t need) {
  size_t want = hak_os_commit_strict() ? hak_page_up(need) : GRAIN, from = tab.accessible[k];
  if (want <= from) return true;
  if (!hak_os_commit(chunk_addr(k) + from, want - from)) return false;
  tab.accessible[k] = (uint32_t)want;
  size_t used = hak_page_up(need) > from ? hak_page_up(need) : from;
  if (used < want && hak_os_found_locked(chunk_addr(k) + want - HAK_PAGE_SIZE) &&
      hak_os_uncommit(chunk_addr(k) + used, want - used))
    tab.accessible[k] = (uint32_t)used;
  return true;
}

/* Chunk to_chunk (SIZE_MAX: none) took chunk from's pages, which a move
 * left empty. */
static void accessible_moved(size_t from, size_t to_chunk) {
  if (to_chunk != SIZE_MAX) tab.accessible[to_chunk] = tab.accessible[from];
  tab.accessible[from] = 0;
}

/* Moves chunk from's pages to `to` (chunk to_chunk's address, or a
 * segment's when to_chunk is SIZE_MAX); from is left empty. */
static bool chunk_move(size_t from, void *to, size_t to_chunk, bool live) {
  if (!hak_os_move(chunk_addr(from), GRAIN, to, live)) return false;
  accessible_moved(from, to_chunk);
  return true;
}

/* Chunk k of a block needs `need` bytes from its start: moves there the
 * pages of the free chunk that covers the most of them (the least
 * committed one among those that cover them all). */
static void chunk_fill(size_t k, size_t need) {
  size_t donor = donor_for(need, chunk_covers(k, need) + DONATE_MIN);
  if (donor == SIZE_MAX) return;
  /* Whole chunks, so each chunk stays one mapping (else a later move of it
   * would fail). Chunk k's own pages, if it has some, trade places with
   * the donor's (through the unused chunk at `high`): moved over, they
   * were dropped, and faulted in again elsewhere (blocks of 1-4 MiB over
   * 64 slots: 71 of 230 MiB faulted in). */
  size_t mine = tab.dirt[k];
  if (!chunk_commit(donor, need)) return; /* k takes its pages as far as they are accessible */
  int swapped = mine >= DONATE_MIN && high < arena_chunks
                    ? hak_os_swap(chunk_addr(k), chunk_addr(donor), chunk_addr(high), GRAIN)
                    : 0;
  if (swapped == 2) {
    tab.dirt[k] = tab.dirt[donor];
    chunk_bin_remove(donor);
    dirty_add(tab.dirt[donor], false);
    tab.dirt[donor] = (uint32_t)mine;
    dirty_add(mine, true);
    chunk_bin_add(donor);
    head_gone(donor);
    uint32_t own = tab.accessible[k];
    tab.accessible[k] = tab.accessible[donor];
    tab.accessible[donor] = own;
    return;
  }
  /* else the donor is left all zero */
  if (swapped == 1) accessible_moved(donor, k);
  else if (!chunk_move(donor, chunk_addr(k), k, false)) return;
  tab.dirt[k] = tab.dirt[donor];
  chunk_forget(donor);
  hak_stats_mapped(GRAIN, false);
}

unsigned hak_large_donate_segment(void *seg) {
  _Static_assert(HAK_SEG_SIZE / GRAIN <= 32, "a bit per half");
  unsigned moved = 0;
  /* Nothing cached (the dirty chunks are part of it): the arena's data, at
   * the far end of the library's, stays untouched (see segmap.c). */
  if (HAK_GUARD_PAGES ||
      atomic_load_explicit(&hak_gstats.large_cached, memory_order_relaxed) == 0)
    return 0;
  pthread_mutex_lock(&hak_large_lock);
  for (size_t i = 0; arena != NULL && i < HAK_SEG_SIZE / GRAIN; i++) {
    size_t donor = donor_for(GRAIN, DONATE_MIN);
    if (donor == SIZE_MAX) break;
    if (!chunk_commit(donor, GRAIN) || !chunk_move(donor, (uint8_t *)seg + i * GRAIN, SIZE_MAX, false))
      continue;
    chunk_forget(donor);
    hak_stats_mapped(GRAIN, false);
    moved |= 1u << i;
  }
  pthread_mutex_unlock(&hak_large_lock);
  return moved;
}

/* Makes what a block of map_size bytes at chunk i uses of its chunks
 * from `from` on accessible (each chunk whole if asked, as block_fill);
 * false if the kernel refuses (its commit limit, or its limit of areas),
 * with the free chunks there that are not dirty made inaccessible again. */
static bool block_commit(size_t i, size_t map_size, size_t offset, size_t from, bool whole) {
  size_t end = i + chunks_of(map_size);
  for (size_t k = from; k < end; k++) {
    if (!chunk_commit(k, whole ? GRAIN : chunk_use(map_size, offset, k - i))) {
      for (size_t j = from; j < k; j++)
        if (!bit_get(tab.used_bits, j) && !bit_get(tab.dirty_bits, j) && tab.accessible[j] &&
            hak_os_uncommit(chunk_addr(j), tab.accessible[j]))
          tab.accessible[j] = 0;
      return false;
    }
  }
  return true;
}

/* Fills the chunks of a block of map_size bytes at chunk i from chunk
 * `from` on (see chunk_fill), each whole if asked (a block that realloc
 * grew grows again, within its last chunk, where that chunk cannot take a
 * donor's pages any more); true if none of its pages are committed. */
static bool block_fill(size_t i, size_t map_size, size_t offset, size_t from, bool whole) {
  size_t n = chunks_of(map_size);
  bool fresh = true;
  for (size_t k = from; k < i + n; k++) {
    size_t need = whole ? GRAIN : chunk_use(map_size, offset, k - i);
    if (tab.dirt[k] + DONATE_MIN <= need) chunk_fill(k, need);
    if (tab.dirt[k]) fresh = false;
  }
  return fresh;
}

/* Bytes a block at chunk i, now of `used` bytes, would fault in to grow
 * in place to map_size bytes. */
static size_t grow_fresh_bytes(size_t i, size_t map_size, size_t used, size_t offset) {
  size_t fresh = 0;
  for (size_t k = 0; k < chunks_of(map_size); k++) {
    size_t need = chunk_use(map_size, offset, k), have = chunk_use(used, offset, k);
    if (tab.dirt[i + k] > have) have = tab.dirt[i + k];
    if (need > have) fresh += need - have;
  }
  return fresh;
}

static hak_segment_t *arena_alloc(size_t map_size, size_t offset, bool whole) {
  size_t n = chunks_of(map_size), faults = 0;
  hak_segment_t *seg = NULL;
  pthread_mutex_lock(&hak_large_lock);
  if (arena_init()) {
    size_t i = arena_find(map_size, offset, NULL);
    if (i != SIZE_MAX && block_commit(i, map_size, offset, i, whole)) {
      chunks_claim(i, n, true);
      bool fresh = block_fill(i, map_size, offset, i, whole);
      faults = grow_fresh_bytes(i, map_size, 0, offset);
      if (faults) calls_keep_learn(map_size);
      seg = (hak_segment_t *)chunk_addr(i);
      header_init(seg, map_size, offset, fresh);
    }
  }
  pthread_mutex_unlock(&hak_large_lock);
  if (faults) { /* pages not committed yet: others' idle ones go back for them */
    hak_span_shed(faults);
    hak_heaps_trim_empty();
  }
  return seg;
}

/* Copying a page costs about a fifth of faulting one in (0.34 against
 * 1.7 us on the reference machine). */
#define COPY_PER_FAULT 5

/* Resizes an arena block to new_map bytes: in place when it shrinks, or
 * when growing there faults in no more than moving would (counting the copy).
 * Else its pages move to a free run that holds no committed pages there.
 * NULL (and nothing changed) when the caller should copy the block, or
 * there is no room. */
static hak_segment_t *arena_resize(hak_segment_t *seg, size_t new_map) {
  size_t i = chunk_index(seg), n = chunks_of(seg->map_size), m = chunks_of(new_map);
  size_t offset = seg->large_offset;
  bool again = seg->grown; /* read before its page moves */
  hak_segment_t *r = seg;
  size_t faults = 0;
  pthread_mutex_lock(&hak_large_lock);
  if (new_map <= seg->map_size) {
    if (m < n) chunks_release(i + m, n - m, seg->map_size - (m << GRAIN_SHIFT), 0);
    /* the last chunk kept stays committed as far as the block used it */
    dirt_fold(i + m - 1, chunk_use(seg->map_size, offset, m - 1));
    seg->map_size = new_map;
    trim_locked();
    goto out;
  }
  bool room = i + m <= arena_chunks;
  for (size_t k = i + n; room && k < i + m; k++) room = k >= high || !bit_get(tab.used_bits, k);
  size_t fresh_there, j = arena_find(new_map, offset, &fresh_there);
  if (room && (j == SIZE_MAX || grow_fresh_bytes(i, new_map, seg->map_size, offset) <=
                                    fresh_there + seg->map_size / COPY_PER_FAULT)) {
    if (!block_commit(i, new_map, offset, i + n - 1, again)) {
      r = NULL;
      goto out;
    }
    if (m > n) {
      chunks_claim(i + n, m - n, false);
      block_fill(i, new_map, offset, i + n, again);
    }
    faults = grow_fresh_bytes(i, new_map, seg->map_size, offset);
    seg->map_size = new_map;
    seg->grown = 1;
    goto out;
  }
  r = NULL;
  if (j == SIZE_MAX) goto out;
  for (size_t k = j; k < j + n; k++)
    if (tab.dirt[k]) goto out; /* moving pages there would drop these: copy */
  /* The moved chunks stay accessible as far as they were: the last one is
   * made so for its new bytes first, the chunks after them for theirs. */
  if (!chunk_commit(i + n - 1, again ? GRAIN : chunk_use(new_map, offset, n - 1)) ||
      !block_commit(j, new_map, offset, j + n, again))
    goto out;
  chunks_claim(j, m, true);
  hak_segment_t *dst = (hak_segment_t *)chunk_addr(j);
  /* chunk by chunk: a chunk that got pages from another is a mapping of
   * its own (see chunk_fill) */
  size_t old_map = seg->map_size; /* seg's page moves with chunk 0 */
  for (size_t k = 0; k < n; k++) {
    if (!chunk_move(i + k, chunk_addr(j + k), j + k, true)) {
      /* A chunk is more than one mapping that the kernel cannot move
       * together (a page the program sealed, or before Linux 6.17 locked or
       * protected): the chunks moved go back, and the caller copies. */
      while (k-- > 0) {
        if (!chunk_move(j + k, chunk_addr(i + k), i + k, true))
          hak_fatal("hakmem: mremap back to %p failed: errno %d", chunk_addr(i + k), errno);
        tab.dirt[i + k] = tab.dirt[j + k];
        tab.dirt[j + k] = 0;
      }
      chunks_release(j, m, 0, 0);
      goto out;
    }
    /* the old chunk is mapped again, empty; the pages moved keep their dirt */
    tab.dirt[j + k] = tab.dirt[i + k];
    dirt_fold(j + k, chunk_use(old_map, offset, k));
    tab.dirt[i + k] = 0;
  }
  chunks_free(i, n);
  block_fill(j, new_map, offset, j + n, again);
  faults = grow_fresh_bytes(j, new_map, old_map, offset);
  head_gone(i);
  hak_stats_mapped(n << GRAIN_SHIFT, false);
  dst->map_size = new_map;
  dst->grown = 1;
  r = dst;
out:
  pthread_mutex_unlock(&hak_large_lock);
  if (faults) hak_span_shed(faults);
  return r;
}

/* A mapping of its own, for what the arena cannot hold. */
static hak_segment_t *large_map(size_t map_size, size_t align, size_t offset) {
  uint8_t *seg;
  if (align <= HAK_SEG_SIZE) {
    seg = hak_os_map_aligned(map_size, HAK_SEG_SIZE);
    if (seg == NULL) return NULL;
  } else {
    /* The block is aligned to more than a segment: its header sits in the
     * chunk just before it, which is where (p - 1) rounds down to. */
    size_t total = map_size + align + HAK_SEG_SIZE;
    if (total < map_size) return NULL;
    uint8_t *raw = hak_os_map(total);
    if (raw == NULL) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + offset + align - 1) & ~(uintptr_t)(align - 1));
    seg = p - offset;
    hak_os_unmap(raw, (size_t)(seg - raw));
    hak_os_unmap(seg + map_size, (size_t)(raw + total - (seg + map_size)));
  }
  if (!hak_segmap_open(seg, HAK_SEG_SIZE)) {
    hak_os_unmap(seg, map_size);
    return NULL;
  }
  header_init((hak_segment_t *)seg, map_size, offset, true);
  own_mapping_publish((hak_segment_t *)seg);
  return (hak_segment_t *)seg;
}

static void large_unmap(hak_segment_t *seg) {
  hak_segmap_set(seg, HAK_SEGMAP_NONE);
  hak_os_unmap(seg, seg->map_size);
}

hak_segment_t *hak_large_header(const void *p) {
  HAK_ASSERT(in_arena((const uint8_t *)p - 1)); /* the segment map says so */
  size_t i = chunk_index((const uint8_t *)p - 1);
  return tab.head_mark[i] == HEAD_HERE ? (hak_segment_t *)chunk_addr(i) : NULL;
}

bool hak_large_freed_start(const void *p) {
  if (!in_arena((const uint8_t *)p - 1)) return false;
  size_t i = chunk_index((const uint8_t *)p - 1);
  uintptr_t offset = (uintptr_t)p - (uintptr_t)chunk_addr(i);
  /* HAK_LARGE_OFFSET, or an alignment past it: powers of two */
  return tab.head_mark[i] == HEAD_GONE && offset >= HAK_LARGE_OFFSET && (offset & (offset - 1)) == 0;
}

static hak_segment_t *large_get(size_t map_size, size_t align, size_t offset, bool whole) {
  hak_segment_t *seg = NULL;
  if (align <= GRAIN && map_size <= ARENA_MAX_BLOCK) seg = arena_alloc(map_size, offset, whole);
  if (seg != NULL) return seg;
  hak_heaps_trim_empty(); /* a new mapping: as arena_alloc's faults */
  return large_map(map_size, align, offset);
}

/* A thread's last freed blocks of one chunk at most wait in its heap (up
 * to HAK_LARGE_KEPT), marked free, for its next large blocks of about
 * their size: a program that churns blocks of a few hundred KiB then takes
 * no lock and walks no bins. A large malloc that none of them fits gives
 * them all back (its sizes moved), and so does the purger once a pass finds
 * that none was kept since the last one, a sweep of the heaps by such a
 * malloc of any thread likewise (kept_sweep), and the thread's exit. The
 * owner takes a block with an exchange, which the purger's or a sweep's may
 * beat; only the owner puts one into an empty place. Without a purge delay,
 * or without the purger that gives back what an idle thread keeps, freed
 * blocks go to the arena at once; where purges run in the program's calls
 * only, unless calls_keep covers them. */
static bool kept_eligible(hak_heap_t *heap, const hak_segment_t *seg) {
  return !HAK_GUARD_PAGES && seg->large_offset == HAK_LARGE_OFFSET && seg->map_size <= GRAIN &&
         hak_opt.purge_delay_ms != 0 && hak_opt.purge_thread &&
         (!hak_purge_in_calls_only() ||
          atomic_load_explicit(&hak_gstats.large_cached, memory_order_relaxed) +
                  kept_bytes(heap) + seg->map_size <=
              atomic_load_explicit(&calls_keep, memory_order_relaxed));
}

static hak_segment_t *kept_take(hak_heap_t *heap, size_t map_size) {
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) {
    size_t kept = heap->large_kept_map[k];
    if (atomic_load_explicit(&heap->large_kept[k], memory_order_relaxed) != NULL &&
        map_size <= kept && map_size > kept / 2) {
      return atomic_exchange_explicit(&heap->large_kept[k], NULL,
                                      memory_order_acquire); /* NULL: the purger took it */
    }
  }
  return NULL;
}

static bool kept_put(hak_heap_t *heap, hak_segment_t *seg) {
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) {
    if (atomic_load_explicit(&heap->large_kept[k], memory_order_relaxed) == NULL) {
      __atomic_store_n(&heap->large_kept_map[k], seg->map_size, __ATOMIC_RELAXED);
      atomic_store_explicit(&heap->large_kept[k], seg, memory_order_release);
      atomic_store_explicit(&heap->large_kept_moved, 1, memory_order_relaxed);
      return true;
    }
  }
  return false;
}

static bool kept_any(hak_heap_t *heap) {
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++)
    if (atomic_load_explicit(&heap->large_kept[k], memory_order_relaxed) != NULL) return true;
  return false;
}

/* A block leaves the live figures once it is back in the arena (or
 * unmapped), not while its thread keeps it: keeping a block and taking it
 * again then write no counter that other threads write too (two threads
 * that churned blocks of 1.1-2 MiB ran 4.8x as fast). Reports subtract the
 * kept blocks (hak_large_usage). */
static void count_freed(const hak_segment_t *seg) {
  HAK_STAT_SUB(large_live, 1);
  HAK_STAT_SUB(large_bytes, seg->large_size);
}

void hak_large_kept_count(hak_heap_t *heap, size_t *blocks, size_t *map_bytes) {
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) {
    if (atomic_load_explicit(&heap->large_kept[k], memory_order_acquire) == NULL) continue;
    *blocks += 1;
    *map_bytes += __atomic_load_n(&heap->large_kept_map[k], __ATOMIC_RELAXED);
  }
}

void hak_large_usage(size_t *live, size_t *bytes, size_t *cached) {
  size_t n = 0, map = 0;
  hak_heaps_large_kept(&n, &map);
  size_t l = atomic_load_explicit(&hak_gstats.large_live, memory_order_relaxed);
  size_t b = atomic_load_explicit(&hak_gstats.large_bytes, memory_order_relaxed);
  size_t kept_size = map - n * HAK_LARGE_OFFSET;
  *live = l > n ? l - n : 0;
  *bytes = b > kept_size ? b - kept_size : 0;
  *cached = atomic_load_explicit(&hak_gstats.large_cached, memory_order_relaxed) + map;
}

/* Under hak_large_lock: the chunks of a freed block are free. */
static void release_locked(hak_segment_t *seg) {
  sample_written(seg);
  chunks_release(chunk_index(seg), chunks_of(seg->map_size), seg->map_size, seg->large_offset);
  if (hak_opt.purge_delay_ms == 0) arena_purge_locked(true, 0, 0);
  else trim_locked();
}

bool hak_large_kept_release(hak_heap_t *heap, bool force) {
  if (!kept_any(heap)) return false;
  if (atomic_exchange_explicit(&heap->large_kept_moved, 0, memory_order_relaxed) && !force) return true;
  hak_segment_t *taken[HAK_LARGE_KEPT];
  size_t n = 0;
  for (size_t k = 0; k < HAK_LARGE_KEPT; k++) {
    hak_segment_t *seg = atomic_exchange_explicit(&heap->large_kept[k], NULL, memory_order_acquire);
    if (seg != NULL) taken[n++] = seg;
  }
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++) count_freed(taken[i]);
  pthread_mutex_lock(&hak_large_lock);
  for (size_t i = 0; i < n; i++) release_locked(taken[i]);
  pthread_mutex_unlock(&hak_large_lock);
  hak_purge_wake();
  return false;
}

/* A thread that blocks (joining the threads it created, waiting for work)
 * kept its blocks until the purger's passes, 25-50 ms: a tree of threads
 * that each wrote a block of 1.2-2.2 MiB a round held one for each waiting
 * parent (`fj4 8 5 20`, a /tmp variant of bench/forkjoin: 245 MiB peak
 * against tcmalloc's 152). So a large malloc that none of its thread's
 * blocks fits, bound for the arena anyway, also gives back those of heaps
 * that kept none since the last such sweep, at most every millisecond
 * (plus one per 256 heaps, so that thousands of threads cost little):
 * 121 MiB and 1.43x as fast. A thread that keeps blocks in a row is not
 * swept; one that waits a millisecond between blocks takes its next from
 * the arena, a lock and a search that cost little against writing one.
 * The next sweep's time is set as one starts: a sweeper that waits for a
 * CPU among hundreds of threads held off the others (184.8 MiB against
 * 137.0 when it was set as one ended). */
static HAK_NEAR_DATA _Atomic uint64_t kept_next_sweep_ms;
static HAK_NEAR_DATA _Atomic size_t kept_swept_heaps; /* how many the last sweep looked at */

static void kept_sweep(void) {
  uint64_t now = hak_clock_ms();
  uint64_t due = atomic_load_explicit(&kept_next_sweep_ms, memory_order_relaxed);
  uint64_t next = now + 1 + atomic_load_explicit(&kept_swept_heaps, memory_order_relaxed) / 256;
  if (now < due || !atomic_compare_exchange_strong(&kept_next_sweep_ms, &due, next)) return;
  atomic_store_explicit(&kept_swept_heaps, hak_heaps_kept_sweep(), memory_order_relaxed);
}

static void *large_alloc(size_t size, size_t align, bool zero, bool grown, bool whole) {
  if (size > PTRDIFF_MAX - 2 * HAK_SEG_SIZE - align) {
    errno = ENOMEM;
    return NULL;
  }
  HAK_SLOW_BEGIN();
  hak_process_init();
  /* align is a power of two: past HAK_LARGE_OFFSET it is at least twice
   * that, so a guard page still fits below the block */
  size_t offset = align <= HAK_LARGE_OFFSET ? HAK_LARGE_OFFSET
                  : align <= HAK_SEG_SIZE   ? align
                                            : HAK_SEG_SIZE;
  size_t map_size = hak_page_up(offset + size);
  hak_heap_t *heap = hak_tls_heap;
  hak_segment_t *seg = NULL;
  /* a thread of large blocks only gets a heap too, to keep them in */
  if (heap == HAK_HEAP_EMPTY && (heap = hak_heap_get()) == NULL) heap = HAK_HEAP_EMPTY;
  /* calloc too, which then clears the block: when calloc left them to
   * malloc, a loop of calloc and free of 1 MiB kept 4 blocks it never
   * used (6.7 MiB peak, 2.7 since; 1.05x as fast), against large's 111.7
   * MiB peak, 115.7 since */
  if (offset == HAK_LARGE_OFFSET && (seg = kept_take(heap, map_size)) == NULL) {
    hak_large_kept_release(heap, true);
    kept_sweep();
  }
  bool counted = seg != NULL; /* kept, it still counts as live */
  if (seg == NULL) seg = large_get(map_size, align, offset, whole);
  /* Out of memory (or address space): what waits for a purge, in a cache
   * or for the purger's unmap goes back to the OS, and one more try, unless
   * the request is more than all hakmem holds (a probe for a huge size). */
  if (seg == NULL && map_size <= atomic_load_explicit(&hak_gstats.mapped, memory_order_relaxed)) {
    hak_release_all();
    seg = large_get(map_size, align, offset, whole);
  }
  if (seg == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  bool guarded = !HAK_GUARD_PAGES || hak_os_guard((uint8_t *)seg + offset - HAK_PAGE_SIZE, HAK_PAGE_SIZE, true);
  seg->large_size = seg->map_size - offset;
  seg->grown = grown;
  hak_slab_set_state(&seg->slabs[0], HAK_SLAB_ACTIVE);
  if (!counted) {
    HAK_STAT_ADD(large_live, 1);
    HAK_STAT_ADD(large_bytes, seg->large_size);
  }
  void *p = (uint8_t *)seg + offset;
  HAK_CSTAT_ALLOC(HAK_STATS_LARGE, size);
  /* The guard page splits a mapping: refused when the process has as many
   * as the kernel allows (vm.max_map_count), the block goes back. */
  if (HAK_UNLIKELY(!guarded)) {
    hak_large_free(seg);
    errno = ENOMEM;
    return NULL;
  }
  if (zero && !seg->fresh) memset(p, 0, size);
  seg->fresh = 0;
  HAK_SLOW_END();
  return p;
}

void *hak_large_alloc(size_t size, size_t align, bool zero) {
  return large_alloc(size, align, zero, false, false);
}
void *hak_large_alloc_grown(size_t size, bool small_step) {
  return large_alloc(size, 0, false, true, small_step);
}

bool hak_large_cache_collect(bool force) {
  pthread_mutex_lock(&hak_large_lock);
  size_t had = dirty_bytes;
  bool pending = arena_purge_locked(force, 0, 0);
  if (!force && dirty_bytes < had) calls_keep_halve();
  pthread_mutex_unlock(&hak_large_lock);
  return pending;
}

void hak_large_free(hak_segment_t *seg) {
  HAK_CSTAT_FREE(HAK_STATS_LARGE);
  if (!in_arena(seg)) {
    count_freed(seg);
    large_unmap(seg);
    return;
  }
  if (HAK_GUARD_PAGES) /* the chunks may hold any block next */
    hak_os_guard((uint8_t *)seg + seg->large_offset - HAK_PAGE_SIZE, HAK_PAGE_SIZE, false);
  hak_slab_set_state(&seg->slabs[0], HAK_SLAB_FREE); /* a second free is a double free */
  hak_heap_t *heap = hak_tls_heap;
  if (heap == HAK_HEAP_EMPTY || !kept_eligible(heap, seg) || !kept_put(heap, seg)) {
    count_freed(seg);
    pthread_mutex_lock(&hak_large_lock);
    release_locked(seg);
    pthread_mutex_unlock(&hak_large_lock);
  }
  hak_purge_wake();
  hak_purge_start();
}

/* Resizes a mapping of its own to new_map bytes without copying: the tail
 * is unmapped, or the mapping grows in place, or its pages move to a new
 * segment-aligned range. Returns the (maybe moved) segment, or NULL with
 * seg unchanged. */
static hak_segment_t *large_resize(hak_segment_t *seg, size_t new_map) {
  size_t old_map = seg->map_size;
  if (new_map <= old_map) {
    hak_os_unmap((uint8_t *)seg + new_map, old_map - new_map);
    seg->map_size = new_map;
    return seg;
  }
  if (hak_os_remap(seg, old_map, new_map, NULL) != NULL) {
    seg->map_size = new_map;
    return seg;
  }
  uint8_t *raw = hak_os_map(new_map + HAK_SEG_SIZE);
  if (raw == NULL) return NULL;
  uint8_t *dst = (uint8_t *)(((uintptr_t)raw + HAK_SEG_MASK) & ~(uintptr_t)HAK_SEG_MASK);
  hak_segment_t *moved = NULL;
  if (hak_segmap_open(dst, HAK_SEG_SIZE)) {
    hak_segmap_set(seg, HAK_SEGMAP_NONE);
    moved = hak_os_remap(seg, old_map, new_map, dst);
    if (moved == NULL) hak_segmap_set(seg, HAK_SEGMAP_SLABS);
  }
  if (moved == NULL) {
    hak_os_unmap(raw, new_map + HAK_SEG_SIZE);
    return NULL;
  }
  /* the reserved range under dst was replaced by the moved pages */
  hak_stats_mapped(new_map, false);
  hak_os_unmap(raw, (size_t)(dst - raw));
  hak_os_unmap(dst + new_map, (size_t)(raw + new_map + HAK_SEG_SIZE - (dst + new_map)));
  moved->map_size = new_map;
  own_mapping_publish(moved);
  return moved;
}

void *hak_large_realloc(hak_segment_t *seg, void *p, size_t size) {
  size_t offset = seg->large_offset, old_size = seg->large_size;
  if (size <= old_size && size >= old_size / 2) return p;
  hak_segment_t *r = NULL;
  if (size <= PTRDIFF_MAX - 2 * HAK_SEG_SIZE) {
    size_t new_map = hak_page_up(offset + size);
    if (in_arena(seg)) {
      /* the chunks of kept blocks may be where it grows */
      if (new_map > seg->map_size) hak_large_kept_release(hak_tls_heap, true);
      if (new_map <= ARENA_MAX_BLOCK) r = arena_resize(seg, new_map);
    } else if (offset == HAK_LARGE_OFFSET && size > old_size) {
      /* shrinking copies into a smaller block instead */
      r = large_resize(seg, new_map);
    }
  }
  if (r != NULL) {
    r->large_size = r->map_size - offset;
    HAK_STAT_ADD(large_bytes, r->large_size);
    HAK_STAT_SUB(large_bytes, old_size);
    return (uint8_t *)r + offset;
  }
  return hak_realloc_move(p, size, old_size);
}
