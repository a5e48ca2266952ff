/* glibc-compatible introspection: mallinfo2, mallinfo, malloc_stats,
 * malloc_info, malloc_trim, mallopt — with hakmem's real figures. */
#include "internal.h"

#include <malloc.h>

#ifndef HAK_NO_OVERRIDE /* glibc's names: the program's own malloc answers them */

#define EXPORT HAK_EXPORT

EXPORT struct mallinfo2 mallinfo2(void) {
  hak_usage_t u;
  hak_heaps_usage(&u);
  struct mallinfo2 mi;
  memset(&mi, 0, sizeof mi);
  size_t mapped = atomic_load(&hak_gstats.mapped), large_cached;
  hak_large_usage(&mi.hblks, &mi.hblkhd, &large_cached);
  mi.arena = mapped > mi.hblkhd ? mapped - mi.hblkhd : 0; /* non-large mapped bytes */
  mi.uordblks = u.used_bytes;
  mi.fordblks = u.free_bytes + u.cached_bytes + large_cached;
  for (size_t c = 0; c < HAK_CLASSES; c++) mi.ordblks += u.blocks_free[c];
  mi.keepcost = u.cached_bytes;
  return mi;
}

static int clamp_int(size_t v) { return v > INT_MAX ? INT_MAX : (int)v; }

EXPORT struct mallinfo mallinfo(void) {
  struct mallinfo2 m2 = mallinfo2();
  struct mallinfo mi;
  mi.arena = clamp_int(m2.arena);
  mi.ordblks = clamp_int(m2.ordblks);
  mi.smblks = clamp_int(m2.smblks);
  mi.hblks = clamp_int(m2.hblks);
  mi.hblkhd = clamp_int(m2.hblkhd);
  mi.usmblks = clamp_int(m2.usmblks);
  mi.fsmblks = clamp_int(m2.fsmblks);
  mi.uordblks = clamp_int(m2.uordblks);
  mi.fordblks = clamp_int(m2.fordblks);
  mi.keepcost = clamp_int(m2.keepcost);
  return mi;
}

/* glibc's layout first (tools parse it), then hakmem's own report. */
EXPORT void malloc_stats(void) {
  struct mallinfo2 mi = mallinfo2();
  hak_print(2,
            "Arena 0:\nsystem bytes     = %10zu\nin use bytes     = %10zu\n"
            "Total (incl. mmap):\nsystem bytes     = %10zu\nin use bytes     = %10zu\n"
            "max mmap regions = %10zu\nmax mmap bytes   = %10zu\n",
            mi.arena, mi.uordblks, mi.arena + mi.hblkhd, mi.uordblks + mi.hblkhd, mi.hblks,
            mi.hblkhd);
  hak_stats_report(2);
}

/* The mmap, system and aspace lines, which glibc gives per heap and in all. */
static void info_system(FILE *fp, size_t large_live, size_t large_bytes) {
  size_t mapped = atomic_load(&hak_gstats.mapped);
  fprintf(fp, "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n", large_live, large_bytes);
  fprintf(fp, "<system type=\"current\" size=\"%zu\"/>\n", mapped);
  fprintf(fp, "<system type=\"max\" size=\"%zu\"/>\n", atomic_load(&hak_gstats.mapped_peak));
  fprintf(fp, "<aspace type=\"total\" size=\"%zu\"/>\n", mapped);
  fprintf(fp, "<aspace type=\"mprotect\" size=\"%zu\"/>\n", mapped);
}

EXPORT int malloc_info(int options, FILE *fp) {
  if (options != 0) {
    errno = EINVAL;
    return -1;
  }
  hak_usage_t u;
  hak_heaps_usage(&u);
  size_t free_blocks = 0, free_bytes = 0;
  fprintf(fp, "<malloc version=\"hakmem-1\">\n<heap nr=\"0\">\n<sizes>\n");
  for (size_t c = 0; c < HAK_CLASSES; c++) {
    if (u.blocks_used[c] + u.blocks_free[c] == 0) continue;
    size_t lo = c ? hak_class_size[c - 1] + 1 : 0, hi = hak_class_size[c];
    fprintf(fp, "  <size from=\"%zu\" to=\"%zu\" total=\"%zu\" count=\"%zu\" used=\"%zu\"/>\n",
            lo, hi, u.blocks_free[c] * hi, u.blocks_free[c], u.blocks_used[c]);
    free_blocks += u.blocks_free[c];
    free_bytes += u.blocks_free[c] * hi;
  }
  fprintf(fp, "</sizes>\n<total type=\"slab\" count=\"%zu\" size=\"%zu\"/>\n", free_blocks,
          free_bytes);
  size_t large_live, large_bytes, large_cached;
  hak_large_usage(&large_live, &large_bytes, &large_cached);
  fprintf(fp, "<total type=\"cached\" size=\"%zu\"/>\n", u.cached_bytes + large_cached);
  info_system(fp, large_live, large_bytes);
  fprintf(fp, "</heap>\n<total type=\"fast\" count=\"0\" size=\"0\"/>\n");
  fprintf(fp, "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n", free_blocks, free_bytes);
  info_system(fp, large_live, large_bytes);
  fprintf(fp, "</malloc>\n");
  return 0;
}

/* Returns 1 if memory went back to the OS, like glibc. */
EXPORT int malloc_trim(size_t pad) { return hak_release_all() ? 1 : 0; }

/* The common parameters are accepted (hakmem sizes itself); others get 0. */
EXPORT int mallopt(int param, int value) {
  switch (param) {
  case M_TRIM_THRESHOLD:
  case M_TOP_PAD:
  case M_MMAP_THRESHOLD:
  case M_MMAP_MAX:
  case M_ARENA_TEST:
  case M_ARENA_MAX:
  case M_PERTURB:
  case M_MXFAST:
    return 1;
  default:
    return 0;
  }
}

/* By name only: copying mallinfo's attributes would copy its deprecation. */
EXPORT struct mallinfo __libc_mallinfo(void) __attribute__((alias("mallinfo")));
int __libc_mallopt(int param, int value) SAME_AS(mallopt);

#endif /* HAK_NO_OVERRIDE */
