/* Multi-thread stress of the hak_* API, for sanitizer builds (TSan, UBSan)
 * and the soak. Uses only the hak_* names, so it links against a
 * no-override archive and malloc stays the system's.
 *
 *   san_stress [-t threads] [-s seconds] [-n slots] [-m max_size]
 *
 * Threads pass blocks through a shared array of slots: each step takes a
 * random slot (atomic exchange), verifies the block found there (written by
 * whichever thread allocated it) and frees it or reallocs it, then puts a
 * freshly allocated and patterned block back. Sizes are log-uniform in
 * 8 B .. max_size (default 2 MiB: slab, span and large blocks). Each block
 * has a descriptor, itself a 32-byte hak_malloc block, so small blocks
 * cross threads too.
 * A bad pattern aborts with a message; at the end every slot is drained and
 * allocations must equal frees. Prints one summary line; exit 0 on success. */
#define _GNU_SOURCE
#include <hakmem.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  uint8_t *p;
  size_t size;
  uint64_t tag;
  size_t align;
} desc_t;

static _Atomic(desc_t *) *slots;
static size_t nslots = 1024;
static size_t max_size = 2 << 20;
static _Atomic int stop;
static _Atomic uint64_t n_alloc, n_free, n_ops, n_realloc, n_bytes;
static _Atomic uint64_t next_tag = 1;

static void die(const char *what, const desc_t *d, size_t off) {
  fprintf(stderr, "san_stress: %s: block %p size %zu tag %llu offset %zu\n", what,
          (void *)d->p, d->size, (unsigned long long)d->tag, off);
  abort();
}

static inline uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return (*s * 0x2545F4914F6CDD1Dull) >> 16; /* xorshift64*: low bits are good too */
}

static inline uint8_t fill_byte(uint64_t tag) { return (uint8_t)(tag * 0x9E3779B97F4A7C15ull >> 56) | 1; }

/* word 0 = tag (when it fits), everything else = fill_byte(tag) */
static void fill(desc_t *d) {
  uint8_t c = fill_byte(d->tag);
  memset(d->p, c, d->size);
  if (d->size >= 8) memcpy(d->p, &d->tag, 8);
}

static void verify(const desc_t *d, size_t upto) {
  if (upto > d->size) upto = d->size;
  uint8_t c = fill_byte(d->tag);
  size_t i = 0;
  if (d->size >= 8) {
    uint64_t t;
    memcpy(&t, d->p, 8);
    if (upto >= 8 && t != d->tag) die("header overwritten", d, 0);
    i = 8;
  }
  uint64_t w = 0x0101010101010101ull * c;
  for (; i + 8 <= upto; i += 8) {
    uint64_t v;
    memcpy(&v, d->p + i, 8);
    if (v != w) die("pattern overwritten", d, i);
  }
  for (; i < upto; i++)
    if (d->p[i] != c) die("pattern overwritten", d, i);
}

static size_t pick_size(uint64_t *s) {
  unsigned maxe = 63 - __builtin_clzl(max_size);
  unsigned e = 3 + (unsigned)(rnd(s) % (maxe - 2)); /* 3 .. maxe */
  size_t lo = (size_t)1 << e;
  size_t sz = lo + rnd(s) % lo;
  return sz > max_size ? max_size : sz;
}

static desc_t *make_block(uint64_t *s) {
  desc_t *d = hak_malloc(sizeof *d);
  if (!d) die("descriptor allocation failed", &(desc_t){0}, 0);
  d->size = pick_size(s);
  d->tag = atomic_fetch_add_explicit(&next_tag, 1, memory_order_relaxed);
  d->align = 0;
  unsigned how = (unsigned)(rnd(s) % 10);
  if (how < 7) {
    d->p = hak_malloc(d->size);
  } else if (how == 7) {
    d->p = hak_calloc(1, d->size);
    if (d->p)
      for (size_t i = 0; i < d->size; i++)
        if (d->p[i]) die("calloc memory not zero", d, i);
  } else {
    d->align = (size_t)1 << (4 + rnd(s) % 17); /* 16 B .. 1 MiB: slab, span and large blocks */
    if (how == 8) {
      d->p = hak_aligned_alloc(d->align, d->size);
    } else {
      void *q = NULL;
      if (hak_posix_memalign(&q, d->align, d->size) != 0) q = NULL;
      d->p = q;
    }
    if (d->p && ((uintptr_t)d->p & (d->align - 1))) die("misaligned block", d, 0);
  }
  if (!d->p) die("allocation failed", d, 0);
  if (((uintptr_t)d->p & 15) != 0) die("block not 16-byte aligned", d, 0);
  if (hak_usable_size(d->p) < d->size) die("usable size below request", d, 0);
  atomic_fetch_add_explicit(&n_alloc, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&n_bytes, d->size, memory_order_relaxed);
  fill(d);
  return d;
}

