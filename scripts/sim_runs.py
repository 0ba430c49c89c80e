"""Shared by the scripts/*_table.py readers of `kvgate sim --json` outputs (standard library).

`grouped(args)` reads LABEL=file.json arguments and returns the affinity-gate runs grouped by
(label, rate scale), with the keys in first-seen order; `mean` is the plain mean (nan when
empty).
"""
import json
from collections import defaultdict


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def grouped(args, policy="affinity-gate"):
    cells = defaultdict(list)
    order = []
    for arg in args:
        label, path = arg.split("=", 1)
        with open(path) as f:
            runs = json.load(f)["runs"]
        for r in runs:
            if r["policy"] == policy:
                key = (label, r["rate_scale"])
                if key not in order:
                    order.append(key)
                cells[key].append(r)
    return order, cells
