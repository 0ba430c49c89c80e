#!/usr/bin/env python3
"""Where in a run the TTFT prediction error sits: the cold start or the warm predictor
(docs/decisions/predictor-ttft-at-first-token.md), from `kvgate sim --json` outputs (standard library only).

Usage: scripts/mape_by_tenth_table.py LABEL=file.json ...

Per label and rate scale, affinity-gate runs, means over the seeds in each file: the TTFT
MAPE % of the chosen pod's prediction over the whole run, of the first tenth of the requests
(arrival order), of the second tenth, and of the last eight tenths
(`predictor.ttft_mape_by_tenth`), and the share of the whole run's error that sits in the
first tenth.
"""
import sys

from sim_runs import grouped, mean


def main():
    order, cells = grouped(sys.argv[1:])
    print("| run | rate | TTFT MAPE % | first tenth % | second tenth % | last 8 tenths % | "
          "share of the error in the first tenth |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, rate in order:
        runs = cells[(label, rate)]
        tenths = [r["predictor"]["ttft_mape_by_tenth"] for r in runs]
        whole = 100 * mean([r["predictor"]["ttft_mape"] for r in runs])
        first = 100 * mean([t[0] for t in tenths])
        second = 100 * mean([t[1] for t in tenths])
        rest = 100 * mean([mean(t[2:]) for t in tenths])
        share = mean([t[0] / max(sum(t), 1e-12) for t in tenths])
        print(f"| {label} | {rate:g} | {whole:.1f} | {first:.1f} | {second:.1f} | {rest:.1f} | "
              f"{100 * share:.0f} % |")


if __name__ == "__main__":
    main()
