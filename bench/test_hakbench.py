"""Unit tests of tools/hakbench.py (run by tests/sh_bench.sh):
   python3 -m unittest discover -s bench -p 'test_hakbench.py'"""
import io
import math
import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import hakbench as hb  # noqa: E402


class Stats(unittest.TestCase):
    def test_median(self):
        self.assertEqual(hb.median([3]), 3)
        self.assertEqual(hb.median([3, 1, 2]), 2)
        self.assertEqual(hb.median([4, 1, 3, 2]), 2.5)
        self.assertRaises(ValueError, hb.median, [])

    def test_spread(self):
        self.assertEqual(hb.spread([5, 1, 9]), (1, 9))
        self.assertAlmostEqual(hb.spread_pct([90, 100, 110]), 20.0)

    def test_ratio(self):
        self.assertAlmostEqual(hb.ratio(93, 100), 0.93)
        self.assertIsNone(hb.ratio(None, 100))
        self.assertIsNone(hb.ratio(1, 0))

    def test_geomean(self):
        self.assertAlmostEqual(hb.geomean([2, 8]), 4.0)
        self.assertAlmostEqual(hb.geomean([1, 1, 1]), 1.0)
        self.assertAlmostEqual(hb.geomean([0.5, 2.0, None]), 1.0)
        self.assertIsNone(hb.geomean([]))
        self.assertIsNone(hb.geomean([None, 0]))

    def test_rotated(self):
        self.assertEqual(hb.rotated([1, 2, 3], 0), [1, 2, 3])
        self.assertEqual(hb.rotated([1, 2, 3], 1), [2, 3, 1])
        self.assertEqual(hb.rotated([1, 2, 3], 5), [3, 1, 2])
        # every item occupies every position once over len(items) rounds
        for pos in range(3):
            self.assertEqual(sorted(hb.rotated([1, 2, 3], r)[pos] for r in range(3)), [1, 2, 3])

    def test_human(self):
        self.assertEqual(hb.human(123456789), "123.5M")
        self.assertEqual(hb.human(1500), "1.5k")
        self.assertEqual(hb.human(None), "-")


class Parsing(unittest.TestCase):
    def test_parse_result(self):
        f, ops = hb.parse_result("noise\nrandom_mixed cycles=20 ws=4 ops/s=123456789 time_s=0.16\n")
        self.assertEqual(ops, 123456789.0)
        self.assertEqual(f["ws"], "4")
        self.assertEqual(f["time_s"], "0.16")
        self.assertEqual(hb.parse_result("no result"), ({}, None))

    def test_alloc_spec(self):
        a = hb.parse_alloc_spec("hakmem-secure=/x/lib.so,HAKMEM_SECURE=1")
        self.assertEqual((a.name, a.lib, a.env), ("hakmem-secure", "/x/lib.so", {"HAKMEM_SECURE": "1"}))
        self.assertIsNone(hb.parse_alloc_spec("sys=none").lib)
        self.assertRaises(ValueError, hb.parse_alloc_spec, "nolib")

    def test_clean_env(self):
        os.environ["HAKMEM_LEAK_TEST"] = "1"
        try:
            e = hb.clean_env(hb.Allocator("x", "/l.so", {"A": "b"}), {"C": "d"})
        finally:
            del os.environ["HAKMEM_LEAK_TEST"]
        self.assertEqual(set(e), {"PATH", "HOME", "LANG", "LD_PRELOAD", "A", "C"})
        self.assertEqual(e["LANG"], "C")
        self.assertNotIn("LD_PRELOAD", hb.clean_env(hb.Allocator("glibc", None)))


def sample(w, a, rnd, ops, rss=1000, rc=0):
    r = hb.RunResult(rc, 0.1, 0.1, 0.0, rss, f"x ops/s={ops}\n" if ops else "", "", {"ops/s": str(ops)},
                     float(ops) if ops else None)
    return hb.Sample(w, a, rnd, 0, r, "cmd")


