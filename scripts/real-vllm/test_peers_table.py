"""Tests of peers_table.py's statistics, peers_run.py's counters and quiet.py's /proc reading, on
synthetic records (standard library only):

    python3 -m unittest discover -s scripts/real-vllm -p 'test_peers_table.py'
"""
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_run  # noqa: E402
import peers_table as pt  # noqa: E402
import quiet  # noqa: E402


def rec(i, ttft, e2e, out, sent=0.0, error=None):
    return {"id": i, "sent_unix_ms": sent, "ttft_ms": ttft, "e2e_ms": e2e, "output_tokens": out,
            "error": error}


class Metrics(unittest.TestCase):
    def test_nearest_rank_as_loadgen(self):
        xs = list(range(1, 101))
        self.assertEqual(pt.nearest_rank(xs, 0.90), 90)
        self.assertEqual(pt.nearest_rank(xs, 0.99), 99)
        self.assertEqual(pt.nearest_rank([5.0], 0.99), 5.0)
        self.assertEqual(pt.nearest_rank(list(range(1, 11)), 0.99), 10)
        self.assertIsNone(pt.nearest_rank([], 0.5))

    def test_run_figures(self):
        # 10 requests sent 100 ms apart, TTFT 10..100 ms, 11 tokens in (e2e - ttft) = 100 ms, one
        # failed request that ends last (its time counts in the span, its tokens do not).
        rs = [rec(i, 10.0 * (i + 1), 10.0 * (i + 1) + 100.0, 11, sent=1e6 + 100 * i) for i in range(10)]
        rs.append(rec(10, None, 5000.0, 0, sent=1e6 + 1000, error="timeout"))
        m = pt.metrics(rs, hit=0.25)
        self.assertEqual(m["requests"], 11)
        self.assertEqual(m["errors"], 1)
        self.assertAlmostEqual(m["ttft_mean"], 55.0)
        self.assertEqual(m["ttft_p90"], 90.0)
        self.assertEqual(m["ttft_p99"], 100.0)
        self.assertAlmostEqual(m["tpot_p99"], 10.0)
        self.assertAlmostEqual(m["span_s"], 6.0)  # 1e6 .. 1e6 + 1000 + 5000 ms
        self.assertAlmostEqual(m["tok_s"], 110 / 6.0)
        self.assertEqual(m["hit"], 0.25)

    def test_each_pods_share_of_the_prompt_tokens(self):
        before = {"http://b": {"hits": 0, "queries": 100}, "http://a": {"hits": 5, "queries": 50}}
        after = {"http://b": {"hits": 10, "queries": 100}, "http://a": {"hits": 35, "queries": 350}}
        c = pt.Cell({"disturbed": False}, [rec(0, 5.0, 5.0, 1)], before, after)
        self.assertEqual(c.shares, [1.0, 0.0])  # a served every query, b none
        self.assertEqual((c.hits, c.queries), (40, 300))
        self.assertIsNone(pt.Cell({}, [rec(0, 5.0, 5.0, 1)]).shares)

    def test_one_token_requests_have_no_tpot(self):
        m = pt.metrics([rec(0, 5.0, 5.0, 1)])
        self.assertIsNone(m["tpot_p99"])
        self.assertEqual(m["ttft_mean"], 5.0)


class Bootstrap(unittest.TestCase):
    def test_median(self):
        self.assertEqual(pt.median([3, 1, 2]), 2)
        self.assertEqual(pt.median([4, 1, 2, 3]), 2.5)

    def test_constant_ratios_give_a_point(self):
        self.assertEqual(pt.bootstrap_median([0.8] * 5, 2000, "s"), (0.8, 0.8, 0.8))

    def test_interval_of_five_rounds_is_their_range(self):
        # A median of 5 rounds resampled falls on the smallest ratio when ≥ 3 of the 5 draws are
        # it: P = 5.8 % > 5 %, so the 90 % interval of 5 rounds is [min, max] (distribution-free
        # coverage of the median: 1 - 2 / 2^5 = 93.75 %).
        ratios = [0.9, 0.7, 1.6, 1.0, 1.1]
        a = pt.bootstrap_median(ratios, 10000, "x")
        self.assertEqual(a, pt.bootstrap_median(ratios, 10000, "x"))  # seeded
        self.assertEqual(a, (1.0, 0.7, 1.6))

    def test_interval_of_more_rounds_is_inside_the_range(self):
        ratios = [0.60, 0.70, 0.75, 0.80, 0.85, 0.90, 1.00, 1.20, 1.50]
        med, lo, hi = pt.bootstrap_median(ratios, 10000, "y")
        self.assertEqual(med, 0.85)
        self.assertIn(lo, ratios)
        self.assertIn(hi, ratios)
        self.assertTrue(0.60 < lo < med < hi < 1.50)

    def test_coverage_on_synthetic_rounds(self):
        # Ratios drawn around 0.8, 5 rounds: the interval holds 0.8 about 94 % of the time.
        import random
        rng = random.Random(7)
        held = 0
        for t in range(100):
            ratios = [0.8 * rng.lognormvariate(0, 0.1) for _ in range(5)]
            _, lo, hi = pt.bootstrap_median(ratios, 1000, f"c{t}")
            held += lo <= 0.8 <= hi
        self.assertGreaterEqual(held, 85)

    def test_too_few(self):
        self.assertEqual(pt.bootstrap_median([], 10), (None, None, None))
        self.assertEqual(pt.bootstrap_median([1.2], 10), (1.2, None, None))
        self.assertEqual(pt.fmt_ratio(1.2, None, None), "×1.20 [n/a]")
        self.assertEqual(pt.fmt_ratio(0.5, 0.4, 0.6), "×0.50 [0.40–0.60] †")
        self.assertEqual(pt.fmt_ratio(0.9, 0.8, 1.1), "×0.90 [0.80–1.10]")


