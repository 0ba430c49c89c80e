#!/usr/bin/env python3
"""Affinity-gate variants against every peer policy, with the best peer named (standard library only).

Usage: scripts/peer_ratio_table.py PEERS.json VARIANT.json [VARIANT.json ...]

PEERS.json is a `kvgate sim --policy all --json` run (or any run holding the peers); each
VARIANT.json an `--policy affinity-gate` run with some router config on the same workload, pods,
rate scales and seeds (its file name names the variant). "Best peer" is, per seed and metric,
the best of every policy in PEERS.json that is not kvgate's own (`affinity-gate`, `latency`):
upstream's `llmd-chain` included, unlike `scripts/gate_table.py`. Ratios are mean [min–max]
over the seeds, each seed against the same seed's best peer.
"""
import json
import os
import sys
from collections import defaultdict

OWN = {"affinity-gate", "latency"}


def index(runs):
    by = defaultdict(dict)
    for r in runs:
        by[(r["rate_scale"], r["policy"])][r["seed"]] = r
    return by


def fmt(xs):
    return f"{sum(xs) / len(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}]" if xs else "n/a"


def main():
    peer_runs = json.load(open(sys.argv[1]))["runs"]
    peers = index(peer_runs)
    names = sorted({r["policy"] for r in peer_runs} - OWN)
    variants = [("affinity-gate (default, with the peers)", peers)]
    variants += [(os.path.basename(p).removesuffix(".json"), index(json.load(open(p))["runs"]))
                 for p in sys.argv[2:]]
    for rate in sorted({rate for (rate, _) in peers}):
        best = {}
        for key in ["mean", "p99"]:
            for seed in {s for (r, _), by in peers.items() if r == rate for s in by}:
                vals = [(peers[(rate, q)][seed]["ttft_ms"][key], q) for q in names
                        if seed in peers.get((rate, q), {})]
                best[(key, seed)] = min(vals)
        named = lambda key: ", ".join(sorted({q for (k, _), (_, q) in best.items() if k == key}))
        print(f"\n#### rate scale {rate}\n")
        print(f"Best peer: mean {named('mean')}; p99 {named('p99')}.\n")
        print("| variant | TTFT mean ms | p99 ms | mean / best peer | p99 / best peer | TPOT p50 ms | hit % | gate e/x/n/l |")
        print("|---|---:|---:|---|---|---:|---:|---|")
        for name, by in variants:
            seeds = by.get((rate, "affinity-gate"), {})
            if not seeds:
                continue
            n = len(seeds)
            ratio = lambda key: fmt([r["ttft_ms"][key] / best[(key, s)][0]
                                     for s, r in seeds.items() if (key, s) in best])
            avg = lambda f: sum(f(r) for r in seeds.values()) / n
            g = lambda k: round(avg(lambda r: r["gate"][k]))
            print(f"| {name} | {avg(lambda r: r['ttft_ms']['mean']):.1f} | "
                  f"{avg(lambda r: r['ttft_ms']['p99']):.1f} | {ratio('mean')} | {ratio('p99')} | "
                  f"{avg(lambda r: r['tpot_ms']['p50']):.2f} | "
                  f"{100 * avg(lambda r: r['prefix_hit_rate']):.1f} | "
                  f"{g('explore')}/{g('exploit')}/{g('no_sticky')}/{g('load_break')} |")


if __name__ == "__main__":
    main()
