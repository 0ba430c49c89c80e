#!/usr/bin/env python3
"""Compares affinity-gate variants against the peer policies (standard library only).

Usage: scripts/gate_table.py PEERS.json VARIANT.json [VARIANT.json ...]

PEERS.json is a `kvgate sim --policy all --json` run (same workload, pods, rate scales, seeds);
each VARIANT.json an `--policy affinity-gate` run with some router config (its file name names
the variant). For each rate scale and variant: mean and p99 TTFT as ratios to the best peer
policy of the same seed (min over round-robin … dynamo-kv) and to `latency`, as
mean [min–max over seeds]; hit rate; pods that got traffic; gate branches.
"""
import json
import os
import sys
from collections import defaultdict

PEERS = ["round-robin", "random", "least-request", "least-kv", "prefix", "weighted",
         "sglang-cache-aware", "dynamo-kv"]


def index(runs):
    by = defaultdict(dict)
    for r in runs:
        by[(r["rate_scale"], r["policy"])][r["seed"]] = r
    return by


def pods_used(run):
    return sum(1 for s in run.get("pod_samples", []) if any(x["running"] + x["waiting"] > 0 for x in s))


def fmt(xs):
    return f"{sum(xs) / len(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}]" if xs else "n/a"


def main():
    peers = index(json.load(open(sys.argv[1]))["runs"])
    variants = [(os.path.basename(p).removesuffix(".json"), index(json.load(open(p))["runs"])) for p in sys.argv[2:]]
    rates = sorted({rate for (rate, _) in peers})
    for rate in rates:
        print(f"\n### rate scale {rate}\n")
        print("| variant | mean / best peer | p99 / best peer | mean / latency | p99 / latency | hit % | pods used | gate e/x/n/l |")
        print("|---|---|---|---|---|---:|---:|---|")
        rows = [("affinity-gate (as run with the peers)", peers)] + variants
        for name, by in rows:
            seeds = by.get((rate, "affinity-gate"), {})
            if not seeds:
                continue
            cols = []
            for key in ["mean", "p99"]:
                xs = []
                for seed, r in seeds.items():
                    best = [peers[(rate, q)][seed]["ttft_ms"][key] for q in PEERS if seed in peers.get((rate, q), {})]
                    if best:
                        xs.append(r["ttft_ms"][key] / min(best))
                cols.append(fmt(xs))
            for key in ["mean", "p99"]:
                xs = [r["ttft_ms"][key] / peers[(rate, "latency")][s]["ttft_ms"][key]
                      for s, r in seeds.items() if s in peers.get((rate, "latency"), {})]
                cols.append(fmt(xs))
            n = len(seeds)
            hit = 100 * sum(r["prefix_hit_rate"] for r in seeds.values()) / n
            used = sum(pods_used(r) for r in seeds.values()) / n
            g = lambda k: round(sum(r["gate"][k] for r in seeds.values()) / n)
            print(f"| {name} | {' | '.join(cols)} | {hit:.1f} | {used:.1f} | "
                  f"{g('explore')}/{g('exploit')}/{g('no_sticky')}/{g('load_break')} |")


if __name__ == "__main__":
    main()
