#!/usr/bin/env python3
"""One markdown row per `make bench-full` report: hakmem's round-by-round ratio
to the fastest peer on each workload (or the range over a group of
workloads), two geometric means over the workloads, and how many workloads'
peaks are under both memory limits of issue 4 (1.10x mimalloc's, and the
peers' median). The geometric means: "gm peer" is hakmem's throughput over
that of the peer with the highest geometric mean (one peer for all
workloads); "gm rows" is the mean of the round-by-round ratios, each against
its workload's fastest peer, the stricter one. A workload that failed is
left out of both and its run is marked. docs/PERFORMANCE.md's table of runs
is this script's output.

With --counts, it reads such a table of runs back from a markdown file and
prints, for each column with a target of issue 4, how many runs met it: the
"met?" column of docs/PERFORMANCE.md's status. A run whose report cell says
"not in the status's counts" is left out. With --check, it compares those
counts with the status of the same file (its paragraph's "counts the N runs",
its table's "over N runs" heading, each row's "k of N" and range) and names
every one that differs.

usage: tools/matrix_runs.py [--rounds N] bench/results/full-*.md
       tools/matrix_runs.py --counts | --check docs/PERFORMANCE.md
  --rounds N  leave out reports of fewer rounds (default 11)
"""
import re
import statistics
import sys

import hakbench as hb  # beside this script

PEERS = ["glibc", "mimalloc", "jemalloc", "tcmalloc"]
COLUMNS = [  # (heading, workload prefix, how: one value or the range of a group, target)
    ("rm 400", "random_mixed ws=400", "one", 1.10),
    ("rm 8192", "random_mixed ws=8192", "one", 1.05),
    ("mlm 1t", "mid_large_mt 1t", "one", 1.10),
    ("mlm 2t", "mid_large_mt 2t", "one", 1.05),
    ("larson", "larson", "range", 1.05),
    ("xmalloc 1p1c", "xmalloc 1p1c", "one", 1.0),
    ("xmalloc 2p2c", "xmalloc 2p2c", "one", 1.0),
    ("cache", "cache_", "range", 1.0),
    ("glibc_*", "glibc_", "range", 1.0),
    ("realloc", "realloc_chain", "one", 1.0),
    ("large", "large", "one", 1.0),
    ("batch", "batch", "one", 1.0),
    ("frag", "frag", "one", 1.0),
]
GM_ROWS_TARGET = 1.15  # the geometric mean over each workload's fastest peer
TARGETS = {h: t for h, _, _, t in COLUMNS} | {"gm rows": GM_ROWS_TARGET}
# The status table's rows: how its first cell starts, the columns a run must meet
# (all of them) to count, and the range its "met?" cell gives: of every value
# ("all"), of each run's lowest row of a group ("lowest"), or none.
STATUS = [
    ("random_mixed ws=400", ["rm 400"], "all"),
    ("random_mixed ws=8192", ["rm 8192"], "all"),
    ("mid_large_mt 1t", ["mlm 1t"], "all"),
    ("mid_large_mt 2t", ["mlm 2t"], "all"),
    ("larson", ["larson"], "lowest"),
    ("xmalloc", ["xmalloc 1p1c", "xmalloc 2p2c"], "all"),
    ("glibc_simple", ["glibc_*"], None),
    ("cache_scratch", ["cache"], "all"),
    ("realloc_chain", ["realloc"], None),
    ("large", ["large"], None),
    ("batch", ["batch"], None),
    ("frag", ["frag"], None),
    ("peak RSS", ["peaks"], None),
    ("geometric mean", ["gm rows"], "all"),
]
HEADS = ["commit", "report"] + [h for h, _, _, _ in COLUMNS] + ["gm peer", "gm rows", "peaks"]


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse(path):
    """(revision, rounds, {workload: hakmem/fastest peer}, (gm peer, gm rows), peaks under
    both, workloads with a peak, workloads)"""
    text = open(path).read()
    rev = re.search(r"hakmem revision: (\S+)", text).group(1).replace("+dirty", "")
    rounds = int(re.search(r"set: \S+, (\d+) rounds", text).group(1))
    best, geo, rss, workloads, gm_report = {}, {}, {}, [], None
    section, heading = None, []
    for line in text.splitlines():
        if line.startswith("| workload ("):
            section = ("thr" if "ops/s" in line else
                       "best" if "best peer" in line or "fastest peer" in line else
                       "other" if "same round" in line else "rss")
            heading = cells(line)
        elif line.startswith("|--"):
            continue
        elif line.startswith("|"):
            c = cells(line)
            if section == "best" and c[0] == "geomean":
                gm_report = float(c[2].rstrip("x"))
            elif section == "best" and c[2] != "-":
                best[c[0]] = float(c[2].rstrip("x"))
            elif section == "thr" and c[0] == "geomean ratio":
                geo = {k: float(v.split("x")[0]) for k, v in zip(heading[1:], c[1:]) if v != "-"}
            elif section == "thr" and c[0] != "geomean ratio":
                workloads.append(c[0])
            elif section == "rss" and "-" not in c[1:]:
                rss[c[0]] = {k: float(v.split("/")[0]) for k, v in zip(heading[1:], c[1:])}
        else:
            section = None
    gm_peer = 1 / max(geo[p] for p in PEERS if p in geo)
    # The report's own row is taken from unrounded medians; the rows above are rounded.
    gm_rows = gm_report if gm_report is not None else hb.geomean(best.values())
    under = sum(r["hakmem"] <= 1.10 * r["mimalloc"] and
                r["hakmem"] <= statistics.median(r[p] for p in PEERS if p in r) for r in rss.values())
    return rev, rounds, best, (gm_peer, gm_rows), under, len(rss), len(workloads)


