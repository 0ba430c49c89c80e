"""What a prefix-cache hit saves on a real vLLM pod: six distinct ~1,450-token completions
prompts sent cold, then the same six again (cached), max_tokens 1, one at a time; prints the
median latency of each round and their ratio (a request of one output token is about its
prefill). Usage: python prefix_saving.py POD_URL [MODEL]   (the fleet's pods: fleet.env)
"""
import json
import sys
import time
import urllib.request

import speed  # this directory's speed.py

url, model = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "tiny")
print(f"machine: {speed.cpu_model()}", flush=True)  # beside the figures (speed.py)


def once(prompt):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    start = time.perf_counter()
    usage = json.load(urllib.request.urlopen(req, timeout=120))["usage"]
    return (time.perf_counter() - start) * 1000, usage["prompt_tokens"]


tag = time.time_ns()
prompts = [f"# {tag} {k}\n" + "".join(f"def f{i}_{k}(x): return x + {i}\n" for i in range(100))
           for k in range(6)]
cold = [once(p) for p in prompts]
warm = [once(p) for p in prompts]
median = lambda xs: sorted(xs)[len(xs) // 2]
c, w = median([ms for ms, _ in cold]), median([ms for ms, _ in warm])
print(f"prompt tokens {cold[0][1]}: cold median {c:.0f} ms, cached median {w:.0f} ms, ratio {c / w:.1f}")