class Summary(unittest.TestCase):
    def test_summarize_ratio_geomean(self):
        ss = [sample("w1", "hak", 0, 1)]  # warm-up: ignored
        for r, (h, m) in enumerate([(100, 50), (110, 60), (90, 40)], 1):
            ss += [sample("w1", "hak", r, h, rss=2000 + r), sample("w1", "mi", r, m)]
        ss += [sample("w2", "hak", 1, 10), sample("w2", "mi", 1, 40)]
        cells = hb.summarize(ss)
        c = cells[("w1", "hak")]
        self.assertEqual((c.n, c.ops_median, c.ops_min, c.ops_max, c.maxrss_kib), (3, 100, 90, 110, 2003))
        rat = hb.ratios(cells, ["w1", "w2"], ["hak", "mi"], "hak")
        self.assertAlmostEqual(rat[("w1", "mi")], 0.5)
        self.assertAlmostEqual(rat[("w2", "mi")], 4.0)
        gm = hb.geomeans(rat, ["w1", "w2"], ["hak", "mi"])
        self.assertAlmostEqual(gm["hak"], 1.0)
        self.assertAlmostEqual(gm["mi"], math.sqrt(2.0))
        txt = hb.format_table(cells, ["w1", "w2"], ["hak", "mi"], "hak")
        self.assertIn("0.50x", txt)
        self.assertIn("1.41x", txt)

    def test_paired_rows_take_the_fastest_peer_round_by_round(self):
        ss = [sample("w", "hakmem", 0, 1), sample("w", "tcmalloc", 0, 1000)]  # warm-up: ignored
        for r, (h, mi, tc, sec) in enumerate([(100, 50, 80, 500), (110, 120, 130, 500),
                                              (90, 96, 95, 500)], 1):
            ss += [sample("w", "hakmem", r, h), sample("w", "mimalloc", r, mi),
                   sample("w", "tcmalloc", r, tc), sample("w", "hakmem-secure", r, sec)]
        allocs = ["hakmem", "mimalloc", "tcmalloc", "hakmem-secure"]
        cells = hb.summarize(ss)
        rows = hb.paired_rows(ss, cells, ["w"], allocs, "hakmem")
        self.assertEqual(len(rows), 3)
        # hakmem-secure is no peer; per round against the fastest of that round:
        # 100/80 (tcmalloc), 110/130 (tcmalloc), 90/96 (mimalloc, whose median
        # is the lower): the median round's pair, not the ratio of the medians
        self.assertEqual(rows[1], ["w", "tcmalloc 2/3", f"{90 / 96:.3f}x",
                                   f"{110 / 130:.2f}-{100 / 80:.2f}", "3 of 3"])
        self.assertEqual(rows[2][0], "geomean")
        self.assertEqual(rows[2][2], f"{90 / 96:.3f}x")
        self.assertEqual(hb.paired_rows(ss, cells, ["w"], ["hakmem", "hakmem-secure"], "hakmem"),
                         [rows[0]])  # no peer, no row
        self.assertIn(f"{90 / 96:.3f}x", hb.format_table(cells, ["w"], allocs, "hakmem", samples=ss))
        self.assertNotIn("fastest peer", hb.format_table(cells, ["w"], allocs, "hakmem"))

    def test_column_rows_pair_each_build_with_the_baseline_round_by_round(self):
        ss = [sample("w", "hakmem", 0, 1), sample("w", "old", 0, 1000)]  # warm-up: ignored
        for r, (h, old, tc) in enumerate([(100, 110, 90), (200, 180, 90), (100, 130, 90),
                                          (100, None, 90), (50, 60, 90)], 1):
            ss += [sample("w", "hakmem", r, h), sample("w", "old", r, old, rc=0 if old else 1),
                   sample("w", "tcmalloc", r, tc)]
        allocs = ["hakmem", "tcmalloc", "old"]
        rows = hb.column_rows(ss, ["w"], allocs, "hakmem")
        # ratios by round 1.1, 0.9, 1.3, (failed), 1.2: tcmalloc is a peer, not a column
        self.assertEqual(rows[1:], [["w", "old", "1.150x", "0.900-1.300", "0.90-1.30", "4 of 5"]])
        ss += [sample("w", "old", r, 100 * r) for r in range(6, 11)]  # no baseline: not counted
        self.assertEqual(hb.column_rows(ss, ["w"], allocs, "hakmem")[1][5], "4 of 5")
        self.assertEqual(hb.column_rows(ss, ["w"], ["hakmem", "tcmalloc"], "hakmem"), [rows[0]])
        cells = hb.summarize(ss)
        self.assertIn("column / hakmem, same round", hb.format_table(cells, ["w"], allocs, "hakmem",
                                                                      samples=ss))

    def test_paired_rows_leave_out_rounds_with_a_failed_run(self):
        ss = []
        for r, (h, mi) in enumerate([(100, 50), (100, None), (None, 10), (60, 30)], 1):
            ss += [sample("w", "hakmem", r, h, rc=0 if h else 1),
                   sample("w", "mimalloc", r, mi, rc=0 if mi else 1)]
        ss += [sample("v", "hakmem", 1, 5), sample("v", "mimalloc", 1, None, rc=1)]
        cells = hb.summarize(ss)
        rows = hb.paired_rows(ss, cells, ["w", "v"], ["hakmem", "mimalloc"], "hakmem")
        self.assertEqual(rows[1], ["w", "mimalloc", "2.000x", "2.00-2.00", "2 of 4"])
        self.assertEqual(rows[2], ["v", "-", "-", "-", "0 of 1"])
        self.assertEqual(rows[3][2:], ["2.000x", "", "1 of 2 workloads"])
        # the main table's geomean says over how many workloads it is taken
        txt = hb.format_table(cells, ["w", "v"], ["hakmem", "mimalloc"], "hakmem")
        self.assertIn("(1 of 2)", txt)

    def test_failures_counted(self):
        cells = hb.summarize([sample("w", "a", 0, None, rc=1), sample("w", "a", 1, None, rc=1),
                              sample("w", "a", 2, 5)])
        self.assertEqual((cells[("w", "a")].failures, cells[("w", "a")].n), (2, 1))  # warm-up too

    def test_a_library_that_was_not_preloaded_fails_the_run(self):
        err = "ERROR: ld.so: object '/x.so' from LD_PRELOAD cannot be preloaded (cannot open shared object file): ignored.\n"
        r = hb.run_once(["/bin/sh", "-c", f'printf "%s" "{err}" >&2; echo ops/s=5'], hb.clean_env())
        self.assertEqual(r.ops_per_s, 5.0)
        self.assertFalse(r.ok)
        self.assertIn("cannot be preloaded", r.error)
        r = hb.run_once(["/bin/sh", "-c", "echo ops/s=5"], hb.clean_env(hb.Allocator("x", "/nonexistent.so")))
        self.assertFalse(r.ok)
        with tempfile.TemporaryDirectory() as d:  # and still failed when read back
            p = os.path.join(d, "x.csv")
            hb.write_csv(p, [hb.Sample("w", "x", 1, 0, r, "cmd")])
            self.assertFalse(hb.load_samples(p)[0].result.ok)

    def test_csv_roundtrip(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.csv")
            hb.write_csv(p, [sample("w", "a", 1, 7)])
            rows = hb.read_csv(p)
            self.assertEqual(rows[0]["ops_per_s"], "7")
            self.assertEqual(rows[0]["allocator"], "a")


class Running(unittest.TestCase):
    def test_run_once_env_and_rusage(self):
        r = hb.run_once(["/bin/sh", "-c", 'echo "t v=$HAKMEM_X ops/s=42"'], hb.clean_env(None, {"HAKMEM_X": "y"}))
        self.assertTrue(r.ok)
        self.assertEqual(r.ops_per_s, 42.0)
        self.assertEqual(r.fields["v"], "y")
        self.assertGreater(r.maxrss_kib, 0)

    def test_run_once_failure(self):
        r = hb.run_once(["/bin/sh", "-c", "exit 3"], hb.clean_env())
        self.assertFalse(r.ok)
        self.assertEqual(r.rc, 3)

    def test_run_once_timeout_kills_what_the_program_started(self):
        t0 = time.monotonic()
        r = hb.run_once(["/bin/sh", "-c", "sleep 37.5; echo ops/s=1"], hb.clean_env(), timeout=1)
        self.assertTrue(r.timed_out)
        self.assertLess(time.monotonic() - t0, 20)
        left = []
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if b"37.5" in f.read():
                        left.append(d)
            except OSError:
                pass
        self.assertEqual(left, [])

    def test_progress_plain(self):
        s = io.StringIO()
        p = hb.Progress(4, stream=s)
        p.update("w | a | round 1/3", 65)
        self.assertIn("[0/4] w | a | round 1/3  ~1m05s left", s.getvalue())


if __name__ == "__main__":
    unittest.main()
