/* The segment map (internal.h). The Makefile links this file after all
 * others but large.c: the map's bytes in use then follow the library's
 * small data and the span pool's table, and the large arena's tables
 * (1 MiB, written only by programs with large blocks) come after it, so a
 * program's writes to the library's data stay within 2 MiB. */
#include "internal.h"

_Atomic uint8_t hak_segmap[HAK_SEGMAP_SIZE];

void hak_segmap_set(hak_segment_t *seg, uint8_t value) {
  uintptr_t chunk = (uintptr_t)seg >> HAK_SEG_SHIFT;
  atomic_store_explicit(&hak_segmap[hak_segmap_slot_of_chunk(chunk)], value, memory_order_release);
}
