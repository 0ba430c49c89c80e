"""The official `openai` client through `kvgate serve` to real vLLM pods: completions and chat,
stream and non-stream, usage only when asked for, the routing headers, and errors (kvgate's
own 400, vLLM's 404 and 400 passed through with their OpenAI shape).
Greedy sampling with `ignore_eos`, so every answer has exactly `max_tokens` tokens (the model
is random; its text is noise).
Usage: openai_real_vllm.py GATEWAY_URL MODEL POD_URL...
($KVGATE_VLLM_SLOWNESS, the pods' measured slowness, stretches the client's 120 s timeout.)
"""
import os
import sys

import openai

base_url, model, pods = sys.argv[1], sys.argv[2], sys.argv[3:]
timeout = 120 * max(1.0, float(os.environ.get("KVGATE_VLLM_SLOWNESS") or 1))
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout)
greedy = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
checks = 0


def check(ok, what):
    global checks
    assert ok, what
    checks += 1


check(model in [m.id for m in client.models.list().data], "the pods' model is listed")

# Completions, non-stream, with the routing headers.
raw = client.completions.with_raw_response.create(
    model=model, prompt="def add(a, b): return a + b", max_tokens=5, **greedy)
check(raw.headers.get("x-kvgate-pod") in pods, f"x-kvgate-pod names a pod: {raw.headers}")
check(bool(raw.headers.get("x-kvgate-branch")), "x-kvgate-branch is set")
r = raw.parse()
check(r.usage.completion_tokens == 5 and r.usage.prompt_tokens > 0, f"usage: {r.usage}")
check(isinstance(r.choices[0].text, str) and r.choices[0].finish_reason == "length", r)

# Completions, stream without usage: kvgate asked the pod for usage and strips it.
chunks = list(client.completions.create(
    model=model, prompt="def add(a, b): return a + b", max_tokens=5, stream=True, **greedy))
check(all(c.usage is None for c in chunks), f"no usage when not asked: {chunks[-1]}")
# A token chunk has a text field; a special token's is empty, so "" counts too.
# (vLLM may merge tokens into one chunk when its reader falls behind.)
check(sum(1 for c in chunks if c.choices and isinstance(c.choices[0].text, str)) >= 1,
      f"streamed token chunks: {chunks}")

# Completions, stream with usage: passed through, last chunk has no choices.
chunks = list(client.completions.create(
    model=model, prompt="def add(a, b): return a + b", max_tokens=5, stream=True,
    stream_options={"include_usage": True}, **greedy))
check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5, f"{chunks[-1]}")

# Chat, non-stream and stream (with and without usage).
messages = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello."}]
c = client.chat.completions.create(model=model, messages=messages, max_tokens=4, **greedy)
check(c.choices[0].message.role == "assistant" and c.usage.completion_tokens == 4, f"{c}")
chunks = list(client.chat.completions.create(
    model=model, messages=messages, max_tokens=4, stream=True, **greedy))
check(all(ch.usage is None for ch in chunks), "chat stream: no usage when not asked")
check(chunks[0].choices[0].delta.role == "assistant", f"first delta has the role: {chunks[0]}")
chunks = list(client.chat.completions.create(
    model=model, messages=messages, max_tokens=4, stream=True,
    stream_options={"include_usage": True}, **greedy))
check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4, f"{chunks[-1]}")

# Errors: kvgate's own 400 (bad messages), vLLM's 404 (unknown model) and 400 (too long).
try:
    client.chat.completions.create(model=model, messages="not a list", max_tokens=4)
    raise AssertionError("bad messages accepted")
except openai.BadRequestError as e:
    check(e.body and e.body.get("type") == "invalid_request_error", f"kvgate 400: {e.body}")
try:
    client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    check("does not exist" in str(e), f"vLLM's 404 passed through: {e}")
try:
    client.completions.create(model=model, prompt="hi", max_tokens=100_000)
    raise AssertionError("max_tokens over the model length accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400, f"vLLM's 400 passed through: {e}")
print(f"ok: {checks} checks")
