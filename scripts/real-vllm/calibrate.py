"""Measures a real vLLM pod's step time, to fit the simulator's step-time model
(crates/kvgate-sim/src/profiles.rs):

    step_us = t0 + a·(uncached prefill tokens) + b·(decode sequences) + k·(context tokens read)
              + k2·(context tokens read)² + q·(prefill attention pairs)

- prefill: one request at a time, prompts of N random token ids (never cached: fresh ids each
  time), max_tokens 1, streamed; TTFT(N) ≈ the prefill steps of N tokens (+ HTTP)
  → c + a·N + q·N(N+1)/2 (+ t0 per extra step when N exceeds the step budget);
- decode: B requests at once (64-token prompts, 64 output tokens, ignore_eos), TPOT of each
  (time between its first and last token / 63) ≈ the step time with B sequences → t0' + b·B;
- context: B sequences with 1,024…3,000-token prompts (up to ~60k tokens read per step); the
  TPOT left after t0 + b·B against the tokens read → k·ctx + k2·ctx².
Least-squares fits. t0 is the decode fit's intercept (token gaps carry no HTTP overhead), a and
q the prefill fit's linear and quadratic terms (prompts of 64…3,072 tokens; beyond the step's
token budget, `max_num_batched_tokens`, a prompt takes two steps, and the second step's t0 is
taken off before the fit); chunked prefill is then checked on a prompt the fit did not see:
a prompt of twice the budget, measured TTFT next to the model's prediction.
Prints every measurement and the fit as JSON (last line); with --profile-out, writes a profile
that `kvgate sim --profile FILE.json` and `kvgate mock-pod --profile FILE.json` read, with the
pod's KV size from its `vllm:cache_config_info` and `max_model_len` from `/v1/models`.
Usage: python calibrate.py POD_URL [MODEL] [--reps N] [--profile-out FILE --name NAME]
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
ap.add_argument("model", nargs="?", default="tiny")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--vocab", type=int, default=4096)
ap.add_argument("--profile-out")
ap.add_argument("--name", default="measured")
# vLLM 0.32's defaults for the OpenAI server on CPU (vllm/engine/arg_utils.py,
# EngineArgs.get_batch_defaults): 2,048 batched tokens, 128 sequences.
ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
ap.add_argument("--max-num-seqs", type=int, default=128)
args = ap.parse_args()
print(f"machine: {speed.cpu_model()}", flush=True)  # beside the figures (speed.py)
rng = random.Random(7)


def tokens(n):
    # Ids 16.. avoid the special tokens of the tiny model (0..6); fresh random ids never hit.
    return [rng.randrange(16, args.vocab) for _ in range(n)]


def stream(prompt, max_tokens):
    """(ttft_s, tpot_s or None) of one streamed completion."""
    body = json.dumps({"model": args.model, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True, "temperature": 0.0}).encode()
    req = urllib.request.Request(args.url + "/v1/completions", body,
                                 {"content-type": "application/json"})
    start = time.perf_counter()
    first = last = None
    n = 0
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            n += 1
            first = first or now
            last = now
    ttft = first - start
    tpot = (last - first) / (n - 1) if n > 1 else None
    return ttft, tpot


def fit(xs, ys):
    """Least squares y = c + m·x over the median y of each x: (c, m). Medians, because a
    client thread descheduled while 16 streams arrive reads a burst of buffered tokens at once
    and reports a TPOT near 0 (seen once in 15 samples)."""
    by_x = {}
    for x, y in zip(xs, ys):
        by_x.setdefault(x, []).append(y)
    xs = sorted(by_x)
    ys = [statistics.median(by_x[x]) for x in xs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    m = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - m * mx, m


def concurrent(batch, prompt_tokens, out_tokens):
    """Median TPOT (s) of `batch` requests started together."""
    results = [None] * batch
    def run(i):
        results[i] = stream(tokens(prompt_tokens), out_tokens)[1]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.median(r for r in results if r is not None)


def fit2(xs, ys, through_origin=False):
    """Least squares y = c + a·n + q·n(n+1)/2 over the median y of each n: (c, a, q); with
    through_origin, c = 0 and the quadratic regressor is n²: (0, a, q)."""
    by_x = {}
    for x, y in zip(xs, ys):
        by_x.setdefault(x, []).append(y)
    if through_origin:
        rows = [(float(n), float(n) * n, statistics.median(v)) for n, v in sorted(by_x.items())]
        m = [[sum(r[i] * r[j] for r in rows) for j in range(2)] + [sum(r[i] * r[2] for r in rows)]
             for i in range(2)]
        det = m[0][0] * m[1][1] - m[0][1] * m[1][0]
        return (0.0, (m[0][2] * m[1][1] - m[0][1] * m[1][2]) / det,
                (m[0][0] * m[1][2] - m[1][0] * m[0][2]) / det)
    rows = [(1.0, float(n), n * (n + 1) / 2.0, statistics.median(v)) for n, v in sorted(by_x.items())]
    # Normal equations, 3 × 3, solved by Gaussian elimination.
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] + [sum(r[i] * r[3] for r in rows)]
         for i in range(3)]
    for i in range(3):
        pivot = max(range(i, 3), key=lambda r: abs(m[r][i]))
        m[i], m[pivot] = m[pivot], m[i]
        for r in range(3):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [a - f * b for a, b in zip(m[r], m[i])]
    return tuple(m[i][3] / m[i][i] for i in range(3))


def steps(n):
    return -(-n // args.max_num_batched_tokens)


stream(tokens(32), 2)  # warm-up
prefill_x, prefill_y = [], []
for n in [64, 256, 512, 1024, 1536, 2048, 3072]:
    for _ in range(args.reps):
        ttft, _ = stream(tokens(n), 1)
        prefill_x.append(n)
        prefill_y.append(ttft * 1e6)
    print(f"prefill {n:5d} tokens: TTFT median {statistics.median(prefill_y[-args.reps:]) / 1000:.1f} ms", flush=True)

decode_x, decode_y = [], []
for b in [1, 2, 4, 8, 16]:
    for _ in range(args.reps):
        decode_x.append(b)
        decode_y.append(concurrent(b, 64, 64) * 1e6)
    print(f"decode {b:2d} seqs (64-token prompts): TPOT median {statistics.median(decode_y[-args.reps:]) / 1000:.2f} ms", flush=True)
t0_decode, b_us = fit(decode_x, decode_y)
# A prompt longer than the step budget pays t0 once per extra step: take it off before the fit.
c, a, q = fit2(prefill_x, [y - (steps(n) - 1) * t0_decode for n, y in zip(prefill_x, prefill_y)])
q = max(0.0, q)

# Context: B sequences with C-token prompts, up to the KV cache the workloads fill. The cost
# per context token read grows with the total read per step on this engine (1.9 µs per token at
# ~9k tokens, ~4 at ~60k: BENCHMARKS "Real vLLM (CPU)"), so the fit is k·ctx + k2·ctx² on the
# TPOT left after t0 + b·B, ctx = B × (C + ~32 decoded).
ctx_points = [(8, 1024), (16, 1024), (32, 1024), (8, 3000), (16, 3000), (32, 1800)]
ctx_x, ctx_y = [], []
for bseqs, c in ctx_points:
    for _ in range(args.reps):
        tpot = concurrent(bseqs, c, 64) * 1e6
        ctx_x.append(bseqs * (c + 32))
        ctx_y.append(tpot - (t0_decode + b_us * bseqs))
    print(f"decode {bseqs:2d} seqs ({c:,}-token prompts): TPOT median "
          f"{statistics.median(ctx_y[-args.reps:]) / 1000 + (t0_decode + b_us * bseqs) / 1000:.2f} ms", flush=True)
_, k_us, k2_us = fit2(ctx_x, ctx_y, through_origin=True)
k_us, k2_us = max(0.0, k_us), max(0.0, k2_us)

# Chunked prefill, held out of the fit: a prompt of budget × 2 − 64 tokens takes two steps.
n_long = args.max_num_batched_tokens * 2 - 64
chunked = statistics.median(stream(tokens(n_long), 1)[0] * 1e6 for _ in range(args.reps))
t0 = c  # the prefill fit's intercept: one step's t0 + HTTP
predicted = c + (steps(n_long) - 1) * t0_decode + a * n_long + q * n_long * (n_long + 1) / 2
linear = c + (steps(n_long) - 1) * t0_decode + a * n_long
print(f"chunked prefill, {n_long} tokens ({steps(n_long)} steps): TTFT median {chunked / 1000:.1f} ms, "
      f"the model predicts {predicted / 1000:.1f} ms (without q: {linear / 1000:.1f} ms)", flush=True)


def pod_info():
    metrics = urllib.request.urlopen(args.url + "/metrics", timeout=10).read().decode()
    info = next(l for l in metrics.splitlines() if l.startswith("vllm:cache_config_info{"))
    labels = dict(kv.split("=", 1) for kv in info[info.index("{") + 1:info.index("}")].split(","))
    kv_tokens = int(labels["num_gpu_blocks"].strip('"')) * int(labels["block_size"].strip('"'))
    models = json.load(urllib.request.urlopen(args.url + "/v1/models", timeout=10))
    return kv_tokens, models["data"][0]["max_model_len"]


if args.profile_out:
    kv_tokens, max_model_len = pod_info()
    profile = {"name": args.name, "t0_us": round(t0_decode, 1),
               "a_us_per_prefill_token": round(a, 3), "b_us_per_decode_seq": round(b_us, 2),
               "k_us_per_context_token": round(k_us, 4),
               "k2_us_per_context_token_sq": round(k2_us, 10),
               "q_us_per_prefill_pair": round(q, 6),
               # The simulator counts KV in blocks of 16 tokens.
               "kv_blocks": kv_tokens // 16, "max_num_batched_tokens": args.max_num_batched_tokens,
               "max_num_seqs": args.max_num_seqs, "max_model_len": max_model_len}
    with open(args.profile_out, "w") as f:
        json.dump(profile, f, indent=2)
        f.write("\n")
    print(f"profile written to {args.profile_out}", flush=True)
print(json.dumps({"chunked_prefill_tokens": n_long, "chunked_ttft_us": round(chunked),
                  "chunked_predicted_us": round(predicted),"t0_us": round(t0, 1), "a_us_per_prefill_token": round(a, 3),
                  "q_us_per_prefill_pair": round(q, 6),
                  "t0_decode_us": round(t0_decode, 1), "b_us_per_decode_seq": round(b_us, 2),
                  "k_us_per_context_token": round(k_us, 4),
                  "prefill": list(zip(prefill_x, [round(y) for y in prefill_y])),
                  "decode": list(zip(decode_x, [round(y) for y in decode_y])),
                  "k2_us_per_context_token_sq": k2_us,
                  "context": list(zip(ctx_x, [round(y) for y in ctx_y]))}))
