#!/usr/bin/env python3
"""The cross-workload predictor table (docs/decisions/predictor-rls-variants.md) from `kvgate sim --json` outputs
(standard library only).

Usage: scripts/predictor_cross_table.py [--fit WORKLOAD] WORKLOAD:MODEL=file.json ...

Per workload and rate scale: busy % (mean pod busy), queued % (share of pod scrapes with waiting
requests), then per model the TTFT MAPE % of the chosen pod's prediction over the run and the
predictor's own p90 coverage % (its last 1000 samples; ideal 85–95). Means over the seeds in
each file. Then a summary per model over the held-out workloads (every one but --fit): the worst
MAPE at ≤ 95 % busy, the worst above 95 % busy (where queueing is real), the mean MAPE, and the
coverage range, against the aims (≤ 10 %, ≤ 15 %, 85–95 %). Last, routing quality: mean / p99
TTFT of affinity-gate per model, and its ratio to the first model's (the baseline).
"""
import json
import sys
from collections import defaultdict


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def queued_share(run):
    samples = [s for pod in run.get("pod_samples", []) for s in pod]
    return mean([1.0 if s["waiting"] > 0 else 0.0 for s in samples]) if samples else 0.0


def main():
    args = sys.argv[1:]
    fit = None
    if "--fit" in args:
        i = args.index("--fit")
        fit = args[i + 1]
        del args[i:i + 2]
    cells = defaultdict(list)  # (workload, rate, model) -> runs
    workloads, models = [], []
    for arg in args:
        key, path = arg.split("=", 1)
        workload, model = key.split(":", 1)
        workloads += [workload] if workload not in workloads else []
        models += [model] if model not in models else []
        for r in json.load(open(path))["runs"]:
            if r["policy"] == "affinity-gate":
                cells[(workload, r["rate_scale"], model)].append(r)
    head = "| workload | rate | busy % | queued % | " + " | ".join(
        f"{m} MAPE | {m} p90 cov" for m in models) + " |"
    print(head)
    print("|---|---:|---:|---:|" + "---:|---:|" * len(models))
    summary = defaultdict(lambda: {"busy": [], "queued": [], "all": [], "cov": []})
    for w in workloads:
        rates = sorted({rt for (wl, rt, _) in cells if wl == w})
        for rate in rates:
            base = cells.get((w, rate, models[0]), [])
            busy = 100 * mean([r["mean_pod_busy"] for r in base])
            queued = 100 * mean([queued_share(r) for r in base])
            row = f"| {w}{' (fit)' if w == fit else ''} | {rate:g} | {busy:.1f} | {queued:.1f} |"
            for m in models:
                runs = cells.get((w, rate, m), [])
                mape = 100 * mean([r["predictor"]["ttft_mape"] for r in runs])
                cov = 100 * mean([r["predictor"]["online"]["ttft_p90_coverage"] for r in runs])
                row += f" {mape:.1f} | {cov:.1f} |"
                if w != fit and runs:
                    s = summary[m]
                    s["all"].append(mape)
                    s["cov"].append(cov)
                    if busy <= 95.0:
                        s["busy"].append(mape)
                    else:
                        s["queued"].append(mape)
            print(row)
    print()
    print("| model (held out) | worst MAPE ≤ 95 % busy (aim ≤ 10) | worst MAPE > 95 % busy "
          "(aim ≤ 15) | worst MAPE, all | mean MAPE | p90 coverage range (aim 85–95) |")
    print("|---|---:|---:|---:|---:|---|")
    for m in models:
        s = summary[m]
        worst = lambda xs: f"{max(xs):.1f}" if xs else "–"
        cov = f"{min(s['cov']):.1f}–{max(s['cov']):.1f}" if s["cov"] else "–"
        print(f"| {m} | {worst(s['busy'])} | {worst(s['queued'])} | {worst(s['all'])} "
              f"| {mean(s['all']):.1f} | {cov} |")
    print()
    print(f"| workload | rate | " + " | ".join(f"{m} TTFT mean / p99 ms" for m in models)
          + " | " + " | ".join(f"{m} mean, p99 / {models[0]}" for m in models[1:]) + " |")
    print("|---|---:|" + "---:|" * (2 * len(models) - 1))
    for w in workloads:
        for rate in sorted({rt for (wl, rt, _) in cells if wl == w}):
            stat = {}
            for m in models:
                runs = cells.get((w, rate, m), [])
                stat[m] = (mean([r["ttft_ms"]["mean"] for r in runs]),
                           mean([r["ttft_ms"]["p99"] for r in runs]))
            b = stat[models[0]]
            print(f"| {w} | {rate:g} | "
                  + " | ".join(f"{stat[m][0]:.1f} / {stat[m][1]:.0f}" for m in models) + " | "
                  + " | ".join(f"{stat[m][0] / b[0]:.3f}, {stat[m][1] / b[1]:.3f}"
                               for m in models[1:]) + " |")


if __name__ == "__main__":
    main()
