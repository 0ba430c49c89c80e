"""Measures a real vLLM pod's step time, to fit the simulator's step-time model
(crates/kvgate-sim/src/profiles.rs):

    step_us = t0 + a·(uncached prefill tokens) + b·(decode sequences) + k·(context tokens read)

- prefill: one request at a time, prompts of N random token ids (never cached: fresh ids each
  time), max_tokens 1, streamed; TTFT(N) ≈ one prefill step of N tokens (+ HTTP) → t0 + a·N;
- decode: B requests at once (64-token prompts, 64 output tokens, ignore_eos), TPOT of each
  (time between its first and last token / 63) ≈ the step time with B sequences → t0' + b·B;
- context: the same with 1,024-token prompts; the TPOT difference per sequence and per extra
  context token → k.
Least-squares fits. t0 is the decode fit's intercept (token gaps carry no HTTP overhead), a
the prefill fit's slope (prefill sizes stay within one step's token budget,
`max_num_batched_tokens`); chunked prefill is then checked: a prompt of twice the budget takes
two steps, and the script prints the measured TTFT next to the model's prediction.
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


stream(tokens(32), 2)  # warm-up
prefill_x, prefill_y = [], []
for n in [n for n in [64, 256, 512, 1024, 1536, 2048] if n <= args.max_num_batched_tokens]:
    for _ in range(args.reps):
        ttft, _ = stream(tokens(n), 1)
        prefill_x.append(n)
        prefill_y.append(ttft * 1e6)
    print(f"prefill {n:5d} tokens: TTFT median {statistics.median(prefill_y[-args.reps:]) / 1000:.1f} ms", flush=True)
t0, a = fit(prefill_x, prefill_y)

decode_x, decode_y = [], []
for b in [1, 2, 4, 8, 16]:
    for _ in range(args.reps):
        decode_x.append(b)
        decode_y.append(concurrent(b, 64, 64) * 1e6)
    print(f"decode {b:2d} seqs (64-token prompts): TPOT median {statistics.median(decode_y[-args.reps:]) / 1000:.2f} ms", flush=True)
t0_decode, b_us = fit(decode_x, decode_y)

long_ctx = 1024
ctx = []
for _ in range(args.reps):
    ctx.append(concurrent(8, long_ctx, 64) * 1e6)
long_tpot = statistics.median(ctx)
short_tpot = t0_decode + b_us * 8
# Context read per step: 8 sequences × (1,024 + ~32 decoded) vs 8 × (64 + ~32) tokens.
k_us = max(0.0, (long_tpot - short_tpot) / (8 * (long_ctx - 64)))
print(f"decode 8 seqs (1,024-token prompts): TPOT median {long_tpot / 1000:.2f} ms", flush=True)

# Chunked prefill: a prompt of budget × 2 − 64 tokens takes two steps.
n_long = args.max_num_batched_tokens * 2 - 64
chunked = statistics.median(stream(tokens(n_long), 1)[0] * 1e6 for _ in range(args.reps))
http_overhead = t0 - t0_decode  # the prefill fit's intercept holds one step's t0 + HTTP
predicted = http_overhead + 2 * t0_decode + a * n_long
print(f"chunked prefill, {n_long} tokens (2 steps): TTFT median {chunked / 1000:.1f} ms, "
      f"the model predicts {predicted / 1000:.1f} ms", flush=True)


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
               # The simulator counts KV in blocks of 16 tokens.
               "kv_blocks": kv_tokens // 16, "max_num_batched_tokens": args.max_num_batched_tokens,
               "max_num_seqs": args.max_num_seqs, "max_model_len": max_model_len}
    with open(args.profile_out, "w") as f:
        json.dump(profile, f, indent=2)
        f.write("\n")
    print(f"profile written to {args.profile_out}", flush=True)
print(json.dumps({"chunked_prefill_tokens": n_long, "chunked_ttft_us": round(chunked),
                  "chunked_predicted_us": round(predicted),"t0_us": round(t0, 1), "a_us_per_prefill_token": round(a, 3),
                  "t0_decode_us": round(t0_decode, 1), "b_us_per_decode_seq": round(b_us, 2),
                  "k_us_per_context_token": round(k_us, 4),
                  "prefill": list(zip(prefill_x, [round(y) for y in prefill_y])),
                  "decode": list(zip(decode_x, [round(y) for y in decode_y])),
                  "decode_8_long_ctx_us": round(long_tpot)}))
