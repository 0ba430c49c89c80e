#!/usr/bin/env python3
"""The tables of scripts/real-vllm/peers.sh, from the raw records it keeps (re-runnable on their
own, at any time: nothing here needs the pods). Python standard library only.

    peers_table.py OUT_DIR [--workload W ...] [--base kvgate-routed] [--routers A,B,...]
                   [--resamples 10000] [--seed 1] [--keep-disturbed]

Reads every complete run (OUT_DIR/<workload>/round-<k>/<router>.meta.json present) of each
workload, whichever sitting ran it, and computes each run's figures from its per-request records
(<router>.requests.jsonl, `kvgate loadgen --requests-jsonl`):
  - TTFT mean, p90, p99 (ms) over the requests that succeeded (nearest rank, as loadgen);
  - TPOT p99 (ms): per request (e2e - TTFT) / (output tokens - 1), requests with ≥ 2 tokens;
  - out tok/s: output tokens of the requests that succeeded / the run's span (first send to the
    last request's end, failed requests included);
  - hit rate: the pods' own, Δ prefix_cache_hits / Δ prefix_cache_queries over the run (the
    counters peers.sh read before and after it; else loadgen's figure).

The ratio table pairs each router's run of round k with the base router's (kvgate-routed) run of
the same round, and gives per metric the MEDIAN OF THE PER-ROUND RATIOS with a bootstrap 90 %
interval: the rounds are resampled with replacement (n of n, RESAMPLES times, random.Random
seeded from SEED, the workload, the router and the metric: the same records give the same
table), the median of each resample is taken, and the interval is the 5th and 95th percentiles
of those medians. With few rounds the interval is coarse: its ends are two of the observed
ratios (order statistics), and its exact coverage of the true median ratio is 94 % at 5 rounds
(the interval is then the range of the 5 ratios), 88 % at 7, 82 % at 9, 94 % at 11. A †
marks an interval that excludes ×1.00. A pair is left out when either run was disturbed (a
process outside the harness used more than the threshold of a CPU during it: quiet.py), unless
--keep-disturbed.

The merged table pools every request of the kept runs of a router (all rounds, all sittings):
TTFT and TPOT over the pooled requests, out tok/s = Σ tokens / Σ spans, hit % = Σ hits / Σ
queries. Then each run's TTFT mean (a * marks a disturbed run), each pod's share of each run's
prompt tokens (from the pods' counters: a run that left a pod idle measures one pod, not
placement), and each sitting's machine.txt
(the CPU, the pods' dtype and measured speed) and kvgate binary.
"""
import argparse
import glob
import json
import math
import os
import random
import re
import sys

BASE = "kvgate-routed"
# (column, key): the metrics of the ratio table.
METRICS = [("TTFT mean", "ttft_mean"), ("TTFT p90", "ttft_p90"), ("TTFT p99", "ttft_p99"),
           ("TPOT p99", "tpot_p99"), ("out tok/s", "tok_s"), ("hit rate", "hit")]
ORDER = ["kvgate-routed", "kvgate-base", "kvgate-engine", "kvgate-engine-base", "sglang-cache", "vllm-cache", "vllm-kv", "llmd-chain",
         "round-robin"]
# The peer routers (kvgate's own builds and modes are not peers).
PEERS = ["sglang-cache", "vllm-cache", "vllm-kv", "llmd-chain", "round-robin"]


def nearest_rank(xs, q):
    """Nearest-rank percentile of sorted xs (loadgen's and the simulator's); None when empty."""
    if not xs:
        return None
    return xs[min(max(math.ceil(q * len(xs)), 1), len(xs)) - 1]


def median(xs):
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def metrics(records, hit=None):
    """One run's figures from its per-request records (dicts as loadgen writes them)."""
    ttft, tpot = [], []
    tokens = errors = 0
    first = last = None
    for r in records:
        sent = r.get("sent_unix_ms")
        if sent is not None:
            end = sent + (r.get("e2e_ms") or 0.0)
            first = sent if first is None else min(first, sent)
            last = end if last is None else max(last, end)
        if r.get("error") is not None:
            errors += 1
            continue
        out = r.get("output_tokens") or 0
        tokens += out
        t = r.get("ttft_ms")
        if t is not None:
            ttft.append(t)
            if out >= 2:
                tpot.append((r["e2e_ms"] - t) / (out - 1))
    ttft.sort()
    tpot.sort()
    span_s = (last - first) / 1e3 if first is not None and last > first else None
    return {
        "requests": len(records),
        "errors": errors,
        "ttft_mean": sum(ttft) / len(ttft) if ttft else None,
        "ttft_p90": nearest_rank(ttft, 0.90),
        "ttft_p99": nearest_rank(ttft, 0.99),
        "tpot_p99": nearest_rank(tpot, 0.99),
        "tok_s": tokens / span_s if span_s else None,
        "tokens": tokens,
        "span_s": span_s,
        "hit": hit,
    }


