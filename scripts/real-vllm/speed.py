"""How fast the real vLLM pods of this machine are, measured in a few seconds, against the machine
the real-vLLM test loads were tuned on. Python standard library only.

    speed.py POD_URL [POD_URL...] [--model tiny] [--dtype D] [--env | --summary]

Per pod, one after the other (each with the machine to itself as far as the pods go):
  - a short warm-up request;
  - prefill: two distinct ~1,000-token completions prompts, never sent before (a fresh tag, so no
    prefix-cache hit), max_tokens 1; the faster of the two, in ms per 1,000 prompt tokens
    (`usage.prompt_tokens`);
  - decode: two streamed completions of 33 tokens (ignore_eos) on a short prompt; the time from
    the first token's chunk to the last one's over the 32 steps between, the faster of the two.
The fleet's figure is its slowest pod's. The slowness is measured / reference, for prefill and
decode, and overall the larger of the two (what a time limit must allow for).

Output: a line per pod on stderr, and on stdout either
  --env      KEY=value lines for $KVGATE_VLLM_RUN/*.env: KVGATE_VLLM_CPU (quoted: the env
             files are sourced by scripts/test), KVGATE_VLLM_POD_DTYPE (with --dtype),
             KVGATE_VLLM_PREFILL_MS_PER_1K, KVGATE_VLLM_DECODE_MS_PER_TOKEN, the reference's
             KVGATE_VLLM_REF_PREFILL_MS_PER_1K and KVGATE_VLLM_REF_DECODE_MS_PER_TOKEN, and
             KVGATE_VLLM_SLOWNESS_MEASURED (the summary line then goes to stderr)
  --summary  one line for a benchmark to print beside its tables (the default)
Exits 1 when a pod cannot be measured.
"""
import argparse
import json
import re
import shlex
import sys
import time
import urllib.request

# The machine where the real-vLLM test loads and time limits were tuned (the project's 2-core VM,
# Intel Xeon with AVX-512 bf16 and AMX, vLLM 0.32 CPU, the tiny model of fleet.sh: 8 layers,
# hidden 512, bfloat16; BENCHMARKS.md "Real vLLM (CPU)", 2026-12-01): a 1,024-token prompt alone
# on an idle pod took 120 ms (probe_mixed.py), 2,048 tokens 258 ms (calibrate.py), 1,450 tokens
# 263 ms with the machine loaded (prefix_saving.py); one sequence decoded at 6.2 ms per token
# (calibrate.py, 1-16 sequences: 6.2 -> 9.9 ms).
REF_PREFILL_MS_PER_1K = 120.0
REF_DECODE_MS_PER_TOKEN = 6.2

PREFILL_TOKENS = 1000
DECODE_TOKENS = 33


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def post(url, body, timeout):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def prefill_ms_per_1k(url, model, tag, timeout):
    """Wall time of a max_tokens-1 completion of a fresh ~1,000-token prompt, per 1,000 tokens."""
    # The tag on the first line makes every block new (a block's hash chains its prefix's);
    # ~12.5 tokens a line with the tiny model's tokenizer, normalised by the real count below.
    lines = "".join(f"def g{i}(x): return x * {i}\n" for i in range(PREFILL_TOKENS * 2 // 25))
    body = {"model": model, "prompt": f"# speed probe {tag}\n{lines}", "max_tokens": 1}
    start = time.perf_counter()
    with post(url, body, timeout) as r:
        usage = json.load(r)["usage"]
    ms = (time.perf_counter() - start) * 1000
    return ms * 1000 / usage["prompt_tokens"], usage["prompt_tokens"]


def decode_ms_per_token(url, model, tag, timeout):
    """Mean time between a stream's first and last token chunks, per step."""
    body = {"model": model, "prompt": f"# decode probe {tag}\ndef f(x):", "max_tokens": DECODE_TOKENS,
            "ignore_eos": True, "temperature": 0.0, "stream": True}
    times = []
    with post(url, body, timeout) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            # Every choice chunk is a token (a special token streams as empty text).
            if chunk.get("choices"):
                times.append(time.perf_counter())
    if len(times) < 2:
        raise RuntimeError(f"{len(times)} token chunks streamed")
    return (times[-1] - times[0]) * 1000 / (len(times) - 1)


def measure(url, model, timeout):
    tag = time.time_ns()
    post(url, {"model": model, "prompt": f"# warm-up {tag}", "max_tokens": 2}, timeout).read()
    prefill = [prefill_ms_per_1k(url, model, f"{tag}p{k}", timeout) for k in range(2)]
    decode = [decode_ms_per_token(url, model, f"{tag}d{k}", timeout) for k in range(2)]
    return min(p for p, _ in prefill), prefill[0][1], min(decode)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pods", nargs="+", help="pod base URLs, http://127.0.0.1:18000")
    p.add_argument("--model", default="tiny")
    p.add_argument("--dtype", default="", help="the pods' dtype, echoed (pod.sh writes NAME.dtype)")
    p.add_argument("--timeout", type=float, default=300, help="per request, seconds")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--env", action="store_true")
    out.add_argument("--summary", action="store_true")
    args = p.parse_args()
    prefill = decode = 0.0
    for url in args.pods:
        url = url.rstrip("/")
        try:
            pf, tokens, dc = measure(url, args.model, args.timeout)
        except Exception as e:  # noqa: BLE001 - reported, then a failure exit
            print(f"speed.py: {url}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"{url}: prefill {pf:.0f} ms per 1k tokens ({tokens}-token prompt), "
              f"decode {dc:.1f} ms per token", file=sys.stderr)
        prefill, decode = max(prefill, pf), max(decode, dc)
    sp, sd = prefill / REF_PREFILL_MS_PER_1K, decode / REF_DECODE_MS_PER_TOKEN
    cpu = cpu_model()
    dtype = f", {args.dtype}" if args.dtype else ""
    summary = (f"machine: {cpu}{dtype}; pod speed: prefill {prefill:.0f} ms per 1k tokens, decode "
               f"{decode:.1f} ms per token (x{sp:.2f} / x{sd:.2f} of the reference machine's "
               f"{REF_PREFILL_MS_PER_1K:.0f} / {REF_DECODE_MS_PER_TOKEN:.1f}; slowness "
               f"{max(sp, sd):.2f})")
    if args.env:
        print(summary, file=sys.stderr)
        # One shell word each: the CPU model has spaces and parentheses, so it is single-quoted
        # with no quote inside (readers strip the quotes).
        cpu_word = "'" + re.sub(r"[^\x20-\x7e]|'", "?", cpu) + "'"
        print(f"KVGATE_VLLM_CPU={cpu_word}")
        if args.dtype:
            print(f"KVGATE_VLLM_POD_DTYPE={shlex.quote(args.dtype)}")
        print(f"KVGATE_VLLM_PREFILL_MS_PER_1K={prefill:.1f}")
        print(f"KVGATE_VLLM_DECODE_MS_PER_TOKEN={decode:.2f}")
        print(f"KVGATE_VLLM_REF_PREFILL_MS_PER_1K={REF_PREFILL_MS_PER_1K}")
        print(f"KVGATE_VLLM_REF_DECODE_MS_PER_TOKEN={REF_DECODE_MS_PER_TOKEN}")
        # For people and scripts; the tests compute it from the four figures.
        print(f"KVGATE_VLLM_SLOWNESS_MEASURED={max(sp, sd):.2f}")
    else:
        print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
