#!/usr/bin/env python3
"""How well can any linear TTFT model do on what kvgate knows at decision time? Fits least-squares
models with several feature sets to the decisions of a peers.sh sitting (each round left out in
turn: the fit never sees the round it predicts), and prints their error beside kvgate's own
online prediction. Needs numpy (the vLLM venv has it: .venv-vllm/bin/python).

    predictor_fit.py OUT_DIR/WORKLOAD [--router kvgate-routed] [--residuals 10]

Per decision with an observed TTFT (`kvgate serve --decisions-log`): the chosen pod's load at
the decision (scraped `waiting`, `running`, `kv_usage`; kvgate's in-flight requests, prefill
and decode tokens) and the request's charged (uncached) prefill tokens. Printed per model: the
mean absolute percentage error, the mean signed error (prediction − observed), and the mean
signed error over the slowest 10 % of requests (the tail the load gate must see). Then the
requests the best model misses most, with their features.
"""

import argparse
import glob
import json
import os

import numpy as np

FEATURES = {
    "uncached": lambda r: r["uncached"],
    "in-flight prefill": lambda r: r["in_flight_prefill"],
    "in-flight requests": lambda r: r["in_flight"],
    "running": lambda r: r["running"],
    "kv usage": lambda r: r["kv"],
    "in-flight decode": lambda r: r["in_flight_decode"],
    "running × (uncached + in-flight prefill)": lambda r: r["running"]
    * (r["uncached"] + r["in_flight_prefill"]),
}
MODELS = [
    ["uncached", "in-flight prefill"],
    ["uncached", "in-flight prefill", "running"],
    ["uncached", "in-flight prefill", "in-flight requests"],
    ["uncached", "in-flight prefill", "in-flight requests", "kv usage"],
    ["uncached", "in-flight prefill", "in-flight decode", "running × (uncached + in-flight prefill)"],
]


def load(workload_dir, router):
    rows = []
    for path in glob.glob(os.path.join(workload_dir, "round-*", f"{router}.decisions.jsonl")):
        k = int(os.path.basename(os.path.dirname(path)).split("-")[1])
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                ttft = (d.get("observed") or {}).get("ttft_ms")
                if not ttft:
                    continue
                chosen = next(p for p in d["pods"] if p["id"] == d["pod"])
                load = next(x for x in d["load"] if x["id"] == d["pod"])
                rows.append(
                    {
                        "round": k,
                        "pod": d["pod"],
                        "branch": d["branch"],
                        "y": ttft,
                        "kvgate": chosen["predicted_ttft_ms"],
                        "uncached": d["charged_prefill_tokens"],
                        "waiting": load["waiting"],
                        "running": load["running"],
                        "kv": load["kv_usage"],
                        "in_flight": load["in_flight_requests"],
                        "in_flight_prefill": load["in_flight_prefill_tokens"],
                        "in_flight_decode": load["in_flight_decode_tokens"],
                    }
                )
    return rows


def summary(pred, y):
    ape = np.abs(pred - y) / y
    top = y >= np.quantile(y, 0.9)
    return (
        f"MAPE {100 * ape.mean():5.1f} %, signed {np.mean(pred - y):+6.0f} ms, "
        f"slowest 10 % signed {np.mean(pred[top] - y[top]):+6.0f} ms"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload_dir")
    ap.add_argument("--router", default="kvgate-routed")
    ap.add_argument("--residuals", type=int, default=10)
    a = ap.parse_args()
    rows = load(a.workload_dir, a.router)
    if len(rows) < 20:
        raise SystemExit(f"{len(rows)} decisions with an observed TTFT: too few to fit")
    y = np.array([r["y"] for r in rows])
    rounds = np.array([r["round"] for r in rows])
    if len(set(rounds)) < 2:
        raise SystemExit("one round only: nothing to leave out")
    print(f"{len(rows)} decisions, {len(set(rounds))} rounds ({a.workload_dir}, {a.router})")
    print(f"{'kvgate online':70s} {summary(np.array([r['kvgate'] for r in rows]), y)}")
    best = None
    for names in MODELS:
        x = np.array([[1.0] + [FEATURES[n](r) for n in names] for r in rows])
        out = np.zeros_like(y)
        for k in set(rounds):
            train, test = rounds != k, rounds == k
            coef, *_ = np.linalg.lstsq(x[train], y[train], rcond=None)
            out[test] = x[test] @ coef
        mape = np.mean(np.abs(out - y) / y)
        print(f"{'fit: 1 + ' + ' + '.join(names):70s} {summary(out, y)}")
        if best is None or mape < best[0]:
            best = (mape, names, out)
    _, names, out = best
    print(f"\nmissed most by 'fit: 1 + {' + '.join(names)}' (observed − fitted):")
    for i in np.argsort(out - y)[: a.residuals]:
        r = rows[i]
        print(
            f"  round {r['round']:2d} {r['branch']:10s} pod …{r['pod'][-5:]} observed {r['y']:6.0f} ms, "
            f"fitted {out[i]:5.0f}, kvgate {r['kvgate']:5.0f}; uncached {r['uncached']}, in flight "
            f"{r['in_flight']} ({r['in_flight_prefill']} prefill tok), running {r['running']}, "
            f"waiting {r['waiting']}"
        )


if __name__ == "__main__":
    main()
