/* cxx_containers — C++ standard containers churned at random.
 *
 * usage: cxx_containers mode [steps [keys [seed]]]
 *   mode   map     std::map<uint32_t, std::string>: a key present is erased,
 *                  else inserted with a string of 16-63 chars (a tree node
 *                  and a string buffer: two allocations, or two frees)
 *          set     std::set<uint32_t> (one node)
 *          umap    std::unordered_map<uint32_t, uint64_t> (one node; the
 *                  bucket array grows a few times, uncounted)
 *          shared  a slot array of std::shared_ptr<std::string>: an empty
 *                  slot gets std::make_shared with 16-63 chars (the control
 *                  block with the string, and its buffer), a full one is reset
 *   steps  default 3000000
 *   keys   distinct keys (slots for shared), default 100000: about half of
 *          them live at a time
 *   seed   default 1234567
 * Models programs whose data lives in node-based containers: each step walks
 * the container (the program's misses) and allocates or frees beside it, so
 * where a freed block's neighbours land decides what the next walk reads.
 * ops = allocator calls (new and delete each count one).
 */
#include "bench_common.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

static const char usage[] =
    "usage: cxx_containers map|set|umap|shared [steps [keys [seed]]]\n"
    "  defaults: 3000000 steps, 100000 keys, seed 1234567\n";

static uint32_t state;
static uint32_t next_random() { return xorshift32(&state); }

/* A string of 16-63 chars: past std::string's 15 inline ones, so it always
 * has a buffer of its own. */
static std::string payload(uint32_t r) { return std::string(16 + (r >> 8) % 48, 'x'); }

BENCH_NOINLINE static long bench_work_map(long steps, uint32_t keys) {
  std::map<uint32_t, std::string> m;
  long calls = 0;
  for (long i = 0; i < steps; i++) {
    uint32_t r = next_random(), k = r % keys;
    auto it = m.find(k);
    if (it == m.end()) m.emplace(k, payload(r));
    else m.erase(it);
    calls += 2;
  }
  return calls + 2 * (long)m.size();
}

BENCH_NOINLINE static long bench_work_set(long steps, uint32_t keys) {
  std::set<uint32_t> s;
  for (long i = 0; i < steps; i++) {
    uint32_t k = next_random() % keys;
    auto it = s.find(k);
    if (it == s.end()) s.insert(k);
    else s.erase(it);
  }
  return steps + (long)s.size();
}

BENCH_NOINLINE static long bench_work_umap(long steps, uint32_t keys) {
  std::unordered_map<uint32_t, uint64_t> m;
  for (long i = 0; i < steps; i++) {
    uint32_t k = next_random() % keys;
    auto it = m.find(k);
    if (it == m.end()) m.emplace(k, (uint64_t)i);
    else m.erase(it);
  }
  return steps + (long)m.size();
}

BENCH_NOINLINE static long bench_work_shared(long steps, uint32_t keys) {
  std::vector<std::shared_ptr<std::string>> slots(keys);
  long calls = 0;
  for (long i = 0; i < steps; i++) {
    uint32_t r = next_random(), k = r % keys;
    if (slots[k]) slots[k].reset();
    else slots[k] = std::make_shared<std::string>(payload(r));
    calls += 2;
  }
  for (auto &p : slots) calls += p ? 2 : 0;
  return calls;
}

int main(int argc, char **argv) {
  if (bench_want_help(argc, argv, usage)) return 0;
  const char *mode = argc > 1 ? argv[1] : "";
  long steps = bench_arg(argc, argv, 2, 3000000);
  long keys = bench_arg(argc, argv, 3, 100000);
  long seed = bench_arg(argc, argv, 4, 1234567);
  long (*work)(long, uint32_t) = !strcmp(mode, "map")      ? bench_work_map
                                 : !strcmp(mode, "set")    ? bench_work_set
                                 : !strcmp(mode, "umap")   ? bench_work_umap
                                 : !strcmp(mode, "shared") ? bench_work_shared
                                                           : nullptr;
  if (work == nullptr || steps < 1 || keys < 1 || keys > (1L << 30) || seed < 1 ||
      seed > (long)UINT32_MAX) {
    fputs(usage, stderr);
    return 2;
  }
  state = bench_seed((uint64_t)seed);
  double t0 = bench_now();
  long ops = work(steps, (uint32_t)keys);
  double t = bench_now() - t0;
  printf("cxx_containers mode=%s steps=%ld keys=%ld seed=%ld build=%s ops=%ld ops/s=%.0f "
         "time_s=%.3f\n",
         mode, steps, keys, seed, BENCH_ALLOC_KIND, ops, ops / t, t);
  return 0;
}
