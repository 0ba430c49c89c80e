"""Tests of sim_check.py's replay arguments and real-run figures, on synthetic records
(standard library only):

    python3 -m unittest discover -s scripts/real-vllm -p 'test_sim_check.py'
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_table as pt  # noqa: E402
import sim_check  # noqa: E402


class ReplayArgs(unittest.TestCase):
    def test_mooncake_replays_the_slice_on_the_runs_pods(self):
        params = {"workload": "mooncake", "requests": "60", "rate_scale": "2", "npods": "1"}
        args = sim_check.sim_args(params, 3, "/out")
        self.assertEqual(args[:2], ["--trace", "/out/mooncake/slice.jsonl"])
        self.assertEqual(args[-4:], ["--rate-scale", "2", "--pods", "1"])

    def test_a_generated_workload_replays_round_ks_seed(self):
        params = {"workload": "chat", "requests": "80", "rate_scale": "1.5", "workload_seed": "round",
                  "max_context_tokens": "1700"}
        args = sim_check.sim_args(params, 4, "/out")
        self.assertEqual(args[args.index("--workload-seed") + 1], "4")
        self.assertEqual(args[args.index("--max-context-tokens") + 1], "1700")
        # Two pods unless the run recorded otherwise (older sittings did not record it).
        self.assertEqual(args[-2:], ["--pods", "2"])
        fixed = dict(params, workload_seed="7")
        args = sim_check.sim_args(fixed, 4, "/out")
        self.assertEqual(args[args.index("--workload-seed") + 1], "7")


class RealFigures(unittest.TestCase):
    def test_p50_mean_tpot_and_hit_percent(self):
        recs = [{"id": i, "sent_unix_ms": 1e6 + i, "ttft_ms": 10.0 * (i + 1),
                 "e2e_ms": 10.0 * (i + 1) + 20.0 * i, "output_tokens": 21, "error": None}
                for i in range(5)]
        recs.append({"id": 5, "sent_unix_ms": 1e6, "ttft_ms": None, "e2e_ms": 1.0,
                     "output_tokens": 0, "error": "timeout"})
        cell = pt.Cell({"pods_hit_rate": 0.25}, recs)
        f = sim_check.real_figures(cell)
        self.assertEqual(f["ttft_p50"], 30.0)
        # TPOT per request: 20 i ms over 20 gaps = i ms; mean of 0..4 = 2.
        self.assertAlmostEqual(f["tpot_mean"], 2.0)
        self.assertAlmostEqual(f["hit"], 25.0)
        self.assertAlmostEqual(f["ttft_mean"], 30.0)


if __name__ == "__main__":
    unittest.main()
