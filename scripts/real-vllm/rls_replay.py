#!/usr/bin/env python3
"""Replays a `kvgate serve --decisions-log` through the predictor's TTFT regression offline:
what weights the RLS learns from a real run, and its prequential error (each request predicted
before its own first token is learnt), for several ridge strengths. Needs numpy.

    rls_replay.py FILE [FILE ...] [--delta 0.01,1,10] [--min-samples 8] [--keep 0,1,2,3,7]
                  [--monotone]

--keep fits only those features (indices into the table's columns, bias = 0): what a smaller
feature set would have learnt and predicted on the same requests.

--monotone predicts with the weights projected onto "every load weight >= 0" (the bias is free)
in the regression's own metric (P^-1, the RLS cost's Hessian): a weight below 0 is fixed at 0 and
the others move by the least the samples allow (active set, added until none is negative). A
build whose RLS predicted with these weights was measured on the real pods and not kept
(BENCHMARKS.md "The predictor's first samples").

--min-samples defaults to 8, the default profile's `predictor_min_samples` until 2026-12-07 and
the value every replay figure in BENCHMARKS.md was taken with; the core's default is 32 now.

An approximation of `crates/kvgate-core/src/predictor` (plain `rls`): the same 10 scaled TTFT
features (features.rs), forgetting 0.999, a ridge prior P0 = I/delta centred on the analytic
weights (6 ms + in-flight and own uncached tokens at 15,928 tokens/s), the diagonal capped at
1/delta, samples learnt in first-token order. The decision record lacks the prompt length for a
fully cached prompt (taken from the request before) and the pod's KV capacity (the shortfall
feature is 0), so the replay's predictions differ from the logged ones by ~150 ms (median).
"""
import argparse
import json

import numpy as np

D = 10
PRIOR = np.zeros(D)
PRIOR[0] = 6.0
PRIOR[1] = PRIOR[2] = 1000 / 15928 * 1000
NAMES = ["bias", "uncached/1k", "prefill in flight/1k", "waiting/10", "running/100", "kv use",
         "decode in flight/10k", "uncached x queued", "input/1k", "kv shortfall/1k"]


def vec(load, score, input_tokens):
    uncached = (1 - score) * input_tokens / 1000
    queued = 1.0 if load["waiting"] > 0 else 0.0
    return np.array([1, uncached, load["in_flight_prefill_tokens"] / 1000, load["waiting"] / 10,
                     load["running"] / 100, load["kv_usage"], load["in_flight_decode_tokens"] / 1e4,
                     uncached * queued, input_tokens / 1000, 0.0])


def records(path):
    recs = [json.loads(line) for line in open(path)]
    recs = [r for r in recs if (r.get("observed") or {}).get("ttft_ms")]
    recs.sort(key=lambda r: r["timestamp_ms"])
    last = 2000.0
    for r in recs:
        i = [p["id"] for p in r["pods"]].index(r["pod"])
        score = r["pods"][i]["prefix_score"]
        r["_x"] = None
        r["_input"] = r["charged_prefill_tokens"] / (1 - score) if score < 0.95 else last
        last = r["_input"]
        r["_x"] = vec(r["load"][i], score, r["_input"])
    return recs


def project(w, p):
    """The weights nearest to w in the metric P^-1 with every weight but the bias >= 0."""
    active = [j for j in range(1, len(w)) if w[j] < 0]
    v = w
    while active:
        a = np.array(active)
        v = w - p[:, a] @ np.linalg.solve(p[np.ix_(a, a)], w[a])
        v[a] = 0.0
        more = [j for j in range(1, len(w)) if j not in active and v[j] < 0]
        if not more:
            break
        active += more
    return v


def replay(recs, delta, min_samples, keep, monotone=False):
    d = len(keep)
    prior = PRIOR[keep]
    events = []
    for r in recs:
        y = r["observed"]["ttft_ms"]
        events.append((r["timestamp_ms"] + y, 1, r["_x"][keep], y))
        events.append((r["timestamp_ms"], 0, r["_x"][keep], y))
    events.sort(key=lambda e: (e[0], e[1]))
    w, p, n, lam = prior.copy(), np.eye(d) / delta, 0, 0.999
    errors, signed = [], []
    for _, learn, x, y in events:
        if learn:
            g = p @ x
            den = lam + x @ g
            w = w + g * (y - w @ x) / den
            p = (p - np.outer(g, g) / den) / lam
            for j in range(d):
                if p[j, j] > 1 / delta:
                    s = np.sqrt((1 / delta) / p[j, j])
                    p[j, :] *= s
                    p[:, j] *= s
            n += 1
        else:
            used = (project(w, p) if monotone else w) if n >= min_samples else prior
            pred = max(x @ used, 1.0)
            errors.append(abs(pred - y) / y)
            signed.append(pred - y)
    return (project(w, p) if monotone else w), float(np.mean(errors)), float(np.mean(signed))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--delta", default="0.01,1,10")
    ap.add_argument("--min-samples", type=int, default=8)
    ap.add_argument("--keep", default=",".join(str(i) for i in range(D)))
    ap.add_argument("--monotone", action="store_true")
    args = ap.parse_args()
    keep = [int(i) for i in args.keep.split(",")]
    runs = [records(f) for f in args.files]
    print("| delta | prequential MAPE | signed error ms | " + " | ".join(NAMES[i] for i in keep) + " |")
    print("|---:|---:|---:|" + "---:|" * len(keep))
    for delta in [float(d) for d in args.delta.split(",")]:
        out = [replay(r, delta, args.min_samples, keep, args.monotone) for r in runs]
        weights = np.mean([o[0] for o in out], axis=0)
        print(f"| {delta:g} | {np.mean([o[1] for o in out]):.2f} | {np.mean([o[2] for o in out]):.0f} | "
              + " | ".join(f"{v:.0f}" for v in weights) + " |")
    print(f"\n(weights: the mean over the {len(runs)} runs of each run's final weights, ms per unit)")


if __name__ == "__main__":
    main()
