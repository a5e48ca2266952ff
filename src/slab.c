/* Slabs: blocks of one size class. Refill hands the heap a whole list at a
 * time. A list of used blocks attaches the slab to the heap: the owner's
 * frees then go straight back to the heap's list, so malloc reuses the
 * block freed last (LIFO, still in cache). A class keeps up to
 * HAK_ATTACH_MAX slabs attached: a class whose live blocks spread over a
 * few slabs (random_mixed ws=8192: 3 to 5) then frees most blocks to the
 * list malloc pops, and refills less. Other slabs take the owner's frees on
 * local_free. Other threads push onto the atomic remote list, which the
 * owner collects when its free list runs dry. */
#include "internal.h"

/* Blocks carved per refill from a fresh slab: about a page, at least 4
 * once the slab has carved 4 (carve_count). A class touches only what it
 * carves, so a thread that uses many classes a little (larson 10-1000: 33
 * classes, ~30 blocks each) stays small. */
#define HAK_EXTEND_BYTES 4096

/* An attached slab's used count starts here (see slab->used): only 2^31
 * frees with no refill between bring it to 0, and hak_slab_emptied then
 * sets it back. */
#define HAK_USED_ATTACHED (UINT32_C(1) << 31)

/* Attached: the owner's frees go to the heap's list (see hak_unit_t). */
static inline bool slab_attached(hak_slab_t *slab) {
  return hak_slab_free_to(slab) != &slab->local_free;
}
/* Every unit's copy: a free may land in any unit of the slab. */
static inline void slab_set_free_to(hak_slab_t *slab, hak_block_t **to) {
  hak_unit_t *unit = &hak_segment_of_slab(slab)->unit[slab->index];
  for (unsigned u = 0; u < slab->units; u++) unit[u].free_to = to;
}
/* The owner's frees go to local_free again, and used is a count again. */
static inline void slab_detach(hak_slab_t *slab, uint32_t used) {
  slab_set_free_to(slab, &slab->local_free);
  slab->used = used;
}

/* Blocks on list, counted up to most. */
static size_t list_length(const hak_block_t *list, size_t most) {
  size_t n = 0;
  for (; list != NULL && n < most; list = hak_next(list)) n++;
  return n;
}

/* The blocks of an attached slab that are out (used counts none of them
 * while it is attached): the reserved ones not on its local_free. */
static uint32_t slab_count_out(const hak_slab_t *slab) {
  return slab->reserved - (uint32_t)list_length(slab->local_free, SIZE_MAX);
}

void hak_queue_push_front(hak_slab_queue_t *q, hak_slab_t *s) {
  s->prev = NULL;
  s->next = q->first;
  if (q->first) q->first->prev = s;
  else q->last = s;
  q->first = s;
}

void hak_queue_push_back(hak_slab_queue_t *q, hak_slab_t *s) {
  s->next = NULL;
  s->prev = q->last;
  if (q->last) q->last->next = s;
  else q->first = s;
  q->last = s;
}

void hak_queue_remove(hak_slab_queue_t *q, hak_slab_t *s) {
  if (s->prev) s->prev->next = s->next;
  else q->first = s->next;
  if (s->next) s->next->prev = s->prev;
  else q->last = s->prev;
  s->next = s->prev = NULL;
}

/* s becomes the current slab of its class. */
static void queue_move_front(hak_slab_queue_t *q, hak_slab_t *s) {
  if (q->first == s) return;
  hak_queue_remove(q, s);
  hak_queue_push_front(q, s);
}

void hak_slab_init(hak_slab_t *slab, size_t cls) {
  hak_segment_t *seg = hak_segment_of_slab(slab);
  size_t bs = hak_class_size[cls];
  slab->block_size = (uint32_t)bs;
  slab->magic = (0 - (uint64_t)bs) / bs + 2; /* (2^64 - bs) / bs + 2 = floor(2^64 / bs) + 1 */
  slab->first_magic = (uint64_t)(uintptr_t)hak_slab_start(seg, slab) * slab->magic;
  slab->capacity = (uint32_t)(hak_slab_bytes(slab) / bs);
  slab->cls = (uint8_t)cls;
  hak_slab_set_reserved(slab, 0);
  slab_detach(slab, 0);
  slab->retiring = 0;
  slab->local_free = NULL;
  slab->remote_seen = NULL;
  atomic_store_explicit(&slab->remote, NULL, memory_order_relaxed);
  HAK_ASSERT(slab->capacity > 0);
}

