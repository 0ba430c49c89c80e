#!/usr/bin/env python3
"""Small steps of scripts/real-vllm/peers.sh (Python standard library only).

    peers_run.py slice TRACE OUT N
        The first N requests of a Mooncake trace whose text prompt (1.7 tokens per trace token,
        with a margin) plus output fit max_model_len 4096.
    peers_run.py params FILE KEY=VALUE...
        Writes the workload's parameters to FILE the first time; later, exits 1 (saying what
        differs) when they are not the same: rounds measured with different parameters must not
        be merged into one table.
    peers_run.py counters OUT URL...
        The pods' prefix-cache counters (`vllm:prefix_cache_hits_total`, `…_queries_total`,
        tokens, summed over series) from each URL's /metrics, as JSON: {url: {hits, queries}} (a
        URL that does not answer: null).
    peers_run.py finish CELL KEY=VALUE...
        Writes CELL.meta.json (atomically, last: its presence marks the cell complete) from the
        KEY=VALUE pairs, CELL.quiet.json (the watcher's summary), CELL.pods-before.json and
        CELL.pods-after.json (the counters), and CELL.json (loadgen's report).
"""
import json
import os
import re
import sys
import urllib.request

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"


def write_atomic(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def parse_counters(text):
    """Sums of the two counters (tokens); None when the queries counter is absent."""
    c = {"hits": 0.0, "queries": 0.0}
    seen = False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for name, key in ((HITS, "hits"), (QUERIES, "queries")):
            m = re.match(re.escape(name) + r"(\{[^}]*\})?\s+(\S+)", line)
            if m:
                try:
                    c[key] += float(m.group(2))
                    seen = seen or key == "queries"
                except ValueError:
                    pass
    return c if seen else None


def scrape(url):
    url = url.rstrip("/")
    if not url.endswith("/metrics"):
        url += "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return parse_counters(r.read(4 << 20).decode("utf-8", "replace"))
    except OSError:
        return None


def hit_rate(before, after):
    """Δhits / Δqueries over every pod; None when a pod is missing or nothing was queried."""
    if not before or not after:
        return None
    h = q = 0.0
    for url, b in before.items():
        a = after.get(url)
        if not a or not b:
            return None
        h += a["hits"] - b["hits"]
        q += a["queries"] - b["queries"]
    return min(1.0, max(0.0, h / q)) if q > 0 and h >= 0 else None


def kv(pairs):
    out = {}
    for p in pairs:
        k, _, v = p.partition("=")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def main(argv):
    cmd = argv[1]
    if cmd == "slice":
        src, dst, n = argv[2], argv[3], int(argv[4])
        kept = []
        with open(src) as f:
            for line in f:
                r = json.loads(line)
                if 1.7 * r["input_length"] + r["output_length"] <= 3900:
                    kept.append(line)
                if len(kept) == n:
                    break
        with open(dst + ".tmp", "w") as f:
            f.writelines(kept)
        os.replace(dst + ".tmp", dst)
        print(f"slice: {len(kept)} requests")
    elif cmd == "params":
        path, want = argv[2], kv(argv[3:])
        have = load(path)
        if have is None:
            write_atomic(path, want)
            return 0
        diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        if diff:
            for k in diff:
                print(f"  {k}: measured with {have.get(k)!r}, now {want.get(k)!r}", file=sys.stderr)
            return 1
    elif cmd == "counters":
        write_atomic(argv[2], {u: scrape(u) for u in argv[3:]})
    elif cmd == "finish":
        cell, meta = argv[2], kv(argv[3:])
        quiet = load(cell + ".quiet.json")
        before, after = load(cell + ".pods-before.json"), load(cell + ".pods-after.json")
        report = load(cell + ".json") or {}
        meta["disturbed"] = bool(quiet and quiet.get("disturbed"))
        meta["quiet_watched"] = quiet is not None
        meta["pods_hit_rate"] = hit_rate(before, after)
        meta["loadgen_hit_rate"] = report.get("prefix_hit_rate")
        meta["errors"] = sum(report.get("errors", {}).values())
        if quiet:
            meta["violations"] = [f"{v['comm']} (pid {v['pid']}, nice {v['nice']}): max {v['max_pct']} %, "
                                  f"{v['intervals']} of {quiet['intervals']} intervals"
                                  for v in quiet.get("violations", [])[:5]]
        write_atomic(cell + ".meta.json", meta)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
