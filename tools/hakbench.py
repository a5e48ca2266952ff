"""hakbench — allocator comparison library (stdlib only).

Used by bench/run (the benchmark matrix) and meant to be imported by other
tools (e.g. a `hakmem compare` command).  Pieces, all usable on their own:

  Allocator, discover_allocators()   which malloc implementations to run
  clean_env(), run_once()            run one command under LD_PRELOAD with a
                                     clean environment; wall/user/sys time and
                                     peak RSS from os.wait4() rusage
  parse_result()                     key=value fields of a result line
  median(), spread(), ratio(), geomean()
  Workload, run_matrix()             interleaved rounds, rotating order
  summarize(), format_table(), write_csv(), write_markdown(), plot_gnuplot()
  paired_rows()                      the baseline against each round's fastest peer
  Progress                           one-line progress/ETA on stderr
  callgrind_instructions()           instruction counts (bench-instr)

Conventions: a benchmark prints one line containing `ops/s=<number>`; all
other `key=value` tokens of that line are kept as extra fields.  Ratios are
"throughput of X / throughput of the baseline" (baseline = hakmem by
default), so 0.93x means X does 93% of the baseline's operations per second.
"""

import csv
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

# ---------------------------------------------------------------------------
# Allocators

DEBIAN_LIBDIR = "/usr/lib/x86_64-linux-gnu"