static void drop_block(desc_t *d, uint64_t *s) {
  verify(d, d->size);
  if (rnd(s) & 1)
    hak_free(d->p);
  else
    hak_free_sized(d->p, d->size);
  hak_free(d);
  atomic_fetch_add_explicit(&n_free, 1, memory_order_relaxed);
}

/* Realloc a block found in a slot (allocated by any thread): the common
 * prefix must survive, then the block is refilled. */
static desc_t *realloc_block(desc_t *d, uint64_t *s) {
  verify(d, d->size);
  size_t ns = pick_size(s);
  uint8_t *q = hak_realloc(d->p, ns);
  if (!q) die("realloc failed", d, 0);
  desc_t old = *d;
  old.p = q;
  verify(&old, ns); /* prefix still carries the old pattern */
  d->p = q;
  d->size = ns;
  d->tag = atomic_fetch_add_explicit(&next_tag, 1, memory_order_relaxed);
  d->align = 0;
  fill(d);
  atomic_fetch_add_explicit(&n_realloc, 1, memory_order_relaxed);
  return d;
}

static void *worker(void *arg) {
  uint64_t s = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
  uint64_t ops = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    for (int k = 0; k < 64; k++) {
      size_t i = rnd(&s) % nslots;
      desc_t *d = atomic_exchange(&slots[i], NULL);
      if (d) {
        if (rnd(&s) % 8 == 0) {
          d = realloc_block(d, &s);
          d = atomic_exchange(&slots[i], d);
          if (d) drop_block(d, &s);
          ops++;
          continue;
        }
        drop_block(d, &s);
      }
      if (rnd(&s) % 4 != 0) {
        desc_t *n = make_block(&s);
        desc_t *prev = atomic_exchange(&slots[i], n);
        if (prev) drop_block(prev, &s);
      }
      ops++;
    }
  }
  atomic_fetch_add(&n_ops, ops);
  return NULL;
}

int main(int argc, char **argv) {
  int nthreads = 8;
  double seconds = 3;
  int opt;
  while ((opt = getopt(argc, argv, "t:s:n:m:")) != -1) {
    switch (opt) {
    case 't': nthreads = atoi(optarg); break;
    case 's': seconds = atof(optarg); break;
    case 'n': nslots = strtoul(optarg, NULL, 0); break;
    case 'm': max_size = strtoul(optarg, NULL, 0); break;
    default:
      fprintf(stderr, "usage: %s [-t threads] [-s seconds] [-n slots] [-m max_size]\n", argv[0]);
      return 2;
    }
  }
  if (nthreads < 1 || nthreads > 256 || nslots < 1 || max_size < 16) return 2;
  slots = calloc(nslots, sizeof *slots);
  pthread_t th[256];
  for (int i = 0; i < nthreads; i++)
    if (pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i) != 0) {
      perror("pthread_create");
      return 1;
    }
  struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
  atomic_store(&stop, 1);
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  uint64_t s = 42;
  for (size_t i = 0; i < nslots; i++) {
    desc_t *d = atomic_exchange(&slots[i], NULL);
    if (d) drop_block(d, &s);
  }
  hak_collect(true);
  hak_stats_t st;
  hak_stats_get(&st);
  uint64_t a = atomic_load(&n_alloc), f = atomic_load(&n_free);
  printf("san_stress: %d threads, %.1f s, %llu ops, %llu allocs, %llu frees, %llu reallocs, "
         "%.1f MiB allocated, rss peak %.1f MiB\n",
         nthreads, seconds, (unsigned long long)atomic_load(&n_ops), (unsigned long long)a,
         (unsigned long long)f, (unsigned long long)atomic_load(&n_realloc),
         atomic_load(&n_bytes) / 1048576.0, st.rss_peak / 1048576.0);
  if (a != f) {
    fprintf(stderr, "san_stress: %llu blocks allocated but %llu freed\n", (unsigned long long)a,
            (unsigned long long)f);
    return 1;
  }
  free(slots);
  return 0;
}