void hak_slab_give_back(hak_slab_t *slab, hak_block_t *list) {
  if (list == NULL) return;
  size_t n = 1;
  hak_block_t *tail = list;
  for (hak_block_t *next; (next = hak_next(tail)) != NULL; tail = next) n++;
  hak_set_next(tail, slab->local_free);
  slab->local_free = list;
  HAK_ASSERT(slab->used >= n);
  slab->used -= (uint32_t)n;
}

/* The slab's remote list, now the caller's, or NULL. */
static inline hak_block_t *take_remote(hak_slab_t *slab) {
  if (atomic_load_explicit(&slab->remote, memory_order_relaxed) == NULL) return NULL;
  hak_block_t *list = atomic_exchange_explicit(&slab->remote, NULL, memory_order_acquire);
  if (list != NULL) HAK_STAT_ADD(remote_collects, 1);
  return list;
}

void hak_slab_collect_remote(hak_slab_t *slab) { hak_slab_give_back(slab, take_remote(slab)); }

/* The block at byte offset off of the slab's first: floor(off / bs) is the
 * high word of off * magic (off < 2^32, magic - 2^64 / bs at most 1), a
 * multiply where a division cost take_local's walk most of its time. */
static size_t slab_index(const hak_slab_t *slab, size_t off) {
  return (size_t)(((unsigned __int128)off * slab->magic) >> 64);
}

/* A block of class cls came back to a slab, for a refill to take: the
 * class does not only grow (slab_units). */
static inline void class_came_back(hak_heap_t *heap, size_t cls) {
  heap->slab_came_back |= UINT64_C(1) << cls;
}

/* The list of a detached slab's own frees, now the caller's (used is a
 * count: the list holds reserved - used blocks), relinked in address order
 * when it is long (HAK_SORT_MIN): blocks the program freed at random then
 * come back in a row, and so does what it allocates next, for a walk in
 * creation order (CPython's GC after a churn: 1.12x; jemalloc's slabs hand
 * out their lowest block first). Shorter lists, which a program that
 * churns a tree or a hash table at random takes all the time, keep the
 * order of their frees: the walk waits on a miss a block, and the order
 * gains such a program nothing (a std::map of 100,000 keys 1.045x, of a
 * million 1.12x; with 32 blocks as the line). Blocks above 1 KiB keep it
 * too: each is a line or more of its own, which the walk and the
 * relinking would read and write (random_mixed 4000-4400 B, ws=2048:
 * 1.13x). */
static hak_block_t *take_local(hak_heap_t *heap, hak_slab_t *slab) {
  hak_block_t *list = slab->local_free;
  class_came_back(heap, slab->cls);
  size_t n = slab->reserved - slab->used;
  slab->local_free = NULL;
  if (n < HAK_SORT_MIN || slab->cls >= HAK_SMALL_CLASSES) return list;
  HAK_ASSERT(slab->capacity <= HAK_SLAB_MAX_BLOCKS);
  uint64_t bits[HAK_SLAB_MAX_BLOCKS / 64];
  size_t words = (slab->capacity + 63) / 64, bs = slab->block_size;
  memset(bits, 0, words * sizeof bits[0]);
  uint8_t *start = hak_slab_start(hak_segment_of_slab(slab), slab);
  for (hak_block_t *b = list; b != NULL; b = hak_next(b), n--) {
    size_t i = slab_index(slab, (size_t)((uint8_t *)b - start));
    bits[i / 64] |= (uint64_t)1 << (i % 64);
  }
  HAK_ASSERT(n == 0);
  hak_block_t *head = NULL;
  for (size_t w = words; w-- > 0;) /* from the top, each block in front */
    for (uint64_t m = bits[w]; m != 0;) {
      size_t top = 63 - (size_t)__builtin_clzll(m);
      m &= ~((uint64_t)1 << top);
      hak_block_t *b = (hak_block_t *)(start + (w * 64 + top) * bs);
      hak_set_next(b, head);
      head = b;
    }
  return head;
}

/* Blocks carved at a time from a slab of block size bs, once it has
 * carved that many (carve_count); a carve's worth of freed blocks
 * (freed_elsewhere). */
static inline size_t carve_batch(size_t bs) {
  size_t n = HAK_EXTEND_BYTES / bs;
  return n < 4 ? 4 : n;
}

/* Blocks the slab's next carve takes. Blocks over 1 KiB (fewer than 4 a
 * page): as many as it has carved until that reaches the batch (1, 1, 2,
 * then 4), so that a class a program uses once writes one page, not four
 * (python3 -c pass: 19 faults fewer). */
