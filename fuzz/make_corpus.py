#!/usr/bin/env python3
"""Writes the seed corpus for fuzz/fuzz_alloc.c (deterministic: same files on
every run). Usage: make_corpus.py DIR. The encoding mirrors fuzz_alloc.c:
op byte (low 4 bits = operation), slot byte, then the operation's operands."""
import os
import random
import sys

MALLOC, CALLOC, REALLOC, ALIGNED, POSIX, FREE, FREE_SIZED, USABLE, REALLOCARRAY, COLLECT, REUSE = (
    0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
EDGES = [0, 1, 15, 16, 17, 64, 128, 1023, 1024, 1025, 32767, 32768, 32769, 262143, 262144,
         262145, 4194304 - 4096, 4194304, 4194305, 8388608, 7167, 7168, 7169, 8192, 8193]


def size(n):
    """Encodes a byte size in the tier that holds it."""
    if n in EDGES:
        return bytes([13, EDGES.index(n)])
    if n <= 64:
        return bytes([0, n])
    if n <= 1024:
        return bytes([5, n & 255, n >> 8])
    if n <= 32768:
        return bytes([8, n & 255, n >> 8])
    if n <= 262144:
        return bytes([10, n & 255, (n >> 8) & 255, n >> 16])
    if n <= 8 << 20:
        v = n - 1
        return bytes([12, v & 255, (v >> 8) & 255, v >> 16])
    v = (n - (8 << 20)) // 512
    return bytes([0x1F, v & 255, v >> 8])


IMPOSSIBLE = bytes([0xFF, 0])


def op(code, slot, *rest):
    return bytes([code, slot]) + b"".join(rest)


def malloc(s, n): return op(MALLOC, s, size(n))
def free(s): return op(FREE, s)
def free_sized(s): return op(FREE_SIZED, s)
def usable(s): return op(USABLE, s)
def realloc(s, n): return op(REALLOC, s, size(n))
def calloc(s, n, parts=1): return op(CALLOC, s, size(n), bytes([(parts - 1) % 16]))
def aligned(s, n, e): return op(ALIGNED, s, size(n), bytes([e]))
def posix(s, n, e): return op(POSIX, s, size(n), bytes([e]))
def reallocarray(s, n, parts=1): return op(REALLOCARRAY, s, size(n), bytes([(parts - 1) % 8]))
def collect(force=True): return b"".join(op(COLLECT | (0x80 if force else 0), 0) for _ in range(16))


def seeds():
    tiers = [0, 1, 16, 48, 64, 100, 1000, 1024, 1025, 4000, 16384, 32768, 40000, 200000,
             262144, 262145, 1 << 20, 4 << 20, 8 << 20, 12 << 20]
    out = {}
    out["tiers_malloc_free"] = b"".join(malloc(i, n) for i, n in enumerate(tiers)) + \
        b"".join(usable(i) + free(i) for i in range(len(tiers)))
    out["tiers_free_sized"] = b"".join(malloc(i, n) + free_sized(i) for i, n in enumerate(tiers))
    out["sixty_four_small"] = b"".join(malloc(i, 16 + i) for i in range(64)) + \
        b"".join(free(i) for i in range(0, 64, 2)) + b"".join(malloc(i, 24) for i in range(0, 64, 2)) + \
        b"".join(free(i) for i in range(64))
    grow = [1, 16, 64, 1000, 1025, 30000, 262145, 5 << 20, 9 << 20]
    out["realloc_grow"] = malloc(0, 0) + b"".join(realloc(0, n) for n in grow) + free(0)
    out["realloc_shrink"] = malloc(0, 9 << 20) + b"".join(realloc(0, n) for n in reversed(grow)) + \
        realloc(0, 0)
    out["realloc_null_and_zero"] = realloc(5, 100) + realloc(5, 0) + realloc(6, 0) + free(6)
    out["realloc_in_place_half"] = malloc(1, 1024) + realloc(1, 600) + realloc(1, 400) + \
        realloc(1, 1024) + free(1)
    out["realloc_large_mremap"] = malloc(2, 300000) + realloc(2, 2 << 20) + realloc(2, 6 << 20) + \
        realloc(2, 300000) + realloc(2, 100) + free(2)
    out["calloc_tiers"] = b"".join(calloc(i, n, 1 + i % 5) for i, n in enumerate(tiers)) + \
        b"".join(free(i) for i in range(len(tiers)))
    out["calloc_reuses_dirty"] = b"".join(malloc(i, 64) for i in range(32)) + \
        b"".join(free(i) for i in range(32)) + b"".join(calloc(i, 64) for i in range(32))
    out["calloc_overflow"] = op(CALLOC, 3, size(64), bytes([0x85]))
    out["aligned_every_power"] = b"".join(aligned(e, 100 + 37 * e, e) for e in range(24)) + \
        b"".join(free(e) for e in range(24))
    out["aligned_huge_alignment"] = aligned(0, 10, 24) + aligned(1, 5 << 20, 26) + \
        aligned(2, 1, 27) + free(0) + free(1) + free(2)
    out["aligned_size_zero"] = b"".join(aligned(e, 0, e) for e in range(24)) + \
        b"".join(posix(e + 24, 0, e) for e in range(3, 24)) + \
        b"".join(free(e) for e in range(48))
    out["aligned_bad"] = aligned(0, 10, 28) + aligned(1, 10, 30) + posix(2, 10, 29) + posix(3, 10, 2)
    out["posix_every_power"] = b"".join(posix(e, 1 << (e % 18), e) for e in range(3, 24)) + \
        b"".join(free_sized(e) for e in range(3, 24))
    out["aligned_then_realloc"] = aligned(0, 1000, 12) + realloc(0, 50000) + \
        aligned(1, 100, 20) + realloc(1, 10) + free(0) + free(1)
    out["reallocarray"] = reallocarray(0, 1000, 4) + reallocarray(0, 100000, 7) + \
        op(REALLOCARRAY, 0, size(64), bytes([0x81])) + free(0)
    out["impossible_sizes"] = op(MALLOC, 0, IMPOSSIBLE) + op(CALLOC, 1, IMPOSSIBLE, b"\0") + \
        malloc(2, 100) + op(REALLOC, 2, IMPOSSIBLE) + usable(2) + free(2)
    out["collect_with_live"] = b"".join(malloc(i, n) for i, n in enumerate(tiers)) + collect(True) + \
        b"".join(usable(i) for i in range(len(tiers))) + collect(False) + \
        b"".join(free(i) for i in range(len(tiers))) + collect(True)
    out["reuse_same_size"] = b"".join(malloc(0, 48) + op(REUSE, 0) for _ in range(20)) + \
        b"".join(malloc(1, 40000) + op(REUSE, 1) for _ in range(5))
    out["slab_fill_64k"] = b"".join(malloc(i, 1024) for i in range(64)) + \
        b"".join(free(i) for i in range(64)) + b"".join(malloc(i, 1024) for i in range(64))
    out["mid_slab_fill"] = b"".join(malloc(i, 16384) for i in range(40)) + \
        b"".join(free(i) for i in range(0, 40, 3)) + collect(True) + \
        b"".join(malloc(i, 20000) for i in range(0, 40, 3))
    out["big_class_fill"] = b"".join(malloc(i, 200000) for i in range(12)) + \
        b"".join(realloc(i, 250000) for i in range(12))
    out["edges_all"] = b"".join(op(MALLOC, i, bytes([13 | ((i & 1) << 7), i])) for i in range(len(EDGES)))
    spans = [8193, 12000, 20000, 40000, 100000, 262144]
    out["span_pages_reuse"] = b"".join(malloc(i, n) for i, n in enumerate(spans * 3)) + \
        b"".join(free(i) for i in range(0, 18, 2)) + collect(True) + \
        b"".join(malloc(i, n) for i, n in zip(range(0, 18, 2), reversed(spans * 2))) + \
        b"".join(free(i) for i in range(18))
    out["span_realloc_in_place"] = malloc(0, 8193) + malloc(1, 20000) + free(1) + collect(True) + \
        b"".join(realloc(0, n) for n in [12000, 24000, 9000, 7168, 30000, 100000, 40000, 5000]) + \
        free(0)
    rnd = random.Random(20261122)
    for k in range(16):
        out["random_%02d" % k] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(16, 600)))
    return out


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(d, exist_ok=True)
    for name, data in sorted(seeds().items()):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("%d seed inputs in %s" % (len(seeds()), d))


if __name__ == "__main__":
    main()
