/* Statistics. Release builds count only on slow paths (mappings, refills,
 * slabs, purges); stats and debug builds add exact per-class counters. */
#include "internal.h"

#include <stdarg.h>
#include <unistd.h>

hak_gstats_t hak_gstats;

void hak_stats_mapped(size_t n, bool on) {
  if (on) {
    size_t now = HAK_STAT_ADD(mapped, n) + n;
    HAK_STAT_ADD(os_mapped_total, n);
    HAK_STAT_ADD(committed, n);
    size_t peak = atomic_load_explicit(&hak_gstats.mapped_peak, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak(&hak_gstats.mapped_peak, &peak, now)) {
    }
  } else {
    HAK_STAT_SUB(mapped, n);
    HAK_STAT_SUB(committed, n);
    HAK_STAT_ADD(os_returned, n);
  }
}

#if HAK_STATS
/* Index HAK_CLASSES counts large blocks. */
typedef struct {
  _Atomic size_t allocs, frees, bytes, live, peak;
} class_stats_t;
static class_stats_t cstats[HAK_CLASSES + 1];

/* The counters of a class, malloc's number or HAK_STATS_LARGE. */
static class_stats_t *class_stats(size_t n) {
  return &cstats[n == HAK_STATS_LARGE ? HAK_CLASSES : hak_class_of_number(n)];
}

void hak_stats_class_alloc(size_t cls, size_t size) {
  class_stats_t *c = class_stats(cls);
  atomic_fetch_add_explicit(&c->allocs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->bytes, size, memory_order_relaxed);
  size_t live = atomic_fetch_add_explicit(&c->live, 1, memory_order_relaxed) + 1;
  size_t peak = atomic_load_explicit(&c->peak, memory_order_relaxed);
  while (live > peak && !atomic_compare_exchange_weak(&c->peak, &peak, live)) {
  }
}

void hak_stats_class_free(size_t cls) {
  class_stats_t *c = class_stats(cls);
  atomic_fetch_add_explicit(&c->frees, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&c->live, 1, memory_order_relaxed);
}

size_t hak_stats_live_blocks(void) {
  size_t live = 0;
  for (size_t i = 0; i <= HAK_CLASSES; i++)
    live += atomic_load_explicit(&cstats[i].live, memory_order_relaxed);
  return live;
}
#endif

/* The length of what vsnprintf left in buf: cut to size - 1. */
static size_t format(char *buf, size_t size, const char *fmt, va_list ap) {
  int n = vsnprintf(buf, size, fmt, ap);
  if (n < 0) return 0;
  return (size_t)n < size ? (size_t)n : size - 1;
}

void hak_print(int fd, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  size_t n = format(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) (void)!write(fd, buf, n);
}

#define LOAD(f) atomic_load_explicit(&hak_gstats.f, memory_order_relaxed)

void hak_stats_get(hak_stats_t *s) {
  memset(s, 0, sizeof *s);
  s->mapped = LOAD(mapped);
  s->mapped_peak = LOAD(mapped_peak);
  s->committed = LOAD(committed);
  s->os_mapped_total = LOAD(os_mapped_total);
  s->os_returned = LOAD(os_returned);
  s->segments = LOAD(segments);
  size_t large_bytes; /* not in the report */
  hak_large_usage(&s->large_live, &large_bytes, &s->large_cached);
  (void)large_bytes;
  s->refills = LOAD(refills);
  s->slabs_allocated = LOAD(slabs_allocated);
  s->purges = LOAD(purges);
  s->remote_collects = LOAD(remote_collects);
  s->rss = hak_os_rss();
  s->rss_peak = hak_os_rss_peak();
}