static inline size_t carve_count(const hak_slab_t *slab, size_t bs) {
  if (HAK_EXTEND_BYTES / bs >= 4 || slab->reserved >= 4) return carve_batch(bs);
  return slab->reserved ? slab->reserved : 1;
}

/* A big program carves pages by the thousand, and a fault each costs more
 * than the kernel writing them in one call: a carve that enters a unit's
 * worth (64 KiB) of a busy class's slab has the rest of it written at once
 * (frag 1 GiB 1.076x). Only busy: a slab longer than a unit is one of a
 * class that filled one before (slab_units); 8 threads that took a block of
 * 25 classes each had 11 MiB written for 1.5. A small program keeps to the
 * pages it carves. */
static void carve_populate(hak_segment_t *seg, hak_slab_t *slab, uintptr_t lo, uintptr_t hi) {
  bool enters = slab->reserved == 0 || ((lo - 1) >> HAK_UNIT_SHIFT) != ((hi - 1) >> HAK_UNIT_SHIFT);
  if (!enters || slab->units < 2 || hak_os_program_is_small()) return;
  uintptr_t from = (hi - 1) & ~(uintptr_t)(HAK_UNIT_SIZE - 1);
  if (from < hak_page_down(lo)) from = hak_page_down(lo);
  uintptr_t end = (uintptr_t)hak_slab_start(seg, slab) + (size_t)slab->capacity * slab->block_size;
  uintptr_t to = ((hi - 1) | (HAK_UNIT_SIZE - 1)) + 1;
  to = hak_page_up(to < end ? to : end);
  hak_os_populate((void *)from, to - from);
}

/* Carves the next batch of never-used blocks into a list. */
static hak_block_t *slab_carve(hak_slab_t *slab) {
  hak_segment_t *seg = hak_segment_of_slab(slab);
  size_t bs = slab->block_size;
  size_t n = carve_count(slab, bs);
  if (n > slab->capacity - slab->reserved) n = slab->capacity - slab->reserved;
  uint8_t *first = hak_slab_start(seg, slab) + (size_t)slab->reserved * bs;
  carve_populate(seg, slab, (uintptr_t)first, (uintptr_t)first + n * bs);
  hak_slab_set_reserved(slab, slab->reserved + (uint32_t)n);
#if HAK_SECURE
  /* A random order, so the next block's address cannot be predicted. */
  uint16_t order[HAK_EXTEND_BYTES / 16];
  for (size_t i = 0; i < n; i++) order[i] = (uint16_t)i;
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = hak_random() % (i + 1);
    uint16_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (size_t i = 0; i + 1 < n; i++)
    hak_set_next((hak_block_t *)(first + order[i] * bs),
                 (hak_block_t *)(first + order[i + 1] * bs));
  hak_set_next((hak_block_t *)(first + order[n - 1] * bs), NULL);
  return (hak_block_t *)(first + order[0] * bs);
#else
  uint8_t *b = first;
  for (size_t i = 1; i < n; i++, b += bs) hak_set_next((hak_block_t *)b, (hak_block_t *)(b + bs));
  hak_set_next((hak_block_t *)b, NULL);
  return (hak_block_t *)first;
#endif
}

/* Carves a batch. A dirty tail may be purged meanwhile: then only under
 * the heap lock. */
static hak_block_t *slab_extend(hak_heap_t *heap, hak_slab_t *slab) {
  if (!__atomic_load_n(&slab->dirty_tail, __ATOMIC_ACQUIRE)) /* pairs with purge_tail */
    return slab_carve(slab);
  pthread_mutex_lock(&heap->lock);
  hak_block_t *list = slab_carve(slab);
  pthread_mutex_unlock(&heap->lock);
  return list;
}

/* The heap took every free block of the slab as its list, empty before:
 * all reserved ones are out. The slab is attached, so its frees feed that
 * list, beside those of the class's other attached slabs (all of them go
 * when there are HAK_ATTACH_MAX already: every block is out, the counts
 * are exact). A fresh run too: a block freed while the program is still
 * growing comes back at the next malloc, so what it allocates in a row
 * lies in a row in memory (see docs/PERFORMANCE.md, python3's GC); calloc
 * clears slab blocks whatever list they come from. */
