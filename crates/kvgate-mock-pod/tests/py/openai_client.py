"""The official `openai` client against a mock pod: chat and completions, stream and
non-stream; usage present and consistent. Usage: openai_client.py BASE_URL MODEL"""
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

assert [m.id for m in client.models.list().data] == [model]

# Completions, non-stream.
r = client.completions.create(model=model, prompt="Say hello", max_tokens=5)
assert r.choices[0].finish_reason == "length", r
assert r.usage.completion_tokens == 5, r.usage
assert r.usage.total_tokens == r.usage.prompt_tokens + 5, r.usage
whole = r.choices[0].text

# Completions, stream with usage: same text, usage chunk last with no choices.
chunks = list(client.completions.create(model=model, prompt="Say hello", max_tokens=5,
                                        stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].text for c in chunks if c.choices)
assert text == whole, (text, whole)
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5, chunks[-1]
assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens

# Chat, non-stream.
messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
c = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
assert c.choices[0].message.role == "assistant"
assert c.usage.completion_tokens == 4 and c.usage.total_tokens == c.usage.prompt_tokens + 4
# The same conversation again: its prompt is now a prefix-cache candidate (cached_tokens read).
assert c.usage.prompt_tokens_details is not None

# Chat, stream with usage.
chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                             stream=True, stream_options={"include_usage": True}))
content = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
assert content == c.choices[0].message.content, (content, c.choices[0].message.content)
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
assert chunks[-1].usage.prompt_tokens == c.usage.prompt_tokens

# Errors surface as the client's typed exceptions.
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError:
    pass
try:
    client.completions.create(model=model, prompt="x", max_tokens=10_000_000)
    raise AssertionError("too-long request accepted")
except openai.BadRequestError as e:
    assert "maximum context length" in str(e), e
print("ok")