void hak_stats_report(int fd) {
  hak_stats_t s;
  hak_stats_get(&s);
  hak_print(fd, "hakmem statistics (%s)\n", hak_version());
#if HAK_STATS
  hak_print(fd, "  %-10s %12s %12s %14s %10s %10s\n", "class", "requests", "frees", "bytes", "live",
            "peak");
  for (size_t i = 0; i <= HAK_CLASSES; i++) {
    class_stats_t *c = &cstats[i];
    size_t a = atomic_load(&c->allocs);
    if (a == 0) continue;
    char name[24];
    if (i == HAK_CLASSES) snprintf(name, sizeof name, "large");
    else snprintf(name, sizeof name, "%u B", hak_class_size[i]);
    hak_print(fd, "  %-10s %12zu %12zu %14zu %10zu %10zu\n", name, a, atomic_load(&c->frees),
              atomic_load(&c->bytes), atomic_load(&c->live), atomic_load(&c->peak));
  }
#else
  hak_print(fd, "  (per-class counters: build with `make stats`)\n");
#endif
  hak_print(fd, "  OS mapped now       %12zu KiB (peak %zu KiB)\n", s.mapped >> 10,
            s.mapped_peak >> 10);
  hak_print(fd, "  OS mapped in total  %12zu KiB, returned %zu KiB in %zu purges/unmaps\n",
            s.os_mapped_total >> 10, s.os_returned >> 10, s.purges);
  hak_print(fd, "  segments live       %12zu\n", s.segments);
  hak_print(fd, "  large blocks live   %12zu, cached %zu KiB\n", s.large_live,
            s.large_cached >> 10);
  hak_print(fd, "  refills             %12zu, slabs allocated %zu, remote collects %zu\n",
            s.refills, s.slabs_allocated, s.remote_collects);
#if HAK_STATS
  hak_print(fd, "  remote frees        %12zu, time in slow paths %zu us\n", LOAD(remote_frees),
            LOAD(slow_path_ns) / 1000);
#endif
  hak_print(fd, "  RSS now             %12zu KiB (peak %zu KiB)\n", s.rss >> 10, s.rss_peak >> 10);
}

void hak_stats_print(void) { hak_stats_report(2); }

void hak_stats_write_records(int fd) {
  hak_stats_t s;
  hak_stats_get(&s);
  hak_print(fd, "hakmem-stats 1\nversion %s\npid %d\n", hak_version(), (int)getpid());
#if HAK_STATS
  for (size_t i = 0; i <= HAK_CLASSES; i++) {
    class_stats_t *c = &cstats[i];
    size_t a = atomic_load(&c->allocs);
    if (a == 0) continue;
    hak_print(fd, "class %u requests %zu frees %zu bytes %zu live %zu peak %zu\n",
              i == HAK_CLASSES ? 0u : hak_class_size[i], a, atomic_load(&c->frees),
              atomic_load(&c->bytes), atomic_load(&c->live), atomic_load(&c->peak));
  }
#endif
  hak_print(fd, "mapped %zu mapped_peak %zu committed %zu\n", s.mapped, s.mapped_peak, s.committed);
  hak_print(fd, "os_mapped_total %zu os_returned %zu purges %zu\n", s.os_mapped_total,
            s.os_returned, s.purges);
  hak_print(fd, "segments %zu large_live %zu large_cached %zu\n", s.segments, s.large_live,
            s.large_cached);
  hak_print(fd, "refills %zu slabs_allocated %zu remote_collects %zu remote_frees %zu\n", s.refills,
            s.slabs_allocated, s.remote_collects, LOAD(remote_frees));
  hak_print(fd, "slow_path_ns %zu\n", LOAD(slow_path_ns));
  hak_print(fd, "rss %zu rss_peak %zu\n", s.rss, s.rss_peak);
}

HAK_COLD void hak_fatal(const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  size_t n = format(buf, sizeof buf - 1, fmt, ap); /* room for the newline */
  va_end(ap);
  buf[n++] = '\n';
  /* write is a cancellation point: a thread with a cancel pending would unwind */
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
  (void)!write(2, buf, n);
  abort();
}
