"""The official `openai` client through the kvgate gateway to mock pods: chat and completions,
stream and non-stream; routing headers present; usage only when asked for.
Usage: openai_gateway.py GATEWAY_URL MODEL"""
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

# The union of the pods' model lists: one model.
assert [m.id for m in client.models.list().data] == [model]

# Completions, non-stream, with the routing headers.
raw = client.completions.with_raw_response.create(model=model, prompt="Say hello", max_tokens=5)
assert raw.headers.get("x-kvgate-pod", "").startswith("http://127.0.0.1:"), raw.headers
assert raw.headers.get("x-kvgate-branch"), raw.headers
r = raw.parse()
assert r.usage.completion_tokens == 5, r.usage
whole = r.choices[0].text

# Completions, stream without usage: the gateway asked the pod for usage and strips it.
chunks = list(client.completions.create(model=model, prompt="Say hello", max_tokens=5, stream=True))
assert all(c.usage is None for c in chunks), chunks[-1]
assert "".join(c.choices[0].text for c in chunks if c.choices) == whole

# Completions, stream with usage: passed through.
chunks = list(client.completions.create(model=model, prompt="Say hello", max_tokens=5,
                                        stream=True, stream_options={"include_usage": True}))
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5, chunks[-1]

# Chat, non-stream.
messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
c = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
assert c.choices[0].message.role == "assistant"
assert c.usage.completion_tokens == 4

# Chat, stream without and with usage.
chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True))
assert all(ch.usage is None for ch in chunks)
content = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
assert content == c.choices[0].message.content, (content, c.choices[0].message.content)
chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                             stream=True, stream_options={"include_usage": True}))
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4

# A bad request is the gateway's 400, typed by the client.
try:
    client.chat.completions.create(model=model, messages="not a list", max_tokens=4)
    raise AssertionError("bad messages accepted")
except openai.BadRequestError:
    pass
print("ok")
