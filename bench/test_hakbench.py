"""Unit tests of tools/hakbench.py (run by tests/sh_bench.sh):
   python3 -m unittest discover -s bench -p 'test_hakbench.py'"""
import io
import math
import os
import sys
import tempfile
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
        for r, (h, mi, tc, sec) in enumerate([(100, 50, 80, 500), (110, 60, 130, 500),
                                              (90, 40, 95, 500)], 1):
            ss += [sample("w", "hakmem", r, h), sample("w", "mimalloc", r, mi),
                   sample("w", "tcmalloc", r, tc), sample("w", "hakmem-secure", r, sec)]
        allocs = ["hakmem", "mimalloc", "tcmalloc", "hakmem-secure"]
        cells = hb.summarize(ss)
        rows = hb.paired_rows(ss, cells, ["w"], allocs, "hakmem")
        self.assertEqual(len(rows), 2)
        # tcmalloc's median (95) beats mimalloc's; hakmem-secure is no peer;
        # per round 100/80, 110/130, 90/95: the median round's pair, not the
        # ratio of the medians (100/95)
        self.assertEqual(rows[1][:3], ["w", "tcmalloc", f"{90 / 95:.3f}x"])
        self.assertEqual(rows[1][3], f"{110 / 130:.2f}-{100 / 80:.2f}")
        self.assertEqual(hb.paired_rows(ss, cells, ["w"], ["hakmem", "hakmem-secure"], "hakmem"),
                         [rows[0]])  # no peer, no row
        self.assertIn(f"{90 / 95:.3f}x", hb.format_table(cells, ["w"], allocs, "hakmem", samples=ss))
        self.assertNotIn("best peer", hb.format_table(cells, ["w"], allocs, "hakmem"))

    def test_failures_counted(self):
        cells = hb.summarize([sample("w", "a", 1, None, rc=1), sample("w", "a", 2, 5)])
        self.assertEqual((cells[("w", "a")].failures, cells[("w", "a")].n), (1, 1))

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

    def test_progress_plain(self):
        s = io.StringIO()
        p = hb.Progress(4, stream=s)
        p.update("w | a | round 1/3", 65)
        self.assertIn("[0/4] w | a | round 1/3  ~1m05s left", s.getvalue())


if __name__ == "__main__":
    unittest.main()
