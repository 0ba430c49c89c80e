#!/usr/bin/env python3
"""What a router's /metrics scrape costs a real pod: runs with and without a background scraper
at a given interval, alternated (ABBA…), on one pod. Standard library only.

    scrape_cost.py URL [--interval-ms 50] [--pairs 4] [--model tiny]

Each run: 8 streams with 200-token outputs start (a decode batch), then 6 requests with fresh
~1,500-word prompts are sent one after the other; the run's figure is the mean TTFT of those 6
(prefill behind the decodes) and its wall time. The scraper GETs URL/metrics, then sleeps the
interval (as a ticker that waits for the answer does). Prints each run, the scrape's own
latency (median, max) and the means per arm, and the ratio scrape / none.
"""

import argparse
import json
import random
import statistics
import threading
import time
import urllib.request

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def prompt(seed, n=1500):
    r = random.Random(seed)
    return " ".join(r.choice(WORDS) for _ in range(n))


def stream(url, model, seed, max_tokens, ttfts):
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt(seed)}],
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/chat/completions", body, {"content-type": "application/json"}
    )
    t0 = time.perf_counter()
    first = None
    with urllib.request.urlopen(req) as resp:
        for line in resp:
            if first is None and line.startswith(b"data: {") and b'"content"' in line:
                first = time.perf_counter() - t0
    if first is not None:
        ttfts.append(first * 1000)


def one_run(url, model, seed0):
    ttfts = []
    decodes = [
        threading.Thread(target=stream, args=(url, model, seed0 + i, 200, []))
        for i in range(8)
    ]
    for t in decodes:
        t.start()
    time.sleep(1.0)
    for i in range(6):
        stream(url, model, seed0 + 100 + i, 4, ttfts)
    for t in decodes:
        t.join()
    return statistics.mean(ttfts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--interval-ms", type=float, default=50)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--model", default="tiny")
    a = ap.parse_args()
    url = a.url.rstrip("/")
    stop = threading.Event()
    scrapes = []

    def scraper():
        while not stop.is_set():
            t0 = time.perf_counter()
            urllib.request.urlopen(url + "/metrics").read()
            scrapes.append((time.perf_counter() - t0) * 1000)
            time.sleep(a.interval_ms / 1000)

    res = {"none": [], "scrape": []}
    for k in range(a.pairs):
        for arm in ["none", "scrape"] if k % 2 == 0 else ["scrape", "none"]:
            th = None
            if arm == "scrape":
                stop.clear()
                th = threading.Thread(target=scraper)
                th.start()
            t0 = time.perf_counter()
            ttft = one_run(url, a.model, 1000 * (2 * k + (arm == "scrape")) + 7)
            wall = time.perf_counter() - t0
            if th:
                stop.set()
                th.join()
            res[arm].append((ttft, wall))
            print(f"{arm:6s} TTFT mean {ttft:6.0f} ms, run wall {wall:5.1f} s", flush=True)
    if scrapes:
        print(
            f"scrape latency: median {statistics.median(scrapes):.1f} ms, "
            f"max {max(scrapes):.1f} ms, n {len(scrapes)} (every {a.interval_ms:g} ms)"
        )
    means = {
        arm: (statistics.mean(t for t, _ in v), statistics.mean(w for _, w in v))
        for arm, v in res.items()
    }
    for arm, (t, w) in means.items():
        print(f"{arm:6s} TTFT mean {t:6.0f} ms, wall {w:5.2f} s")
    print(
        f"scrape / none: TTFT x{means['scrape'][0] / means['none'][0]:.2f}, "
        f"wall x{means['scrape'][1] / means['none'][1]:.2f}"
    )


if __name__ == "__main__":
    main()
