"""Do two vLLM CPU pods on one machine slow each other? Measures pod A's prefill and decode speed
on an idle machine, then each pod's throughput alone and with the other busy, and the CPU each
pod's processes use meanwhile.
Python standard library only.

    layout.py POD_A_URL POD_B_URL --pgid-a PGID --pgid-b PGID [--label L] [--rounds 3]
              [--concurrency 2] [--seconds 30] [--json FILE]

The probes are speed.py's (a fresh ~1,000-token prompt with max_tokens 1: ms per 1,000 prompt
tokens; a streamed 33-token completion on a short prompt: ms per token between the first token
and the last), the fastest of ROUNDS each, so that a probe measures the pod and not a hiccup.
Then each pod's throughput alone and with the other busy: CONCURRENCY clients per busy pod send
it fresh ~1,000-token prompts with 16 output tokens back to back for SECONDS (after 2 s of
warm-up): p0 alone, p1 alone, both at once; per pod, requests completed per second and their
mean latency. Two machines would keep each pod's throughput with both busy equal to its own
alone (ratio 1.0). CPU: the sum of utime + stime over every process in each pod's process group
(pod.sh starts each pod with setsid, so its API server, engine core and workers share one
group), in cores (1.0 = one core busy the whole time). A pod whose engine spins after each read
(vLLM's multiprocess executor: shm_broadcast's busy loop) uses more than one core while busy.
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


def probe(url, model, rounds):
    tag = time.time_ns()
    prefill = min(speed.prefill_ms_per_1k(url, model, f"{tag}p{k}", 300)[0] for k in range(rounds))
    decode = min(speed.decode_ms_per_token(url, model, f"{tag}d{k}", 300) for k in range(rounds))
    return prefill, decode


def warm(url, model):
    speed.post(url, {"model": model, "prompt": f"# warm-up {time.time_ns()}", "max_tokens": 2},
               300).read()


def load(urls, model, concurrency, seconds):
    """Keeps each pod in `urls` busy with `concurrency` clients for `seconds`; per pod: requests
    completed, their mean latency (s) and its process group's CPU (cores)."""
    stop = threading.Event()
    done = {u: [] for u in urls}
    lat = {u: [] for u in urls}

    def client(u, k):
        lines = "".join(f"def h{i}(x): return x + {i}\n" for i in range(80))  # ~1,000 tokens
        i = 0
        while not stop.is_set():
            i += 1
            body = {"model": model, "prompt": f"# load {time.time_ns()}-{k}-{i}\n{lines}",
                    "max_tokens": 16, "ignore_eos": True, "temperature": 0.0}
            t = time.monotonic()
            try:
                speed.post(u, body, 300).read()
            except Exception:
                continue
            if not stop.is_set():
                done[u].append(1)
                lat[u].append(time.monotonic() - t)

    threads = [threading.Thread(target=client, args=(u, k), daemon=True)
               for u in urls for k in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # the clients in flight before counting
    for u in urls:
        done[u].clear()
        lat[u].clear()
    return threads, stop, done, lat


def measure(pods, pgids, model, concurrency, seconds, busy):
    """Loads the pods in `busy` (indexes) for `seconds`; per pod in `busy`: requests/s, mean
    latency, and every pod's CPU in cores."""
    urls = [pods[i] for i in busy]
    threads, stop, done, lat = load(urls, model, concurrency, seconds)
    c0, t0 = [group_cpu_s(g) for g in pgids], time.monotonic()
    time.sleep(seconds)
    c1, t1 = [group_cpu_s(g) for g in pgids], time.monotonic()
    rates = {u: len(done[u]) / (t1 - t0) for u in urls}
    lats = {u: (sum(lat[u]) / len(lat[u]) if lat[u] else float("nan")) for u in urls}
    stop.set()
    for t in threads:
        t.join(timeout=300)
    return {"busy": [f"p{i}" for i in busy],
            "requests_per_s": {f"p{i}": round(rates[pods[i]], 3) for i in busy},
            "latency_s": {f"p{i}": round(lats[pods[i]], 3) for i in busy},
            "cpu_cores": {f"p{i}": round((c1[i] - c0[i]) / (t1 - t0), 2) for i in range(len(pods))}}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pod_a")
    p.add_argument("pod_b")
    p.add_argument("--pgid-a", type=int, required=True)
    p.add_argument("--pgid-b", type=int, required=True)
    p.add_argument("--model", default="tiny")
    p.add_argument("--label", default="")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--json", default="")
    args = p.parse_args()
    pods, pgids = [args.pod_a, args.pod_b], [args.pgid_a, args.pgid_b]
    for u in pods:
        warm(u, args.model)
    out = {"label": args.label, "processes": [group_size(g) for g in pgids]}
    prefill, decode = probe(args.pod_a, args.model, args.rounds)
    out["a_alone_idle"] = {"prefill_ms_per_1k": round(prefill, 1), "decode_ms_per_token": round(decode, 2)}
    print(f"{args.label}: p0 alone, idle machine: prefill {prefill:.1f} ms/1k, decode {decode:.2f} ms/token; "
          f"processes per pod {out['processes']}", flush=True)
    runs = []
    for busy in ([0], [1], [0, 1]):
        r = measure(pods, pgids, args.model, args.concurrency, args.seconds, busy)
        runs.append(r)
        print(f"{args.label}: busy {'+'.join(r['busy'])}: requests/s {r['requests_per_s']}, "
              f"latency s {r['latency_s']}, CPU cores {r['cpu_cores']}", flush=True)
    out["runs"] = runs
    alone = {**runs[0]["requests_per_s"], **runs[1]["requests_per_s"]}
    both = runs[2]["requests_per_s"]
    out["throughput_both_over_alone"] = {k: round(both[k] / alone[k], 2) if alone[k] else None
                                         for k in both}
    print(f"{args.label}: each pod's throughput with both busy / alone: "
          f"{out['throughput_both_over_alone']} (1.0: as two machines)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
