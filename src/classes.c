/* Size classes: block sizes and the small-size lookup table. */
#include "internal.h"

/* The span classes' sizes, page multiples: the classes past the slab
 * classes, and again malloc's numbers past the classes (hak_span_at_page). */
#define SPAN_SIZES                                                                       \
  8192, 12288, 16384, 20480, 24576, 28672, 32768, 40960, 49152, 57344, 65536, 81920, 98304, \
      114688, 131072, 163840, 196608, 229376, 262144, 327680, 393216, 458752, 524288,       \
      655360, 786432, 917504, 1048576
_Static_assert(sizeof((uint32_t[]){SPAN_SIZES}) / sizeof(uint32_t) == HAK_SPAN_CLASSES,
               "SPAN_SIZES lists every span class");

const uint32_t hak_class_size[HAK_NUMBERS] = {
  16, 32, 48, 64, 80, 96, 112, 128,
  144, 160, 176, 192, 208, 224, 240, 256,
  288, 320, 352, 384, 416, 448, 480, 512,
  576, 640, 704, 768, 832, 896, 960, 1024,
  1152, 1280, 1408, 1536, 1664, 1792, 1920, 2048,
  2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096,
  4608, 5120, 5632, 6144, 6656, 7168,
  SPAN_SIZES,
  SPAN_SIZES,
};

/* Class of a size <= 1 MiB, indexed by (size + 15) / 16: the malloc fast
 * path serves every size over HAK_TABLE_MAX with one lookup (64 KiB, of
 * which a program touches the lines of the sizes it uses; each heap has its
 * own table of the smaller ones, hak_heap_t.small_class). */
const uint8_t hak_fast_class[HAK_FAST_MAX / 16 + 1] = {
#include "class_table.inc"
};

