#!/usr/bin/env python3
"""Spread a Mooncake-format trace's arrivals: each request later by a uniform draw in [0, J) ms.

    bench/jitter_trace.py TRACE N J OUT

Writes the first N requests of TRACE to OUT with `timestamp` moved by a seeded (seed 1) uniform
draw in [0, J) ms each, re-sorted by the new times (ties keep the trace's order); J = 0 copies
them unchanged. The Mooncake conversation trace's timestamps come in ticks of ~3,000 ms (2,133
of its first 2,400 requests share their arrival instant with the one before), so J = 3000
spreads each tick's requests over it: arrivals as a client fleet would send them rather than
in synchronized bursts (docs/decisions/cluster-sharing.md). Used by bench/replicas.sh --jitter-ms; the
output is also a `kvgate sim --trace` input. Standard library only.
"""
import json
import random
import sys


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    trace, n, jitter, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    with open(trace) as f:
        lines = [line for _, line in zip(range(n), f)]
    if jitter > 0:
        rng = random.Random(1)
        moved = []
        for line in lines:
            r = json.loads(line)
            r["timestamp"] = int(r["timestamp"] + rng.random() * jitter)
            moved.append(r)
        moved.sort(key=lambda r: r["timestamp"])
        lines = [json.dumps(r) + "\n" for r in moved]
    with open(out, "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main()
