#!/usr/bin/env python3
"""What the quiet tenants' slowest first tokens are made of, in bench/flow_overload.sh rounds.

    bench/flow_tail.py [--time-scale X] [--show N] DIR [DIR ...]

Each DIR holds one round's `on-requests.jsonl` and `on-share-requests.jsonl` (kvgate loadgen
--requests-jsonl, through kvgate: each line names its pod and its time in kvgate's queue). The
quiet tenants' requests (tenant != 0) are the same in both runs, so they are matched by id.
Per round it prints: the quiet tenants' p99 TTFT in both runs and their ratio; of the slowest
1 %, how many have a prompt of 60,000 tokens or more (slow at any load) and how many waited in
kvgate's queue; the paired per-request TTFT ratio (median) and the ratio of the means. With
--show N, the N slowest quiet requests of the `on` run with what was on their pod when they
were dispatched: their decision branch (recorded by loadgen since 2026-12-02), the requests
dispatched to that pod earlier and not yet at their first token, how many of them the noisy
tenant's, and their prompt tokens. TTFTs in model ms (wall × --time-scale,
default 2). Standard library only.
"""
import argparse
import json
import statistics

BIG = 60_000


def load(path):
    rows = [json.loads(line) for line in open(path)]
    t0 = min(r["sent_unix_ms"] for r in rows)
    for r in rows:
        r["t"] = r["sent_unix_ms"] - t0
        r["dispatch"] = r["t"] + (r.get("queue_ms") or 0.0)
        r["first"] = r["t"] + (r["ttft_ms"] or 0.0)
        r["end"] = r["t"] + r["e2e_ms"]
    return {r["id"]: r for r in rows}


def p99(values):
    values = sorted(values)
    return values[-(-99 * len(values) // 100) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--show", type=int, default=0)
    a = ap.parse_args()
    ts = a.time_scale
    for d in a.dirs:
        on, share = load(f"{d}/on-requests.jsonl"), load(f"{d}/on-share-requests.jsonl")
        quiet = [i for i, r in share.items()
                 if r["tenant"] != 0 and r["ttft_ms"] and on.get(i, {}).get("ttft_ms")]
        q_on = p99([on[i]["ttft_ms"] for i in quiet])
        q_share = p99([share[i]["ttft_ms"] for i in quiet])
        k = len(quiet) // 100 + 1
        top_on = sorted(quiet, key=lambda i: -on[i]["ttft_ms"])[:k]
        top_share = sorted(quiet, key=lambda i: -share[i]["ttft_ms"])[:k]
        big = lambda run, ids: sum(1 for i in ids if run[i]["input_tokens"] >= BIG)
        queued = sum(1 for i in top_on if (on[i].get("queue_ms") or 0) > 0)
        paired = statistics.median(on[i]["ttft_ms"] / share[i]["ttft_ms"] for i in quiet)
        means = (statistics.mean(on[i]["ttft_ms"] for i in quiet)
                 / statistics.mean(share[i]["ttft_ms"] for i in quiet))
        print(f"{d}: quiet requests {len(quiet)}; p99 {q_on * ts:,.0f} ms on, {q_share * ts:,.0f} ms at share "
              f"(÷ {q_on / q_share:.2f}); slowest {k}: {big(on, top_on)} with ≥ {BIG:,} prompt tokens on, "
              f"{big(share, top_share)} at share, {queued} waited in kvgate's queue; paired TTFT ratio "
              f"median {paired:.2f}, means {means:.2f}")
        rows = list(on.values())
        for i in sorted(quiet, key=lambda i: -on[i]["ttft_ms"])[: a.show]:
            r = on[i]
            ahead = [o for o in rows if o is not r and o.get("pod") == r.get("pod") and o["error"] is None
                     and o["dispatch"] < r["dispatch"] < o["first"]]
            print(f"  sent {r['t'] / 1e3:6.1f} s  ttft {r['ttft_ms'] * ts:6,.0f} ms  queued {(r.get('queue_ms') or 0) * ts:5,.0f} ms  "
                  f"prompt {r['input_tokens']:7,}  pod {r.get('pod')}  branch {r.get('branch', '?')}  ahead before first token: {len(ahead)} "
                  f"({sum(1 for o in ahead if o['tenant'] == 0)} noisy, {sum(o['input_tokens'] for o in ahead):,} prompt tokens)")


if __name__ == "__main__":
    main()
