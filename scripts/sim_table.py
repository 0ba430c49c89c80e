#!/usr/bin/env python3
"""Markdown tables from `kvgate sim --json` output (standard library only).

Usage: scripts/sim_table.py out.json [--focus affinity-gate]

Per rate scale: every policy's mean over seeds of mean/p50/p99 TTFT, prefix hit rate, pod busy
fraction, pods used, and the gate's branches; then the focus policy's ratios against the best
peer policy (the best non-kvgate policy for that metric at that rate, per seed) and against
`latency`, as mean [min–max over seeds].
"""
import json
import sys
from collections import defaultdict

PEERS = ["round-robin", "random", "least-request", "least-kv", "prefix", "weighted",
         "sglang-cache-aware", "dynamo-kv", "llmd-chain"]


def pods_used(run):
    return sum(1 for series in run.get("pod_samples", []) if any(s["running"] + s["waiting"] > 0 for s in series))


def main():
    args = sys.argv[1:]
    focus = "affinity-gate"
    if "--focus" in args:
        i = args.index("--focus")
        focus = args[i + 1]
        del args[i:i + 2]
    report = json.load(open(args[0]))
    runs = report["runs"]
    by = defaultdict(dict)  # (rate, policy) -> seed -> run
    for r in runs:
        by[(r["rate_scale"], r["policy"])][r["seed"]] = r
    rates = sorted({r["rate_scale"] for r in runs})
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    wl = report["workload"]
    print(f"workload: {wl.get('source') or wl['params']['kind']}, {wl['request_count']} requests, "
          f"{report['pods']} pods × {report['profile']}\n")
    for rate in rates:
        print(f"### rate scale {rate}\n")
        print("| policy | TTFT mean ms | p50 | p99 | hit % | busy % | pods used | gate e/x/n/l |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for p in policies:
            seeds = by.get((rate, p), {})
            if not seeds:
                continue
            avg = lambda f: sum(f(r) for r in seeds.values()) / len(seeds)
            g = lambda k: round(avg(lambda r: r["gate"][k]))
            print(f"| {p} | {avg(lambda r: r['ttft_ms']['mean']):.1f} | {avg(lambda r: r['ttft_ms']['p50']):.1f} "
                  f"| {avg(lambda r: r['ttft_ms']['p99']):.1f} | {100 * avg(lambda r: r['prefix_hit_rate']):.1f} "
                  f"| {100 * avg(lambda r: r['mean_pod_busy']):.1f} | {avg(pods_used):.1f} "
                  f"| {g('explore')}/{g('exploit')}/{g('no_sticky')}/{g('load_break')} |")
        focus_seeds = by.get((rate, focus), {})
        if focus_seeds:
            print()
            for metric, key in [("mean", "mean"), ("p99", "p99")]:
                vs_peer, vs_lat, best_names = [], [], []
                for seed, r in focus_seeds.items():
                    peers = [(by[(rate, q)][seed]["ttft_ms"][key], q) for q in PEERS if seed in by.get((rate, q), {})]
                    if peers:
                        best, name = min(peers)
                        vs_peer.append(r["ttft_ms"][key] / best)
                        best_names.append(name)
                    lat = by.get((rate, "latency"), {}).get(seed)
                    if lat:
                        vs_lat.append(r["ttft_ms"][key] / lat["ttft_ms"][key])
                fmt = lambda xs: f"{sum(xs) / len(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}]" if xs else "n/a"
                names = ", ".join(sorted(set(best_names)))
                print(f"- {focus} / best peer ({names}), {metric} TTFT: {fmt(vs_peer)}; / latency: {fmt(vs_lat)}")
            print()


if __name__ == "__main__":
    main()
