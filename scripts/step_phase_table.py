#!/usr/bin/env python3
"""How much of the TTFT prediction error is the pod's step phase (docs/decisions/predictor-model-rls.md), from
`kvgate sim --json` outputs (standard library only).

Usage: scripts/step_phase_table.py WORKLOAD=file.json ...

Per workload and rate scale, affinity-gate runs, means over the seeds in each file: busy %,
the share of requests dispatched to a pod in mid-step, that wait's mean (ms) and its mean
share of the observed TTFT, the TTFT MAPE % of the chosen pod's prediction, and the MAPE the
same predictions would have had knowing the wait (`predictor.step_phase`, see the sim's
`StepPhase`), with the share of the error that is the phase alone.
"""
import sys

from sim_runs import grouped, mean


def main():
    order, cells = grouped(sys.argv[1:])
    print("| workload | rate | busy % | dispatched mid-step % | mean wait ms | wait ÷ TTFT | TTFT MAPE % | "
          "MAPE knowing the wait % | share of the error that is the phase |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in order:
        runs = cells[key]
        ph = [r["predictor"]["step_phase"] for r in runs]
        busy = 100 * mean([r["mean_pod_busy"] for r in runs])
        mid = 100 * mean([p["busy_requests"] / max(p["requests"], 1) for p in ph])
        wait = mean([p["mean_wait_ms"] for p in ph])
        share = mean([p["mean_wait_share"] for p in ph])
        mape = 100 * mean([p["ttft_mape"] for p in ph])
        known = 100 * mean([p["ttft_mape_phase_known"] for p in ph])
        part = (mape - known) / mape if mape > 0 else float("nan")
        print(f"| {key[0]} | {key[1]:g} | {busy:.1f} | {mid:.1f} | {wait:.1f} | {share:.2f} | {mape:.1f} | "
              f"{known:.1f} | {part:.0%} |")


if __name__ == "__main__":
    main()
