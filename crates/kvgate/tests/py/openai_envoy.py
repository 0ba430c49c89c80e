"""The official openai client through Envoy (kvgate as ext_proc endpoint picker).

Usage: openai_envoy.py BASE_URL MODEL
Prints one JSON line per request, in order: {"kind": ..., "pod": <x-mock-pod header>}.
"""
import json
import sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)


def emit(kind, pod):
    assert pod, f"{kind}: the response has no x-mock-pod header"
    print(json.dumps({"kind": kind, "pod": pod}), flush=True)


# Non-stream chat.
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "Say hello through Envoy."}], max_tokens=8
)
completion = raw.parse()
assert completion.choices[0].message.content, completion
emit("chat", raw.headers.get("x-mock-pod"))

# Stream chat, without and with usage.
for kind, extra in (("stream", {}), ("stream_usage", {"stream_options": {"include_usage": True}})):
    with client.chat.completions.with_streaming_response.create(
        model=model,
        messages=[{"role": "user", "content": f"Stream a few words ({kind})."}],
        max_tokens=8,
        stream=True,
        **extra,
    ) as resp:
        pod = resp.headers.get("x-mock-pod")
        text, usage = "", None
        for chunk in resp.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
        assert text, f"{kind}: no content streamed"
        if extra:
            assert usage is not None and usage.completion_tokens > 0, usage
    emit(kind, pod)

# A multi-turn conversation with a long system prompt: every turn should stay on one pod.
system = "".join(f"Rule {i}: answer precisely and briefly. " for i in range(150))
messages = [{"role": "system", "content": system}]
for turn in range(4):
    messages.append({"role": "user", "content": f"Turn {turn}: tell me something new."})
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=8)
    reply = raw.parse().choices[0].message.content
    messages.append({"role": "assistant", "content": reply})
    emit("turn", raw.headers.get("x-mock-pod"))
