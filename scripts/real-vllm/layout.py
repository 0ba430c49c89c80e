"""Do two vLLM CPU pods on one machine slow each other? Measures pod A's prefill and decode speed
with pod B idle, then with pod B kept busy, and the CPU that each pod's processes use meanwhile.
Python standard library only.

    layout.py POD_A_URL POD_B_URL --pgid-a PGID --pgid-b PGID [--label L] [--rounds 3]
              [--busy-concurrency 4] [--json FILE]

The probes are speed.py's (a fresh ~1,000-token prompt with max_tokens 1: ms per 1,000 prompt
tokens; a streamed 33-token completion on a short prompt: ms per token between the first token
and the last), the fastest of ROUNDS each, so that a probe measures the pod and not a hiccup.
"B busy": BUSY_CONCURRENCY client threads send B fresh ~1,000-token prompts with 16 output
tokens, back to back, for the whole probe of A (and one second before it). CPU: the sum of
utime + stime over every process in each pod's process group (pod.sh starts each pod with
setsid, so its API server, engine core and helpers share one group), over the probe, in cores
(1.0 = one core busy the whole time). A pod whose engine spins after each read (vLLM's
multiprocess executor: shm_broadcast's busy loop) uses more than one core while busy.
"""
import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import speed  # noqa: E402  (speed.py beside this file)

CLK_TCK = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid):
    """CPU seconds (user + system) used so far by the live processes of process group PGID."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command (which may hold spaces) start after the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) != pgid:  # pgrp is field 5; fields[0] is field 3 (state)
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLK_TCK


def group_size(pgid):
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                if int(stat[stat.rindex(")") + 2:].split()[2]) == pgid:
                    n += 1
            except OSError:
                pass
    return n


def keep_busy(url, model, stop, sent, tag):
    lines = "".join(f"def h{i}(x): return x + {i}\n" for i in range(80))  # ~1,000 tokens
    i = 0
    while not stop.is_set():
        i += 1
        body = {"model": model, "prompt": f"# busy {tag}-{i}\n{lines}", "max_tokens": 16,
                "ignore_eos": True, "temperature": 0.0}
        try:
            speed.post(url, body, 300).read()
            sent.append(1)
        except Exception:  # a failure shows as fewer requests served, printed
            time.sleep(0.1)


def probe(url, model, rounds):
    tag = time.time_ns()
    prefill = min(speed.prefill_ms_per_1k(url, model, f"{tag}p{k}", 300)[0] for k in range(rounds))
    decode = min(speed.decode_ms_per_token(url, model, f"{tag}d{k}", 300) for k in range(rounds))
    return prefill, decode


def warm(url, model):
    speed.post(url, {"model": model, "prompt": f"# warm-up {time.time_ns()}", "max_tokens": 2},
               300).read()


def measure(a, b, pgid_a, pgid_b, model, rounds, busy, b_busy):
    stop = threading.Event()
    sent = []
    threads = []
    if b_busy:
        tag = f"busy{time.time_ns()}"
        threads = [threading.Thread(target=keep_busy, args=(b, model, stop, sent, f"{tag}-{k}"),
                                    daemon=True) for k in range(busy)]
        for t in threads:
            t.start()
        time.sleep(1.0)
    ca0, cb0, t0 = group_cpu_s(pgid_a), group_cpu_s(pgid_b), time.monotonic()
    prefill, decode = probe(a, model, rounds)
    ca1, cb1, t1 = group_cpu_s(pgid_a), group_cpu_s(pgid_b), time.monotonic()
    stop.set()
    for t in threads:
        t.join(timeout=300)
    span = t1 - t0
    return {"b_busy": b_busy, "prefill_ms_per_1k": round(prefill, 1),
            "decode_ms_per_token": round(decode, 2), "cpu_a_cores": round((ca1 - ca0) / span, 2),
            "cpu_b_cores": round((cb1 - cb0) / span, 2), "b_requests_served": len(sent),
            "span_s": round(span, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pod_a")
    p.add_argument("pod_b")
    p.add_argument("--pgid-a", type=int, required=True)
    p.add_argument("--pgid-b", type=int, required=True)
    p.add_argument("--model", default="tiny")
    p.add_argument("--label", default="")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--busy-concurrency", type=int, default=4)
    p.add_argument("--json", default="")
    args = p.parse_args()
    warm(args.pod_a, args.model)
    warm(args.pod_b, args.model)
    out = {"label": args.label, "processes_a": group_size(args.pgid_a),
           "processes_b": group_size(args.pgid_b), "runs": []}
    for b_busy in (False, True):
        r = measure(args.pod_a, args.pod_b, args.pgid_a, args.pgid_b, args.model, args.rounds,
                    args.busy_concurrency, b_busy)
        out["runs"].append(r)
        print(f"{args.label}: B {'busy' if b_busy else 'idle'}: A prefill {r['prefill_ms_per_1k']} ms/1k, "
              f"decode {r['decode_ms_per_token']} ms/token; CPU A {r['cpu_a_cores']} cores, "
              f"B {r['cpu_b_cores']} cores (B served {r['b_requests_served']} in {r['span_s']} s)",
              flush=True)
    idle, busy = out["runs"]
    out["slowdown_prefill"] = round(busy["prefill_ms_per_1k"] / idle["prefill_ms_per_1k"], 2)
    out["slowdown_decode"] = round(busy["decode_ms_per_token"] / idle["decode_ms_per_token"], 2)
    print(f"{args.label}: A slowed by B busy: prefill x{out['slowdown_prefill']}, "
          f"decode x{out['slowdown_decode']}; processes per pod {out['processes_a']} / {out['processes_b']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
