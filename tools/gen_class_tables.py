#!/usr/bin/env python3
"""Writes malloc's class lookup tables from hak_class_size (src/classes.c).

usage: tools/gen_class_tables.py fast|small   (prints the .inc to stdout)

  fast  src/class_table.inc: entry i is the class of 16*i bytes,
        i = 0 .. HAK_FAST_MAX / 16 (hak_fast_class, sizes over HAK_TABLE_MAX),
        or HAK_SPAN_CLASSES more for a span class's sizes that do not fit
        after its largest colour
  small src/small_class_table.inc: entry s is the class of s bytes,
        s = 0 .. HAK_TABLE_MAX (every heap's small_class, which malloc
        reads first)

The class of a size is the smallest class whose block holds it (size 0 as
1). `make class-tables` rewrites both files, `make check-class-tables` (run
by `make test`) fails when either is stale, and
unit_core.class_is_smallest_fitting checks every size against them.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def constant(src, name):
    m = re.search(r"#define %s \(\(size_t\)(\d+)\)" % name, src)
    if not m:
        sys.exit("gen_class_tables: %s not found in src/types.h" % name)
    return int(m.group(1))


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("fast", "small"):
        sys.exit(__doc__.strip().splitlines()[2])
    classes_c = read("src/classes.c")
    m = re.search(r"hak_class_size\[HAK_NUMBERS\] = \{(.*?)\};", classes_c, re.S)
    span = re.search(r"#define SPAN_SIZES((?:.*\\\n)*.*)", classes_c)
    if not m or not span:
        sys.exit("gen_class_tables: hak_class_size or SPAN_SIZES not found in src/classes.c")
    types = read("src/types.h")
    classes = re.search(r"#define HAK_CLASSES (\d+)", types)
    if not classes:
        sys.exit("gen_class_tables: HAK_CLASSES not found in src/types.h")
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S).replace("SPAN_SIZES", span.group(1))
    sizes = [int(x) for x in re.findall(r"\d+", body)][:int(classes.group(1))]  # the classes'

    slab_max, colour_max = constant(types, "HAK_SLAB_MAX"), constant(types, "HAK_SPAN_COLOUR_MAX")
    span_classes = sum(1 for s in sizes if s > slab_max)

    def cls(n):
        n = max(n, 1)
        return next(i for i, s in enumerate(sizes) if s >= n)

    def malloc_number(n):
        c = cls(n)
        span_at_page = sizes[c] > slab_max and n + colour_max > sizes[c]
        return c + span_classes if span_at_page else c

    if sys.argv[1] == "fast":
        last = constant(types, "HAK_FAST_MAX") // 16
        head = ("/* Generated from hak_class_size by tools/gen_class_tables.py: entry i is\n"
                " * the smallest class whose block holds 16*i bytes, i = 0..%d, or for a\n"
                " * span class whose largest colour leaves no room for them, its number\n"
                " * plus HAK_SPAN_CLASSES (HAK_SPAN_COLOUR_MAX).\n"
                " * unit_core.class_is_smallest_fitting checks every size against it. */" % last)
        values, per_line = [malloc_number(16 * i) for i in range(last + 1)], 16
    else:
        last = constant(types, "HAK_TABLE_MAX")
        head = ("/* Generated from hak_class_size by tools/gen_class_tables.py: entry s is\n"
                " * the smallest class whose block holds s bytes, s = 0..HAK_TABLE_MAX.\n"
                " * unit_core.class_is_smallest_fitting checks every size against it. */")
        values, per_line = [cls(s) for s in range(last + 1)], 24
    print(head)
    for k in range(0, len(values), per_line):
        print("  " + " ".join("%d," % v for v in values[k:k + per_line]))


if __name__ == "__main__":
    main()