def write_cell(root, w, k, router, records, disturbed=False, hits=None, sitting="S1"):
    d = os.path.join(root, w, f"round-{k}")
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, router)
    with open(base + ".requests.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    meta = {"workload": w, "round": k, "router": router, "disturbed": disturbed,
            "quiet_watched": True, "sitting": sitting, "quiet_threshold_pct": 5}
    if hits is not None:
        before = {"a": {"hits": 0, "queries": 0}, "b": {"hits": 10, "queries": 10}}
        after = {"a": {"hits": hits[0], "queries": hits[1]}, "b": {"hits": 10, "queries": 10}}
        for name, obj in (("pods-before", before), ("pods-after", after)):
            with open(f"{base}.{name}.json", "w") as f:
                json.dump(obj, f)
        meta["pods_hit_rate"] = peers_run.hit_rate(before, after)
    with open(base + ".meta.json", "w") as f:
        json.dump(meta, f)


class Table(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        # 6 rounds; the peer's TTFT is half kvgate's in every round, its throughput the same;
        # round 3's peer run is disturbed and ×10 slower; round 6 has no kvgate run.
        for k in range(1, 7):
            t = 100.0 * k
            base = [rec(i, t, t + 90.0, 10, sent=1000.0 * i) for i in range(20)]
            peer = [rec(i, t / 2, t / 2 + 90.0, 10, sent=1000.0 * i) for i in range(20)]
            if k == 3:
                peer = [rec(i, t * 5, t * 5 + 90.0, 10, sent=1000.0 * i) for i in range(20)]
            if k != 6:
                write_cell(self.root, "chat", k, "kvgate-routed", base, hits=(40, 100))
            write_cell(self.root, "chat", k, "sglang-cache", peer, disturbed=(k == 3), hits=(30, 100))
        os.makedirs(os.path.join(self.root, "sittings", "S1"))
        with open(os.path.join(self.root, "sittings", "S1", "machine.txt"), "w") as f:
            f.write("machine: test CPU\n")

    def tearDown(self):
        self.dir.cleanup()

    def test_pairs_leave_out_disturbed_and_missing_rounds(self):
        cells = pt.load_workload(os.path.join(self.root, "chat"))
        pr = pt.paired_ratios(cells, "sglang-cache", "ttft_mean")
        self.assertEqual([k for k, _ in pr], [1, 2, 4, 5])
        self.assertTrue(all(abs(x - 0.5) < 1e-12 for _, x in pr))
        kept = pt.paired_ratios(cells, "sglang-cache", "ttft_mean", keep_disturbed=True)
        self.assertEqual([k for k, _ in kept], [1, 2, 3, 4, 5])
        hit = pt.paired_ratios(cells, "sglang-cache", "hit")
        self.assertTrue(all(abs(x - 0.75) < 1e-12 for _, x in hit))

    def test_table_output(self):
        buf = io.StringIO()
        pt.table(self.root, "chat", resamples=500, file=buf)
        text = buf.getvalue()
        self.assertIn("Rounds: 6 (1–6)", text)
        self.assertIn("Disturbed rounds: 1 (3)", text)
        row = next(line for line in text.splitlines() if line.startswith("| sglang-cache | 4 |"))
        self.assertIn("×0.50 [0.50–0.50] †", row)  # TTFT mean
        self.assertIn("×0.75 [0.75–0.75] †", row)  # hit rate
        self.assertIn("×1.00 [1.00–1.00]", row)  # throughput
        self.assertIn("fewer than 5 paired rounds for sglang-cache", text)
        self.assertIn("machine: test CPU", text)
        # The merged table: kvgate's 5 runs, 100 requests, pooled hit rate Σ/Σ = 40 %.
        merged = next(line for line in text.splitlines() if line.startswith("| kvgate-routed | 5 | 100 |"))
        self.assertIn("| 40.0 |", merged)

    def test_aim_against_the_best_peer(self):
        # The peer is ×0.5 kvgate's TTFT: kvgate ÷ the best peer is ×2.00, the aim not met;
        # a second, slower peer (×2 kvgate's) is not the best one.
        for k in range(1, 7):
            t = 100.0 * k
            write_cell(self.root, "chat", k, "round-robin",
                       [rec(i, 2 * t, 2 * t + 90.0, 10, sent=1000.0 * i) for i in range(20)])
        buf = io.StringIO()
        pt.table(self.root, "chat", resamples=200, file=buf)
        text = buf.getvalue()
        self.assertIn("kvgate-routed ÷ the best peer router (sglang-cache, round-robin)", text)
        row = next(line for line in text.splitlines() if line.startswith("| TTFT mean |"))
        self.assertEqual(row, "| TTFT mean | sglang-cache | ×2.00 [2.00–2.00] | 0.00 | not met |")
        # Against the slower peer alone, kvgate is ×0.50: met (width 0, upper bound ≤ 1.05).
        buf = io.StringIO()
        pt.table(self.root, "chat", routers=["kvgate-routed", "round-robin"], resamples=200, file=buf)
        row = next(line for line in buf.getvalue().splitlines() if line.startswith("| TTFT p99 |"))
        self.assertEqual(row, "| TTFT p99 | round-robin | ×0.50 [0.50–0.50] | 0.00 | met |")

    def test_cli(self):
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, os.path.join(here, "peers_table.py"), self.root,
                            "--resamples", "200"], capture_output=True, text=True, check=True)
        self.assertIn("### Workload chat", r.stdout)