def bootstrap_median(ratios, resamples=10000, seed="1", level=0.90):
    """(median, low, high): the median of the ratios and a bootstrap interval of it (percentile
    method, resampling the ratios with replacement); low/high are None with fewer than 2."""
    if not ratios:
        return None, None, None
    m = median(ratios)
    n = len(ratios)
    if n < 2:
        return m, None, None
    rng = random.Random(seed)
    stats = sorted(median([ratios[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - level) / 2
    return m, nearest_rank(stats, tail), nearest_rank(stats, 1 - tail)


class Cell:
    def __init__(self, meta, records, pods_before=None, pods_after=None):
        self.meta = meta
        self.records = records
        self.disturbed = bool(meta.get("disturbed"))
        self.hits = self.queries = None
        # Each pod's share of the run's prompt tokens (its prefix-cache queries), by pod order.
        self.shares = None
        if pods_before and pods_after and all(pods_before.get(u) and pods_after.get(u) for u in pods_before):
            self.hits = sum(pods_after[u]["hits"] - pods_before[u]["hits"] for u in pods_before)
            self.queries = sum(pods_after[u]["queries"] - pods_before[u]["queries"] for u in pods_before)
            if self.queries > 0:
                self.shares = [(pods_after[u]["queries"] - pods_before[u]["queries"]) / self.queries
                               for u in sorted(pods_before)]
        hit = meta.get("pods_hit_rate")
        if hit is None:
            hit = meta.get("loadgen_hit_rate")
        self.m = metrics(records, hit)


def read_jsonl(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_workload(wdir):
    """{(round, router): Cell} for every complete run under wdir."""
    cells = {}
    for meta_path in glob.glob(os.path.join(wdir, "round-*", "*.meta.json")):
        m = re.search(r"round-(\d+)$", os.path.dirname(meta_path))
        if not m:
            continue
        k = int(m.group(1))
        base = meta_path[: -len(".meta.json")]
        router = os.path.basename(base)
        meta = load_json(meta_path) or {}
        try:
            records = read_jsonl(base + ".requests.jsonl")
        except (OSError, ValueError) as e:
            print(f"!! {base}: no usable per-request records ({e}); run left out", file=sys.stderr)
            continue
        cells[(k, router)] = Cell(meta, records, load_json(base + ".pods-before.json"),
                                  load_json(base + ".pods-after.json"))
    return cells


def paired_ratios(cells, router, key, base=BASE, keep_disturbed=False):
    """[(round, ratio)] of router's metric to base's over the rounds both completed (left out:
    a disturbed run unless keep_disturbed, a missing value, a base value of 0)."""
    out = []
    for (k, name), c in sorted(cells.items()):
        if name != router:
            continue
        b = cells.get((k, base))
        if b is None or (not keep_disturbed and (c.disturbed or b.disturbed)):
            continue
        x, y = c.m[key], b.m[key]
        if x is None or y is None or y == 0:
            continue
        out.append((k, x / y))
    return out


def pooled(cells_of_router):
    recs = [r for c in cells_of_router for r in c.records]
    m = metrics(recs)
    spans = [c.m["span_s"] for c in cells_of_router if c.m["span_s"]]
    m["tok_s"] = sum(c.m["tokens"] for c in cells_of_router) / sum(spans) if spans else None
    if all(c.queries is not None for c in cells_of_router) and sum(c.queries for c in cells_of_router) > 0:
        m["hit"] = sum(c.hits for c in cells_of_router) / sum(c.queries for c in cells_of_router)
    else:
        hits = [c.m["hit"] for c in cells_of_router if c.m["hit"] is not None]
        m["hit"] = sum(hits) / len(hits) if hits else None
    return m


def fmt_ratio(med, lo, hi):
    if med is None:
        return "n/a"
    if lo is None:
        return f"×{med:.2f} [n/a]"
    mark = " †" if hi < 1 or lo > 1 else ""
    return f"×{med:.2f} [{lo:.2f}–{hi:.2f}]{mark}"


def fmt(x, digits=0):
    return "n/a" if x is None else f"{x:,.{digits}f}"


def ranges(ks):
    """[1, 2, 3, 5] -> '1–3, 5'."""
    ks = sorted(ks)
    out, i = [], 0
    while i < len(ks):
        j = i
        while j + 1 < len(ks) and ks[j + 1] == ks[j] + 1:
            j += 1
        out.append(str(ks[i]) if i == j else f"{ks[i]}–{ks[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def table(out_dir, workload, routers=None, base=BASE, resamples=10000, seed=1, keep_disturbed=False,
          file=sys.stdout):
    p = lambda *a: print(*a, file=file)
    wdir = os.path.join(out_dir, workload)
    cells = load_workload(wdir)
    p(f"\n### Workload {workload} ({wdir})\n")
    params = load_json(os.path.join(wdir, "params.json"))
    if params:
        p("Parameters: " + ", ".join(f"{k}={v}" for k, v in sorted(params.items())))
    if not cells:
        p("No complete run yet.")
        return cells
    names = sorted({r for _, r in cells}, key=lambda r: (ORDER.index(r) if r in ORDER else len(ORDER), r))
    if routers:
        names = [r for r in routers if r in names]
    rounds = sorted({k for k, _ in cells})
    disturbed = sorted({k for (k, r), c in cells.items() if c.disturbed and r in names})
    unwatched = sum(1 for c in cells.values() if not c.meta.get("quiet_watched"))
    p(f"Rounds: {len(rounds)} ({ranges(rounds)}); complete runs: {len(cells)}"
      f" ({', '.join(f'{r} {sum(1 for _, n in cells if n == r)}' for r in names)}).")
    p(f"Disturbed rounds: {len(disturbed)} ({ranges(disturbed)}): a process outside the harness "
      f"used > {threshold(cells)} % of a CPU during a run; "
      + ("kept (--keep-disturbed)." if keep_disturbed else "those runs' pairs are left out."))
    if unwatched:
        p(f"!! {unwatched} run(s) were not watched by quiet.py (QUIET_PCT=off or the watcher failed).")
    for (k, r), c in sorted(cells.items()):
        if c.disturbed and r in names and c.meta.get("violations"):
            p(f"  round {k} {r}: " + "; ".join(c.meta["violations"][:3]))

    if base not in names:
        p(f"\nNo run of the base router {base}: no ratios.")
    else:
        p(f"\nRatio to {base} (its own run of the same round): median of the per-round ratios "
          f"[bootstrap {resamples:,} resamples of the rounds, 90 % interval]; n: paired rounds; "
          "† the interval excludes ×1.00.\n")
        p("| router | n | " + " | ".join(c for c, _ in METRICS) + " |")
        p("|---|---:|" + "---|" * len(METRICS))
        for r in names:
            if r == base:
                continue
            cols, n = [], 0
            for col, key in METRICS:
                pr = paired_ratios(cells, r, key, base, keep_disturbed)
                n = max(n, len(pr))
                cols.append(fmt_ratio(*bootstrap_median([x for _, x in pr], resamples,
                                                        f"{seed}/{workload}/{r}/{key}")))
            p(f"| {r} | {n} | " + " | ".join(cols) + " |")
        aim(cells, names, base, resamples, seed, workload, keep_disturbed, p)
        few = [r for r in names if r != base and len(paired_ratios(cells, r, "ttft_mean", base, keep_disturbed)) < 5]
        if few:
            p(f"\n!! fewer than 5 paired rounds for {', '.join(few)}: run more rounds (ROUNDS=…).")

    kept = {r: [c for (k, n), c in sorted(cells.items()) if n == r and (keep_disturbed or not c.disturbed)]
            for r in names}
    p("\nAll kept runs' requests merged, per router (out tok/s: Σ tokens / Σ run spans; hit %: "
      "Σ hits / Σ queries):\n")
    p("| router | runs | requests | errors | TTFT mean ms | p90 | p99 | TPOT p99 ms | out tok/s | hit % |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in names:
        if not kept[r]:
            p(f"| {r} | 0 | | | | | | | | |")
            continue
        m = pooled(kept[r])
        hit = None if m["hit"] is None else 100 * m["hit"]
        p(f"| {r} | {len(kept[r])} | {m['requests']:,} | {m['errors']} | {fmt(m['ttft_mean'])} | "
          f"{fmt(m['ttft_p90'])} | {fmt(m['ttft_p99'])} | {fmt(m['tpot_p99'])} | {fmt(m['tok_s'])} | "
          f"{fmt(hit, 1)} |")

    p("\nTTFT mean ms per round (* disturbed):\n")
    p("| router | " + " | ".join(f"r{k}" for k in rounds) + " |")
    p("|---|" + "---:|" * len(rounds))
    for r in names:
        row = []
        for k in rounds:
            c = cells.get((k, r))
            row.append("" if c is None else fmt(c.m["ttft_mean"]) + ("*" if c.disturbed else ""))
        p(f"| {r} | " + " | ".join(row) + " |")

    p("\nEach pod's share of the run's prompt tokens (the pods' prefix-cache queries), pods in URL "
      "order; a run that left a pod idle measures one pod, not placement:\n")
    p("| router | " + " | ".join(f"r{k}" for k in rounds) + " |")
    p("|---|" + "---:|" * len(rounds))
    for r in names:
        row = []
        for k in rounds:
            c = cells.get((k, r))
            row.append("" if c is None or c.shares is None
                       else " / ".join(f"{100 * x:.0f}" for x in c.shares))
        p(f"| {r} | " + " | ".join(row) + " |")

    sittings = {}
    for (k, r), c in cells.items():
        sittings.setdefault(c.meta.get("sitting", "?"), set()).add(k)
    p("")
    for s, ks in sorted(sittings.items()):
        sdir = os.path.join(out_dir, "sittings", s)
        p(f"Sitting {s} (rounds {ranges(ks)}):")
        for name in ("machine.txt", "kvgate.txt"):
            try:
                with open(os.path.join(sdir, name)) as f:
                    for line in f.read().splitlines():
                        if line.strip():
                            p(f"  {line}")
            except OSError:
                p(f"  ({name} missing)")
    return cells


def aim(cells, names, base, resamples, seed, workload, keep_disturbed, p):
    """kvgate's default against the best peer per metric (the peer with the lowest median
    ratio to it): the median of the per-round ratios base ÷ peer and its bootstrap interval,
    the interval's width, and whether its upper bound is ≤ 1.05 (issue 40's aim; < 1.00 on
    the agent workload) and its width ≤ 0.2."""
    peers = [r for r in names if r in PEERS]
    if not peers:
        return
    p(f"\n{base} ÷ the best peer router ({', '.join(peers)}), for the mean and p99 TTFT: median "
      "of the per-round ratios [90 % interval], the interval's width, and issue 40's aim (upper "
      "bound ≤ 1.05, < 1.00 on the agent workload; width ≤ 0.2):\n")
    p("| metric | best peer | ratio | width | aim |")
    p("|---|---|---|---:|---|")
    bound = 1.0 if workload == "agent" else 1.05
    for col, key in (("TTFT mean", "ttft_mean"), ("TTFT p99", "ttft_p99")):
        inverse = {r: [1 / x for _, x in paired_ratios(cells, r, key, base, keep_disturbed) if x > 0]
                   for r in peers}
        inverse = {r: xs for r, xs in inverse.items() if xs}
        if not inverse:
            continue
        # The best peer: the highest median of base ÷ peer.
        best = max(inverse, key=lambda r: median(inverse[r]))
        med, lo, hi = bootstrap_median(inverse[best], resamples, f"{seed}/{workload}/aim/{best}/{key}")
        if lo is None:
            p(f"| {col} | {best} | ×{med:.2f} [n/a] | | n/a |")
            continue
        ok = (hi < bound if workload == "agent" else hi <= bound) and hi - lo <= 0.2
        p(f"| {col} | {best} | ×{med:.2f} [{lo:.2f}–{hi:.2f}] | {hi - lo:.2f} | "
          f"{'met' if ok else 'not met'} |")


def threshold(cells):
    for c in cells.values():
        t = c.meta.get("quiet_threshold_pct")
        if t is not None:
            return t
    return 5


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--workload", action="append", help="default: every workload under OUT_DIR")
    ap.add_argument("--base", default=BASE)
    ap.add_argument("--routers", help="comma list, in this order (default: all found)")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep-disturbed", action="store_true")
    a = ap.parse_args(argv)
    workloads = a.workload or sorted(
        d for d in os.listdir(a.out_dir)
        if glob.glob(os.path.join(a.out_dir, d, "round-*")))
    if not workloads:
        print(f"no workload with rounds under {a.out_dir}")
        return 1
    for w in workloads:
        table(a.out_dir, w, a.routers.split(",") if a.routers else None, a.base, a.resamples, a.seed,
              a.keep_disturbed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