static inline void slab_all_out(hak_heap_t *heap, hak_slab_t *slab) {
  size_t cls = slab->cls;
  slab->retiring = 0;
  slab->used = HAK_USED_ATTACHED;
  if (slab_attached(slab)) return;
  if (heap->attached_n[cls] == HAK_ATTACH_MAX) hak_heap_return_list(heap, cls);
  heap->attached[cls][heap->attached_n[cls]++] = slab;
  slab_set_free_to(slab, &heap->free[cls]);
}

/* Off its class's attached set, when its heap's list is empty (every
 * reserved block not on local_free is out). */
static void slab_unattach(hak_heap_t *heap, hak_slab_t *slab) {
  hak_slab_t **a = heap->attached[slab->cls];
  unsigned n = heap->attached_n[slab->cls];
  for (unsigned i = 0; i < n; i++)
    if (a[i] == slab) {
      a[i] = a[n - 1];
      heap->attached_n[slab->cls] = (uint8_t)(n - 1);
      break;
    }
  slab_detach(slab, slab_count_out(slab));
}

static inline bool slab_has_freed(const hak_slab_t *slab) {
  return slab->local_free != NULL ||
         atomic_load_explicit(&slab->remote, memory_order_relaxed) != NULL;
}

/* All free blocks of the slab as one list for the heap, or NULL. The
 * remote list goes out whole, uncounted (slab_all_out sets used): a count
 * would walk every block, lines another thread wrote last, before malloc
 * does. */
static hak_block_t *slab_take(hak_heap_t *heap, hak_slab_t *slab) {
  hak_block_t *list;
  if (slab->local_free) {
    list = take_local(heap, slab);
  } else if ((list = take_remote(slab)) != NULL) {
    class_came_back(heap, slab->cls);
  } else {
    if (slab->reserved == slab->capacity) return NULL;
    list = slab_extend(heap, slab);
  }
  slab_all_out(heap, slab);
  return list;
}

static void slab_activate(hak_heap_t *heap, hak_slab_t *slab) {
  hak_slab_set_state(slab, HAK_SLAB_ACTIVE);
  atomic_store_explicit(&slab->owner, heap->token, memory_order_relaxed);
}

/* It has no free block: every reserved one is out. */
static void slab_mark_full(hak_heap_t *heap, hak_slab_t *slab) {
  atomic_store_explicit(&slab->owner, 0, memory_order_relaxed);
  slab->remote_seen = NULL;
  slab_unattach(heap, slab);
  hak_slab_set_state(slab, HAK_SLAB_FULL);
  hak_queue_push_back(&heap->full[slab->cls], slab);
}

/* Back on its queue: in front when it has a batch of blocks that came
 * back, behind for one block its owner freed. */
static void slab_unfull(hak_heap_t *heap, hak_slab_t *slab, bool front) {
  hak_queue_remove(&heap->full[slab->cls], slab);
  if (front) hak_queue_push_front(&heap->queue[slab->cls], slab);
  else hak_queue_push_back(&heap->queue[slab->cls], slab);
  slab_activate(heap, slab);
}

void hak_slab_take_back(hak_heap_t *heap, hak_slab_t *slab, hak_block_t *b) {
  hak_set_next(b, slab->local_free);
  slab->local_free = b;
  slab->used--;
  class_came_back(heap, slab->cls);
  if (slab->state == HAK_SLAB_FULL) slab_unfull(heap, slab, false);
}

bool hak_slab_adopt(hak_heap_t *heap, hak_slab_t *slab) {
  hak_slab_collect_remote(slab);
  if (slab->used == 0) return false;
  if (slab->local_free || slab->reserved < slab->capacity) {
    hak_queue_push_back(&heap->queue[slab->cls], slab);
    slab_activate(heap, slab);
  } else {
    slab_mark_full(heap, slab);
  }
  return true;
}

/* FULL slabs are also the purger's (hak_slab_release_idle_full): their
 * lists change under the heap's lock only. */
static void slab_mark_full_locked(hak_heap_t *heap, hak_slab_t *slab) {
  pthread_mutex_lock(&heap->lock);
  slab_mark_full(heap, slab);
  pthread_mutex_unlock(&heap->lock);
}

/* A heap whose thread has not refilled since the purger's last pass may
 * not allocate again for long (a main thread waiting for its workers),
 * while other threads free what it allocated: FULL slabs whose every
 * block came back on the remote list go back to their segment. Under the
 * heap's lock; the owner's FULL slabs change only under it. A list is
 * counted again only if it grew, and a pass counts about *budget blocks
 * in all (the lists of a big idle heap would otherwise be walked every
 * pass). True if the heap should be looked at again. */