def row(path, parsed):
    rev, _, best, (gm_peer, gm_rows), under, n, total = parsed
    out = [f"`{rev}`", path.rsplit("/", 1)[-1].removesuffix(".md")]
    for _, prefix, how, _ in COLUMNS:
        vals = [v for w, v in best.items() if w.startswith(prefix)]
        if not vals:
            out.append("")
        elif how == "one":
            out.append(f"{vals[0]:.3f}")
        else:
            out.append(f"{min(vals):.3f}–{max(vals):.3f}")
    partial = f" ({len(best)} of {total})" if len(best) < total else ""
    out += [f"{gm_peer:.2f}", f"{gm_rows:.3f}{partial}", f"{under} of {n}" +
            (f" ({total - n} failed)" if n < total else "")]
    return "| " + " | ".join(out) + " |"


def runs_of(path):
    """The rows of the table of runs in path that the status counts."""
    heads, rows = False, []
    for line in open(path):
        if line.startswith("|") and cells(line) == HEADS:
            heads = True
        elif heads and line.startswith("| `") and "full-" in line:
            c = cells(line)
            if "not in the status" not in c[1]:
                rows.append(dict(zip(HEADS, c)))
    if not rows:
        sys.exit(f"tools/matrix_runs.py: no table of runs in {path}")
    return rows


def tally(rows, heads):
    """(runs with a value in every column of heads, runs meeting every target
    there, lows, highs): lows and highs over each run's value or group range."""
    if heads == ["peaks"]:
        peaks = [r["peaks"].split() for r in rows]
        return len(peaks), sum(p[0] == p[2] for p in peaks), [], []
    n, met, lows, highs = 0, 0, [], []
    for r in rows:
        # a group's cell is "low–high"; "gm rows" may carry " (n of m)"
        ends = [(r.get(h) or "–").split()[0].split("–") for h in heads]
        if any(e == ["", ""] for e in ends):
            continue
        n += 1
        met += all(float(e[0]) >= TARGETS[h] for h, e in zip(heads, ends))
        lows += [float(e[0]) for e in ends]
        highs += [float(e[-1]) for e in ends]
    return n, met, lows, highs


def counts(path):
    """Per target column of the table of runs in path: runs counted, the lowest
    and the highest value (a group's lowest row), runs at or over the target."""
    rows = runs_of(path)
    print("| column | target | runs | lowest | highest | at or over the target |")
    print("|---|--:|--:|--:|--:|--:|")
    for head, target in TARGETS.items():
        n, met, lows, highs = tally(rows, [head])
        print(f"| {head} | {target:.2f} | {n} | {min(lows):.3f} | {max(highs):.3f} | {met} |")
    n, met, _, _ = tally(rows, ["peaks"])
    print(f"| peaks | all | {n} | | | {met} |")
    return 0


def check(path):
    """Names each cell of the status table in path that the table of runs does
    not bear out; 0 if there is none."""
    rows, status, faults = runs_of(path), {}, []
    text = open(path).read()
    want = f"counts the {len(rows)} runs"
    if want not in " ".join(text.split()):
        faults.append(f"status paragraph: want '{want}'")
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("| target | hakmem / fastest peer"):
            want = f"(over {len(rows)} runs)"
            if want not in line:
                faults.append(f"status heading: want '{want}'")
            for line in lines:
                if not line.startswith("|"):
                    break
                c = cells(line)
                status.update({p: c[-1] for p, _, _ in STATUS if c[0].startswith(p)})
            break
    for prefix, heads, span in STATUS:
        cell = status.get(prefix)
        if cell is None:
            faults.append(f"status: no row '{prefix}'")
            continue
        n, met, lows, highs = tally(rows, heads)
        want = [f"{met} of {n}"] if met else []
        if span:
            top = max(lows) if span == "lowest" else max(highs)
            want.append(f"{min(lows):.3f}–{top:.3f}")
        faults += [f"status '{prefix}': want '{w}' in: {cell}" for w in want if w not in cell]
    for f in faults:
        print(f)
    return 1 if faults else 0


def main(argv):
    if len(argv) == 2 and argv[0] in ("--counts", "--check"):
        return (counts if argv[0] == "--counts" else check)(argv[1])
    rounds = 11
    if len(argv) > 1 and argv[0] == "--rounds":
        rounds, argv = int(argv[1]), argv[2:]
    if not argv or argv[0].startswith("-"):
        sys.stderr.write(__doc__)
        return 2
    print("| " + " | ".join(HEADS) + " |")
    print("|" + "---|" * len(HEADS))
    for path in argv:
        parsed = parse(path)
        if parsed[1] >= rounds:
            print(row(path, parsed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
