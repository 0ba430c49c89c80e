#!/usr/bin/env python3
"""One `kvgate calibrate --from-capture` input from a peers.sh directory's captures (issue 42).

    capture_cached.py OUT_DIR ROUTER OUT_FILE [--trace-block 512] [--pod-block 128]

Without TOKENS_DETAILS=1 peers.sh's pods do not report cached tokens (no --enable-prompt-tokens-details), so
each captured request's `cached_tokens` is estimated from its `hash_ids`: the longest run of
leading trace blocks (--trace-block tokens each) already sent to the same pod in that round,
cut to whole pod blocks (--pod-block) and to the prompt minus one token. It ignores evictions
and the tail of a previous turn that a trace block does not cover, so it errs either way by
up to a pod block. Rounds (OUT_DIR/*/round-*/ROUTER.capture.jsonl) are shifted in time so that
they never overlap. Python standard library only.
"""
import argparse
import glob
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("router")
    ap.add_argument("out_file")
    ap.add_argument("--trace-block", type=int, default=512)
    ap.add_argument("--pod-block", type=int, default=128)
    a = ap.parse_args()
    offset, n = 0.0, 0
    with open(a.out_file, "w") as w:
        for path in sorted(glob.glob(f"{a.out_dir}/*/round-*/{a.router}.capture.jsonl")):
            seen, end = {}, 0.0
            for line in open(path):
                r = json.loads(line)
                pod = seen.setdefault(r["pod"], set())
                hits = 0
                for h in r["hash_ids"]:
                    if h not in pod:
                        break
                    hits += 1
                pod.update(r["hash_ids"])
                cached = min(hits * a.trace_block, r["input_length"] - 1)
                r["cached_tokens"] = max(0, cached // a.pod_block * a.pod_block)
                end = max(end, r["dispatch_ms"] + r["e2e_ms"])
                r["dispatch_ms"] += offset
                w.write(json.dumps(r) + "\n")
                n += 1
            offset += end + 60000.0
    print(f"{n} requests written to {a.out_file}")


if __name__ == "__main__":
    main()