bool hak_slab_release_idle_full(hak_heap_t *heap, size_t *budget) {
  uint32_t refills = __atomic_load_n(&heap->refills, __ATOMIC_RELAXED);
  bool idle = refills == heap->refills_at_purge;
  heap->refills_at_purge = refills;
  if (!atomic_load_explicit(&heap->full_remote, memory_order_relaxed)) return false;
  if (!idle) return true;
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++) {
    for (hak_slab_t *s = heap->full[c].first, *next; s; s = next) {
      next = s->next;
      hak_block_t *head = atomic_load_explicit(&s->remote, memory_order_acquire);
      if (head == NULL || head == s->remote_seen) continue;
      if (*budget == 0) return true;
      s->remote_seen = head;
      /* Blocks only join the list at its head, and none can after the
       * last one of the slab: counting it needs no exchange first. */
      uint32_t n = (uint32_t)list_length(head, (size_t)s->used + 1);
      *budget -= n < *budget ? n : *budget;
      if (n != s->used) continue;
      hak_slab_collect_remote(s);
      hak_queue_remove(&heap->full[c], s);
      hak_segment_free_slab(heap, s, false);
    }
  }
  return false;
}

/* FULL slabs with remote frees go back to their queues, in front: their
 * blocks come before any the current slab would carve. */
void hak_heap_revive_full_locked(hak_heap_t *heap) {
  atomic_store(&heap->full_remote, 0);
  for (size_t c = 0; c < HAK_SLAB_CLASSES; c++) {
    hak_slab_t *s = heap->full[c].first;
    while (s) {
      hak_slab_t *next = s->next;
      if (atomic_load_explicit(&s->remote, memory_order_relaxed) != NULL) {
        hak_slab_collect_remote(s);
        slab_unfull(heap, s, true);
      }
      s = next;
    }
  }
}

static void heap_revive_full(hak_heap_t *heap) {
  if (!atomic_load_explicit(&heap->full_remote, memory_order_relaxed)) return;
  pthread_mutex_lock(&heap->lock);
  hak_heap_revive_full_locked(heap);
  pthread_mutex_unlock(&heap->lock);
}

/* The list head is cleared before the call: with the store after it,
 * gcc 12.2 at -O1 (the debug build) deleted every call to this function. */
hak_slab_t *hak_heap_return_list(hak_heap_t *heap, size_t cls) {
  hak_slab_t *cur = heap->queue[cls].first;
  hak_block_t *list = heap->free[cls];
  unsigned n = heap->attached_n[cls];
  if (list != NULL) heap->free[cls] = NULL;
  if (n == 0) { /* the list holds blocks of attached slabs only */
    HAK_ASSERT(list == NULL);
    return cur;
  }
  hak_slab_t **a = heap->attached[cls];
  for (unsigned i = 0; i < n; i++) /* count again */
    a[i]->used = slab_count_out(a[i]);
  if (n == 1 && list != NULL) { /* one slab's blocks: spliced whole */
    hak_block_t *tail = list;
    uint32_t len = 1;
    for (hak_block_t *b;; tail = b, len++) {
      HAK_ASSERT(hak_slab_of(hak_segment_of(tail), tail) == a[0]);
      if ((b = hak_next(tail)) == NULL) break;
    }
    HAK_ASSERT(a[0]->used >= len);
    hak_set_next(tail, a[0]->local_free);
    a[0]->local_free = list;
    a[0]->used -= len;
    list = NULL;
  }
  while (list != NULL) {
    hak_block_t *b = list;
    list = hak_next(b);
    hak_slab_t *slab = hak_slab_of(hak_segment_of(b), b);
    hak_set_next(b, slab->local_free);
    slab->local_free = b;
    HAK_ASSERT(slab->used > 0 && slab_attached(slab));
    slab->used--;
  }
  for (unsigned i = 0; i < n; i++) slab_set_free_to(a[i], &a[i]->local_free);
  heap->attached_n[cls] = 0;
  return cur;
}

/* Class cls's current slab gets the heap's list back and retires: it is
 * released now if that empties it, else when its last block is freed,
 * unless the heap takes blocks from it again first. */
