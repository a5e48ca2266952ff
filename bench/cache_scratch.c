/* cache_scratch — Hoard's passive-false-sharing test.
 *
 * usage: cache_scratch [threads [iterations [objsize [repetitions]]]]
 *   threads      worker threads (default 2)
 *   iterations   malloc/write/free cycles per thread (default 1000)
 *   objsize      object size in bytes (default 8)
 *   repetitions  times each byte is written per cycle (default 20000)
 *
 * The main thread allocates one small object per thread (adjacent objects,
 * likely on one cache line) and hands one to each thread, which frees it.
 * Each thread then repeatedly mallocs an object, writes it many times and
 * frees it.  An allocator that recycles a freed remote object for the next
 * local malloc makes threads write into the same cache line (passive false
 * sharing) and runs much slower.  ops = threads * iterations * 2 (+ threads),
 * but the time is dominated by the writes: what matters is the ratio.
 */
#include "false_sharing.h"

static const char usage[] =
    "usage: cache_scratch [threads [iterations [objsize [repetitions]]]]\n"
    "  defaults: 2 threads, 1000 iterations, 8 B objects, 20000 repetitions\n";

int main(int argc, char **argv) {
  return false_sharing_main(argc, argv, "cache_scratch", usage, true);
}
