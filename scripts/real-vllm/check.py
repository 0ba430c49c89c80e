"""Checks kvgate's engine index against one real vLLM CPU pod (run by scripts/real-vllm/check.sh).

1. A prompt sent straight to the pod before kvgate starts is learnt from the replay buffer:
   through kvgate it scores 1.0 and is charged only its uncached tail.
2. `kill -9` of the pod's process group and a restart: kvgate clears the old engine's blocks
   (the old prompt scores 0) and follows the new engine (a prompt cached on it scores 1.0).
Exits non-zero with a message on the first failed expectation; prints the figures it saw.
Arguments: POD_URL GATEWAY_URL ADMIN_URL KVGATE_ARGV_JSON RESTART_ARGV_JSON KVGATE_LOG.
"""
import json
import subprocess
import sys
import time
import urllib.request

POD, GW, ADMIN = sys.argv[1:4]
kvgate_cmd, restart_cmd = json.loads(sys.argv[4]), json.loads(sys.argv[5])


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))


def last_decision():
    return json.load(urllib.request.urlopen(f"{ADMIN}/debug/decisions", timeout=10))[-1]


def route(body):
    post(f"{GW}/v1/completions", body)
    d = last_decision()
    return d["pods"][0]["prefix_score"], d["charged_prefill_tokens"]


def metric(name):
    text = urllib.request.urlopen(f"{ADMIN}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def expect(ok, what):
    if not ok:
        sys.exit(f"FAILED: {what}")
    print("ok:", what)


def wait(what, cond, seconds):
    deadline = time.time() + seconds
    while True:
        try:
            if cond():
                return
        except OSError:
            pass
        if time.time() > deadline:
            sys.exit(f"FAILED: {what} within {seconds} s")
        time.sleep(0.2)


old = {"model": "tiny", "prompt": " ".join(f"def f{i}(x): return x + {i}" for i in range(200)),
       "max_tokens": 2}
tokens = post(f"{POD}/v1/completions", old)["usage"]["prompt_tokens"]
print("phase 1: prompt of", tokens, "tokens cached on the pod; kvgate starting")
sys.stdout.flush()
gateway = subprocess.Popen(kvgate_cmd, stdout=subprocess.DEVNULL, stderr=open(sys.argv[6], "w"))
wait("kvgate up", lambda: urllib.request.urlopen(f"{ADMIN}/healthz", timeout=2).status == 200, 30)
time.sleep(2)
score, charged = route(old)
print(f"  through kvgate: prefix score {score}, charged {charged} of {tokens} tokens")
expect(score == 1.0, "blocks cached before kvgate subscribed are known (replay, 4-frame framing)")
expect(charged < 128, "charged only the uncached tail (under one 128-token block)")

print("phase 2: kill -9 of the pod's process group and a restart")
sys.stdout.flush()
subprocess.run(restart_cmd, check=True)
new = {"model": "tiny", "prompt": " ".join(f"class C{i}: pass" for i in range(300)), "max_tokens": 2}
post(f"{POD}/v1/completions", new)
t0 = time.time()
wait("new engine followed", lambda: route(new)[0] == 1.0, 10)
print(f"  the new engine's prompt scored 1.0 {time.time() - t0:.1f} s after the pod cached it")
score, _ = route(old)
expect(score == 0.0, f"the old engine's blocks are cleared (old prompt scores {score})")
expect(metric("kvgate_kv_events_restarts_total") >= 1, "the restart is counted")
print("all checks passed")
gateway.terminate()