static void class_retire(hak_heap_t *heap, size_t cls) {
  hak_slab_t *was[HAK_ATTACH_MAX];
  unsigned n = heap->attached_n[cls];
  memcpy(was, heap->attached[cls], n * sizeof *was);
  hak_slab_t *cur = hak_heap_return_list(heap, cls);
  for (unsigned i = 0; i < n; i++) /* the others that the list's return emptied */
    if (was[i] != cur && was[i]->used == 0) {
      hak_queue_remove(&heap->queue[cls], was[i]);
      hak_segment_free_slab(heap, was[i], true);
    }
  if (cur == NULL) return;
  if (cur->used == 0) {
    hak_queue_remove(&heap->queue[cls], cur);
    hak_segment_free_slab(heap, cur, true);
  } else {
    cur->retiring = 1;
  }
}

/* Units of a new slab of cls. A class that has filled a slab of the heap
 * is busy: its next slabs hold at least HAK_BUSY_BLOCKS blocks and are
 * twice as long as the slab it filled last, so that more of its frees go
 * to the attached slab, whose blocks malloc takes next while they are in
 * cache, and a refill takes a longer list from another. In one unit, a
 * 6 KiB class has 10 blocks: with a few hundred live, nearly every free
 * went to a slab other than the attached one, and one malloc in five took
 * a refill; 2,000 live blocks of 272 B filled slab after slab of 2 units.
 * A class with few blocks keeps one unit. A class that has only grown (no
 * block has come back to a slab since it last had none) doubles only up
 * to HAK_GROWING_MAX_UNITS: blocks that all move on to the next class in
 * the order they came (a thousand buffers grown together by realloc) then
 * leave slab after slab empty for the next class to take, where slabs of
 * 14 units stayed until their last buffer left (peak 5.7 -> 4.7 MiB). */
#define HAK_GROWING_MAX_UNITS 8
static unsigned slab_units(hak_heap_t *heap, size_t cls) {
  const hak_slab_t *filled = heap->full[cls].last;
  if (heap->queue[cls].first == NULL && filled == NULL) /* no slab: it starts over */
    heap->slab_came_back &= ~(UINT64_C(1) << cls);
  if (filled == NULL) return 1;
  size_t bs = hak_class_size[cls];
  size_t units = (HAK_BUSY_BLOCKS * bs + HAK_UNIT_SIZE - 1) >> HAK_UNIT_SHIFT;
  size_t grown = 2 * (size_t)filled->units;
  if (!(heap->slab_came_back >> cls & 1) && grown > HAK_GROWING_MAX_UNITS)
    grown = HAK_GROWING_MAX_UNITS;
  if (units < grown) units = grown;
  size_t most = HAK_SLAB_MAX_BLOCKS * bs >> HAK_UNIT_SHIFT;
  if (most > HAK_BUSY_MAX_UNITS) most = HAK_BUSY_MAX_UNITS;
  return (unsigned)(units < most ? units : most);
}

/* Slabs of a class a refill looks at for freed blocks before carving. A
 * random loop over 4,096 slots of 4-4.5 KiB blocks keeps them in 10 slabs
 * of up to 1 MiB: looking at the first 4 for a carve's worth, it carved a
 * fifth more blocks than it ever had live (11.8 MiB against mimalloc's
 * 10.2), while the slabs further back held the most. */
#define HAK_REFILL_SCAN 16

/* When the class's current slab has no freed block, the one of the next
 * few with the most freed blocks, if a carve's worth: its blocks come
 * before carving; else NULL. Carving touches memory, and a thread that
 * took over an exited one's slabs (larson), or whose blocks other threads
 * free (xmalloc), would otherwise keep both sets. A slab with fewer would
 * hand the heap a short list and take an attached place, each refill
 * another (7 KiB blocks over 4,096 slots: ten times the refills taking the
 * first with any, 0.84x). The owner's frees are counted without a walk
 * (reserved - used); other threads' only as far as they could win. */
static hak_slab_t *freed_elsewhere(const hak_slab_queue_t *q, size_t cls) {
  hak_slab_t *cur = q->first, *best = NULL;
  if (cur == NULL || slab_has_freed(cur)) return NULL;
  uint32_t most = (uint32_t)carve_batch(hak_class_size[cls]) - 1;
  unsigned n = 1;
  for (hak_slab_t *s = cur->next; s != NULL && n < HAK_REFILL_SCAN; s = s->next, n++) {
    uint32_t freed = slab_attached(s) ? 0 : s->reserved - s->used; /* on local_free */
    if (freed <= most) /* the remote list only grows at its head; only the owner takes it */
      freed += (uint32_t)list_length(atomic_load_explicit(&s->remote, memory_order_acquire),
                                     most + 1 - freed);
    if (freed > most) {
      most = freed;
      best = s;
    }
  }
  return best;
}

