"""Tests of sim_tables.py's subcommands on tiny hand-written `kvgate sim --json` reports (standard
library only; run by .ci/run):

    python3 scripts/test_sim_tables.py
"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim_tables  # noqa: E402


def run(policy, seed=1, rate=1.0, mean=10.0, p99=20.0, hit=0.5, busy=0.5, gate=(0, 0, 0, 0), mape=0.1,
        cov=0.9, tenths=None, phase=None, goodput=None, tau_eps=None, pods=((1, 0), (0, 0))):
    """One run with what the subcommands read; pods: per pod, its one sample's (running, waiting)."""
    r = {
        "policy": policy, "seed": seed, "rate_scale": rate,
        "ttft_ms": {"mean": mean, "p50": mean, "p99": p99}, "tpot_ms": {"p50": 5.0},
        "prefix_hit_rate": hit, "mean_pod_busy": busy,
        "gate": dict(zip(["explore", "exploit", "no_sticky", "load_break"], gate)),
        "pod_samples": [[{"running": run_, "waiting": wait}] for run_, wait in pods],
        "predictor": {
            "ttft_mape": mape, "tpot_mape": 0.02, "ttft_coverage": 0.5, "online": {"ttft_p90_coverage": cov},
            "ttft_mape_by_tenth": tenths or [mape] * 10,
            "step_phase": phase or {"requests": 10, "busy_requests": 5, "mean_wait_ms": 2.0,
                                    "mean_wait_share": 0.25, "ttft_mape": mape, "ttft_mape_phase_known": mape / 2},
        },
    }
    if goodput is not None:
        r["slo_goodput"] = goodput
    if tau_eps:
        r["gate_state"] = {"affinity_gate_tau": tau_eps[0], "epsilon_explore_sticky": tau_eps[1]}
    return r


