#!/usr/bin/env python3
"""Predictor tables from several `kvgate sim --json` outputs, one per predictor model
(standard library only).

Usage: scripts/predictor_table.py [--policy affinity-gate] [--label NAME=file.json ...] a.json b.json ...

Each file's runs are labelled by its `router_config.predictor_model` (or by NAME when given as
NAME=file.json). Prints, per rate scale:

1. accuracy of the focus policy's runs: busy %, TTFT MAPE %, TPOT MAPE % (the chosen pod's
   predictions over the whole run), TTFT coverage % (requests with TTFT ≤ predicted: about 50 %
   for a central model), and the online p90 coverage of the predictor's own p90 (last 1000
   samples; the p90 ratio tracker);
2. routing quality: mean / p99 TTFT and hit rate of the focus policy per model, and of the best
   baseline policy (lowest mean TTFT among the non-kvgate policies found in any file at that
   rate), with the ratio to it.

Means over seeds.
"""
import json
import sys
from collections import defaultdict

PEERS = ["round-robin", "random", "least-request", "least-kv", "prefix", "weighted",
         "sglang-cache-aware", "dynamo-kv"]


def main():
    args = sys.argv[1:]
    policy = "affinity-gate"
    if "--policy" in args:
        i = args.index("--policy")
        policy = args[i + 1]
        del args[i:i + 2]
    focus = defaultdict(list)  # (rate, label) -> runs
    peers = defaultdict(list)  # (rate, policy) -> runs
    labels = []
    for arg in args:
        label, path = arg.split("=", 1) if "=" in arg else (None, arg)
        report = json.load(open(path))
        label = label or report["router_config"].get("predictor_model", "rls")
        if label not in labels:
            labels.append(label)
        for r in report["runs"]:
            if r["policy"] == policy:
                focus[(r["rate_scale"], label)].append(r)
            elif r["policy"] in PEERS:
                peers[(r["rate_scale"], r["policy"])].append(r)
    rates = sorted({rate for rate, _ in focus})
    mean = lambda runs, f: sum(f(r) for r in runs) / len(runs)
    print(f"#### accuracy ({policy})\n")
    print("| rate | model | busy % | TTFT MAPE % | TPOT MAPE % | TTFT ≤ predicted % | online p90 coverage % |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for rate in rates:
        for label in labels:
            runs = focus.get((rate, label))
            if not runs:
                continue
            p = lambda f: mean(runs, f)
            print(f"| {rate} | {label} | {100 * p(lambda r: r['mean_pod_busy']):.1f} "
                  f"| {100 * p(lambda r: r['predictor']['ttft_mape']):.1f} "
                  f"| {100 * p(lambda r: r['predictor']['tpot_mape']):.1f} "
                  f"| {100 * p(lambda r: r['predictor'].get('ttft_coverage', float('nan'))):.1f} "
                  f"| {100 * p(lambda r: r['predictor']['online']['ttft_p90_coverage']):.1f} |")
    print(f"\n#### routing quality ({policy} per model vs the best baseline)\n")
    print("| rate | driven by | TTFT mean ms | p99 | hit % | mean / best baseline | p99 / best baseline |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for rate in rates:
        candidates = [(mean(runs, lambda r: r["ttft_ms"]["mean"]), name, runs)
                      for (rt, name), runs in peers.items() if rt == rate]
        best = min(candidates) if candidates else None
        for label in labels:
            runs = focus.get((rate, label))
            if not runs:
                continue
            m = mean(runs, lambda r: r["ttft_ms"]["mean"])
            p99 = mean(runs, lambda r: r["ttft_ms"]["p99"])
            hit = 100 * mean(runs, lambda r: r["prefix_hit_rate"])
            if best:
                bm, _, bruns = best
                bp99 = mean(bruns, lambda r: r["ttft_ms"]["p99"])
                ratios = f"{m / bm:.3f} | {p99 / bp99:.3f}"
            else:
                ratios = "n/a | n/a"
            print(f"| {rate} | {policy} ({label}) | {m:.1f} | {p99:.1f} | {hit:.1f} | {ratios} |")
        if best:
            bm, name, bruns = best
            print(f"| {rate} | best baseline: {name} | {bm:.1f} "
                  f"| {mean(bruns, lambda r: r['ttft_ms']['p99']):.1f} "
                  f"| {100 * mean(bruns, lambda r: r['prefix_hit_rate']):.1f} | 1 | 1 |")
    print()


if __name__ == "__main__":
    main()