/* Whether every block of class cls's slabs is on the heap's list: no
 * slab of the class is full or detached, and the list is as long as the
 * blocks its attached slabs have out. */
static bool class_all_free(hak_heap_t *heap, size_t cls) {
  if (heap->attached_n[cls] == 0 || heap->full[cls].first != NULL) return false;
  size_t out = 0, listed = 0;
  for (hak_slab_t *s = heap->queue[cls].first; s != NULL; s = s->next) {
    if (!slab_attached(s)) return false;
    out += slab_count_out(s);
  }
  for (hak_block_t *b = heap->free[cls]; b != NULL && listed <= out; b = hak_next(b)) listed++;
  return listed == out;
}

/* Every block of class cls is on the heap's list (class_all_free): its
 * slabs go back as they are, without the walk that would return each
 * block to its slab first. */
static void class_release(hak_heap_t *heap, size_t cls) {
  hak_slab_queue_t *q = &heap->queue[cls];
  heap->free[cls] = NULL;
  heap->attached_n[cls] = 0;
  for (hak_slab_t *s; (s = q->first) != NULL;) {
    hak_queue_remove(q, s);
    slab_detach(s, 0);
    hak_segment_free_slab(heap, s, true);
  }
}

/* Before a new slab takes memory, the classes that have not refilled
 * since the last two new slabs, and whose blocks are all free, give their
 * slabs back, so that other classes reuse the pages: a program whose
 * buffers grow through the classes (strings built by realloc) otherwise
 * kept every class's most blocks, as a slab of the class it left. A class
 * is looked at once while it stays idle (its list may be long). */
static void classes_reclaim_idle(hak_heap_t *heap, size_t cls) {
  uint64_t active = heap->slab_refilled | heap->slab_refilled_before;
  heap->slab_checked &= ~active;
  uint64_t classes = (UINT64_C(1) << HAK_SLAB_CLASSES) - 1;
  uint64_t look = classes & ~active & ~heap->slab_checked & ~(UINT64_C(1) << cls);
  heap->slab_refilled_before = heap->slab_refilled;
  heap->slab_refilled = 0;
  for (; look; look &= look - 1) {
    size_t c = (size_t)__builtin_ctzll(look);
    if (heap->free[c] == NULL) {
      /* A class with no slab gets one only by a refill, which makes it
       * active: it is not looked at again until then. */
      if (heap->queue[c].first == NULL) heap->slab_checked |= UINT64_C(1) << c;
      continue;
    }
    heap->slab_checked |= UINT64_C(1) << c;
    if (class_all_free(heap, c)) class_release(heap, c);
  }
}

/* The queues are the owner's alone: only taking a slab from the segments
 * (state the purger and fork also see) needs the heap lock. */
static HAK_NOINLINE bool heap_refill(hak_heap_t *heap, size_t cls) {
  HAK_ASSERT(heap->free[cls] == NULL);
  HAK_STAT_ADD(refills, 1);
  heap->slab_refilled |= UINT64_C(1) << cls;
  __atomic_store_n(&heap->refills, heap->refills + 1, __ATOMIC_RELAXED);
  /* Blocks other threads freed come before new ones: a producer whose
   * consumers free its blocks (xmalloc) carved a fresh page for most
   * refills while its FULL slabs held the blocks that came back. */
  heap_revive_full(heap);
  hak_slab_queue_t *q = &heap->queue[cls];
  hak_slab_t *freed = freed_elsewhere(q, cls);
  if (freed) queue_move_front(q, freed); /* the current slab stays attached */
  bool released = false;
  for (int round = 0;; round++) {
    hak_slab_t *slab = q->first;
    /* A slab with nothing to give goes FULL, off the queue, where a free
     * of the owner's takes the slow path to bring it back. The first one
     * (the current slab, run dry) goes to the back instead if others
     * follow: its blocks come back soon, and while it waits its frees take
     * the fast path (mid_large_mt 2t: 77,000 slow frees in 2M before). It
     * goes FULL when the walk reaches it again with nothing. */
    bool requeued = false;
    while (slab) {
      hak_block_t *list = slab_take(heap, slab);
      if (list) {
        queue_move_front(q, slab);
        heap->free[cls] = list;
        return true;
      }
      hak_slab_t *next = slab->next;
      hak_queue_remove(q, slab);
      if (!requeued && next != NULL) {
        requeued = true;
        slab_unattach(heap, slab);
        hak_queue_push_back(q, slab);
      } else {
        slab_mark_full_locked(heap, slab);
      }
      slab = next;
    }
    if (round == 0) {
      heap_revive_full(heap);
      if (q->first) continue;
    }
    bool adopted, new_pages;
    pthread_mutex_lock(&heap->lock);
    classes_reclaim_idle(heap, cls);
    slab = hak_segment_alloc_slab(heap, slab_units(heap, cls), hak_class_size[cls], &adopted,
                                  &new_pages);
    heap->releases_in_row = 0;
    if (slab) hak_slab_init(slab, cls); /* the purge may look at a dirty tail */
    pthread_mutex_unlock(&heap->lock);
    if (new_pages) { /* its pages for those this slab takes */
      hak_heaps_trim_empty();
      if (slab) hak_span_slab_grows(heap);
    }
    if (slab == NULL) {
      if (adopted) continue;
      /* Out of memory: once, give back what waits for a purge, in a cache
       * or for the purger's unmap, and look again. */
      if (!released) {
        released = true;
        hak_release_all();
        continue;
      }
      return false;
    }
    hak_queue_push_front(q, slab);
    slab_activate(heap, slab);
  }
}

