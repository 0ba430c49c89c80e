"""Measures what a request's TTFT costs on a real vLLM pod that is already busy, to check the
simulator's step-time model where it matters for routing: a prefill that shares steps with
running decodes (chunked prefill mixes them in one batch).

For each background (B sequences decoding, each with a C-token prompt, started together and
left decoding) and each probe size P: wait until every background stream has its first token,
measure the background's TPOT for a while (the decode step time), then send a probe of P fresh
tokens (max_tokens 1) and record its TTFT. The background is closed after each probe (vLLM
aborts a request whose client disconnects). Every prompt is fresh random ids: no prefix hits.

Prints one line per point and a JSON object (last line) with every sample, which
`calibrate.py --mixed FILE` fits. With --profile FILE.json, also prints what the profile's
step-time model predicts for each point (the probe waits half a decode step on average, then
its prefill steps run with the B decodes).
Usage: python probe_mixed.py POD_URL [--model tiny] [--reps 3] [--profile FILE.json]
"""
import argparse
import json
import random
import statistics
import threading
import time
import urllib.request

import speed  # this directory's speed.py

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--model", default="tiny")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--vocab", type=int, default=4096)
ap.add_argument("--backgrounds", default="0x0,2x1024,4x1024,8x1024,4x3000",
                help="comma list of BxC: B sequences with C-token prompts")
ap.add_argument("--probes", default="256,1024,2048,3000,4000")
ap.add_argument("--profile")
ap.add_argument("--scrape-hz", type=float, default=0.0,
                help="also GET /metrics this often, as a router scraping the pod would")
args = ap.parse_args()
print(f"machine: {speed.cpu_model()}", flush=True)  # beside the figures (speed.py)
rng = random.Random()  # fresh ids in every run: a second run must not hit the first one's cache
MAX_LEN = 4096


def tokens(n):
    return [rng.randrange(16, args.vocab) for _ in range(n)]


class Stream(threading.Thread):
    """One streamed completion; records each token's arrival time."""

    def __init__(self, n_prompt, max_tokens):
        super().__init__(daemon=True)
        self.body = json.dumps({"model": args.model, "prompt": tokens(n_prompt),
                                "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                                "temperature": 0.0}).encode()
        self.times = []
        self.stop = threading.Event()
        self.started = None

    def run(self):
        req = urllib.request.Request(args.url + "/v1/completions", self.body,
                                     {"content-type": "application/json"})
        self.started = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                for line in r:
                    if line.startswith(b"data: {"):
                        self.times.append(time.perf_counter())
                    if self.stop.is_set():
                        break
        except OSError:
            pass


def point(b, c, p):
    """(probe TTFT s, background TPOT s or None) for one sample."""
    bg = [Stream(c, MAX_LEN - c - 8) for _ in range(b)]
    for s in bg:
        s.start()
    while any(len(s.times) == 0 for s in bg):
        time.sleep(0.01)
    tpot = None
    if bg:
        time.sleep(0.5)
        mark = [len(s.times) for s in bg]
        t_mark = time.perf_counter()
        time.sleep(1.0)
        gaps = [(time.perf_counter() - t_mark) / max(1, len(s.times) - m) for s, m in zip(bg, mark)]
        tpot = statistics.median(gaps)
    probe = Stream(p, 1)
    probe.run()
    ttft = probe.times[0] - probe.started
    for s in bg:
        s.stop.set()
    for s in bg:
        s.join(timeout=30)
    time.sleep(0.3)  # let the aborts land before the next point
    return ttft, tpot


def predict(profile, b, c, p, tpot_s):
    """The profile's TTFT for the probe: half a decode step of waiting, then the probe's prefill
    steps (chunks of the step budget) with the B decodes in each."""
    budget = profile["max_num_batched_tokens"]
    ctx_bg = b * (c + 16)
    wait = 0.5 * tpot_s * 1e6 if tpot_s else 0.0
    total, done = wait, 0
    while done < p:
        chunk = min(budget - b, p - done)
        total += (profile["t0_us"] + profile["a_us_per_prefill_token"] * chunk
                  + profile["b_us_per_decode_seq"] * b
                  + profile["k_us_per_context_token"] * (ctx_bg + done + chunk)
                  + profile.get("q_us_per_prefill_pair", 0.0) * (chunk * done + chunk * (chunk + 1) / 2))
        done += chunk
    return total / 1e6


profile = json.load(open(args.profile)) if args.profile else None
scrape_ms = []


def scraper():
    while True:
        t = time.perf_counter()
        try:
            urllib.request.urlopen(args.url + "/metrics", timeout=10).read()
            scrape_ms.append((time.perf_counter() - t) * 1000)
        except OSError:
            pass
        time.sleep(max(0.0, 1.0 / args.scrape_hz - (time.perf_counter() - t)))


if args.scrape_hz > 0:
    threading.Thread(target=scraper, daemon=True).start()
Stream(32, 2).run()  # warm-up
samples = []
for bgspec in args.backgrounds.split(","):
    b, c = (int(x) for x in bgspec.split("x"))
    for p in (int(x) for x in args.probes.split(",")):
        if p + 1 > MAX_LEN:
            continue
        ttfts, tpots = [], []
        for _ in range(args.reps):
            ttft, tpot = point(b, c, p)
            ttfts.append(ttft)
            if tpot:
                tpots.append(tpot)
            samples.append({"bg_seqs": b, "bg_prompt": c, "probe": p, "ttft_us": round(ttft * 1e6),
                            "bg_tpot_us": round(tpot * 1e6) if tpot else None})
        med = statistics.median(ttfts)
        tpot = statistics.median(tpots) if tpots else None
        line = (f"background {b:2d} x {c:4d} (TPOT {tpot * 1000 if tpot else 0:6.1f} ms), "
                f"probe {p:4d}: TTFT median {med * 1000:7.1f} ms")
        if profile:
            pred = predict(profile, b, c, p, tpot)
            line += f", model {pred * 1000:7.1f} ms ({pred / med:.2f}x)"
        print(line, flush=True)
if scrape_ms:
    print(f"/metrics: {len(scrape_ms)} scrapes, median {statistics.median(scrape_ms):.1f} ms, "
          f"max {max(scrape_ms):.1f} ms", flush=True)
print(json.dumps({"samples": samples, "scrape_ms": [round(x, 1) for x in scrape_ms]}))
