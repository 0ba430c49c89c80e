#!/usr/bin/env python3
"""Tables from a `kvgate serve --decisions-log FILE`: how the predictor and the routing behaved
over a run, per time window and per pod. Python standard library only.

    decisions_table.py FILE [--windows 8]

Per window (the run cut in equal spans of decision time), over the requests decided in it:
  - decided, and the share sent to each pod;
  - the branches (explore, exploit, no_sticky, load_break, …);
  - the predictor's error on the chosen pod: mean |predicted − observed| / observed TTFT and
    the mean signed error (predicted − observed, ms), over the streams with an observed TTFT
    (how many requests it takes to learn shows as the error falling window by window);
  - per pod, as the decisions saw it: the mean of its own queue (`waiting`, `running`) against
    kvgate's ledger (`in_flight_requests`, decode tokens in flight), and its observed TTFT mean.
"""
import argparse
import json
import sys
from collections import Counter, defaultdict


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--windows", type=int, default=8)
    args = p.parse_args()
    records = []
    bad = 0
    with open(args.file) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
    if not records:
        sys.exit(f"{args.file}: no records")
    records.sort(key=lambda r: r["timestamp_ms"])
    t0, t1 = records[0]["timestamp_ms"], records[-1]["timestamp_ms"]
    span = max(t1 - t0, 1)
    n = max(args.windows, 1)
    pods = sorted({l["id"] for r in records for l in r.get("load", [])} | {r["pod"] for r in records})
    short = {pod: f"p{i}" for i, pod in enumerate(pods)}
    branches = sorted({r["branch"] for r in records})
    windows = defaultdict(list)
    for r in records:
        windows[min(int((r["timestamp_ms"] - t0) * n / span), n - 1)].append(r)
    print(f"{args.file}: {len(records)} decisions over {span / 1000:.1f} s"
          + (f" ({bad} unreadable lines)" if bad else "") + "; pods: "
          + ", ".join(f"{short[p]} = {p}" for p in pods))
    print()
    head = ["window (s)", "decided"] + [f"→{short[p]}" for p in pods] + branches + [
        "TTFT err %", "signed err ms", "observed"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for w in range(n):
        rs = windows.get(w, [])
        if not rs:
            continue
        to = Counter(r["pod"] for r in rs)
        br = Counter(r["branch"] for r in rs)
        errs, signed = [], []
        for r in rs:
            obs = (r.get("observed") or {}).get("ttft_ms")
            chosen = next((e for e in r.get("pods", []) if e["id"] == r["pod"]), None)
            if obs and chosen:
                errs.append(abs(chosen["predicted_ttft_ms"] - obs) / obs)
                signed.append(chosen["predicted_ttft_ms"] - obs)
        lo, hi = t0 + span * w / n, t0 + span * (w + 1) / n
        row = [f"{(lo - t0) / 1000:.1f}–{(hi - t0) / 1000:.1f}", str(len(rs))]
        row += [f"{100 * to[p] / len(rs):.0f} %" for p in pods]
        row += [str(br[b]) for b in branches]
        row += [f"{100 * mean(errs):.0f}" if errs else "–", f"{mean(signed):+.0f}" if signed else "–",
                str(len(errs))]
        print("| " + " | ".join(row) + " |")
    print()
    head = ["window (s)"] + [f"{short[p]} {k}" for p in pods for k in (
        "waiting", "running", "kvgate in flight", "decode tok", "TTFT ms")]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for w in range(n):
        rs = windows.get(w, [])
        if not rs:
            continue
        lo = span * w / n
        row = [f"{lo / 1000:.1f}–{span * (w + 1) / n / 1000:.1f}"]
        for p in pods:
            loads = [l for r in rs for l in r.get("load", []) if l["id"] == p]
            ttft = [r["observed"]["ttft_ms"] for r in rs if r["pod"] == p and r.get("observed")]
            row += [f"{mean([l['waiting'] for l in loads]):.1f}", f"{mean([l['running'] for l in loads]):.1f}",
                    f"{mean([l['in_flight_requests'] for l in loads]):.1f}",
                    f"{mean([l['in_flight_decode_tokens'] for l in loads]):.0f}",
                    f"{mean(ttft):.0f}" if ttft else "–"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