class SimTables(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, runs, model=None):
        path = os.path.join(self.dir.name, name)
        report = {"workload": {"params": {"kind": "chat"}, "request_count": 100}, "pods": 2,
                  "profile": "llama3-8b-h100", "router_config": {"predictor_model": model} if model else {},
                  "runs": runs}
        with open(path, "w") as f:
            json.dump(report, f)
        return path

    def out(self, *argv):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            sim_tables.main(list(argv))
        text = buf.getvalue()
        self.well_formed(text)
        return text

    def well_formed(self, text):
        """Every table's rows have as many cells as its delimiter row."""
        lines = text.splitlines()
        tables = 0
        for i, line in enumerate(lines):
            if line.startswith("|---"):
                tables += 1
                body = [lines[i - 1]]
                for row in lines[i + 1:]:
                    if not row.startswith("| "):
                        break
                    body.append(row)
                for row in body:
                    self.assertEqual(row.count(" | ") + 1, line.count("|") - 1, row)
        self.assertGreater(tables, 0, text)

    def peers(self):
        # Per seed: round-robin 20 / 40 ms, least-kv 10 / 50, llmd-chain 5 / 60, latency 12 / 30;
        # the gate 9 / 36 on seed 1 and 11 / 36 on seed 2.
        runs = []
        for seed, gate_mean in [(1, 9.0), (2, 11.0)]:
            runs += [run("round-robin", seed, mean=20.0, p99=40.0), run("least-kv", seed, mean=10.0, p99=50.0),
                     run("llmd-chain", seed, mean=5.0, p99=60.0), run("latency", seed, mean=12.0, p99=30.0),
                     run("affinity-gate", seed, mean=gate_mean, p99=36.0, gate=(1, 2, 3, 4 * seed))]
        return self.write("peers.json", runs)

    def test_sim(self):
        text = self.out("sim", self.peers())
        self.assertIn("workload: chat, 100 requests, 2 pods × llama3-8b-h100", text)
        self.assertIn("| affinity-gate | 10.0 | 10.0 | 36.0 | 50.0 | 50.0 | 1.0 | 1/2/3/6 |", text)
        # The best peer counts llmd-chain: 5 ms on the mean, round-robin's 40 ms on the p99.
        self.assertIn("- affinity-gate / best peer (llmd-chain), mean TTFT: 2.000 [1.800–2.200]; "
                      "/ latency: 0.833 [0.750–0.917]", text)
        self.assertIn("- affinity-gate / best peer (round-robin), p99 TTFT: 0.900 [0.900–0.900]", text)
        self.assertIn("- latency / best peer", self.out("sim", self.peers(), "--focus", "latency"))

    def test_gate_leaves_llmd_chain_out_and_peer_ratio_names_it(self):
        peers = self.peers()
        variant = self.write("eps-0.1.json", [run("affinity-gate", s, mean=20.0, p99=45.0) for s in (1, 2)])
        text = self.out("gate", peers, variant)
        self.assertIn("| affinity-gate (as run with the peers) | 1.000 [0.900–1.100] | 0.900 [0.900–0.900] "
                      "| 0.833 [0.750–0.917] | 1.200 [1.200–1.200] | 50.0 | 1.0 | 1/2/3/6 |", text)
        self.assertIn("| eps-0.1 | 2.000 [2.000–2.000] | 1.125 [1.125–1.125] |", text)
        text = self.out("peer-ratio", peers, variant)
        self.assertIn("Best peer: mean llmd-chain; p99 round-robin.", text)
        self.assertIn("| eps-0.1 | 20.0 | 45.0 | 4.000 [4.000–4.000] | 1.125 [1.125–1.125] | 5.00 | 50.0 | 0/0/0/0 |",
                      text)

    def test_variant(self):
        base = self.write("base.json", [run("affinity-gate", s, mean=10.0, p99=20.0, goodput=0.9,
                                            tau_eps=(0.8, 0.01)) for s in (1, 2)])
        other = self.write("slo.json", [run("affinity-gate", 1, mean=12.0, p99=30.0, goodput=0.8),
                                        run("affinity-gate", 2, mean=14.0, p99=30.0, goodput=0.7)])
        text = self.out("variant", base, other)
        self.assertIn("| variant | TTFT mean ms | / base | p99 ms | / base | hit % | goodput % | final τ / ε |", text)
        self.assertIn("| base | 10.0 | 1.000 [1.000–1.000] | 20.0 | 1.000 [1.000–1.000] | 50.0 | 90.0 "
                      "| 0.80, 0.80 / 0.010, 0.010 |", text)
        self.assertIn("| slo | 13.0 | 1.300 [1.200–1.400] | 30.0 | 1.500 [1.500–1.500] | 50.0 | 75.0 | – |", text)
        # Without SLOs, no goodput column.
        self.assertNotIn("goodput", self.out("variant", self.write("a.json", [run("affinity-gate")])))

    def test_predictor(self):
        base = self.write("baselines.json", [run("least-kv", mean=10.0, p99=20.0), run("round-robin", mean=15.0),
                                             run("llmd-chain", mean=1.0)])
        rls = self.write("rls.json", [run("affinity-gate", busy=0.4, mape=0.12, cov=0.88, mean=9.0, p99=30.0)],
                         model="rls")
        text = self.out("predictor", base, rls, "blind=" + rls)
        self.assertIn("| 1.0 | rls | 40.0 | 12.0 | 2.0 | 50.0 | 88.0 |", text)
        self.assertIn("| 1.0 | blind | 40.0 |", text)
        self.assertIn("| 1.0 | affinity-gate (rls) | 9.0 | 30.0 | 50.0 | 0.900 | 1.500 |", text)
        self.assertIn("| 1.0 | best baseline: least-kv | 10.0 | 20.0 | 50.0 | 1 | 1 |", text)  # not llmd-chain
        self.assertIn("| 1.0 | affinity-gate (rls) | 9.0 | 30.0 | 50.0 | n/a | n/a |", self.out("predictor", rls))

    def test_predictor_cross(self):
        files = []
        for w, busy in [("chat", 0.5), ("sp", 0.99), ("mc", 0.6)]:
            for model, mape in [("rls", 0.2), ("min8", 0.1)]:
                scale = {"chat": 1.0, "sp": 2.0, "mc": 3.0}[w]
                path = self.write(f"{w}-{model}.json", [run("affinity-gate", busy=busy, mape=mape * scale,
                                                            cov=0.9, mean=10.0 * scale, p99=20.0,
                                                            pods=((1, 1), (1, 0)))])
                files.append(f"{w}:{model}={path}")
        text = self.out("predictor-cross", "--fit", "chat", *files)
        self.assertIn("| chat (fit) | 1 | 50.0 | 50.0 | 20.0 | 90.0 | 10.0 | 90.0 |", text)
        # Held out: sp (99 % busy, 40 / 20 %) and mc (60 % busy, 60 / 30 %).
        self.assertIn("| rls | 60.0 | 40.0 | 60.0 | 50.0 | 90.0–90.0 |", text)
        self.assertIn("| min8 | 30.0 | 20.0 | 30.0 | 25.0 | 90.0–90.0 |", text)
        self.assertIn("| mc | 1 | 30.0 / 20 | 30.0 / 20 | 1.000, 1.000 |", text)
        one = self.out("predictor-cross", *[f for f in files if ":rls=" in f])
        self.assertIn("| workload | rate | rls TTFT mean / p99 ms |\n", one)

    def test_mape_by_tenth(self):
        tenths = [0.5, 0.3] + [0.025] * 8
        path = self.write("a.json", [run("affinity-gate", mape=0.1, tenths=tenths), run("latency")])
        self.assertIn("| cold | 1 | 10.0 | 50.0 | 30.0 | 2.5 | 50 % |", self.out("mape-by-tenth", "cold=" + path))

    def test_step_phase(self):
        phase = {"requests": 10, "busy_requests": 4, "mean_wait_ms": 3.0, "mean_wait_share": 0.5,
                 "ttft_mape": 0.2, "ttft_mape_phase_known": 0.05}
        path = self.write("a.json", [run("affinity-gate", busy=0.7, phase=phase)])
        self.assertIn("| chat | 1 | 70.0 | 40.0 | 3.0 | 0.50 | 20.0 | 5.0 | 75% |", self.out("step-phase", "chat=" + path))


if __name__ == "__main__":
    unittest.main()