# name -> (library file, Debian package providing it)
KNOWN_PEERS = {
    "mimalloc": (DEBIAN_LIBDIR + "/libmimalloc.so.2", "libmimalloc2.0"),
    "jemalloc": (DEBIAN_LIBDIR + "/libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": (DEBIAN_LIBDIR + "/libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
}
# The allocators the baseline is measured against ("the best peer").
PEERS = ("glibc",) + tuple(KNOWN_PEERS)


@dataclass
class Allocator:
    """One column of the matrix.  lib=None means the system allocator (no
    LD_PRELOAD).  env holds extra variables this allocator needs (e.g. a
    hardened mode switch); they are passed explicitly to its children only."""
    name: str
    lib: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    package: Optional[str] = None

    def describe(self) -> str:
        s = self.lib or "(no preload: system malloc)"
        if self.env:
            s += " " + " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return s


def parse_alloc_spec(spec: str) -> Allocator:
    """'name=/path/lib.so[,KEY=VAL...]' -> Allocator.  '/path' may be empty or
    'none' for a no-preload column."""
    if "=" not in spec:
        raise ValueError(f"allocator spec {spec!r} is not name=/path/lib.so")
    name, rest = spec.split("=", 1)
    parts = rest.split(",")
    lib = parts[0] or None
    if lib in ("none", "glibc"):
        lib = None
    env = {}
    for p in parts[1:]:
        if "=" not in p:
            raise ValueError(f"allocator env {p!r} is not KEY=VAL")
        k, v = p.split("=", 1)
        env[k] = v
    if not name:
        raise ValueError(f"allocator spec {spec!r} has an empty name")
    return Allocator(name, os.path.abspath(lib) if lib else None, env)


def apt_install(packages: Sequence[str], log: Callable[[str], None]) -> bool:
    """apt-get install -y the packages (root only).  Returns success."""
    if not packages or os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    log(f"installing missing Debian packages: {' '.join(packages)} (apt-get install -y)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "-q", *packages], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        log("apt-get failed: " + r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "apt-get failed")
    return r.returncode == 0


def discover_allocators(root: str = ".", only: Optional[Iterable[str]] = None,
                        extra: Sequence[Allocator] = (), install: bool = True,
                        hakmem_lib: Optional[str] = None,
                        log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                        ) -> List[Allocator]:
    """The default columns: hakmem (root/build/libhakmem.so), glibc, mimalloc,
    jemalloc, tcmalloc, then `extra`.  Missing Debian peers are apt-get
    installed when running as root and install=True, else skipped with a
    message.  `only` selects and orders by name."""
    hak = hakmem_lib or os.path.join(os.path.abspath(root), "build", "libhakmem.so")
    cands = [Allocator("hakmem", hak), Allocator("glibc", None)]
    for name, (lib, pkg) in KNOWN_PEERS.items():
        cands.append(Allocator(name, lib, package=pkg))
    names = {a.name for a in extra}
    cands = [a for a in cands if a.name not in names] + list(extra)
    wanted = list(only) if only else None
    if wanted:
        unknown = [w for w in wanted if w not in {a.name for a in cands}]
        for w in unknown:
            log(f"unknown allocator {w!r} (use --alloc {w}=/path/lib.so)")
        cands = [a for w in wanted for a in cands if a.name == w]
    missing_pkgs = [a.package for a in cands if a.lib and a.package and not os.path.exists(a.lib)]
    if missing_pkgs and install:
        apt_install(missing_pkgs, log)
    out = []
    for a in cands:
        if a.lib and not os.path.exists(a.lib):
            why = f"(package {a.package})" if a.package else ""
            if a.name == "hakmem":
                why = "(run `make` first)"
            log(f"skipping {a.name}: {a.lib} not found {why}".rstrip())
            continue
        out.append(a)
    return out


# ---------------------------------------------------------------------------
# Running one command

def clean_env(alloc: Optional[Allocator] = None, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Only PATH, HOME, LANG=C, the allocator's LD_PRELOAD and env, and the
    explicitly given extras.  Nothing else leaks (no HAKMEM_*, no MALLOC_*)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "HOME": os.environ.get("HOME", "/"), "LANG": "C"}
    if alloc is not None:
        if alloc.lib:
            env["LD_PRELOAD"] = alloc.lib
        env.update(alloc.env)
    if extra:
        env.update(extra)
    return env


def command_line(cmd: Sequence[str], env: Dict[str, str]) -> str:
    """A shell line that reproduces the run exactly: env -i VARS... cmd."""
    vars_ = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"env -i {vars_} " + " ".join(shlex.quote(c) for c in cmd)


@dataclass
class RunResult:
    rc: int
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_kib: int
    stdout: str
    stderr: str
    fields: Dict[str, str]
    ops_per_s: Optional[float]
    timed_out: bool = False
    error: str = ""      # a failure the exit status does not show

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.ops_per_s is not None and not self.timed_out and not self.error


def preload_error(stderr: str) -> str:
    """ld.so's complaint that LD_PRELOAD's library was not loaded: the
    program then ran on glibc's malloc, and its figures are not the
    allocator's."""
    for line in stderr.splitlines():
        if "LD_PRELOAD cannot be preloaded" in line:
            return line.strip()
    return ""


_KV = re.compile(r"([A-Za-z_][A-Za-z0-9_/]*)=(\S+)")


def parse_result(text: str) -> Tuple[Dict[str, str], Optional[float]]:
    """Fields of the last line containing 'ops/s=' ({} , None if none)."""
    line = None
    for l in text.splitlines():
        if "ops/s=" in l:
            line = l
    if line is None:
        return {}, None
    fields = dict(_KV.findall(line))
    try:
        ops = float(fields["ops/s"])
    except (KeyError, ValueError):
        ops = None
    return fields, ops


_GNU_TIME: Optional[str] = None


def gnu_time() -> Optional[str]:
    """Path of GNU time if installed (used as the RSS-measuring parent)."""
    global _GNU_TIME
    if _GNU_TIME is None:
        _GNU_TIME = ""
        for p in ("/usr/bin/time",):
            if os.access(p, os.X_OK):
                try:
                    r = subprocess.run([p, "--version"], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, timeout=5)
                    if "GNU" in r.stdout:
                        _GNU_TIME = p
                except (OSError, subprocess.SubprocessError):
                    pass
    return _GNU_TIME or None


def run_once(cmd: Sequence[str], env: Dict[str, str], timeout: float = 300.0,
             cwd: Optional[str] = None, exact_rss: bool = True) -> RunResult:
    """Run cmd with exactly env; wall time, and user/sys time and peak RSS of
    the child from os.wait4() rusage (ru_maxrss is KiB on Linux).

    Peak RSS caveat: a process forked by this (large) Python process inherits
    Python's RSS high-water mark through fork+exec, so ru_maxrss of a direct
    child is never below ~15 MiB.  With exact_rss (default) and GNU time
    installed, the command runs as
        /usr/bin/time -o F -f %M env [LD_PRELOAD=...] cmd
    where time (not preloaded) forks the measured process from its own small
    image and reports that child's ru_maxrss (also from wait4); the
    environment the program sees is still exactly `env`."""
    wrap = gnu_time() if exact_rss else None
    tmp = None
    full = list(cmd)
    penv = env
    if wrap:
        import tempfile
        fd, tmp = tempfile.mkstemp(prefix="hakbench-rss-")
        os.close(fd)
        penv = {k: env[k] for k in ("PATH", "HOME", "LANG") if k in env}
        full = [wrap, "-q", "-o", tmp, "-f", "%M", "/usr/bin/env", "-i",
                *[f"{k}={v}" for k, v in env.items()], *cmd]
    t0 = time.monotonic()
    # A session of its own: a timeout kills its whole process group, the
    # program under GNU time and whatever it started.
    p = subprocess.Popen(full, env=penv, cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    # Drain pipes without reaping, then reap with wait4 for the rusage.
    try:
        out, err, timed_out = _communicate_noreap(p, timeout)
    except KeyboardInterrupt:
        _kill_group(p)
        raise
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    maxrss = int(ru.ru_maxrss)
    if tmp:
        try:
            with open(tmp) as f:
                txt = f.read().split()
            maxrss = int(txt[-1]) if txt else maxrss
        except (OSError, ValueError):
            pass
        os.unlink(tmp)
        if p.returncode > 128:          # GNU time: 128 + signal number
            p.returncode = -(p.returncode - 128)
    fields, ops = parse_result(out)
    return RunResult(p.returncode, wall, ru.ru_utime, ru.ru_stime, maxrss,
                     out, err, fields, ops, timed_out, preload_error(err))


def _kill_group(p: subprocess.Popen):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass


def _communicate_noreap(p: subprocess.Popen, timeout: Optional[float]) -> Tuple[str, str, bool]:
    """The program's stdout and stderr, and whether it ran out of time (its
    process group is then killed, and the pipes read to their end).
    Popen.communicate() may reap the child (losing rusage) through wait();
    reading the pipes to EOF does not.  Threads read both."""
    import threading
    bufs = {"out": [], "err": []}

    def rd(f, key):
        bufs[key].append(f.read())
        f.close()
    ts = [threading.Thread(target=rd, args=(p.stdout, "out"), daemon=True),
          threading.Thread(target=rd, args=(p.stderr, "err"), daemon=True)]
    for t in ts:
        t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for t in ts:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    timed_out = any(t.is_alive() for t in ts)
    if timed_out:
        _kill_group(p)
        for t in ts:
            t.join()
    return "".join(bufs["out"]), "".join(bufs["err"]), timed_out


# ---------------------------------------------------------------------------
# Statistics

def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("median of empty sequence")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def spread(xs: Sequence[float]) -> Tuple[float, float]:
    """(min, max)."""
    if not xs:
        raise ValueError("spread of empty sequence")
    return min(xs), max(xs)


def spread_pct(xs: Sequence[float]) -> float:
    """(max - min) / median, in percent: the run-to-run noise of a cell."""
    m = median(xs)
    lo, hi = spread(xs)
    return 100.0 * (hi - lo) / m if m else float("nan")


def ratio(x: Optional[float], base: Optional[float]) -> Optional[float]:
    """x / base, None when either is missing or base is 0."""
    if x is None or base is None or base == 0:
        return None
    return x / base


def geomean(xs: Iterable[Optional[float]]) -> Optional[float]:
    """Geometric mean of the positive values; None if there are none."""
    v = [x for x in xs if x is not None and x > 0]
    if not v:
        return None
    return math.exp(sum(math.log(x) for x in v) / len(v))


def rotated(items: Sequence, k: int) -> List:
    """items rotated left by k (round k's order in interleaved runs)."""
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def human(x: Optional[float], unit: str = "") -> str:
    """123456789 -> '123.5M'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.1f}{suf}{unit}"
    return f"{x:.0f}{unit}" if abs(x) >= 10 else f"{x:.2f}{unit}"


def fmt_duration(s: float) -> str:
    s = max(0, int(round(s)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


# ---------------------------------------------------------------------------
# Progress line

class Progress:
    """Single progress line on stderr: '\\r'-updated on a tty, one plain line
    per update otherwise."""

    def __init__(self, total: int, stream=sys.stderr, enabled: bool = True):
        self.total = total
        self.done = 0
        self.stream = stream
        self.enabled = enabled
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.width = 0

    def update(self, text: str, eta_s: Optional[float] = None):
        if not self.enabled:
            return
        line = f"[{self.done}/{self.total}] {text}"
        if eta_s is not None:
            line += f"  ~{fmt_duration(eta_s)} left"
        if self.tty:
            pad = max(0, self.width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self.width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self):
        if self.enabled and self.tty and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


# ---------------------------------------------------------------------------
# The matrix

@dataclass
class Workload:
    name: str            # unique label, e.g. "random_mixed-ws400"
    argv: List[str]      # program and arguments
    est_s: float = 1.0   # rough run time, for the first ETA


@dataclass
class Sample:
    workload: str
    allocator: str
    round: int           # 0 = warm-up (not used in the statistics)
    position: int        # position in this round's order
    result: RunResult
    command: str


def run_matrix(workloads: Sequence[Workload], allocs: Sequence[Allocator], rounds: int = 5,
               warmup: int = 1, timeout: float = 300.0, extra_env: Optional[Dict[str, str]] = None,
               progress: Optional[Progress] = None,
               on_sample: Optional[Callable[[Sample], None]] = None,
               cwd: Optional[str] = None) -> List[Sample]:
    """For each workload: `warmup` unrecorded rounds, then `rounds` rounds;
    every round runs every allocator once, in an order rotated by one each
    round (so each runs first in turn)."""
    samples: List[Sample] = []
    per_cell: Dict[Tuple[str, str], List[float]] = {}
    total_runs = len(workloads) * len(allocs) * (rounds + warmup)
    if progress:
        progress.total = total_runs

    def eta(wi: int, r: int, pos: int) -> float:
        # Known cells: their mean wall; unknown: the workload's estimate,
        # scaled by how far observed/estimated went so far.
        obs = [(sum(v) / len(v), w) for (w, _), v in per_cell.items()]
        scale = 1.0
        est = {w.name: w.est_s for w in workloads}
        if obs:
            scale = sum(o for o, _ in obs) / max(1e-9, sum(est[w] for _, w in obs))
        left = 0.0
        for j, w in enumerate(workloads):
            if j < wi:
                continue
            for a in allocs:
                cell = per_cell.get((w.name, a.name))
                t = sum(cell) / len(cell) if cell else w.est_s * scale
                n = rounds + warmup
                if j == wi:
                    n -= r
                left += t * n
        if wi < len(workloads):
            # subtract runs already done in the current round
            w = workloads[wi]
            for a in allocs[:pos]:
                cell = per_cell.get((w.name, a.name))
                left -= sum(cell) / len(cell) if cell else w.est_s * scale
        return max(0.0, left)

    for wi, w in enumerate(workloads):
        for r in range(rounds + warmup):
            order = rotated(allocs, r)
            for pos, a in enumerate(order):
                env = clean_env(a, extra_env)
                if progress:
                    label = "warm-up" if r < warmup else f"round {r - warmup + 1}/{rounds}"
                    progress.update(f"{w.name} | {a.name} | {label}", eta(wi, r, pos))
                res = run_once(w.argv, env, timeout=timeout, cwd=cwd)
                per_cell.setdefault((w.name, a.name), []).append(res.wall_s)
                s = Sample(w.name, a.name, 0 if r < warmup else r - warmup + 1, pos, res,
                           command_line(w.argv, env))
                if progress:
                    progress.done += 1
                samples.append(s)
                if on_sample:
                    on_sample(s)
    if progress:
        progress.clear()
    return samples


@dataclass
class Cell:
    workload: str
    allocator: str
    n: int = 0
    failures: int = 0
    ops_median: Optional[float] = None
    ops_min: Optional[float] = None
    ops_max: Optional[float] = None
    wall_median: Optional[float] = None
    maxrss_kib: Optional[int] = None
    extra: Dict[str, str] = field(default_factory=dict)   # fields of the median run
    error: str = ""

    @property
    def spread_pct(self) -> Optional[float]:
        if self.ops_median and self.ops_min is not None and self.ops_max is not None:
            return 100.0 * (self.ops_max - self.ops_min) / self.ops_median
        return None


def summarize(samples: Sequence[Sample]) -> Dict[Tuple[str, str], Cell]:
    """Per (workload, allocator): median ops/s, min-max, median wall, peak
    RSS (max ru_maxrss) over the recorded (non-warm-up) rounds; failures
    counts every failed run, warm-up included."""
    cells: Dict[Tuple[str, str], Cell] = {}
    groups: Dict[Tuple[str, str], List[Sample]] = {}
    for s in samples:
        groups.setdefault((s.workload, s.allocator), []).append(s)
    for key, every in groups.items():
        c = Cell(*key)
        ss = [s for s in every if s.round > 0]
        good = [s for s in ss if s.result.ok]
        c.n = len(good)
        bad = [s for s in every if not s.result.ok]  # a failed warm-up too
        c.failures = len(bad)
        if bad:
            r = bad[0].result
            msg = r.error or (r.stderr.strip().splitlines() or [""])[-1][:120]
            c.error = ("timeout" if r.timed_out else f"exit {r.rc}") + (f": {msg}" if msg else "")
        if good:
            ops = [s.result.ops_per_s for s in good]
            c.ops_median = median(ops)
            c.ops_min, c.ops_max = spread(ops)
            c.wall_median = median([s.result.wall_s for s in good])
            c.maxrss_kib = max(s.result.maxrss_kib for s in good)
            mid = min(good, key=lambda s: abs(s.result.ops_per_s - c.ops_median))
            c.extra = dict(mid.result.fields)
        cells[key] = c
    return cells


def ratios(cells: Dict[Tuple[str, str], Cell], workloads: Sequence[str], allocs: Sequence[str],
           baseline: str) -> Dict[Tuple[str, str], Optional[float]]:
    out = {}
    for w in workloads:
        b = cells.get((w, baseline))
        for a in allocs:
            c = cells.get((w, a))
            out[(w, a)] = ratio(c.ops_median if c else None, b.ops_median if b else None)
    return out


def geomeans(rat: Dict[Tuple[str, str], Optional[float]], workloads: Sequence[str],
             allocs: Sequence[str]) -> Dict[str, Optional[float]]:
    return {a: geomean(rat.get((w, a)) for w in workloads) for a in allocs}


# ---------------------------------------------------------------------------
# Output

def _table(rows: List[List[str]], md: bool) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(widths[i]) for i, c in enumerate(r) if i > 0]
        if md:
            lines.append("| " + " | ".join(cells) + " |")
            if k == 0:
                lines.append("|" + "|".join("-" * (widths[0] + 2) if i == 0 else "-" * (widths[i] + 1) + ":"
                                            for i in range(len(r))) + "|")
        else:
            lines.append("  ".join(cells).rstrip())
            if k == 0:
                lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def throughput_rows(cells, workloads, allocs, baseline) -> List[List[str]]:
    rat = ratios(cells, workloads, allocs, baseline)
    rows = [["workload (ops/s, ratio to " + baseline + ")"] + list(allocs)]
    for w in workloads:
        row = [w]
        for a in allocs:
            c = cells.get((w, a))
            if c is None or c.ops_median is None:
                row.append("FAIL" if c and c.failures else "-")
                continue
            r = rat.get((w, a))
            sp = c.spread_pct
            txt = human(c.ops_median)
            if r is not None:
                txt += f" {r:.2f}x"
            if sp is not None:
                txt += f" ±{sp / 2:.0f}%"
            if c.failures:
                txt += f" ({c.failures} fail)"
            row.append(txt)
        rows.append(row)
    gm = geomeans(rat, workloads, allocs)
    row = ["geomean ratio"]
    for a in allocs:
        k = sum(rat.get((w, a)) is not None for w in workloads)
        # over fewer workloads than the table's, it says so
        row.append("-" if gm[a] is None else f"{gm[a]:.2f}x" + (f" ({k} of {len(workloads)})" if k < len(workloads) else ""))
    rows.append(row)
    return rows


def paired_rows(samples: Sequence[Sample], cells, workloads, allocs, baseline) -> List[List[str]]:
    """Per workload, the baseline's ops/s over the fastest peer's (of PEERS
    among allocs) in the same round: the median and min-max over the rounds,
    the peer fastest in most of them, and how many rounds counted (one where
    a run of the baseline or of a peer failed cannot be compared, and is
    left out). A round runs every allocator back to back, so its pair shares
    the machine's state of that moment, which the medians of the main
    table, taken over all rounds, do not. Last, the geometric mean of the
    rows' medians."""
    ops = round_ops(samples)
    peers = [a for a in allocs if a in PEERS and a != baseline]
    rows = [[f"workload ({baseline} / fastest peer, same round)", "fastest peer", "median",
             "min-max", "rounds"]]
    meds = []
    for w in workloads:
        ran = [a for a in peers if (w, a) in cells]
        rounds = sorted({r for (ww, a, r) in ops if ww == w and a == baseline})
        if not ran or not rounds:
            continue
        rs, fastest = [], {}
        for r in rounds:
            x = ops.get((w, baseline, r))
            ys = [(ops.get((w, a, r)), a) for a in ran]
            if not x or any(not y for y, _ in ys):
                continue
            y, a = max(ys)
            rs.append(x / y)
            fastest[a] = fastest.get(a, 0) + 1
        counted = f"{len(rs)} of {len(rounds)}"
        if not rs:
            rows.append([w, "-", "-", "-", counted])
            continue
        peer, k = max(fastest.items(), key=lambda kv: kv[1])
        lo, hi = spread(rs)
        meds.append(median(rs))
        rows.append([w, peer if k == len(rs) else f"{peer} {k}/{len(rs)}", f"{meds[-1]:.3f}x",
                     f"{lo:.2f}-{hi:.2f}", counted])
    if meds:
        rows.append(["geomean", "", f"{geomean(meds):.3f}x", "",
                     f"{len(meds)} of {len(rows) - 1} workloads"])
    return rows


def round_ops(samples: Sequence[Sample]) -> Dict[Tuple[str, str, int], Optional[float]]:
    """ops/s by (workload, allocator, round) of the measured rounds; None for a failed run."""
    return {(s.workload, s.allocator, s.round): s.result.ops_per_s if s.result.ok else None
            for s in samples if s.round > 0}


def column_rows(samples: Sequence[Sample], workloads, allocs, baseline) -> List[List[str]]:
    """Per workload, each column that is neither the baseline nor a peer (a
    --alloc or --rev build) over the baseline in the same round: the median,
    the middle half and the min-max of those ratios, and how many rounds
    counted. How one build is measured against another: the pair of a
    round shares the machine's state of that moment."""
    ops = round_ops(samples)
    others = [a for a in allocs if a != baseline and a not in PEERS]
    rows = [[f"workload (column / {baseline}, same round)", "column", "median", "middle half",
             "min-max", "rounds"]]
    for w in workloads:
        rounds = sorted({r for (ww, a, r) in ops if ww == w and a == baseline})
        for a in others:
            rs = sorted(x for x in (ratio(ops.get((w, a, r)), ops.get((w, baseline, r)))
                                    for r in rounds) if x)
            counted = f"{len(rs)} of {len(rounds)}"
            if not rs:
                rows.append([w, a, "-", "-", "-", counted])
                continue
            quarter = (len(rs) - 1) / 4
            lo, hi = spread(rs)
            rows.append([w, a, f"{median(rs):.3f}x",
                         f"{rs[math.floor(quarter)]:.3f}-{rs[math.ceil(3 * quarter)]:.3f}",
                         f"{lo:.2f}-{hi:.2f}", counted])
    return rows


def rss_rows(cells, workloads, allocs) -> List[List[str]]:
    rows = [["workload (peak RSS MiB / median wall s)"] + list(allocs)]
    for w in workloads:
        row = [w]
        for a in allocs:
            c = cells.get((w, a))
            if c is None or c.maxrss_kib is None:
                row.append("-")
            else:
                row.append(f"{c.maxrss_kib / 1024:.1f} / {c.wall_median:.2f}")
        rows.append(row)
    return rows


def format_table(cells, workloads, allocs, baseline, md: bool = False,
                 samples: Sequence[Sample] = ()) -> str:
    """The throughput table, the round-by-round ones if samples are given
    (against the fastest peer, if one ran; of the other columns, if any), and
    the RSS table."""
    out = [_table(throughput_rows(cells, workloads, allocs, baseline), md)]
    for rows in (paired_rows(samples, cells, workloads, allocs, baseline),
                 column_rows(samples, workloads, allocs, baseline)):
        if len(rows) > 1:
            out.append(_table(rows, md))
    out.append(_table(rss_rows(cells, workloads, allocs), md))
    return "\n\n".join(out)


CSV_FIELDS = ["workload", "allocator", "round", "position", "ok", "rc", "ops_per_s", "wall_s",
              "user_s", "sys_s", "maxrss_kib", "result_line", "command"]


def write_csv(path: str, samples: Sequence[Sample]):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for s in samples:
            w.writerow(csv_row(s))


def csv_row(s: Sample) -> List:
    r = s.result
    line = next((l for l in r.stdout.splitlines() if "ops/s=" in l), "")
    return [s.workload, s.allocator, s.round, s.position, int(r.ok), r.rc,
            "" if r.ops_per_s is None else f"{r.ops_per_s:.0f}", f"{r.wall_s:.4f}",
            f"{r.user_s:.4f}", f"{r.sys_s:.4f}", r.maxrss_kib, line, s.command]


def read_csv(path: str) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_samples(path: str) -> List[Sample]:
    """Samples back from a CSV written by write_csv()/csv_row() (enough for
    summarize(), tables and charts; stdout is reduced to the result line)."""
    out = []
    for r in read_csv(path):
        fields, ops = parse_result(r["result_line"])
        res = RunResult(int(r["rc"]), float(r["wall_s"]), float(r["user_s"]), float(r["sys_s"]),
                        int(r["maxrss_kib"]), r["result_line"], "", fields, ops)
        if r["ok"] == "0" and res.ok:  # failed for a reason the CSV has no column for
            res.error = "failed"
        out.append(Sample(r["workload"], r["allocator"], int(r["round"]), int(r["position"]),
                          res, r["command"]))
    return out


def write_markdown(path: str, title: str, cells, workloads: Sequence[Workload],
                   allocs: Sequence[Allocator], baseline: str, meta: Dict[str, str],
                   extra_env: Optional[Dict[str, str]] = None, images: Sequence[str] = (),
                   samples: Sequence[Sample] = ()):
    wn = [w.name for w in workloads]
    an = [a.name for a in allocs]
    out = [f"# {title}", ""]
    for k, v in meta.items():
        out.append(f"- {k}: {v}")
    out += ["", "Throughput: median ops/s over the rounds, ratio = allocator / "
            f"{baseline} (higher is faster), ± = half the min-max spread in % of the median.", "",
            _table(throughput_rows(cells, wn, an, baseline), True), ""]
    paired = paired_rows(samples, cells, wn, an, baseline)
    if len(paired) > 1:
        out += [f"{baseline} against the fastest peer ({', '.join(PEERS)}) of each round: "
                f"{baseline}'s ops/s over that peer's, the median and the range over the rounds "
                "where every one ran; the geometric mean of the medians last.", "",
                _table(paired, True), ""]
    columns = column_rows(samples, wn, an, baseline)
    if len(columns) > 1:
        out += [f"Each other column against {baseline} in each round: its ops/s over {baseline}'s, "
                "the median, the middle half and the range of those ratios over the rounds "
                "where both ran.", "", _table(columns, True), ""]
    out += ["Peak RSS (max ru_maxrss over the rounds) and median wall time:", "",
            _table(rss_rows(cells, wn, an), True), ""]
    errs = [c for c in cells.values() if c.error]
    if errs:
        out += ["Failures:", ""]
        out += [f"- {c.workload} / {c.allocator}: {c.failures} failed run(s), {c.error}" for c in errs]
        out.append("")
    for img in images:
        out += [f"![{os.path.basename(img)}]({os.path.basename(img)})", ""]
    out += ["## Commands", "", "Each run is exactly (clean environment):", "", "```"]
    for a in allocs:
        for w in workloads:
            out.append(command_line(w.argv, clean_env(a, extra_env)))
    out += ["```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def plot_gnuplot(prefix: str, cells, workloads: Sequence[str], allocs: Sequence[str],
                 baseline: str, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
                 title: str = "") -> List[str]:
    """Two PNG charts: relative throughput per workload (clustered bars,
    baseline = 1) and peak RSS per workload (MiB, log scale).  Returns the
    files written ([] if gnuplot is unavailable)."""
    gp = shutil.which("gnuplot")
    if not gp:
        log("gnuplot not found: skipping PNG charts (apt-get install gnuplot-nox)")
        return []
    rat = ratios(cells, workloads, allocs, baseline)
    dat = prefix + "-plot.dat"
    with open(dat, "w") as f:
        f.write("workload " + " ".join(allocs) + " " + " ".join(allocs) + "\n")
        for w in workloads:
            vals = []
            for a in allocs:
                r = rat.get((w, a))
                vals.append("NaN" if r is None else f"{r:.4f}")
            for a in allocs:
                c = cells.get((w, a))
                vals.append("NaN" if not c or c.maxrss_kib is None else f"{c.maxrss_kib / 1024:.2f}")
            f.write('"' + w.replace('"', "'") + '" ' + " ".join(vals) + "\n")
    n = len(allocs)
    width = max(900, 95 * len(workloads) + 200)
    thr, rss = prefix + "-throughput.png", prefix + "-rss.png"
    common = f"""
set terminal pngcairo size {width},560 noenhanced font ",10"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set xtics rotate by -35 scale 0 nomirror
set key outside top center horizontal reverse Left samplen 2 width 1
set xrange [-0.6:{len(workloads) - 0.4}]
set grid ytics
set border 3
set ytics nomirror
"""
    script = common + f"""
set output '{thr}'
set title '{title + ": " if title else ""}throughput relative to {baseline} (higher is better)'
set ylabel 'ops/s / {baseline} ops/s'
set logscale y 2
set yrange [*:*]
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lw 1.5 lc rgb 'black' front
plot '{dat}' using 2:xtic(1) title columnheader(2)""" + "".join(
        f", '' using {i + 2} title columnheader({i + 2})" for i in range(1, n)) + f"""
unset arrow 1
set output '{rss}'
set title '{title + ": " if title else ""}peak RSS per workload (lower is better)'
set ylabel 'peak RSS, MiB (log scale)'
set logscale y 10
plot '{dat}' using {n + 2}:xtic(1) title columnheader({n + 2})""" + "".join(
        f", '' using {n + 2 + i} title columnheader({n + 2 + i})" for i in range(1, n)) + "\n"
    gpf = prefix + "-plot.gp"
    with open(gpf, "w") as f:
        f.write(script)
    r = subprocess.run([gp, gpf], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        log("gnuplot failed: " + r.stderr.strip()[-300:])
        return []
    return [thr, rss]


# ---------------------------------------------------------------------------
# Instruction counts (callgrind)

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def callgrind_instructions(cmd: Sequence[str], env: Dict[str, str], toggle: str = "bench_work*",
                           timeout: float = 900.0) -> Tuple[Optional[int], RunResult]:
    """Instructions executed inside functions matching `toggle` (and their
    callees) under valgrind --tool=callgrind.  Returns (Ir or None, result)."""
    vg = shutil.which("valgrind")
    if not vg:
        raise FileNotFoundError("valgrind not found (apt-get install valgrind)")
    full = [vg, "--tool=callgrind", "--callgrind-out-file=/dev/null",
            f"--toggle-collect={toggle}", *cmd]
    # valgrind must see LD_PRELOAD for the client; it passes it through.
    res = run_once(full, env, timeout=timeout)
    m = _COLLECTED.findall(res.stderr)
    return (int(m[-1]) if m else None), res
