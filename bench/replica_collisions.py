#!/usr/bin/env python3
"""Near-simultaneous requests and where they went, per bench/replicas.sh run.

    bench/replica_collisions.py RUN_DIR [RUN_DIR ...]

RUN_DIR is one scenario's log directory of bench/replicas.sh (`OUT/log/round<r>/<scenario>`,
holding requests<h>.jsonl from `kvgate loadgen --requests-jsonl`). For pairs of requests sent
within W ms of each other by different load generators (parts; part h goes to replica h mod R),
prints how many such pairs there were and the share that landed on the same pod, for W = 2, 5
and 20 ms, over all pairs and over pairs of prompts above 8,000 tokens.

One router decides such a pair one after the other, the second seeing the first's charge;
R replicas decide it in parallel when the parts go to different replicas, each before it hears
of the other's route (docs/decisions/cluster-sharing.md). A higher same-pod share than one replica's is what
that costs. Standard library only.
"""
import json
import statistics
import sys
from pathlib import Path

WINDOWS_MS = (2, 5, 20)
BIG_PROMPT = 8000


def load(run_dir):
    reqs = []
    for path in sorted(Path(run_dir).glob("requests*.jsonl")):
        part = path.stem.removeprefix("requests")
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("error") is None and r.get("pod"):
                    r["part"] = part
                    reqs.append(r)
    reqs.sort(key=lambda r: r["sent_unix_ms"])
    return reqs


def pairs(reqs, window_ms):
    n = same = big = big_same = 0
    for i, a in enumerate(reqs):
        for b in reqs[i + 1:]:
            if b["sent_unix_ms"] - a["sent_unix_ms"] > window_ms:
                break
            if a["part"] == b["part"]:
                continue
            hit = a["pod"] == b["pod"]
            n += 1
            same += hit
            if a["input_tokens"] > BIG_PROMPT and b["input_tokens"] > BIG_PROMPT:
                big += 1
                big_same += hit
    return n, same, big, big_same


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("| run | requests | TTFT mean ms | " + " | ".join(
        f"pairs ≤ {w} ms: n, same pod (big prompts)" for w in WINDOWS_MS) + " |")
    print("|---|---:|---:|" + "---|" * len(WINDOWS_MS))
    for d in sys.argv[1:]:
        reqs = load(d)
        if not reqs:
            print(f"| {d} | 0 | – |" + " – |" * len(WINDOWS_MS))
            continue
        ttft = [r["ttft_ms"] for r in reqs if r.get("ttft_ms") is not None]
        cells = []
        for w in WINDOWS_MS:
            n, same, big, big_same = pairs(reqs, w)
            cells.append(f"{n}, {same / max(n, 1):.2f} ({big_same / max(big, 1):.2f} of {big})")
        name = "/".join(Path(d).parts[-2:])
        print(f"| {name} | {len(reqs)} | {statistics.mean(ttft):.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
