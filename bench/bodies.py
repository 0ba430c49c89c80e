#!/usr/bin/env python3
"""The chat bodies of bench/cost.sh and bench/body_ir.sh (standard library only):

    bench/bodies.py OUT_DIR [NAME ...]     NAME: short (~200 chars), 32k, 400k (default: all)

Writes OUT_DIR/body-NAME.json: a shared system prompt (7/8 of the characters) and a user
message (1/8) that starts with `@@N@@`, which the load generator replaces by the request's
number, so every request is a new turn after a shared prefix. Deterministic (seeded words).
"""
import json
import sys

SIZES = {"short": 200, "32k": 32_000, "400k": 400_000}
WORDS = "the router pod cache prefix token block engine request latency model fleet gate score".split()


def text(chars, seed):
    s, x = [], seed
    n = 0
    while n < chars:
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        w = WORDS[(x >> 60) % len(WORDS)]
        s.append(w)
        n += len(w) + 1
        if len(s) % 40 == 0:
            s.append("\n")
    return " ".join(s)[:chars]


def body(chars):
    return {"model": "m", "messages": [{"role": "system", "content": text(chars * 7 // 8, 1)},
                                       {"role": "user", "content": "@@N@@ " + text(chars // 8, 2)}],
            "max_tokens": 1}


if __name__ == "__main__":
    out, names = sys.argv[1], sys.argv[2:] or list(SIZES)
    for name in names:
        with open(f"{out}/body-{name}.json", "w") as f:
            f.write(json.dumps(body(SIZES[name])))
