#!/usr/bin/env python3
"""Compares `kvgate sim --policy affinity-gate --json` runs of one workload side by side
(standard library only).

Usage: scripts/variant_table.py BASE.json VARIANT.json [VARIANT.json ...]

Each file is one variant (its file name names it), run with the same workload, rate scales and
seeds. Per rate scale, one row per variant: mean / p99 TTFT (mean over seeds), their ratios to
BASE of the same seed as mean [min–max], prefix hit rate, SLO goodput when the runs had SLOs,
and the τ / ε the gate had at the end (the runs' `gate_state`).
"""
import json
import os
import sys
from collections import defaultdict


def load(path):
    by = defaultdict(dict)
    for r in json.load(open(path))["runs"]:
        by[r["rate_scale"]][r["seed"]] = r
    return os.path.basename(path).removesuffix(".json"), by


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def ratio(xs):
    return f"{mean(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}]" if xs else "n/a"


def main():
    files = [load(p) for p in sys.argv[1:]]
    base_name, base = files[0]
    goodput = any("slo_goodput" in r for _, by in files for seeds in by.values() for r in seeds.values())
    for rate in sorted(base):
        print(f"\n#### rate scale {rate:g}\n")
        head = "| variant | TTFT mean ms | / " + base_name + " | p99 ms | / " + base_name + " | hit % |"
        sep = "|---|---:|---:|---:|---:|---:|"
        if goodput:
            head += " goodput % |"
            sep += "---:|"
        head += " final τ / ε |"
        sep += "---|"
        print(head)
        print(sep)
        for name, by in files:
            runs = by.get(rate, {})
            seeds = sorted(runs)
            if not seeds:
                continue
            m = [runs[s]["ttft_ms"]["mean"] for s in seeds]
            p = [runs[s]["ttft_ms"]["p99"] for s in seeds]
            rm = [runs[s]["ttft_ms"]["mean"] / base[rate][s]["ttft_ms"]["mean"] for s in seeds if s in base[rate]]
            rp = [runs[s]["ttft_ms"]["p99"] / base[rate][s]["ttft_ms"]["p99"] for s in seeds if s in base[rate]]
            hit = mean([runs[s]["prefix_hit_rate"] * 100 for s in seeds])
            row = f"| {name} | {mean(m):.1f} | {ratio(rm)} | {mean(p):.1f} | {ratio(rp)} | {hit:.1f} |"
            if goodput:
                g = [runs[s]["slo_goodput"] * 100 for s in seeds if "slo_goodput" in runs[s]]
                row += f" {mean(g):.1f} |" if g else " – |"
            gs = [runs[s].get("gate_state") for s in seeds]
            gs = [g for g in gs if g]
            if gs:
                taus = ", ".join(f"{g['affinity_gate_tau']:.2f}" for g in gs)
                eps = ", ".join(f"{g['epsilon_explore_sticky']:.3f}" for g in gs)
                row += f" {taus} / {eps} |"
            else:
                row += " – |"
            print(row)


if __name__ == "__main__":
    main()
