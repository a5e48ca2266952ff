/* Every HAKMEM_* environment variable, in one table: the snapshot struct,
 * the parser, `HAKMEM_VERBOSE` output and docs/OPTIONS.md come from it.
 * X(field, NAME, default, min, max, doc) — all values are integers; a
 * profile sets defaults before explicit variables are applied. */
#ifndef HAK_OPTIONS_H
#define HAK_OPTIONS_H

#include <stdbool.h>

#define HAK_OPTIONS(X)                                                         \
  X(stats, "STATS", 0, 0, 1,                                                   \
    "Print a statistics report to stderr at exit (1) or not (0).")             \
  X(verbose, "VERBOSE", 0, 0, 1,                                               \
    "Print the version, build flags and every option's value at start-up.")    \
  X(purge_delay_ms, "PURGE_DELAY_MS", 100, 0, 3600000,                         \
    "Milliseconds a free slab, free span pages, a segment or a cached large "  \
    "block stay committed before their memory is returned to the OS (0: at "  \
    "once).")                                                                  \
  X(purge_thread, "PURGE_THREAD", 1, 0, 1,                                     \
    "Return memory on time from a background thread even when the program "   \
    "stops calling malloc (1); 0 purges only during allocation. A program "    \
    "of one thread gets the thread once it has mapped 32 MiB; without it, "    \
    "freed large blocks stay committed only as far as the program reused "     \
    "them within the delay.")                                                  \
  X(segment_cache, "SEGMENT_CACHE", 8, 0, 1024,                                \
    "Free 4 MiB segments kept mapped for reuse; only the last one cached "     \
    "stays committed until the purge delay, the others are purged at once.")   \
  X(large_cache_mb, "LARGE_CACHE_MB", 256, 0, 65536,                           \
    "Megabytes of freed large blocks' memory (> 1 MiB) kept committed for "    \
    "reuse (or the live large bytes, if more); beyond it, the longest idle "   \
    "is purged at once.")

/* Profiles set these defaults; an explicitly set variable wins. */
#define HAK_PROFILES(X)                                                        \
  X("balanced", 100, 8, 256, "The default: short purge delay, moderate caches.") \
  X("throughput", 5000, 32, 512, "Long purge delay and large caches: fewest syscalls.") \
  X("lowmem", 0, 0, 0, "Return memory at once; no caches.")

/* Options whose value is text: X(field, NAME, default, doc). */
#define HAK_STR_OPTIONS(X)                                                     \
  X(profile, "PROFILE", "balanced",                                           \
    "Preset for the purge delay and cache sizes: balanced, throughput or "    \
    "lowmem (see the profiles table); explicitly set variables win.")         \
  X(stats_file, "STATS_FILE", "",                                             \
    "With HAKMEM_STATS=1, write the statistics at exit to this file "         \
    "instead of stderr, as `key value` lines; %p in the name is the pid. A "  \
    "path longer than 4095 bytes is refused with a message.")

typedef struct {
#define HAK_OPT_FIELD(field, name, def, lo, hi, doc) long field;
  HAK_OPTIONS(HAK_OPT_FIELD)
#undef HAK_OPT_FIELD
#define HAK_STR_FIELD(field, name, def, doc) const char *field;
  HAK_STR_OPTIONS(HAK_STR_FIELD)
#undef HAK_STR_FIELD
} hak_options_t;

extern hak_options_t hak_opt;
/* Reads the environment once; warns about unknown HAKMEM_* and bad values. */
void hak_options_load(void);
/* Prints the options (HAKMEM_VERBOSE) to fd. */
void hak_options_print(int fd);

#endif