class Counters(unittest.TestCase):
    def test_parse(self):
        text = ('# HELP x\nvllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 30.0\n'
                'vllm:prefix_cache_queries_total{engine="0"} 100\n'
                'vllm:prefix_cache_queries_total{engine="1"} 20\n'
                'vllm:prefix_cache_hits_total_other 5\n')
        self.assertEqual(peers_run.parse_counters(text), {"hits": 30.0, "queries": 120.0})
        self.assertIsNone(peers_run.parse_counters("vllm:prefix_cache_hits_total 3\n"))

    def test_hit_rate(self):
        b = {"u": {"hits": 10, "queries": 100}, "v": {"hits": 0, "queries": 0}}
        a = {"u": {"hits": 40, "queries": 200}, "v": {"hits": 20, "queries": 100}}
        self.assertAlmostEqual(peers_run.hit_rate(b, a), 50 / 200)
        self.assertIsNone(peers_run.hit_rate(b, {"u": a["u"], "v": None}))


class Quiet(unittest.TestCase):
    def test_parse_stat_with_odd_comm(self):
        raw = ("4242 (a b) c)) S 1 4242 4242 0 -1 4194304 0 0 0 0 250 50 0 0 20 5 1 0 12345 0 0 "
               + " ".join(["0"] * 30))
        p = quiet.parse_stat(raw)
        self.assertEqual((p.pid, p.comm, p.ppid, p.pgrp, p.session), (4242, "a b) c)", 1, 4242, 4242))
        self.assertEqual((p.ticks, p.nice, p.start, p.kthread), (300, 5, 12345, False))

    def test_harness_set_descendants_and_sessions(self):
        def proc(pid, ppid, session):
            p = quiet.Proc()
            p.pid, p.ppid, p.pgrp, p.session, p.comm = pid, ppid, pid, session, "x"
            return p
        procs = {p.pid: p for p in [proc(10, 1, 10), proc(11, 10, 10), proc(12, 11, 10),
                                    proc(20, 1, 20), proc(21, 20, 20), proc(30, 1, 30)]}
        self.assertEqual(quiet.harness_set(procs, {11}, {20}, set()), {11, 12, 20, 21})

    def test_check_sees_a_busy_child_unless_excluded(self):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.2)
            s = quiet.Sampler((set(), set(), set()))
            time.sleep(1.0)
            sample = s.sample()
            self.assertIn(busy.pid, [p.pid for _, p in quiet.culprits(sample, 5)])
            s = quiet.Sampler(({os.getpid()}, set(), set()))
            time.sleep(1.0)
            sample = s.sample()
            self.assertNotIn(busy.pid, [p.pid for _, p in quiet.culprits(sample, 5)])
        finally:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    unittest.main()
