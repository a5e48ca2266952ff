/* cache_thrash — Hoard's active-false-sharing test.
 *
 * usage: cache_thrash [threads [iterations [objsize [repetitions]]]]
 *   threads      worker threads (default 2)
 *   iterations   malloc/write/free cycles per thread (default 1000)
 *   objsize      object size in bytes (default 8)
 *   repetitions  times each byte is written per cycle (default 20000)
 *
 * Each thread repeatedly mallocs a small object, writes it many times and
 * frees it.  An allocator that hands concurrently running threads objects on
 * the same cache line (e.g. one shared heap carving adjacent blocks) makes
 * the writes ping-pong the line between cores.  ops = threads*iterations*2;
 * the time is dominated by the writes: what matters is the ratio.
 */
#include "false_sharing.h"

static const char usage[] =
    "usage: cache_thrash [threads [iterations [objsize [repetitions]]]]\n"
    "  defaults: 2 threads, 1000 iterations, 8 B objects, 20000 repetitions\n";

int main(int argc, char **argv) {
  return false_sharing_main(argc, argv, "cache_thrash", usage, false);
}