static HAK_NOINLINE void *heap_refill_pop(size_t size, hak_heap_t *heap, size_t cls) {
  if (HAK_UNLIKELY(heap == HAK_HEAP_EMPTY)) heap = hak_heap_get();
  HAK_SLOW_BEGIN();
  bool ok = heap != NULL && heap_refill(heap, cls);
  HAK_SLOW_END();
  /* The block is taken before the purger starts: creating its thread
   * allocates, and that could take the class's new list or retire it. */
  void *b = ok ? hak_heap_pop(heap, cls) : NULL;
  return hak_refill_done(b, cls, size);
}

/* Most refills find blocks the owner freed to the class's current slab:
 * those take no lock, and read no clock unless something waits for a
 * pass in a program without the purger thread (hak_purge_start). A new
 * thread's sentinel heap (its queues are empty) and everything else go
 * the long way. */
void *hak_heap_refill(size_t size, hak_heap_t *heap, size_t cls) {
  hak_slab_t *slab = heap->queue[cls].first;
  if (HAK_UNLIKELY(slab == NULL || slab->local_free == NULL))
    return heap_refill_pop(size, heap, cls);
  HAK_STAT_ADD(refills, 1);
  heap->slab_refilled |= UINT64_C(1) << cls;
  hak_block_t *list = take_local(heap, slab);
  slab_all_out(heap, slab);
  heap->free[cls] = list;
  return hak_refill_done(hak_heap_pop(heap, cls), cls, size);
}

/* Slabs released in a row, with none taken, after which every class
 * retires its current slab: the thread is freeing, not allocating. */
#define HAK_SHRINK_RELEASES 8

/* A current slab stays when it empties (a malloc/free ping-pong would
 * otherwise take and release it over and over), unless it is retiring.
 * Any other slab goes; its class is shrinking, so the class retires its
 * current slab too, and after a few releases with no slab taken, every
 * class does. A thread that stops allocating and frees its blocks thus
 * releases its slabs, and the purger returns the memory even though the
 * thread makes no further call. */
void hak_slab_emptied(hak_heap_t *heap, hak_slab_t *slab) {
  /* A thread with no heap freed a slab's last block as its owner: the slab
   * is of a heap that a dead thread, whose pointer this one reuses, made
   * after its exit handler ran (a malloc in the last round of destructors).
   * The heap this thread takes now retires that one (heap_install). */
  if (HAK_UNLIKELY(heap == HAK_HEAP_EMPTY)) {
    hak_heap_get();
    return;
  }
  if (slab_attached(slab)) { /* used is not a count */
    slab->used = HAK_USED_ATTACHED;
    return;
  }
  size_t cls = slab->cls;
  hak_slab_queue_t *q = &heap->queue[cls];
  bool current = slab == q->first;
  if (current && !slab->retiring) return;
  pthread_mutex_lock(&heap->lock);
  hak_queue_remove(q, slab);
  hak_segment_free_slab(heap, slab, true);
  if (!current) {
    if (++heap->releases_in_row < HAK_SHRINK_RELEASES) {
      class_retire(heap, cls);
    } else {
      heap->releases_in_row = 0;
      for (size_t c = 0; c < HAK_SLAB_CLASSES; c++) class_retire(heap, c);
    }
  }
  pthread_mutex_unlock(&heap->lock);
  hak_purge_start();
}
